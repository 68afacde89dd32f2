#include "tools/hub/progress.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

#include <unistd.h>

namespace tandem::hub {

progress::progress(std::string label, uint64_t total, uint64_t start)
    : label_(std::move(label)),
      total_(total),
      start_(start),
      done_(start),
      tty_(::isatty(2) == 1),
      t0_(clock::now()),
      last_(t0_) {}

void progress::update(uint64_t done) {
  done_ = done;
  const auto now = clock::now();
  // A terminal redraws 10 times a second; a log gets a line every 5 s.
  if (now - last_ < (tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000))) return;
  last_ = now;
  draw(false);
}

void progress::finish() {
  if (tty_ || drawn_) draw(true);
}

void progress::draw(bool last) {
  constexpr double mib = 1024.0 * 1024.0;
  const double s = std::chrono::duration<double>(clock::now() - t0_).count();
  const double rate = s > 0 ? double(done_ - start_) / s : 0.0;
  const double pct = total_ ? 100.0 * double(done_) / double(total_) : 100.0;
  std::string eta = "--:--";
  if (rate > 0 && total_ >= done_) {
    const auto left = uint64_t(double(total_ - done_) / rate);
    eta = left >= 3600 ? fmt::format("{}:{:02}:{:02}", left / 3600, left / 60 % 60, left % 60)
                       : fmt::format("{:02}:{:02}", left / 60, left % 60);
  }
  drawn_ = true;
  if (!tty_) {
    spdlog::info("{}: {:.0f}% ({:.1f} / {:.1f} MiB, {:.1f} MiB/s, {} left)", label_, pct, double(done_) / mib,
                 double(total_) / mib, rate / mib, eta);
    return;
  }
  constexpr int width = 24;
  const int filled = int(pct / 100.0 * width);
  std::string bar(size_t(std::clamp(filled, 0, width)), '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %8.1f / %.1f MiB %7.1f MiB/s ETA %s\x1b[K%s", label_.c_str(), bar.c_str(),
               pct, double(done_) / mib, double(total_) / mib, rate / mib, eta.c_str(), last ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace tandem::hub
