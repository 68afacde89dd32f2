// The metrics registry: series identity, thread safety, histogram estimates and both exports.
#include "runtime/metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

using namespace tandem::metrics;

namespace {

// Runs f, which must throw std::invalid_argument whose message mentions `needle`.
template <class F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Metrics, CounterAndGaugeValues) {
  registry r;
  counter& c = r.get_counter("c_total", "help");
  c.inc();
  c.inc(2.5);
  EXPECT_DOUBLE_EQ(c.value(), 3.5);
  expect_invalid([&] { c.inc(-1); }, "counter increment");
  expect_invalid([&] { c.inc(NAN); }, "counter increment");
  EXPECT_DOUBLE_EQ(c.value(), 3.5);

  gauge& g = r.get_gauge("g", "help");
  g.set(10);
  g.add(-4);
  EXPECT_DOUBLE_EQ(g.value(), 6);
}

TEST(Metrics, SameNameAndLabelsIsSameSeries) {
  registry r;
  counter& a = r.get_counter("req_total", "help", {{"worker", "prefill-0"}, {"reason", "ttft"}});
  // Label order does not matter; values do.
  counter& b = r.get_counter("req_total", "other help", {{"reason", "ttft"}, {"worker", "prefill-0"}});
  counter& c = r.get_counter("req_total", "help", {{"worker", "prefill-1"}, {"reason", "ttft"}});
  counter& d = r.get_counter("req_total", "help");
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
  EXPECT_NE(&a, &d);
  a.inc();
  EXPECT_DOUBLE_EQ(b.value(), 1);
  EXPECT_DOUBLE_EQ(c.value(), 0);

  // References stay valid while many more series are added.
  for (int i = 0; i < 1000; ++i) r.get_counter("req_total", "help", {{"worker", std::to_string(i)}}).inc();
  EXPECT_EQ(&a, &r.get_counter("req_total", "help", {{"reason", "ttft"}, {"worker", "prefill-0"}}));
  EXPECT_DOUBLE_EQ(a.value(), 1);

  histogram& h = r.get_histogram("h", "help", {1, 2});
  EXPECT_EQ(&h, &r.get_histogram("h", "help", {1, 2}));
}

