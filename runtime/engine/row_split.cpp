#include "runtime/engine/row_split.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tandem {

row_split::row_split(int threads) {
  if (threads < 1) throw std::invalid_argument("row_split: at least one thread");
  weight_.assign(size_t(threads), 1.0 / threads);
}

row_split::piece row_split::piece_of(int p, int64_t rows) const {
  // Boundary b_q = the weights of participants before q, times the rows, rounded to `align`;
  // b_0 = 0 and b_n = rows, so the pieces tile the batch whatever the rounding.
  auto boundary = [&](int q) -> int64_t {
    if (q == 0) return 0;
    if (q == threads()) return rows;
    double before = 0;
    for (int i = 0; i < q; ++i) before += weight_[size_t(i)];
    const int64_t b = int64_t(std::llround(before * double(rows) / double(align))) * align;
    return std::clamp<int64_t>(b, 0, rows);
  };
  const int64_t begin = boundary(p), end = std::max(begin, boundary(p + 1));
  return {begin, end};
}

void row_split::observe(std::span<const int64_t> rows, std::span<const double> seconds) {
  const size_t n = weight_.size();
  if (n == 1 || rows.size() != n || seconds.size() != n) return;
  std::vector<double> speed(n);
  double total = 0;
  for (size_t p = 0; p < n; ++p) {
    if (rows[p] <= 0 || !(seconds[p] > 0)) return;  // not a comparison of all of them
    speed[p] = double(rows[p]) / seconds[p];
    total += speed[p];
  }
  const double lo = (1 - max_skew) / double(n), hi = (1 + max_skew) / double(n);
  double sum = 0;
  for (size_t p = 0; p < n; ++p) {
    weight_[p] = std::clamp((1 - step) * weight_[p] + step * speed[p] / total, lo, hi);
    sum += weight_[p];
  }
  for (double& w : weight_) w /= sum;
}

}  // namespace tandem
