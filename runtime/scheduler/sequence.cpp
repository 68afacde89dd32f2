#include "runtime/scheduler/sequence.h"

namespace tandem::sched {

token_outcome take_token(const request_spec& spec, int32_t& generated, std::vector<token_id>& output, token_id& last,
                         token_id tok, bool eog, int32_t n_ctx) {
  token_outcome o;
  o.index = generated;
  o.end = finish_after(spec, generated + 1, eog, n_ctx);
  o.emit = o.end != finish_reason::stop;  // a stop token ends the output; it is not part of it
  if (o.emit) {
    ++generated;
    if (spec.sampling.needs_output()) output.push_back(tok);
    last = tok;
  }
  return o;
}

token_outcome take_token(sequence& s, token_id tok, bool eog, int32_t n_ctx) {
  return take_token(s.spec, s.generated, s.output, s.last, tok, eog, n_ctx);
}

step_work::decode_item decode_item(sequence& s) {
  s.in_step = true;
  return {s.spec.id, s.seq, s.last, s.generated, s.spec.sampling, s.output, s.penalty_prompt};
}

step_work::chunk_item chunk_item(sequence& s, const prefill_chunk& c) {
  step_work::chunk_item ci;
  ci.id = s.spec.id;
  ci.seq = s.seq;
  ci.tokens.assign(s.spec.prompt.begin() + c.begin, s.spec.prompt.begin() + c.begin + c.length);
  ci.last = c.last;
  ci.sampling = s.spec.sampling;
  ci.epoch = s.spec.epoch;
  ci.first_index = s.spec.resumed;
  if (c.last) {  // only the last chunk samples
    ci.output = s.output;
    ci.prompt = s.penalty_prompt;
  }
  s.in_step = true;
  s.planned = c.length;
  return ci;
}

void step_returned(sequence& s) {
  s.in_step = false;
  if (!s.decoding) s.prefilled += s.planned;
  s.planned = 0;
}

std::string_view to_string(cancel_outcome c) {
  switch (c) {
    case cancel_outcome::unknown: return "unknown";
    case cancel_outcome::now: return "now";
    case cancel_outcome::after_step: return "after_step";
  }
  return "?";
}

}  // namespace tandem::sched