TEST(Metrics, ConcurrentUpdatesSumExactly) {
  registry r;
  constexpr int threads = 4, per_thread = 100000;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&r, t] {
      // Every thread looks the series up itself, racing on their creation too.
      counter& c = r.get_counter("ops_total", "help");
      counter& mine = r.get_counter("ops_by_thread_total", "help", {{"thread", std::to_string(t)}});
      gauge& g = r.get_gauge("inflight", "help");
      histogram& h = r.get_histogram("lat", "help", {1, 10});
      for (int i = 0; i < per_thread; ++i) {
        c.inc();
        mine.inc(0.5);
        g.add(1);
        h.observe(i % 3 == 0 ? 0.5 : 5);
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(r.get_counter("ops_total", "help").value(), threads * per_thread);
  for (int t = 0; t < threads; ++t)
    EXPECT_EQ(r.get_counter("ops_by_thread_total", "help", {{"thread", std::to_string(t)}}).value(), per_thread / 2);
  EXPECT_EQ(r.get_gauge("inflight", "help").value(), threads * per_thread);
  histogram& h = r.get_histogram("lat", "help", {1, 10});
  EXPECT_EQ(h.count(), uint64_t{threads * per_thread});
  const uint64_t small = threads * ((per_thread + 2) / 3);
  EXPECT_EQ(h.bucket_counts(), (std::vector<uint64_t>{small, threads * per_thread - small, 0}));
  EXPECT_DOUBLE_EQ(h.sum(), small * 0.5 + (threads * per_thread - small) * 5.0);
}

TEST(Metrics, HistogramBucketsCountAndSum) {
  histogram h({1, 2.5, 5});
  for (double v : {0.5, 1.0, 2.0, 3.0, 10.0, -1.0}) h.observe(v);
  h.observe(NAN);  // dropped
  EXPECT_EQ(h.count(), 6u);
  EXPECT_DOUBLE_EQ(h.sum(), 15.5);
  // le semantics: 1.0 belongs to the le=1 bucket; -1 to the first; 10 to +Inf.
  EXPECT_EQ(h.bucket_counts(), (std::vector<uint64_t>{3, 1, 1, 1}));
  EXPECT_EQ(h.bounds(), (std::vector<double>{1, 2.5, 5}));
}

TEST(Metrics, HistogramQuantiles) {
  const auto bounds = linear_buckets(10, 10, 100);  // 10, 20, ..., 1000
  histogram h(bounds);
  EXPECT_TRUE(std::isnan(h.quantile(0.5)));  // empty
  for (int v = 1; v <= 1000; ++v) h.observe(v);
  const double width = 10;
  EXPECT_NEAR(h.quantile(0.5), 500, width);
  EXPECT_NEAR(h.quantile(0.9), 900, width);
  EXPECT_NEAR(h.quantile(0.99), 990, width);
  EXPECT_NEAR(h.quantile(0), 0, width);
  EXPECT_NEAR(h.quantile(1), 1000, width);
  // Monotonic in q.
  double last = -1;
  for (double q = 0; q <= 1; q += 0.01) {
    EXPECT_GE(h.quantile(q), last);
    last = h.quantile(q);
  }
  expect_invalid([&] { h.quantile(1.5); }, "quantile");
  expect_invalid([&] { h.quantile(-0.1); }, "quantile");

  // Interpolation inside one bucket: 4 values in (2, 4] spread the rank linearly over it.
  histogram one({2, 4});
  for (int i = 0; i < 4; ++i) one.observe(3);
  EXPECT_DOUBLE_EQ(one.quantile(0.5), 3);
  EXPECT_DOUBLE_EQ(one.quantile(0.25), 2.5);
  EXPECT_DOUBLE_EQ(one.quantile(0), 2);  // lower edge of the first occupied bucket

  // Ranks in the +Inf bucket answer the highest finite bound.
  histogram over({1, 2});
  over.observe(100);
  EXPECT_DOUBLE_EQ(over.quantile(0.5), 2);
}

TEST(Metrics, BucketHelpers) {
  EXPECT_EQ(exponential_buckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(linear_buckets(0, 0.5, 3), (std::vector<double>{0, 0.5, 1}));
  expect_invalid([] { exponential_buckets(0, 2, 3); }, "exponential_buckets");
  expect_invalid([] { exponential_buckets(1, 1, 3); }, "exponential_buckets");
  expect_invalid([] { linear_buckets(0, 1, 0); }, "linear_buckets");

  const auto& lat = latency_seconds_buckets();
  ASSERT_FALSE(lat.empty());
  EXPECT_DOUBLE_EQ(lat.front(), 0.0001);
  EXPECT_GE(lat.back(), 60);
  EXPECT_TRUE(std::is_sorted(lat.begin(), lat.end()));
  EXPECT_EQ(std::adjacent_find(lat.begin(), lat.end()), lat.end());
  EXPECT_NO_THROW(histogram{lat});
}

TEST(Metrics, PrometheusExpositionExact) {
  registry r;
  r.get_counter("app_requests_total", "Requests served.\nBy path, with a \\ in the help.",
                {{"path", "/a\"b\\c\nd"}, {"code", "200"}})
      .inc(3);
  r.get_counter("app_requests_total", "ignored: first help wins").inc(0.25);
  r.get_gauge("app_temperature", "Current temperature.").set(-1.5);
  histogram& h = r.get_histogram("app_latency_ms", "Latency.", {1, 2.5, 5}, {{"worker", "w0"}});
  for (double v : {0.5, 1.0, 2.0, 3.0, 10.0}) h.observe(v);
  r.get_histogram("app_latency_ms", "Latency.", {1, 2.5, 5});  // empty, unlabelled series

  const std::string expected =
      "# HELP app_latency_ms Latency.\n"
      "# TYPE app_latency_ms histogram\n"
      "app_latency_ms_bucket{le=\"1\"} 0\n"
      "app_latency_ms_bucket{le=\"2.5\"} 0\n"
      "app_latency_ms_bucket{le=\"5\"} 0\n"
      "app_latency_ms_bucket{le=\"+Inf\"} 0\n"
      "app_latency_ms_sum 0\n"
      "app_latency_ms_count 0\n"
      "app_latency_ms_bucket{worker=\"w0\",le=\"1\"} 2\n"
      "app_latency_ms_bucket{worker=\"w0\",le=\"2.5\"} 3\n"
      "app_latency_ms_bucket{worker=\"w0\",le=\"5\"} 4\n"
      "app_latency_ms_bucket{worker=\"w0\",le=\"+Inf\"} 5\n"
      "app_latency_ms_sum{worker=\"w0\"} 16.5\n"
      "app_latency_ms_count{worker=\"w0\"} 5\n"
      "# HELP app_requests_total Requests served.\\nBy path, with a \\\\ in the help.\n"
      "# TYPE app_requests_total counter\n"
      "app_requests_total 0.25\n"
      "app_requests_total{code=\"200\",path=\"/a\\\"b\\\\c\\nd\"} 3\n"
      "# HELP app_temperature Current temperature.\n"
      "# TYPE app_temperature gauge\n"
      "app_temperature -1.5\n";
  EXPECT_EQ(r.to_prometheus(), expected);
  EXPECT_EQ(registry().to_prometheus(), "");
}

TEST(Metrics, InvalidNamesAndClashesThrow) {
  registry r;
  for (const std::string bad : {"", "1abc", "a-b", "a b", "é"})
    expect_invalid([&] { r.get_counter(bad, "help"); }, "invalid metric name");
  EXPECT_NO_THROW(r.get_counter("ns:sub_name1", "help"));
  EXPECT_NO_THROW(r.get_counter("_x", "help"));

  expect_invalid([&] { r.get_counter("l_total", "help", {{"a-b", "x"}}); }, "invalid label name 'a-b'");
  expect_invalid([&] { r.get_counter("l_total", "help", {{"__reserved", "x"}}); }, "invalid label name");
  expect_invalid([&] { r.get_counter("l_total", "help", {{"a", "x"}, {"a", "y"}}); }, "duplicate label 'a'");
  expect_invalid([&] { r.get_histogram("h_ms", "help", {1}, {{"le", "x"}}); }, "reserved");
  // A refused registration leaves nothing behind: these names are still free, with any buckets.
  EXPECT_NO_THROW(r.get_gauge("l_total", "help"));

  r.get_counter("shared", "help");
  expect_invalid([&] { r.get_gauge("shared", "help"); }, "'shared' is already registered as a counter, not a gauge");
  expect_invalid([&] { r.get_histogram("shared", "help", {1}); }, "not a histogram");
  r.get_histogram("h_ms", "help", {1, 2});
  expect_invalid([&] { r.get_histogram("h_ms", "help", {1, 3}); }, "different buckets");
  expect_invalid([&] { r.get_counter("h_ms", "help"); }, "already registered as a histogram");

  expect_invalid([&] { r.get_histogram("bad_bounds", "help", {2, 1}); }, "strictly increasing");
  expect_invalid([&] { r.get_histogram("bad_bounds", "help", {1, INFINITY}); }, "finite");
  expect_invalid([] { histogram h({1, 1}); }, "strictly increasing");
  EXPECT_NO_THROW(r.get_gauge("bad_bounds", "help"));
}

TEST(Metrics, JsonParsesBack) {
  registry r;
  r.get_counter("c_total", "help", {{"worker", "decode-0"}}).inc(7);
  r.get_gauge("g", "help").set(2.5);
  histogram& h = r.get_histogram("h_ms", "help", linear_buckets(10, 10, 100));
  for (int v = 1; v <= 1000; ++v) h.observe(v);
  r.get_histogram("empty_ms", "help", {1});

  const auto j = nlohmann::json::parse(r.to_json());
  ASSERT_TRUE(j.contains("counters") && j.contains("gauges") && j.contains("histograms"));
  const auto& c = j["counters"]["c_total"];
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0]["labels"]["worker"], "decode-0");
  EXPECT_EQ(c[0]["value"], 7);
  EXPECT_EQ(j["gauges"]["g"][0]["value"], 2.5);
  EXPECT_TRUE(j["gauges"]["g"][0]["labels"].is_object());

  const auto& hj = j["histograms"]["h_ms"][0];
  EXPECT_EQ(hj["count"], 1000);
  EXPECT_EQ(hj["sum"], 500500);
  EXPECT_NEAR(hj["p50"].get<double>(), 500, 10);
  EXPECT_NEAR(hj["p90"].get<double>(), 900, 10);
  EXPECT_NEAR(hj["p99"].get<double>(), 990, 10);
  EXPECT_DOUBLE_EQ(hj["mean"].get<double>(), 500.5);

  const auto& ej = j["histograms"]["empty_ms"][0];
  EXPECT_EQ(ej["count"], 0);
  EXPECT_TRUE(ej["p50"].is_null());
  EXPECT_TRUE(ej["mean"].is_null());

  const auto empty = nlohmann::json::parse(registry().to_json());
  EXPECT_EQ(empty, nlohmann::json::parse(R"({"counters":{},"gauges":{},"histograms":{}})"));
}

