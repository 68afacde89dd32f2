#pragma once
// A download's progress on stderr: a bar redrawn in place when stderr is a terminal (percent,
// MiB, MiB/s, time left), else a log line every few seconds (CI logs, files, pipes).
#include <chrono>
#include <cstdint>
#include <string>

namespace tandem::hub {

class progress {
 public:
  // `start`: bytes already there (a resumed download); the rate counts this run's bytes only.
  progress(std::string label, uint64_t total, uint64_t start);
  void update(uint64_t done);
  // The last state (the bar's final line ends with a newline).
  void finish();

 private:
  void draw(bool last);
  using clock = std::chrono::steady_clock;
  std::string label_;
  uint64_t total_, start_, done_;
  bool tty_, drawn_ = false;
  clock::time_point t0_, last_;
};

}  // namespace tandem::hub
