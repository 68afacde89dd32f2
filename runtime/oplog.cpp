#include "runtime/oplog.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <deque>
#include <mutex>

namespace tandem::oplog {
namespace {

std::atomic<format> g_format{format::text};

// The timeline's events (a bounded ring: memory stays flat however long the server runs).
struct ring {
  std::mutex mu;
  std::deque<recorded> events;
  uint64_t next = 1;
} g_ring;

void json_escape(std::string& out, std::string_view s) {
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
}

bool needs_quotes(std::string_view s) {
  if (s.empty()) return true;
  for (unsigned char c : s)
    if (c <= ' ' || c == '"' || c == '=' || c == '\\') return true;
  return false;
}

// Every line one JSON object. A message that is one already (an event) gets the time and level
// put in front of its fields; any other becomes {"msg": ...}.
class json_formatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto secs = std::chrono::time_point_cast<std::chrono::seconds>(msg.time);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(msg.time - secs).count();
    const std::time_t t = std::chrono::system_clock::to_time_t(msg.time);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char ts[96];
    std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                  tm.tm_hour, tm.tm_min, tm.tm_sec, int(ms));
    std::string line = "{\"ts\":\"";
    line += ts;
    line += "\",\"level\":\"";
    const auto lv = spdlog::level::to_string_view(msg.level);
    line.append(lv.data(), lv.size());
    line += "\",";
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    if (payload.size() >= 2 && payload.front() == '{' && payload.back() == '}') {
      line.append(payload.substr(1));
    } else {
      line += "\"msg\":\"";
      json_escape(line, payload);
      line += "\"}";
    }
    line += '\n';
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<json_formatter>(); }
};

}  // namespace

field::field(std::string_view k, double v) : key(k), quote(false) {
  if (!std::isfinite(v)) {
    value = "null";
    return;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  value = buf;
}

void set_format(format f) {
  g_format = f;
  switch (f) {
    case format::text: spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v"); break;
    case format::json: spdlog::set_formatter(std::make_unique<json_formatter>()); break;
  }
}

format current_format() { return g_format.load(); }

std::vector<recorded> recent(uint64_t after_seq) {
  std::lock_guard lk(g_ring.mu);
  std::vector<recorded> out;
  for (const auto& r : g_ring.events)
    if (r.seq > after_seq) out.push_back(r);
  return out;
}

std::string render(format f, std::string_view name, std::initializer_list<field> fields) {
  std::string out;
  switch (f) {
    case format::text:
      out.append(name);
      for (const auto& fl : fields) {
        out += ' ';
        out.append(fl.key);
        out += '=';
        if (fl.quote && needs_quotes(fl.value)) {
          out += '"';
          json_escape(out, fl.value);
          out += '"';
        } else {
          out += fl.value;
        }
      }
      break;
    case format::json:
      out = "{\"event\":\"";
      json_escape(out, name);
      out += '"';
      for (const auto& fl : fields) {
        out += ",\"";
        json_escape(out, fl.key);
        out += "\":";
        if (fl.quote) {
          out += '"';
          json_escape(out, fl.value);
          out += '"';
        } else {
          out += fl.value;
        }
      }
      out += '}';
      break;
  }
  return out;
}

void event(level lvl, std::string_view name, std::initializer_list<field> fields) {
  if (lvl != level::debug && name != "request" && name != "stats") {
    recorded r;
    r.unix_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    r.json = render(format::json, name, fields);
    std::lock_guard lk(g_ring.mu);
    r.seq = g_ring.next++;
    g_ring.events.push_back(std::move(r));
    if (g_ring.events.size() > 256) g_ring.events.pop_front();
  }
  const auto sl = lvl == level::debug  ? spdlog::level::debug
                  : lvl == level::info ? spdlog::level::info
                  : lvl == level::warn ? spdlog::level::warn
                                       : spdlog::level::err;
  if (!spdlog::should_log(sl)) return;
  spdlog::log(sl, "{}", render(g_format.load(), name, fields));
}

}  // namespace tandem::oplog