TEST(Metrics, RecordRequestFillsFamilies) {
  registry r;
  request_timings t;
  t.queue_prefill_ms = 1;
  t.queue_decode_ms = 2;
  t.prefill_ms = 30;
  t.ttft_ms = 40;
  t.tpot_ms = 12;
  t.kv_transfer_ms = 3;
  t.decode_ms = 200;
  t.e2e_ms = 250;
  t.kv_bytes = 1 << 20;
  t.prompt_tokens = 17;
  t.output_tokens = 16;
  record_request(r, t, "finished");

  const auto& b = latency_seconds_buckets();
  const std::pair<const char*, double> expected[] = {
      {"tandem_request_queue_prefill_seconds", 0.001}, {"tandem_request_queue_decode_seconds", 0.002},
      {"tandem_request_prefill_seconds", 0.030},       {"tandem_request_ttft_seconds", 0.040},
      {"tandem_request_tpot_seconds", 0.012},          {"tandem_request_kv_transfer_seconds", 0.003},
      {"tandem_request_decode_seconds", 0.200},        {"tandem_request_e2e_seconds", 0.250},
  };
  for (const auto& [name, v] : expected) {
    histogram& h = r.get_histogram(name, "", b);
    EXPECT_EQ(h.count(), 1u) << name;
    EXPECT_DOUBLE_EQ(h.sum(), v) << name;
  }
  EXPECT_EQ(r.get_counter("tandem_kv_bytes_total", "").value(), 1 << 20);
  EXPECT_EQ(r.get_counter("tandem_prompt_tokens_total", "").value(), 17);
  EXPECT_EQ(r.get_counter("tandem_output_tokens_total", "").value(), 16);
  EXPECT_EQ(r.get_counter("tandem_requests_total", "", {{"outcome", "finished"}}).value(), 1);

  // A rejected request is counted but keeps its ~0 s out of the latency quantiles.
  record_request(r, request_timings{.e2e_ms = 0.01, .prompt_tokens = 5}, "rejected");
  EXPECT_EQ(r.get_counter("tandem_requests_total", "", {{"outcome", "rejected"}}).value(), 1);
  EXPECT_EQ(r.get_histogram("tandem_request_e2e_seconds", "", b).count(), 1u);
  EXPECT_EQ(r.get_counter("tandem_prompt_tokens_total", "").value(), 22);

  // One output token has no time per output token; a colocated request moved no KV.
  record_request(r, request_timings{.tpot_ms = 0, .kv_transfer_ms = 0, .e2e_ms = 5, .output_tokens = 1}, "finished");
  EXPECT_EQ(r.get_histogram("tandem_request_tpot_seconds", "", b).count(), 1u);
  EXPECT_EQ(r.get_histogram("tandem_request_kv_transfer_seconds", "", b).count(), 1u);
  EXPECT_EQ(r.get_histogram("tandem_request_e2e_seconds", "", b).count(), 2u);
  EXPECT_EQ(r.get_counter("tandem_requests_total", "", {{"outcome", "finished"}}).value(), 2);

  expect_invalid([&] { record_request(r, t, "finshed"); }, "unknown request outcome 'finshed'");

  const auto j = nlohmann::json::parse(r.to_json());
  EXPECT_EQ(j["histograms"]["tandem_request_ttft_seconds"][0]["count"], 2);
  EXPECT_EQ(j["counters"]["tandem_requests_total"].size(), 2u);
}

