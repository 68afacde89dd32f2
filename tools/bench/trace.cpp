#include "tools/bench/trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <stdexcept>

namespace tandem::bench {
namespace {

// mt19937_64's sequence is fixed by the standard; the transforms below are ours, so a seed
// gives the same trace with any standard library.
class rng {
 public:
  explicit rng(uint64_t seed) : g_(seed) {}
  double uniform() { return double(g_() >> 11) * 0x1.0p-53; }  // [0, 1)
  int32_t between(int32_t lo, int32_t hi) { return lo + int32_t(uniform() * double(hi - lo + 1)); }
  double exponential(double rate) { return -std::log1p(-uniform()) / rate; }
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  double gamma(double shape) {  // Marsaglia-Tsang; shape < 1 through the boost u^(1/shape)
    if (shape < 1.0) return gamma(shape + 1.0) * std::pow(1.0 - uniform(), 1.0 / shape);
    const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x, v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0);
      v = v * v * v;
      const double u = 1.0 - uniform();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
    }
  }

 private:
  std::mt19937_64 g_;
};

}  // namespace

bool parse_workload(const std::string& s, workload& out) {
  if (s == "short") out = workload::short_prompts;
  else if (s == "long") out = workload::long_prompts;
  else if (s == "mixed") out = workload::mixed;
  else return false;
  return true;
}

std::vector<trace_entry> make_trace(const trace_options& o) {
  if (o.requests < 0 || !(o.rate > 0) || !(o.burstiness > 0))
    throw std::invalid_argument("a trace needs requests >= 0, rate > 0 and burstiness > 0");
  rng r(o.seed);
  std::vector<trace_entry> t;
  double at = 0;
  for (int32_t i = 0; i < o.requests; ++i) {
    trace_entry e;
    // The first request arrives at 0; each gap has mean 1/rate.
    if (i > 0)
      at += o.arrival == arrival_kind::poisson ? r.exponential(o.rate) : r.gamma(o.burstiness) / (o.rate * o.burstiness);
    e.arrival_s = at;
    const bool long_one = o.kind == workload::long_prompts || (o.kind == workload::mixed && r.uniform() < 0.25);
    if (long_one) {
      e.prompt_tokens = r.between(1000, 4000);
      e.output_tokens = r.between(30, 100);
    } else {
      e.prompt_tokens = r.between(100, 300);
      e.output_tokens = r.between(100, 200);
    }
    if (o.max_context > 0) {  // bounded by the model's context: the prompt gives way
      e.output_tokens = std::min(e.output_tokens, std::max(1, o.max_context / 4));
      e.prompt_tokens = std::max(1, std::min(e.prompt_tokens, o.max_context - e.output_tokens - 1));
    }
    t.push_back(std::move(e));
  }
  return t;
}

std::vector<trace_entry> load_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read trace file '" + path + "'");
  std::vector<trace_entry> t;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto where = [&](const std::string& what) { return path + ":" + std::to_string(n) + ": " + what; };
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw std::runtime_error(where("not a JSON object"));
    trace_entry e;
    if (!j.contains("arrival_s") || !j["arrival_s"].is_number() || !(j["arrival_s"].get<double>() >= 0))
      throw std::runtime_error(where("'arrival_s' (seconds >= 0) is required"));
    e.arrival_s = j["arrival_s"].get<double>();
    if (j.contains("prompt") && j["prompt"].is_string() && !j["prompt"].get<std::string>().empty()) {
      e.prompt_text = j["prompt"].get<std::string>();
    } else if (j.contains("prompt_tokens") && j["prompt_tokens"].is_number_integer() && j["prompt_tokens"].get<int64_t>() > 0 &&
               j["prompt_tokens"].get<int64_t>() < (int64_t(1) << 24)) {
      e.prompt_tokens = int32_t(j["prompt_tokens"].get<int64_t>());
    } else {
      throw std::runtime_error(where("'prompt' (text) or 'prompt_tokens' (a positive integer) is required"));
    }
    if (!j.contains("output_tokens") || !j["output_tokens"].is_number_integer() || j["output_tokens"].get<int64_t>() < 1 ||
        j["output_tokens"].get<int64_t>() >= (int64_t(1) << 24))
      throw std::runtime_error(where("'output_tokens' (a positive integer) is required"));
    e.output_tokens = int32_t(j["output_tokens"].get<int64_t>());
    t.push_back(std::move(e));
  }
  std::stable_sort(t.begin(), t.end(), [](const auto& a, const auto& b) { return a.arrival_s < b.arrival_s; });
  return t;
}

void save_trace(const std::vector<trace_entry>& t, const std::string& path) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write trace file '" + path + "'");
  for (const auto& e : t) {
    nlohmann::json j = {{"arrival_s", e.arrival_s}, {"output_tokens", e.output_tokens}};
    if (e.prompt_text.empty()) j["prompt_tokens"] = e.prompt_tokens;
    else j["prompt"] = e.prompt_text;
    out << j.dump() << "\n";
  }
}

std::vector<trace_entry> at_rate(std::vector<trace_entry> t, double rate) {
  if (t.size() < 2 || !(rate > 0)) return t;
  const double span = t.back().arrival_s - t.front().arrival_s;
  if (!(span > 0)) return t;
  const double now = double(t.size() - 1) / span, k = now / rate, first = t.front().arrival_s;
  for (auto& e : t) e.arrival_s = (e.arrival_s - first) * k;
  return t;
}

}  // namespace tandem::bench
