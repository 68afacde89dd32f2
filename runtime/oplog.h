#pragma once
// The operator's log: one line per thing an operator wants to see (a request ended, a worker
// was killed or restarted, a pool degraded or recovered, a node joined, a periodic stats
// line), with named fields, through spdlog to stderr. Text: `request id=7 status=200
// ttft_ms=41.2 ...`; with `--log-format json` every log line (these and the free-form ones) is
// one JSON object: {"ts": ..., "level": ..., "event": "request", "id": 7, ...} or
// {"ts": ..., "level": ..., "msg": "..."}, for Loki, Elasticsearch or jq.
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::oplog {

enum class format : uint8_t { text, json };
enum class level : uint8_t { debug, info, warn, error };

// Installs the formatter on the default logger (call once, at start-up).
void set_format(format f);
format current_format();

// One field: a number, a string or a flag.
struct field {
  field(std::string_view k, std::string_view v) : key(k), value(v), quote(true) {}
  field(std::string_view k, const char* v) : key(k), value(v), quote(true) {}
  field(std::string_view k, const std::string& v) : key(k), value(v), quote(true) {}
  field(std::string_view k, bool v) : key(k), value(v ? "true" : "false"), quote(false) {}
  template <std::integral T>
  field(std::string_view k, T v) : key(k), value(std::to_string(v)), quote(false) {}
  field(std::string_view k, double v);  // one decimal (milliseconds, ratios)
  std::string_view key;
  std::string value;
  bool quote;
};

// Renders an event: `name k=v k="a b"` or `{"event":"name","k":v,...}` (no level, no time).
std::string render(format f, std::string_view name, std::initializer_list<field> fields);
// Logs it at `lvl` in the current format. Supervision events (all but `request`, `stats` and
// debug ones) are also kept, the last 256, for the dashboard's timeline.
void event(level lvl, std::string_view name, std::initializer_list<field> fields);

struct recorded {
  uint64_t seq = 0;  // 1, 2, ... in the order they happened
  int64_t unix_ms = 0;  // when
  std::string json;  // {"event": ..., fields...} (render(format::json, ...))
};
// The kept events after `seq`, oldest first.
std::vector<recorded> recent(uint64_t after_seq = 0);

}  // namespace tandem::oplog
