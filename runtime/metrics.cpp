#include "runtime/metrics.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <variant>

#include <unistd.h>

#include <nlohmann/json.hpp>

namespace tandem::metrics {
namespace {

// Relaxed throughout: every series is an independent statistic, nothing else is published through it.
constexpr auto relaxed = std::memory_order_relaxed;

bool valid_metric_name(const std::string& s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// Label names follow the metric name rule without ':'; '__' prefixes are reserved to Prometheus.
bool valid_label_name(const std::string& s) {
  return valid_metric_name(s) && s.find(':') == std::string::npos && !s.starts_with("__");
}

void validate_bounds(const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]))
      throw std::invalid_argument("metrics: histogram bounds must be finite (the +Inf bucket is implicit)");
    if (i > 0 && !(bounds[i] > bounds[i - 1]))
      throw std::invalid_argument("metrics: histogram bounds must be strictly increasing");
  }
}

// Shortest text that parses back to the same double; Prometheus spells the infinities +Inf/-Inf.
std::string format_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

void append_escaped(std::string& out, const std::string& s, bool quotes) {
  for (const char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '"' && quotes) out += "\\\"";
    else out += c;
  }
}

// `{a="x",le="0.5"}`, or nothing when there are no labels at all.
std::string label_block(const labels& l, const std::string* le = nullptr) {
  if (l.empty() && le == nullptr) return {};
  std::string out = "{";
  for (const auto& [k, v] : l) {
    if (out.size() > 1) out += ',';
    out += k + "=\"";
    append_escaped(out, v, true);
    out += '"';
  }
  if (le != nullptr) out += (out.size() > 1 ? ",le=\"" : "le=\"") + *le + '"';
  return out + "}";
}

template <class T>
constexpr const char* type_name();
template <>
constexpr const char* type_name<counter>() {
  return "counter";
}
template <>
constexpr const char* type_name<gauge>() {
  return "gauge";
}
template <>
constexpr const char* type_name<histogram>() {
  return "histogram";
}

nlohmann::json labels_json(const labels& l) {
  auto j = nlohmann::json::object();
  for (const auto& [k, v] : l) j[k] = v;
  return j;
}

}  // namespace

// ---- series ----

void counter::inc(double v) {
  if (!(v >= 0)) throw std::invalid_argument("metrics: counter increment must be >= 0, got " + format_number(v));
  value_.fetch_add(v, relaxed);
}

histogram::histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  validate_bounds(bounds_);
}

void histogram::observe(double v) {
  if (std::isnan(v)) return;
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i].fetch_add(1, relaxed);
  sum_.fetch_add(v, relaxed);
}

std::vector<uint64_t> histogram::bucket_counts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = counts_[i].load(relaxed);
  return out;
}

// Derived from the buckets rather than kept separately, so _count always equals the +Inf bucket.
uint64_t histogram::count() const {
  uint64_t n = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) n += counts_[i].load(relaxed);
  return n;
}

double histogram::quantile(double q) const {
  if (!(q >= 0 && q <= 1)) throw std::invalid_argument("metrics: quantile must be in [0, 1], got " + format_number(q));
  const auto counts = bucket_counts();
  uint64_t total = 0;
  for (const uint64_t c : counts) total += c;
  if (total == 0 || bounds_.empty()) return std::numeric_limits<double>::quiet_NaN();

  const double rank = q * static_cast<double>(total);
  uint64_t below = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    // Empty buckets are skipped so q = 0 answers the lower edge of the first occupied bucket.
    if (counts[i] == 0) continue;
    if (static_cast<double>(below + counts[i]) >= rank) {
      const double upper = bounds_[i];
      if (i == 0 && upper <= 0) return upper;  // no known lower edge
      const double lower = i == 0 ? 0.0 : bounds_[i - 1];
      return lower + (upper - lower) * (rank - static_cast<double>(below)) / static_cast<double>(counts[i]);
    }
    below += counts[i];
  }
  return bounds_.back();  // the rank lies in the +Inf bucket
}

// ---- registry ----

struct registry::impl {
  // std::map nodes never move, so references handed out stay valid as series are added.
  struct family {
    std::string help;
    std::vector<double> bounds;  // histograms only: every series of a family shares its buckets
    std::variant<std::map<labels, counter>, std::map<labels, gauge>, std::map<labels, histogram>> series;
  };

  std::mutex mu;
  std::map<std::string, family, std::less<>> families;

