#include "tools/server/openai_stream.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "runtime/errors.h"

namespace tandem::server {

namespace {

std::string trim_left(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b);
}

}  // namespace

std::string sse_event(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

generation::applied generation::apply(const request_event& ev) {
  applied a;
  switch (ev.kind) {
    case event_kind::accepted: break;
    case event_kind::token:
      if (ended) break;
      tokens.push_back(ev.token);
      a.shown = stops.push(ev.text);
      if (stops.stopped()) {
        ended = true;
        finish_reason = tandem::finish_reason::stop;
        a.stopped = true;
      }
      text += a.shown;
      break;
    case event_kind::done:
      if (!ended) {
        a.shown = stops.flush();
        finish_reason = ev.finish_reason;
      }
      text += a.shown;
      timings = ev.timings;
      ended = true;
      break;
    case event_kind::error: ended = true; break;
  }
  return a;
}

// ---------------------------------------------------------------- the state machine

openai_stream::openai_stream(api_request req, stream_context ctx) : req_(std::move(req)), ctx_(std::move(ctx)) {
  if (req_.best_of > req_.n && req_.gen.sampling.logprobs < 0) {  // ranked by them, not shown
    req_.gen.sampling.logprobs = 0;
    req_.hide_logprobs = true;
  }
  if (!req_.parse_tools) tools_ = tools_mode::none;
  else tools_ = req_.gen.sampling.grammar.empty() ? tools_mode::read : tools_mode::forced;
  choices_.emplace_back(0, req_.stop);
}

std::vector<output> openai_stream::start() {
  if (choices_.front().id != 0) throw failure(errc::invalid_argument, "openai_stream: started twice");
  return {out::submit{0, req_.gen}};
}

void openai_stream::submitted(int32_t choice, request_id id) {
  if (choice < 0 || size_t(choice) >= choices_.size())
    throw failure(errc::invalid_argument, "openai_stream: no choice " + std::to_string(choice) + " was submitted");
  choices_[size_t(choice)].id = id;
}

template <class E>
std::vector<output> openai_stream::dispatch(const E& e) {
  out_.clear();
  switch (phase_) {
    case phase::ended: break;  // the end went out; what still comes is for requests given up
    case phase::waiting:
    case phase::streaming: handle(e); break;
  }
  return std::move(out_);
}

std::vector<output> openai_stream::on(const input& i) {
  return std::visit([this](const auto& x) { return dispatch(x); }, i);
}

std::vector<output> openai_stream::on(const request_event& ev) { return dispatch(ev); }

openai_stream::choice* openai_stream::find(request_id id) {
  for (auto& c : choices_)
    if (c.id != 0 && c.id == id) return &c;
  return nullptr;
}

bool openai_stream::all_done() const {
  return choices_.size() == size_t(req_.best_of) &&
         std::all_of(choices_.begin(), choices_.end(), [](const choice& c) { return c.done; });
}

void openai_stream::handle(const request_event& ev) {
  choice* c = find(ev.id);
  if (!c) return;  // not one of this answer's
  switch (ev.kind) {
    case event_kind::error:
      c->gen.timings = ev.timings;  // for its log line
      return fail(error_from(ev.code, ev.message, ev.retry_after_ms));
    case event_kind::accepted:
    case event_kind::token:
    case event_kind::done: return step(*c, ev);
  }
}

void openai_stream::handle(const in::client_gone&) { finish(499, "client_closed", "the connection closed"); }

void openai_stream::handle(const in::abort& a) { fail(a.error); }

void openai_stream::step(choice& c, const request_event& ev) {
  const bool generated = ev.kind == event_kind::token || ev.kind == event_kind::done;
  if (c.index == 0 && generated && choices_.size() < size_t(req_.best_of)) submit_more();
  const bool was_ended = c.gen.ended;
  const bool new_token = ev.kind == event_kind::token && ev.token >= 0 && !was_ended;
  if (new_token && ev.logprobs) {
    c.logprob_sum += ev.logprobs->logprob;
    ++c.logprob_count;
    if (!req_.hide_logprobs) c.logprobs.push_back({ev.token, *ev.logprobs, int64_t(c.gen.text.size())});
  }
  const auto [shown, stopped] = c.gen.apply(ev);
  if (stopped) emit(out::cancel{c.id});
  if (ev.kind == event_kind::done) c.done = true;
  if (req_.stream) {
    stream_step(c, ev, shown, new_token);
    if (all_done()) end_stream();
  } else if (all_done()) {
    respond();
  }
}

// Choices 1..best_of-1: each samples with its own seed and has its own grammar matcher (the
// compiled grammar is shared).
void openai_stream::submit_more() {
  for (int32_t i = 1; i < req_.best_of; ++i) {
    generation_request g = req_.gen;
    auto& sp = g.sampling;
    sp.seed = derived_seed(sp.seed, i);
    if (!sp.grammar.empty()) (void)sp.set_grammar(std::string(sp.grammar));  // compiled: cached by text
    choices_.emplace_back(i, req_.stop);
    emit(out::submit{i, std::move(g)});
  }
}

// ---------------------------------------------------------------- streamed (SSE)

void openai_stream::stream_step(choice& c, const request_event& ev, const std::string& shown, bool new_token) {
  if (phase_ == phase::waiting && (ev.kind == event_kind::accepted || ev.kind == event_kind::token)) open_stream();
  const bool at_end = ev.kind == event_kind::done;
  switch (tools_) {
    // One chunk per generated token, as documented, even when its text is empty (a token that
    // ends inside a UTF-8 character, or text a stop string holds back for now).
    case tools_mode::none:
      if (new_token || !shown.empty()) emit(out::sse{sse_event(chunk(c, shown, nullptr))});
      break;
    // The grammar makes the answer one call: streamed as OpenAI's are, the name once known,
    // then the arguments as they come.
    case tools_mode::forced: stream_forced_call(c, at_end); break;
    // The answer may be a call: the text that cannot be one streams, the calls come at the end.
    case tools_mode::read:
      if (!at_end) stream_content_before_calls(c);
      break;
  }
  if (at_end) stream_end_of_choice(c);
}

void openai_stream::open_stream() {
  phase_ = phase::streaming;
  emit(out::open_sse{});
  if (req_.echo)  // every choice starts with the prompt
    for (int32_t i = 0; i < req_.n; ++i) {
      bool first = true;
      emit(out::sse{sse_event(chunk(i, first, echoed_prompt(), nullptr, nullptr))});
    }
}

// A forced call's deltas so far: the call's opening (id, type, name) once the text has its
// name and the start of its arguments, then the arguments' new bytes, short of the closing
// that may follow (`}` and, for hermes, `\n</tool_call>`) and never inside a UTF-8 character.
void openai_stream::stream_forced_call(choice& c, bool at_end) {
  const std::string& text = c.gen.text;
  const std::string_view closing = forced_call_closing(req_.tools_format);
  if (c.args_at == 0) {
    for (const auto& name : req_.tool_names) {
      const std::string head = forced_call_head(req_.tools_format, name);
      if (text.rfind(head, 0) != 0) continue;
      c.args_at = c.args_sent = head.size();
      send_tool_calls(c, json::array({{{"index", 0},
                                       {"id", call_id(c, 0)},
                                       {"type", "function"},
                                       {"function", {{"name", name}, {"arguments", ""}}}}}));
      break;
    }
    if (c.args_at == 0) return;
  }
  size_t end = text.size();
  const bool closed = at_end && text.size() >= c.args_at + closing.size() &&
                      text.compare(text.size() - closing.size(), closing.size(), closing) == 0;
  if (closed) end -= closing.size();
  else if (!at_end) end = end >= c.args_at + closing.size() ? end - closing.size() : c.args_at;
  while (end > c.args_sent && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80 && end < text.size()) --end;
  if (end <= c.args_sent) return;
  const std::string piece = text.substr(c.args_sent, end - c.args_sent);
  send_tool_calls(c, json::array({{{"index", 0}, {"function", {{"arguments", piece}}}}}));
  c.args_sent = end;
}

// tool_choice auto: the text streams as content up to where a call may begin (hermes: a
// `<tool_call>`, or a tail that could become one; Llama 3: an answer that starts as a JSON
// object or <|python_tag|>, which is then held whole); the calls come at the end.
void openai_stream::stream_content_before_calls(choice& c) {
  const std::string& text = c.gen.text;
  size_t limit = text.size();
  if (req_.tools_format == tool_format::hermes) {
    static const std::string open = "<tool_call>";
    if (const size_t at = text.find(open); at != std::string::npos) {
      limit = at;
    } else {
      for (size_t k = std::min(open.size() - 1, text.size()); k > 0; --k)
        if (text.compare(text.size() - k, k, open, 0, k) == 0) {
          limit = text.size() - k;
          break;
        }
    }
  } else {
    static const std::string tag = "<|python_tag|>";
    const std::string t = trim_left(text);
    const bool may_be_call = t.empty() || t[0] == '{' || t.rfind(tag, 0) == 0 || tag.rfind(t, 0) == 0;
    if (may_be_call && c.content_sent == 0) limit = 0;
  }
  if (limit <= c.content_sent) return;
  emit(out::sse{sse_event(chunk(c, text.substr(c.content_sent, limit - c.content_sent), nullptr))});
  c.content_sent = limit;
}

// A choice's done event: what it still holds back, then its finish chunk ("tool_calls" when
// its answer is a call that ended on its own).
void openai_stream::stream_end_of_choice(choice& c) {
  std::string finish(to_string(c.gen.finish_reason));
  const bool stopped = c.gen.finish_reason == finish_reason::stop;
  switch (tools_) {
    case tools_mode::none: break;
    case tools_mode::forced:
      if (c.args_at > 0 && stopped) finish = "tool_calls";
      break;
    case tools_mode::read: {
      const auto answer = read_calls(c);
      // What was not streamed yet: the rest of the text without calls; with calls, the rest
      // of their content (the text outside them) past what went out already.
      std::string rest;
      if (answer.calls.empty()) {
        rest = c.gen.text.substr(c.content_sent);
      } else {
        const std::string sent = trim_left(c.gen.text.substr(0, c.content_sent));
        if (answer.content.rfind(sent, 0) == 0) rest = answer.content.substr(sent.size());
      }
      if (!rest.empty() || (c.content_sent == 0 && answer.calls.empty()))
        emit(out::sse{sse_event(chunk(c, rest, nullptr))});
      if (!answer.calls.empty()) {
        send_tool_calls(c, calls_json(c, answer, true));
        if (stopped) finish = "tool_calls";
      }
      break;
    }
  }
  emit(out::sse{sse_event(chunk(c, "", finish))});
}

// Every choice is done: the usage chunk when asked for (stream_options.include_usage: no
// choices, the request's usage), then [DONE].
void openai_stream::end_stream() {
  if (req_.include_usage) {
    json u = envelope(json::array(), true);
    u["usage"] = usage_all();
    u["tandem"] = timings_json(choices_.front().gen.timings);
    emit(out::sse{sse_event(u)});
  }
  emit(out::sse{std::string(sse_done)});
  emit(out::close_sse{});
  finish(200);
}

// A streamed chunk whose delta is `calls` (OpenAI's tool_calls entries); it keeps the role
// when nothing came before.
void openai_stream::send_tool_calls(choice& c, json calls) {
  json j = chunk(c, "", nullptr);
  auto& d = j["choices"][0]["delta"];
  d.erase("content");
  d["tool_calls"] = std::move(calls);
  emit(out::sse{sse_event(j)});
}

// ---------------------------------------------------------------- whole (JSON), and the ends

void openai_stream::respond() {
  // best_of: the n choices with the highest mean log-probability per token (ties: the lower
  // choice), renumbered 0..n-1.
  std::vector<choice*> shown;
  for (auto& c : choices_) shown.push_back(&c);
  if (req_.best_of > req_.n) {
    auto mean = [](const choice* c) {
      return c->logprob_count ? c->logprob_sum / c->logprob_count : -std::numeric_limits<double>::infinity();
    };
    std::stable_sort(shown.begin(), shown.end(), [&](auto* a, auto* b) { return mean(a) > mean(b); });
    shown.resize(size_t(req_.n));
  }
  json list = json::array();
  for (size_t i = 0; i < shown.size(); ++i) {
    choice& c = *shown[i];
    json one = {{"index", int(i)}, {"finish_reason", std::string(to_string(c.gen.finish_reason))}};
    if (req_.chat) one["message"] = {{"role", "assistant"}, {"content", c.gen.text}};
    if (req_.chat && req_.parse_tools) {
      const auto answer = read_calls(c);
      if (!answer.calls.empty()) {
        one["message"]["content"] = answer.content.empty() ? json() : json(answer.content);
        one["message"]["tool_calls"] = calls_json(c, answer, false);
        if (c.gen.finish_reason == finish_reason::stop) one["finish_reason"] = "tool_calls";
      }
    } else {  // (a chat answer without tools has its "text" too, as it always had)
      one["text"] = req_.echo ? echoed_prompt() + c.gen.text : c.gen.text;
    }
    one["logprobs"] = logprobs_json(c);
    if (req_.return_token_ids) {  // where vLLM puts them: the prompt's per choice on completions
      one["token_ids"] = c.gen.tokens;
      if (!req_.chat) one["prompt_token_ids"] = req_.gen.prompt_tokens;
    }
    list.push_back(std::move(one));
  }
  json j = envelope(std::move(list), false);
  j["usage"] = usage_all();
  j["tandem"] = timings_json(choices_.front().gen.timings);
  if (req_.return_token_ids && req_.chat) j["prompt_token_ids"] = req_.gen.prompt_tokens;
  finish(200);
  emit(out::respond{std::move(j)});
}

// The answer ends with an error: an SSE error event and [DONE] once streaming began (its
// status was 200), else the error response.
void openai_stream::fail(const api_error& e) {
  switch (phase_) {
    case phase::streaming:
      emit(out::sse{sse_event(error_body(e))});
      emit(out::sse{std::string(sse_done)});
      emit(out::close_sse{});
      return finish(200, e.code, e.message);
    case phase::waiting: finish(e.http_status, e.code, e.message); return emit(out::refuse{e});
    case phase::ended: return;
  }
}

// It is over (status: its HTTP status; 499 when the client went away first): the choices
// still running are cancelled (an error ends them all), then its log line.
void openai_stream::finish(int status, std::string_view error, std::string_view message) {
  for (const auto& c : choices_)
    if (!c.done && c.id != 0) emit(out::cancel{c.id});
  const choice& first = choices_.front();
  request_log r;
  r.id = int64_t(first.id);
  r.ref = id();
  r.message = std::string(message);
  r.endpoint = req_.chat ? "/v1/chat/completions" : "/v1/completions";
  r.protocol = req_.stream ? "sse" : "json";
  r.status = status;
  r.timings = first.gen.timings;
  for (const auto& c : choices_) r.output_tokens += int64_t(c.gen.tokens.size());
  r.finish = std::string(to_string(first.gen.finish_reason));
  r.error = std::string(error);
  emit(out::finished{std::move(r)});
  phase_ = phase::ended;
}

// ---------------------------------------------------------------- shapes

std::string openai_stream::id() const { return (req_.chat ? "chatcmpl-" : "cmpl-") + std::to_string(ctx_.serial); }

int64_t openai_stream::now() const {
  if (ctx_.now) return ctx_.now();
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

json openai_stream::envelope(json choices, bool chunked) const {
  const char* object = !req_.chat ? "text_completion" : chunked ? "chat.completion.chunk" : "chat.completion";
  return {{"id", id()}, {"object", object}, {"created", now()}, {"model", ctx_.model}, {"choices", std::move(choices)}};
}

// One streamed chunk of choice `index`: chat's delta (the role in the choice's first) or the
// completion's text.
json openai_stream::chunk(int32_t index, bool& first, const std::string& delta, const json& finish,
                          json logprobs) const {
  json one = {{"index", index}, {"finish_reason", finish}};
  if (req_.chat) {
    json d = json::object();
    if (first) d["role"] = "assistant";
    if (!delta.empty() || first) d["content"] = delta;
    first = false;
    one["delta"] = d;
  } else {
    one["text"] = delta;
  }
  one["logprobs"] = std::move(logprobs);
  return envelope(json::array({std::move(one)}), true);
}

json openai_stream::chunk(choice& c, const std::string& delta, const json& finish) {
  json lp = logprobs_json(c);
  return chunk(c.index, c.first, delta, finish, std::move(lp));
}

// The pending log-probabilities in the request's API form (null when not asked), then
// forgotten.
json openai_stream::logprobs_json(choice& c) {
  if (req_.gen.sampling.logprobs < 0 || req_.hide_logprobs) return nullptr;
  json j = req_.chat ? chat_logprobs_json(*ctx_.tok, c.logprobs) : completion_logprobs_json(*ctx_.tok, c.logprobs);
  c.logprobs.clear();
  return j;
}

std::string openai_stream::call_id(const choice& c, size_t k) const {
  return "call_" + std::to_string(ctx_.serial) + "_" + std::to_string(c.index) + "_" + std::to_string(k);
}

// The calls in a choice's answer (all of them, or the first with parallel_tool_calls false).
parsed_answer openai_stream::read_calls(const choice& c) const {
  auto a = parse_tool_calls(req_.tools_format, c.gen.text, req_.tool_names);
  if (!req_.parallel_tools && a.calls.size() > 1) a.calls.resize(1);
  return a;
}

// OpenAI's tool_calls list (streamed: each with its index).
json openai_stream::calls_json(const choice& c, const parsed_answer& a, bool streamed) const {
  json list = json::array();
  for (size_t k = 0; k < a.calls.size(); ++k) {
    json one = {{"id", call_id(c, k)},
                {"type", "function"},
                {"function", {{"name", a.calls[k].name}, {"arguments", a.calls[k].arguments}}}};
    if (streamed) one["index"] = int(k);
    list.push_back(std::move(one));
  }
  return list;
}

// The request's usage, as OpenAI counts it for n choices: the prompt once, every choice's
// completion tokens.
json openai_stream::usage_all() const {
  const auto& t = choices_.front().gen.timings;
  json u = usage_json(t);
  int64_t completion = 0;
  for (const auto& c : choices_) completion += int64_t(c.gen.timings.output_tokens);
  u["completion_tokens"] = completion;
  u["total_tokens"] = int64_t(t.prompt_tokens) + completion;
  return u;
}

// echo: the prompt as text (a token-id prompt decoded), ahead of the completion.
std::string openai_stream::echoed_prompt() const {
  if (!req_.gen.prompt.empty()) return req_.gen.prompt;
  return ctx_.tok->decode(req_.gen.prompt_tokens);
}

}  // namespace tandem::server
