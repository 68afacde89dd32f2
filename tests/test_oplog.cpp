// The operator's log (runtime/oplog): how an event renders in text and in JSON, and that with
// --log-format json every line, free-form ones included, is one JSON object.
#include "runtime/oplog.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <limits>
#include <sstream>

using namespace tandem;
using json = nlohmann::json;

TEST(Oplog, TextIsNameThenKeyValuePairsQuotedOnlyWhereNeeded) {
  EXPECT_EQ(oplog::render(oplog::format::text, "request",
                          {{"id", 7},
                           {"endpoint", "/v1/completions"},
                           {"ttft_ms", 41.25},
                           {"stream", true},
                           {"error", "a b"},
                           {"empty", ""}}),
            "request id=7 endpoint=/v1/completions ttft_ms=41.2 stream=true error=\"a b\" empty=\"\"");
  EXPECT_EQ(oplog::render(oplog::format::text, "x", {{"msg", "say \"hi\"\n"}}), "x msg=\"say \\\"hi\\\"\\n\"");
}

TEST(Oplog, JsonIsOneObjectWithTypedValues) {
  const std::string s = oplog::render(oplog::format::json, "restart",
                                      {{"worker", "decode-1"},
                                       {"restarts", int64_t(3)},
                                       {"after_ms", 2.0},
                                       {"crash", false},
                                       {"nan", std::numeric_limits<double>::quiet_NaN()},
                                       {"why", "tab\there \"q\""}});
  const json j = json::parse(s);
  EXPECT_EQ(j["event"], "restart");
  EXPECT_EQ(j["worker"], "decode-1");
  EXPECT_EQ(j["restarts"], 3);
  EXPECT_DOUBLE_EQ(j["after_ms"].get<double>(), 2.0);
  EXPECT_EQ(j["crash"], false);
  EXPECT_TRUE(j["nan"].is_null());
  EXPECT_EQ(j["why"], "tab\there \"q\"");
}

TEST(Oplog, JsonFormatMakesEveryLineAnObject) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto logger = std::make_shared<spdlog::logger>("oplog-test", sink);
  auto before = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  oplog::set_format(oplog::format::json);
  spdlog::info("free text with \"quotes\"");
  oplog::event(oplog::level::warn, "degraded", {{"pool", "decode"}, {"backoff_s", 30}});
  oplog::set_format(oplog::format::text);
  oplog::event(oplog::level::info, "recovered", {{"pool", "decode"}});
  spdlog::set_default_logger(before);
  std::istringstream lines(out.str());
  std::string line;
  ASSERT_TRUE(std::getline(lines, line));
  json a = json::parse(line);
  EXPECT_EQ(a["level"], "info");
  EXPECT_EQ(a["msg"], "free text with \"quotes\"");
  EXPECT_TRUE(a["ts"].is_string());
  ASSERT_TRUE(std::getline(lines, line));
  json b = json::parse(line);
  EXPECT_EQ(b["level"], "warning");
  EXPECT_EQ(b["event"], "degraded");
  EXPECT_EQ(b["pool"], "decode");
  EXPECT_EQ(b["backoff_s"], 30);
  ASSERT_TRUE(std::getline(lines, line));
  EXPECT_NE(line.find("recovered pool=decode"), std::string::npos) << line;
  EXPECT_EQ(line.find('{'), std::string::npos) << line;
}

TEST(Oplog, TheTimelineKeepsTheLastSupervisionEventsOnly) {
  const uint64_t before = oplog::recent().empty() ? 0 : oplog::recent().back().seq;
  oplog::event(oplog::level::info, "request", {{"id", 1}});  // not a supervision event
  oplog::event(oplog::level::info, "stats", {{"running", 0}});
  oplog::event(oplog::level::debug, "migrate_resume", {{"id", 1}});
  oplog::event(oplog::level::warn, "restart", {{"actor", "decode-0"}});
  auto got = oplog::recent(before);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(json::parse(got[0].json)["actor"], "decode-0");
  EXPECT_GT(got[0].unix_ms, 0);
  for (int i = 0; i < 300; ++i) oplog::event(oplog::level::warn, "restart", {{"n", i}});
  got = oplog::recent();
  EXPECT_EQ(got.size(), 256u);  // bounded
  EXPECT_EQ(json::parse(got.back().json)["n"], 299);
  EXPECT_EQ(got.back().seq, got.front().seq + 255);
}