  template <class T>
  T& get(const std::string& name, const std::string& help, const labels& l, const std::vector<double>* bounds) {
    // One canonical order per label set; already-sorted sets (the usual case) are not copied.
    const auto by_name = [](const auto& a, const auto& b) { return a.first < b.first; };
    labels sorted;
    const labels* key = &l;
    if (!std::is_sorted(l.begin(), l.end(), by_name)) {
      sorted = l;
      std::sort(sorted.begin(), sorted.end(), by_name);
      key = &sorted;
    }

    std::lock_guard lock(mu);
    auto it = families.find(name);
    if (it != families.end()) {
      family& f = it->second;
      if (f.help.empty()) f.help = help;  // a reader looked it up before its writer named it
      auto* series = std::get_if<std::map<labels, T>>(&f.series);
      if (series == nullptr) {
        const char* existing = std::visit(
            [](const auto& m) { return type_name<typename std::decay_t<decltype(m)>::mapped_type>(); }, f.series);
        throw std::invalid_argument("metrics: '" + name + "' is already registered as a " + existing + ", not a " +
                                    type_name<T>());
      }
      if (bounds != nullptr && *bounds != f.bounds)
        throw std::invalid_argument("metrics: histogram '" + name + "' is already registered with different buckets");
      if (auto s = series->find(*key); s != series->end()) return s->second;
    } else {
      if (!valid_metric_name(name))
        throw std::invalid_argument("metrics: invalid metric name '" + name + "' (want [a-zA-Z_:][a-zA-Z0-9_:]*)");
      if (bounds != nullptr) validate_bounds(*bounds);
    }

    // A new series. Everything is checked before anything is inserted, so a refused call leaves
    // the registry as it was.
    for (size_t i = 0; i < key->size(); ++i) {
      const std::string& label = (*key)[i].first;
      if (!valid_label_name(label))
        throw std::invalid_argument("metrics: invalid label name '" + label + "' on '" + name + "'");
      if (bounds != nullptr && label == "le")
        throw std::invalid_argument("metrics: label 'le' is reserved for histogram buckets (on '" + name + "')");
      if (i > 0 && (*key)[i - 1].first == label)
        throw std::invalid_argument("metrics: duplicate label '" + label + "' on '" + name + "'");
    }
    if (it == families.end()) {
      it = families.try_emplace(name).first;
      it->second.help = help;
      if (bounds != nullptr) it->second.bounds = *bounds;
      it->second.series.template emplace<std::map<labels, T>>();
    }
    auto& series = std::get<std::map<labels, T>>(it->second.series);
    if constexpr (std::is_same_v<T, histogram>) return series.try_emplace(*key, it->second.bounds).first->second;
    else return series.try_emplace(*key).first->second;
  }
};

registry::registry() : impl_(std::make_unique<impl>()) {}
registry::~registry() = default;

counter& registry::get_counter(const std::string& name, const std::string& help, const labels& l) {
  return impl_->get<counter>(name, help, l, nullptr);
}

gauge& registry::get_gauge(const std::string& name, const std::string& help, const labels& l) {
  return impl_->get<gauge>(name, help, l, nullptr);
}

histogram& registry::get_histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                                   const labels& l) {
  return impl_->get<histogram>(name, help, l, &bounds);
}

std::string registry::to_prometheus() const {
  std::string out;
  std::lock_guard lock(impl_->mu);
  for (const auto& [name, f] : impl_->families) {
    out += "# HELP " + name + " ";
    append_escaped(out, f.help, false);
    out += "\n";
    std::visit(
        [&](const auto& series) {
          using T = typename std::decay_t<decltype(series)>::mapped_type;
          out += "# TYPE " + name + " " + type_name<T>() + "\n";
          for (const auto& [l, s] : series) {
            if constexpr (std::is_same_v<T, histogram>) {
              // Read the buckets once so the cumulative lines, +Inf and _count agree with each other.
              const auto counts = s.bucket_counts();
              uint64_t cumulative = 0;
              for (size_t i = 0; i < counts.size(); ++i) {
                cumulative += counts[i];
                const std::string le = i < f.bounds.size() ? format_number(f.bounds[i]) : "+Inf";
                out += name + "_bucket" + label_block(l, &le) + " " + std::to_string(cumulative) + "\n";
              }
              out += name + "_sum" + label_block(l) + " " + format_number(s.sum()) + "\n";
              out += name + "_count" + label_block(l) + " " + std::to_string(cumulative) + "\n";
            } else {
              out += name + label_block(l) + " " + format_number(s.value()) + "\n";
            }
          }
        },
        f.series);
  }
  return out;
}

std::string registry::to_json() const {
  nlohmann::json out = {{"counters", nlohmann::json::object()},
                        {"gauges", nlohmann::json::object()},
                        {"histograms", nlohmann::json::object()}};
  std::lock_guard lock(impl_->mu);
  for (const auto& [name, f] : impl_->families) {
    std::visit(
        [&](const auto& series) {
          using T = typename std::decay_t<decltype(series)>::mapped_type;
          auto& list = out[std::string(type_name<T>()) + "s"][name];
          list = nlohmann::json::array();
          for (const auto& [l, s] : series) {
            nlohmann::json item = {{"labels", labels_json(l)}};
            if constexpr (std::is_same_v<T, histogram>) {
              const uint64_t n = s.count();
              item["count"] = n;
              item["sum"] = s.sum();
              // JSON has no NaN: an empty histogram has no quantiles or mean.
              static constexpr std::pair<const char*, double> quantiles[] = {{"p50", 0.5}, {"p90", 0.9}, {"p99", 0.99}};
              for (const auto& [key, q] : quantiles)
                item[key] = n == 0 ? nlohmann::json(nullptr) : nlohmann::json(s.quantile(q));
              item["mean"] = n == 0 ? nlohmann::json(nullptr) : nlohmann::json(s.sum() / static_cast<double>(n));
            } else {
              item["value"] = s.value();
            }
            list.push_back(std::move(item));
          }
        },
        f.series);
  }
  return out.dump();
}

