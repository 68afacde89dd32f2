#pragma once
// How a prefill's rows are shared among an engine's threads (engine::run_layers' row jobs):
// one contiguous piece per thread, sized in proportion to the speed each thread showed in the
// jobs before.
//
// Why: a share is one piece (a thread reads all of a layer's weights once per piece, so
// smaller pieces that a fast thread could take over cost more than they save), and on a VM
// one vCPU often runs slower than the other for seconds at a time. With equal pieces the fast
// thread then waits at every layer: a 2-thread prefill of 509 tokens measured one thread at
// 80 ms of row work per forward and the other at 99 ms. Sized by speed, both finish together.
//
// A plain class (no clock, no threads): the engine times each piece and reports it; tests
// drive it with tables of (observed rows and seconds in → pieces out).
#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

class row_split {
 public:
  // Piece boundaries are multiples of `align` rows (but the batch's end), so that most pieces
  // fill the integer kernels' 4-row blocks; a finer grain than the float kernels' 6 rows, whose
  // rounding (up to half of it per boundary) would itself unbalance the pieces.
  static constexpr int64_t align = 4;
  // How far a thread's weight may move from an equal share, either way: a bad measurement (a
  // thread descheduled for one job) cannot starve or swamp it.
  static constexpr double max_skew = 0.5;
  // How much one job's measurement moves the weights (an exponential moving average).
  static constexpr double step = 0.25;

  explicit row_split(int threads);

  int threads() const { return int(weight_.size()); }
  // Participant p's share of the rows, within (1 ± max_skew) / n (exactly, for 2 threads); the
  // weights sum to 1.
  double weight(int p) const { return weight_[size_t(p)]; }
  // Participant p's piece of a job of `rows` rows, as [begin, end): the pieces of all
  // participants, in order, cover [0, rows) without overlap (a piece may be empty).
  struct piece {
    int64_t begin, end;
  };
  piece piece_of(int p, int64_t rows) const;
  // A finished job: rows[p] rows took participant p seconds[p] seconds. Only a job in which
  // every participant computed a piece of its own says how their speeds compare; any other
  // (one of them took over another's piece, or timed nothing) changes nothing.
  void observe(std::span<const int64_t> rows, std::span<const double> seconds);

 private:
  std::vector<double> weight_;
};

}  // namespace tandem
