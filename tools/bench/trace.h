#pragma once
// Arrival traces for serving benchmarks: when each request arrives, how long its prompt is and
// how many tokens it asks for. Generated (seeded: the same options give the same trace on any
// machine, as the random numbers are drawn with our own transforms, not <random>'s
// implementation-defined distributions) or read from JSON Lines:
//   {"arrival_s": 0.25, "prompt_tokens": 812, "output_tokens": 64}
//   {"arrival_s": 0.31, "prompt": "Summarise ...", "output_tokens": 120}
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::bench {

struct trace_entry {
  double arrival_s = 0;
  int32_t prompt_tokens = 0;  // used when prompt_text is empty
  std::string prompt_text;
  int32_t output_tokens = 0;
};

// short: chat, 100-300 tokens in, 100-200 out; long: documents / RAG, 1000-4000 in, 30-100
// out; mixed: one long in four.
enum class workload { short_prompts, long_prompts, mixed };
bool parse_workload(const std::string& s, workload& out);

enum class arrival_kind { poisson, gamma };

struct trace_options {
  workload kind = workload::short_prompts;
  int32_t requests = 100;
  double rate = 1.0;             // mean requests per second (> 0)
  arrival_kind arrival = arrival_kind::poisson;
  double burstiness = 1.0;       // gamma shape: < 1 burstier than Poisson, 1 is Poisson
  uint64_t seed = 1;
  int32_t max_context = 0;       // > 0: prompt + output kept within it
};

std::vector<trace_entry> make_trace(const trace_options& o);

// Reads a JSON Lines trace; throws std::runtime_error naming the line of any malformed entry.
// Entries are sorted by arrival.
std::vector<trace_entry> load_trace(const std::string& path);
void save_trace(const std::vector<trace_entry>& t, const std::string& path);

// The same lengths arriving at another mean rate (arrival times scaled): compare sweeps rates.
std::vector<trace_entry> at_rate(std::vector<trace_entry> t, double rate);

}  // namespace tandem::bench