// ---- buckets ----

std::vector<double> exponential_buckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1)
    throw std::invalid_argument("metrics: exponential_buckets needs start > 0, factor > 1, count >= 1");
  std::vector<double> out(count);
  out[0] = start;
  for (int i = 1; i < count; ++i) out[i] = out[i - 1] * factor;
  return out;
}

std::vector<double> linear_buckets(double start, double width, int count) {
  if (!(width > 0) || count < 1) throw std::invalid_argument("metrics: linear_buckets needs width > 0, count >= 1");
  std::vector<double> out(count);
  // start + i*width rather than a running sum, so rounding errors do not accumulate.
  for (int i = 0; i < count; ++i) out[i] = start + i * width;
  return out;
}

// Latencies are exported in seconds (Prometheus base units), 100 µs to 75 s.
// Written out so the `le` labels read as the numbers they are (0.00015, not 0.00015000000000000001).
const std::vector<double>& latency_seconds_buckets() {
  static const std::vector<double> buckets = {
      0.0001, 0.00015, 0.0002, 0.0003, 0.0005, 0.00075,  //
      0.001,  0.0015,  0.002,  0.003,  0.005,  0.0075,  //
      0.01,   0.015,   0.02,   0.03,   0.05,   0.075,  //
      0.1,    0.15,    0.2,    0.3,    0.5,    0.75,  //
      1,      1.5,     2,      3,      5,      7.5,  //
      10,     15,      20,     30,     50,     75,  //
  };
  return buckets;
}

// ---- requests ----

void record_request(registry& r, const request_timings& t, const std::string& outcome) {
  if (outcome != "finished" && outcome != "failed" && outcome != "cancelled" && outcome != "rejected")
    throw std::invalid_argument("metrics: unknown request outcome '" + outcome +
                                "' (want finished, failed, cancelled or rejected)");
  r.get_counter("tandem_requests_total", "Requests by outcome.", {{"outcome", outcome}}).inc();
  r.get_counter("tandem_prompt_tokens_total", "Prompt tokens of all requests.").inc(std::max(t.prompt_tokens, 0));
  r.get_counter("tandem_prompt_tokens_cached_total", "Prompt tokens served from a prefix cache instead of computed.")
      .inc(std::max(t.cached_tokens, 0));
  r.get_counter("tandem_output_tokens_total", "Output tokens generated for all requests.")
      .inc(std::max(t.output_tokens, 0));
  r.get_counter("tandem_kv_bytes_total", "KV cache bytes moved from prefill to decode workers.")
      .inc(static_cast<double>(t.kv_bytes));
  if (outcome != "finished") return;

  // Prometheus convention: base units. tandem measures in ms and exports seconds.
  const auto& b = latency_seconds_buckets();
  const auto observe = [&](const char* name, const char* help, double ms) {
    r.get_histogram(name, help, b).observe(ms / 1000.0);
  };
  observe("tandem_request_queue_prefill_seconds", "Time a request waited for a prefill worker, seconds.",
          t.queue_prefill_ms);
  observe("tandem_request_queue_decode_seconds", "Time a request waited for a decode worker, seconds.",
          t.queue_decode_ms);
  observe("tandem_request_prefill_seconds", "Prefill compute time, seconds.", t.prefill_ms);
  observe("tandem_request_ttft_seconds", "Time to first token, seconds.", t.ttft_ms);
  if (t.output_tokens >= 2)
    observe("tandem_request_tpot_seconds", "Time per output token after the first, seconds.", t.tpot_ms);
  if (t.kv_bytes > 0)
    observe("tandem_request_kv_transfer_seconds", "KV cache transfer time, seconds.", t.kv_transfer_ms);
  if (t.handoff_ms > 0)
    observe("tandem_request_handoff_seconds", "First token to decode start (KV handoff), seconds.", t.handoff_ms);
  observe("tandem_request_decode_seconds", "Decode time, seconds.", t.decode_ms);
  observe("tandem_request_e2e_seconds", "End-to-end request latency, seconds.", t.e2e_ms);
}

process_stats read_process_stats() {
  process_stats st;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    long long size = 0, resident = 0;
    if (std::fscanf(f, "%lld %lld", &size, &resident) == 2)
      st.resident_bytes = resident * int64_t(sysconf(_SC_PAGESIZE));
    std::fclose(f);
  }
  std::error_code ec;
  int64_t n = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) ++n;
  if (!ec) st.open_fds = n - 1;  // the iterator's own descriptor on the folder
  return st;
}

void update_process_metrics(registry& r) {
  const process_stats st = read_process_stats();
  r.get_gauge("process_resident_memory_bytes", "Resident memory size in bytes").set(double(st.resident_bytes));
  r.get_gauge("process_open_fds", "Number of open file descriptors").set(double(st.open_fds));
}

}  // namespace tandem::metrics
