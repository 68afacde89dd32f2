#pragma once
// Arrival traces for serving benchmarks: when each request arrives, how long its prompt is and
// how many tokens it asks for. Generated (seeded: the same options give the same trace on any
// machine, as the random numbers are drawn with our own transforms, not <random>'s
// implementation-defined distributions) or read from JSON Lines:
//   {"arrival_s": 0.25, "prompt_tokens": 812, "output_tokens": 64}
//   {"arrival_s": 0.31, "prompt": "Summarise ...", "output_tokens": 120}
// Two kinds of entry exercise a server's prefix cache (optional keys):
//   {"arrival_s": 0.4, "prompt_tokens": 1150, "output_tokens": 32, "prefix_group": 0, "prefix_tokens": 1024}
//     the first prefix_tokens token ids are the group's, identical in every entry of the group;
//   {"arrival_s": 2.1, "prompt_tokens": 700, "output_tokens": 20, "conversation": 3, "turn": 1, "new_tokens": 64}
//     turn k's prompt is turn k-1's prompt, then the tokens turn k-1 actually produced, then
//     new_tokens new ones; prompt_tokens is that length if turn k-1 produced all its output_tokens.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::bench {

struct trace_entry {
  double arrival_s = 0;
  int32_t prompt_tokens = 0;  // used when prompt_text is empty
  std::string prompt_text;
  int32_t output_tokens = 0;
  int32_t prefix_group = -1;  // >= 0: the prompt starts with this group's shared tokens
  int32_t prefix_tokens = 0;  // how many (<= prompt_tokens)
  int32_t conversation = -1;  // >= 0: a turn of this conversation, sent once the previous turn finished
  int32_t turn = 0;  // 0, 1, ... within the conversation
  int32_t new_tokens = 0;  // a turn's own new tokens at the end of its prompt (turn 0: the whole prompt)
  // A prompt made of blocks (a Mooncake trace): block k is block_tokens token ids drawn from
  // block_ids[k] alone (the last block may be shorter), so equal ids give equal blocks, and
  // requests whose ids agree up to a block share their prompt up to there. Empty: not so.
  std::vector<int64_t> block_ids;
  int32_t block_tokens = 0;
};

// short: chat, 100-300 tokens in, 100-200 out; long: documents / RAG, 1000-4000 in, 30-100
// out; mixed: one long in four; system-prompt (shared_prefix): one long instruction shared by
// many users (prefix_tokens, then a unique 64-192 token question), 16-48 out; multiturn:
// conversations whose every turn resends the whole history (256-512 token opening, 32-96 new
// tokens a turn), 16-48 out.
enum class workload { short_prompts, long_prompts, mixed, shared_prefix, multiturn };
bool parse_workload(const std::string& s, workload& out);

enum class arrival_kind { poisson, gamma };

struct trace_options {
  workload kind = workload::short_prompts;
  int32_t requests = 100;  // multiturn: conversations x turns instead
  double rate = 1.0;  // mean requests per second (> 0); multiturn: of first turns
  arrival_kind arrival = arrival_kind::poisson;
  double burstiness = 1.0;  // gamma shape: < 1 burstier than Poisson, 1 is Poisson
  uint64_t seed = 1;
  int32_t max_context = 0;  // > 0: prompt + output kept within it
  int32_t prefix_tokens = 1024;  // system-prompt: the shared prefix's length
  int32_t prefix_groups = 1;  // system-prompt: distinct shared prefixes, each request picks one
  int32_t conversations = 8;  // multiturn
  int32_t turns = 4;  // multiturn: turns per conversation
};

// Throws std::invalid_argument for options that cannot make a trace (naming the option).
std::vector<trace_entry> make_trace(const trace_options& o);

// Reads a JSON Lines trace; throws std::runtime_error naming the line of any malformed entry.
// Entries are sorted by arrival (a conversation's turns stay in turn order).
std::vector<trace_entry> load_trace(const std::string& path);
void save_trace(const std::vector<trace_entry>& t, const std::string& path);

// A window of a Mooncake trace (Moonshot AI's published format, one JSON object a line:
// {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [one per 512-token
// block]}), scaled to this machine: lengths and the 512-token block divided by scale_tokens,
// arrival times (from the window's first) by speedup.
struct mooncake_options {
  int32_t scale_tokens = 16;  // 1..512: blocks of 512 / scale_tokens tokens
  double speedup = 1.0;  // > 0
  size_t from = 0;  // the window: entries [from, from + count) in file order
  size_t count = 0;  // 0: to the end
  int32_t max_context = 0;  // > 0: prompt + output within it (outputs shortened, then prompts cut)
};
struct mooncake_trace {
  std::vector<trace_entry> entries;
  size_t file_entries = 0;  // in the whole file
  int32_t trimmed = 0;  // entries shortened to fit max_context
  std::string scaling;  // what was done, in words, for the report
};
// Throws std::runtime_error naming the line of a malformed entry, std::invalid_argument for
// options it cannot honour.
mooncake_trace load_mooncake_trace(const std::string& path, const mooncake_options& o);

// The same lengths arriving at another mean rate (arrival times scaled): compare sweeps rates.
std::vector<trace_entry> at_rate(std::vector<trace_entry> t, double rate);

// Prompt tokens a prefix cache could reuse (a group's shared prefix; a later turn's history; a
// block whose id an earlier request had),
// as a fraction of all prompt tokens; 0 for a trace without either. An upper bound on the hit
// ratio: the first request of each group, and every turn 0, still computes its prefix.
double shared_prefix_share(const std::vector<trace_entry>& t);

}  // namespace tandem::bench