// The process gauges follow the process: an opened descriptor is counted at the next update,
// and memory touched shows in the resident size.
TEST(Metrics, ProcessGaugesFollowTheProcess) {
  using namespace tandem::metrics;
  const process_stats before = read_process_stats();
  ASSERT_GT(before.resident_bytes, 0);
  ASSERT_GE(before.open_fds, 3);  // stdin, stdout, stderr at least
  FILE* f = std::fopen("/proc/self/statm", "r");
  ASSERT_NE(f, nullptr);
  std::vector<char> block(64 << 20, 1);  // 64 MiB touched
  const process_stats during = read_process_stats();
  EXPECT_EQ(during.open_fds, before.open_fds + 1);
  EXPECT_GE(during.resident_bytes, before.resident_bytes + (48 << 20)) << int(block[12345]);
  registry r;
  update_process_metrics(r);
  const std::string text = r.to_prometheus();
  EXPECT_NE(text.find("\nprocess_open_fds " + std::to_string(during.open_fds) + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE process_resident_memory_bytes gauge\n"), std::string::npos) << text;
  std::fclose(f);
  update_process_metrics(r);
  EXPECT_NE(r.to_prometheus().find("\nprocess_open_fds " + std::to_string(before.open_fds) + "\n"), std::string::npos);
}

// A reader (the stats log line, a dashboard) may look a metric up before its writer: the writer's
// help text still makes it into the exposition (promtool refuses a metric without one).
TEST(Metrics, HelpComesFromTheFirstCallThatGivesOne) {
  registry r;
  EXPECT_EQ(r.get_counter("tandem_x_total", "").value(), 0);
  r.get_counter("tandem_x_total", "Things counted.").inc();
  r.get_counter("tandem_x_total", "Another text.").inc();
  const std::string text = r.to_prometheus();
  EXPECT_NE(text.find("# HELP tandem_x_total Things counted.\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tandem_x_total 2"), std::string::npos) << text;
}
