// cpu::matmul against a double-precision reference on the dequantized weights, on every ISA
// level this CPU supports, for 1-3 threads.
//
// Error bound per output y[i, r], relative to its L1 magnitude sum_c |x[i,c]| |w[r,c]|:
//   f32, f16, bf16 weights: 1e-4 (f32 accumulation only; f16 weights are widened exactly, on
//     the avx512_bf16 level in their panel kernel, as f32's)
//   bf16 weights on the avx512_bf16 level (panels, every m, either mode): 1e-2 (x is
//     rounded to bf16 there, 2^-9 per term)
//   q8_0 weights: 1e-2 (x is quantized to 8 bits, or to bf16 on the avx512_bf16 `fastest` GEMM)
//   q4_0, q4_k, q5_k, q6_k weights: 1e-4 (dequantized exactly to f32, then the f32 kernels);
//     on the avx512_bf16 level (their panel kernels): 1e-2 (x quantized per 32, as for q8_0)
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/ops.h"

namespace tandem::kernels {
inline void PrintTo(dtype t, std::ostream* os) { *os << to_string(t); }  // readable test names
}  // namespace tandem::kernels

namespace tk = tandem::kernels;
namespace cpu = tandem::kernels::cpu;
using cpu::detail::isa;

namespace {

struct problem {
  tk::dtype type;
  int64_t m, rows, cols;
  std::vector<uint8_t> w;  // rows * row_bytes
  std::vector<float> x;  // [m, cols]
  std::vector<double> ref, mag;  // [m, rows]
  std::shared_ptr<tk::panel_memory> store = std::make_shared<tk::panel_memory>();
  tk::weight_view packed;  // w with this CPU's panels, as a model would load it

  tk::weight_view view() const { return packed; }
};

problem make_problem(tk::dtype t, int64_t m, int64_t rows, int64_t cols, uint32_t seed) {
  problem p{t, m, rows, cols, {}, {}, {}, {}, std::make_shared<tk::panel_memory>(), {}};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t rb = tk::row_bytes(t, cols);
  p.w.resize(size_t(rows * rb));
  std::vector<float> row(static_cast<size_t>(cols)), deq(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = 0.05f * float(1 + r % 7);  // rows of different magnitude
    for (auto& v : row) v = scale * u(rng);
    tk::quantize_row(t, row.data(), p.w.data() + r * rb, cols);
    tk::dequantize_row(t, p.w.data() + r * rb, deq.data() + r * cols, cols);
  }
  p.x.resize(size_t(m * cols));
  for (auto& v : p.x) v = 2.0f * u(rng);
  p.ref.resize(size_t(m * rows));
  p.mag.resize(size_t(m * rows));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double xv = p.x[size_t(i * cols + c)], wv = deq[size_t(r * cols + c)];
        s += xv * wv;
        a += std::fabs(xv * wv);
      }
      p.ref[size_t(i * rows + r)] = s;
      p.mag[size_t(i * rows + r)] = a;
    }
  p.packed = tk::pack_for_matmul({t, p.w.data(), rows, cols}, *p.store);
  return p;
}

double tolerance(tk::dtype t, isa level) {
  if (t == tk::dtype::q8_0) return 1e-2;
  // Integer kernels (panels on avx512_bf16, matmul_kquant_avx2 on avx2/avx512): x in 8 bits, a
  // scale per 32 (Q4_0) or per 256 (the k-quants' Q8_K).
  if (tk::is_dequantized_on_the_fly(t) && level != isa::scalar) return 1e-2;
  if (t == tk::dtype::bf16) return 1e-2;  // x rounded to bf16 on every level (8 bits of mantissa)
  return 1e-4;
}

std::vector<isa> supported_levels() {
  std::vector<isa> out;
  for (isa l : {isa::scalar, isa::avx2, isa::avx512, isa::avx512_bf16})
    if (cpu::detail::isa_supported(l)) out.push_back(l);
  return out;
}

std::vector<float> run(isa level, const problem& p, tk::thread_pool& pool,
                       cpu::matmul_mode mode = cpu::matmul_mode::fastest) {
  std::vector<float> y(size_t(p.m * p.rows), -12345.0f);
  cpu::detail::matmul_with_isa(level, p.view(), p.x.data(), p.m, y.data(), pool, mode);
  return y;
}

// Largest |y - ref| / max(mag, tiny) over all outputs.
double worst_error(const problem& p, const std::vector<float>& y) {
  double worst = 0;
  for (size_t j = 0; j < y.size(); ++j)
    worst = std::max(worst, std::fabs(double(y[j]) - p.ref[j]) / std::max(p.mag[j], 1e-30));
  return worst;
}

// Floats for the f16 conversions: the edge cases (zeros, half's smallest subnormal and half of
// it, its largest finite value and the overflow bound, infinities, ties of nearest-even), then
// n_random random bit patterns (NaNs among them).
std::vector<float> f16_conversion_cases(uint32_t seed, int n_random) {
  std::vector<float> x;
  for (uint32_t special : {0x00000000u, 0x80000000u, 0x33000000u, 0x33000001u, 0x387fe000u, 0x38800000u, 0x477fefffu,
                           0x477ff000u, 0x7f800000u, 0xff800000u, 0x3f801000u, 0x3f803000u, 0x3c000800u})
    x.push_back(std::bit_cast<float>(special));
  std::mt19937 rng(seed);
  for (int i = 0; i < n_random; ++i) x.push_back(std::bit_cast<float>(uint32_t(rng())));
  return x;
}

tk::thread_pool& pool_of(int n) {
  static tk::thread_pool p1(1), p2(2), p3(3);
  return n == 1 ? p1 : n == 2 ? p2 : p3;
}

class matmul_test : public ::testing::TestWithParam<tk::dtype> {};

TEST_P(matmul_test, matches_reference_on_every_isa_and_thread_count) {
  const tk::dtype t = GetParam();
  uint32_t seed = 1;
  // (rows, cols): odd row counts, partial 64-row panels, k blocking (768 > one k panel), and
  // 4000 x 768, big enough (>= 3 MiB) that the decode path splits rows over 3 threads.
  const std::pair<int64_t, int64_t> shapes[] = {{1, 32},   {67, 32}, {300, 32}, {1, 96},    {67, 96},
                                                {300, 96}, {1, 768}, {67, 768}, {300, 768}, {4000, 768}};
  for (auto [rows, cols] : shapes)
    for (int64_t m : {1, 2, 3, 7, 12, 64, 130}) {  // 12: two decode chunks for q8_0
      if (cols % tk::block_elems(t) != 0) continue;  // k-quant rows are whole 256-blocks: 768 only
      if (rows == 4000 && m > 12) continue;  // the GEMM splits are covered by 300 rows
      const problem p = make_problem(t, m, rows, cols, seed++);
      for (isa level : supported_levels()) {
        SCOPED_TRACE(std::string(cpu::detail::isa_label(level)) + " m=" + std::to_string(m) +
                     " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols));
        const std::vector<float> y1 = run(level, p, pool_of(1));
        EXPECT_LE(worst_error(p, y1), tolerance(t, level));
        EXPECT_LE(worst_error(p, run(level, p, pool_of(2), cpu::matmul_mode::batch_invariant)), tolerance(t, level));
        for (int threads : {2, 3}) {
          const std::vector<float> yn = run(level, p, pool_of(threads));
          for (size_t j = 0; j < yn.size(); ++j)  // same kernels, same order: rounding only
            ASSERT_NEAR(yn[j], y1[j], 1e-6 * p.mag[j] + 1e-30) << threads << " threads, j=" << j;
        }
      }
    }
}

TEST_P(matmul_test, dispatched_path_agrees_with_scalar) {
  const tk::dtype t = GetParam();
  for (int64_t m : {1, 5, 64}) {
    const problem p = make_problem(t, m, 129, 256, 77 + uint32_t(m));
    std::vector<float> ys = run(isa::scalar, p, pool_of(2)), yd(ys.size());
    cpu::matmul(p.view(), p.x.data(), m, yd.data(), pool_of(2));
    const double tol = tolerance(t, isa::scalar) + tolerance(t, cpu::detail::best_isa());
    for (size_t j = 0; j < ys.size(); ++j)
      ASSERT_LE(std::fabs(double(ys[j]) - yd[j]), tol * p.mag[j] + 1e-30) << "m=" << m << ", j=" << j;
  }
}

// matmul_mode::batch_invariant: a row's result is bitwise the same whatever else is in the
// batch (m = 1, a decode batch, a prefill) and however many threads run it.
TEST_P(matmul_test, batch_invariant_rows_do_not_depend_on_the_batch) {
  const tk::dtype t = GetParam();
  const problem big = make_problem(t, 70, 300, 768, 4242);
  for (isa level : supported_levels()) {
    SCOPED_TRACE(cpu::detail::isa_label(level));
    const auto all = run(level, big, pool_of(2), cpu::matmul_mode::batch_invariant);
    for (int64_t m : {1, 2, 3, 5, 8, 9, 17, 33}) {
      for (int64_t i0 : {int64_t(0), big.m - m}) {  // the first and the last rows of the batch
        for (int threads : {1, 3}) {
          // The same weights in place (a kernel may align its loads to their addresses).
          std::vector<float> y(size_t(m * big.rows));
          cpu::detail::matmul_with_isa(level, big.view(), big.x.data() + i0 * big.cols, m, y.data(), pool_of(threads),
                                       cpu::matmul_mode::batch_invariant);
          for (int64_t j = 0; j < m * big.rows; ++j)
            ASSERT_EQ(y[size_t(j)], all[size_t(i0 * big.rows + j)]) << "m=" << m << " i0=" << i0 << " j=" << j;
        }
      }
    }
  }
}

// The AVX2 integer kernels and the VNNI panels quantize x alike and sum exactly: they differ by
// float rounding only (where this CPU runs both), far below the 8-bit error both share.
TEST(matmul, integer_kernels_agree_across_levels) {
  if (!cpu::detail::isa_supported(isa::avx512_bf16)) {
    GTEST_SKIP() << "this CPU lacks AVX-512 VNNI/BF16: there is only one integer kernel to run";
  }
  for (tk::dtype t : {tk::dtype::q4_0, tk::dtype::q4_k, tk::dtype::q5_k, tk::dtype::q6_k}) {
    const problem p = make_problem(t, 9, 300, 768, 77);
    const auto a = run(isa::avx2, p, pool_of(2), cpu::matmul_mode::batch_invariant);
    const auto b = run(isa::avx512_bf16, p, pool_of(2), cpu::matmul_mode::batch_invariant);
    double worst = 0;
    for (size_t j = 0; j < a.size(); ++j)
      worst = std::max(worst, std::fabs(double(a[j]) - b[j]) / std::max(p.mag[j], 1e-30));
    EXPECT_LE(worst, 2e-6) << tk::to_string(t);
  }
}

// The table: a row's result is bitwise equal in batches of m in {1, 2, 3, 7, 16, 64,
// 512}, at 1 and 2 threads, wherever it lands in a microkernel tile (6 rows for the float
// kernels, 4 for q8_0: offsets 0..11 put a row at every position of both), on the dispatched
// level with the weights as a model loads them (panels where this CPU has them).
TEST_P(matmul_test, batch_invariant_at_every_size_and_tile_position) {
  const tk::dtype t = GetParam();
  const problem big = make_problem(t, 512, 200, 768, 99);
  if (cpu::detail::best_isa() == isa::avx512_bf16) {
    ASSERT_NE(big.view().panels, nullptr) << "this CPU's batch-invariant kernels use panels";
  }
  const auto all = run(cpu::detail::best_isa(), big, pool_of(2), cpu::matmul_mode::batch_invariant);
  EXPECT_LE(worst_error(big, all), tolerance(t, cpu::detail::best_isa()));
  for (int64_t m : {1, 2, 3, 7, 16, 64, 512})
    for (int64_t i0 = 0; i0 < 12 && i0 + m <= big.m; ++i0)
      for (int threads : {1, 2}) {
        std::vector<float> y(size_t(m * big.rows));
        cpu::matmul(big.view(), big.x.data() + i0 * big.cols, m, y.data(), pool_of(threads),
                    cpu::matmul_mode::batch_invariant);
        for (int64_t j = 0; j < m * big.rows; ++j)
          ASSERT_EQ(y[size_t(j)], all[size_t(i0 * big.rows + j)])
              << "m=" << m << " i0=" << i0 << " threads=" << threads << " j=" << j;
      }
}

// A slice of a packed weight (the engine's decode split) computes its rows exactly as the
// whole weight does.
TEST_P(matmul_test, row_slices_equal_the_whole) {
  const tk::dtype t = GetParam();
  const problem p = make_problem(t, 3, 300, 256, 7);
  const auto all = run(cpu::detail::best_isa(), p, pool_of(1), cpu::matmul_mode::batch_invariant);
  const int64_t a = tk::row_align(p.view());
  for (int64_t r0 = 0; r0 < p.rows; r0 += 2 * a) {
    const int64_t r1 = std::min(p.rows, r0 + 2 * a);
    std::vector<float> y(size_t(p.m * (r1 - r0)));
    cpu::matmul(tk::slice_rows(p.view(), r0, r1), p.x.data(), p.m, y.data(), pool_of(2));
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t r = r0; r < r1; ++r)
        ASSERT_EQ(y[size_t(i * (r1 - r0) + r - r0)], all[size_t(i * p.rows + r)]) << "r0=" << r0 << " r=" << r;
  }
  if (a > 1) {
    EXPECT_THROW(tk::slice_rows(p.view(), 1, 10), std::invalid_argument);
  }
}

// A fused input (RMSNorm, SwiGLU or GEGLU formed row by row inside the kernel's conversion of
// x) gives bitwise the result of forming the input first and multiplying it, for every m and
// thread count; the panel kernels of every type but f32 fuse, the other paths form it first.
TEST_P(matmul_test, fused_input_equals_the_op_then_the_matmul) {
  const tk::dtype t = GetParam();
  const problem p = make_problem(t, 64, 200, 512, 21);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::vector<float> aux(size_t(p.m * p.cols)), norm_w(size_t(p.cols));
  for (auto& v : aux) v = u(rng);
  for (auto& v : norm_w) v = 1.0f + 0.5f * u(rng);
  EXPECT_EQ(cpu::fuses_input(p.view()),
            cpu::detail::best_isa() == isa::avx512_bf16 && t != tk::dtype::f32 && t != tk::dtype::f16);
  for (cpu::input_op op : {cpu::input_op::rms_norm, cpu::input_op::silu_mul, cpu::input_op::gelu_mul}) {
    const cpu::matmul_input in{p.x.data(), op, op == cpu::input_op::rms_norm ? norm_w.data() : aux.data(), 1e-5f};
    for (int64_t m : {1, 2, 7, 64})
      for (int threads : {1, 2}) {
        std::vector<float> formed(size_t(m * p.cols)), want(size_t(m * p.rows)), got(size_t(m * p.rows));
        cpu::form_input(in, m, p.cols, formed.data(), pool_of(threads));
        cpu::matmul(p.view(), formed.data(), m, want.data(), pool_of(threads));
        cpu::matmul(p.view(), in, m, got.data(), pool_of(threads));
        for (size_t j = 0; j < got.size(); ++j)
          ASSERT_EQ(got[j], want[j]) << "op=" << int(op) << " m=" << m << " threads=" << threads << " j=" << j;
      }
  }
  // form_input's rows are ops.h's functions, row by row.
  std::vector<float> formed(size_t(3 * p.cols)), want(size_t(3 * p.cols));
  cpu::form_input({p.x.data(), cpu::input_op::rms_norm, norm_w.data(), 1e-5f}, 3, p.cols, formed.data(), pool_of(2));
  cpu::rms_norm(p.x.data(), norm_w.data(), want.data(), 3, p.cols, 1e-5f);
  EXPECT_EQ(formed, want);
  cpu::form_input({p.x.data(), cpu::input_op::silu_mul, aux.data()}, 3, p.cols, formed.data(), pool_of(2));
  cpu::silu_mul_fast(p.x.data(), aux.data(), want.data(), 3 * p.cols);
  EXPECT_EQ(formed, want);
}

// Weights that share one input (a layer's q/k/v, gate/up) computed as a group: bitwise each
// matmul on its own, for every m and thread count, the input fused (RMSNorm) where the kernels
// fuse it. Rows of 192, 64 and 130 (a partial panel); 509 rows reach the prefill job, whose
// last slices are cut into blocks of rows.
TEST_P(matmul_test, a_group_equals_each_matmul_on_its_own) {
  const tk::dtype t = GetParam();
  const problem a = make_problem(t, 1, 192, 512, 31), b = make_problem(t, 1, 64, 512, 32),
                c = make_problem(t, 1, 130, 512, 33);
  const problem* ps[] = {&a, &b, &c};
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::vector<float> x(size_t(509 * 512)), norm_w(512);
  for (auto& v : x) v = u(rng);
  for (auto& v : norm_w) v = 1.0f + 0.5f * u(rng);
  std::vector<cpu::matmul_input> inputs{{x.data()}};
  if (cpu::fuses_input(a.view())) inputs.push_back({x.data(), cpu::input_op::rms_norm, norm_w.data(), 1e-5f});
  for (const cpu::matmul_input& in : inputs)
    for (int64_t m : {1, 7, 97, 509})
      for (int threads : {1, 2, 3}) {
        std::vector<std::vector<float>> want(3), got(3);
        std::vector<cpu::matmul_output> outs;
        for (size_t g = 0; g < 3; ++g) {
          want[g].assign(size_t(m * ps[g]->rows), 0.0f);
          got[g].assign(size_t(m * ps[g]->rows), -1.0f);
          cpu::matmul(ps[g]->view(), in, m, want[g].data(), pool_of(threads));
          outs.push_back({&ps[g]->packed, got[g].data()});
        }
        cpu::matmul_group(outs, in, m, pool_of(threads));
        for (size_t g = 0; g < 3; ++g)
          ASSERT_EQ(got[g], want[g]) << "weight " << g << " op=" << int(in.op) << " m=" << m << " threads=" << threads;
      }
}

INSTANTIATE_TEST_SUITE_P(dtypes, matmul_test,
                         ::testing::Values(tk::dtype::f32, tk::dtype::f16, tk::dtype::bf16, tk::dtype::q8_0,
                                           tk::dtype::q4_0, tk::dtype::q4_k, tk::dtype::q5_k, tk::dtype::q6_k),
                         [](const auto& info) { return std::string(tk::to_string(info.param)); });

// x's Q8_0 scales rounded to f16 and back (F16C where the CPU has it) as the scalar
// f32_to_f16 then f16_to_f32: nearest-even, subnormals, overflow to infinity.
TEST(matmul, scales_round_to_f16_as_the_scalar_conversion) {
  std::vector<float> d = f16_conversion_cases(23, 100000);
  std::erase_if(d, [](float v) { return std::isnan(v); });  // NaN payloads differ (F16C keeps them)
  d.resize((d.size() - 5) / 8 * 8 + 5);  // a tail past the 8-wide loop
  std::vector<float> got = d;
  cpu::detail::round_scales_f16(got.data(), int64_t(got.size()));
  for (size_t i = 0; i < d.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(tk::f16_to_f32(tk::f32_to_f16(d[i]))))
        << std::hexfloat << d[i];
}

// Float weights with cols not a multiple of 16 (not produced by our models, handled anyway).
TEST(matmul, ragged_columns) {
  for (tk::dtype t : {tk::dtype::f32, tk::dtype::f16, tk::dtype::bf16})
    for (int64_t cols : {1, 7, 40, 777})
      for (int64_t m : {1, 3, 9}) {
        const problem p = make_problem(t, m, 70, cols, 1000 + uint32_t(cols + m));
        for (isa level : supported_levels()) {
          SCOPED_TRACE(std::string(cpu::detail::isa_label(level)) + " " + std::string(tk::to_string(t)) +
                       " m=" + std::to_string(m) + " cols=" + std::to_string(cols));
          EXPECT_LE(worst_error(p, run(level, p, pool_of(2))), tolerance(t, level));
          EXPECT_LE(worst_error(p, run(level, p, pool_of(2), cpu::matmul_mode::batch_invariant)), tolerance(t, level));
        }
      }
}

TEST(matmul, empty_shapes_do_nothing) {
  const problem p = make_problem(tk::dtype::f32, 2, 3, 32, 5);
  std::vector<float> y(6, 7.0f);
  cpu::matmul(p.view(), p.x.data(), 0, y.data(), pool_of(2));
  for (float v : y) EXPECT_EQ(v, 7.0f);
}

TEST(matmul, q8_0_rows_must_be_whole_blocks) {
  std::vector<uint8_t> w(2 * 2 * sizeof(tk::block_q8_0));
  std::vector<float> x(48), y(2);
  const tk::weight_view v{tk::dtype::q8_0, w.data(), 2, 48};
  EXPECT_THROW(cpu::matmul(v, x.data(), 1, y.data(), pool_of(1)), std::invalid_argument);
}

// Engines with their own pools call matmul at the same time: scratch must not be shared.
TEST(matmul, concurrent_callers_with_separate_pools) {
  const problem a = make_problem(tk::dtype::q8_0, 2, 200, 768, 11);
  const problem b = make_problem(tk::dtype::bf16, 40, 150, 512, 12);
  const std::vector<float> ya = run(cpu::detail::best_isa(), a, pool_of(1), cpu::matmul_mode::batch_invariant);
  const std::vector<float> yb = run(cpu::detail::best_isa(), b, pool_of(1), cpu::matmul_mode::batch_invariant);
  auto hammer = [](const problem& p, const std::vector<float>& expect, bool* ok) {
    tk::thread_pool pool(2);
    std::vector<float> y(expect.size());
    for (int it = 0; it < 30; ++it) {
      cpu::matmul(p.view(), p.x.data(), p.m, y.data(), pool);
      for (size_t j = 0; j < y.size(); ++j)
        if (std::fabs(y[j] - expect[j]) > 1e-6 * p.mag[j] + 1e-30) *ok = false;
    }
  };
  bool ok_a = true, ok_b = true;
  std::thread ta(hammer, std::cref(a), std::cref(ya), &ok_a);
  std::thread tb(hammer, std::cref(b), std::cref(yb), &ok_b);
  ta.join();
  tb.join();
  EXPECT_TRUE(ok_a);
  EXPECT_TRUE(ok_b);
}

TEST(matmul, isa_name_is_the_dispatched_level) {
  const std::string name = cpu::isa_name();
  EXPECT_TRUE(name == "avx512" || name == "avx2" || name == "scalar") << name;
  EXPECT_TRUE(cpu::detail::isa_supported(cpu::detail::best_isa()));
  EXPECT_TRUE(cpu::detail::isa_supported(isa::scalar));
}

// ---- attention over a paged KV context ----

// A sequence's K/V in blocks of `bs` positions (in reverse order in memory), with
// random values, and queries for n_tok tokens starting at pos0.
struct attention_problem {
  int32_t n_tok, n_rep, pos0, bs, hd;
  std::vector<float> q, kv;  // kv: per block, [2][bs][hd]
  std::vector<const float*> kb, vb;
  attention_problem(int32_t n_tok_, int32_t n_rep_, int32_t pos0_, int32_t bs_, int32_t hd_, uint32_t seed)
      : n_tok(n_tok_), n_rep(n_rep_), pos0(pos0_), bs(bs_), hd(hd_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int32_t nb = (pos0 + n_tok + bs - 1) / bs;
    q.resize(size_t(n_tok) * n_rep * hd);
    for (auto& v : q) v = 2.0f * nd(rng);  // scores of several units: a peaked softmax
    kv.resize(size_t(nb) * 2 * bs * hd);
    for (auto& v : kv) v = nd(rng);
    for (int32_t i = 0; i < nb; ++i) {
      const int32_t slot = nb - 1 - i;  // blocks out of order in memory
      kb.push_back(kv.data() + int64_t(slot) * 2 * bs * hd);
      vb.push_back(kv.data() + int64_t(slot) * 2 * bs * hd + int64_t(bs) * hd);
    }
  }
  // out[i][r][d] in double, straight from the definition.
  // window > 0: token p sees positions [p - window + 1, p] only.
  std::vector<double> reference(float scale, int32_t window = 0) const {
    std::vector<double> out(q.size(), 0.0);
    for (int32_t i = 0; i < n_tok; ++i)
      for (int32_t r = 0; r < n_rep; ++r) {
        const float* qr = q.data() + (int64_t(i) * n_rep + r) * hd;
        const int32_t n = pos0 + i + 1, first = window > 0 ? std::max(0, n - window) : 0;
        std::vector<double> s(static_cast<size_t>(n), -1e300);
        double mx = -1e300;
        for (int32_t t = first; t < n; ++t) {
          const float* k = kb[size_t(t / bs)] + int64_t(t % bs) * hd;
          double d = 0;
          for (int32_t c = 0; c < hd; ++c) d += double(qr[c]) * k[c];
          s[size_t(t)] = d * scale;
          mx = std::max(mx, s[size_t(t)]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));  // positions before the window: exp(-huge) = 0
        double* o = out.data() + (int64_t(i) * n_rep + r) * hd;
        for (int32_t t = first; t < n; ++t) {
          const float* v = vb[size_t(t / bs)] + int64_t(t % bs) * hd;
          for (int32_t c = 0; c < hd; ++c) o[c] += s[size_t(t)] / sum * v[c];
        }
      }
    return out;
  }
};

TEST(attention, causal_kernel_matches_double_reference) {
  uint32_t seed = 5;
  for (int32_t hd : {8, 16, 32, 64, 128})
    for (int32_t n_rep : {1, 3, 4})
      for (int32_t bs : {4, 16, 5})
        for (auto [pos0, n_tok] : {std::pair{0, 1}, {0, 7}, {0, 70}, {37, 1}, {63, 2}, {130, 33}, {200, 1}}) {
          SCOPED_TRACE("hd=" + std::to_string(hd) + " n_rep=" + std::to_string(n_rep) + " bs=" + std::to_string(bs) +
                       " pos0=" + std::to_string(pos0) + " n_tok=" + std::to_string(n_tok));
          const attention_problem p(n_tok, n_rep, pos0, bs, hd, seed++);
          const float scale = 1.0f / std::sqrt(float(hd));
          const std::vector<double> ref = p.reference(scale);
          // Output rows padded apart (stride > n_rep * hd) to check the strides are honoured.
          const int64_t stride = int64_t(n_rep) * hd + 16;
          std::vector<float> fast(size_t(n_tok) * stride, -7.0f), slow(fast);
          std::vector<float> qs(size_t(n_tok) * stride, 0.0f);
          for (int32_t i = 0; i < n_tok; ++i)
            std::copy_n(p.q.data() + int64_t(i) * n_rep * hd, n_rep * hd, qs.data() + i * stride);
          cpu::attention_causal(qs.data(), stride, n_tok, n_rep, pos0, p.kb.data(), p.vb.data(), bs, hd, scale,
                                fast.data(), stride);
          cpu::attention_causal_reference(qs.data(), stride, n_tok, n_rep, pos0, p.kb.data(), p.vb.data(), bs, hd,
                                          scale, slow.data(), stride);
          double worst_fast = 0, worst_slow = 0;
          for (int32_t i = 0; i < n_tok; ++i) {
            for (int32_t c = 0; c < n_rep * hd; ++c) {
              const double r = ref[size_t(int64_t(i) * n_rep * hd + c)];
              worst_fast = std::max(worst_fast, std::fabs(fast[size_t(i * stride + c)] - r));
              worst_slow = std::max(worst_slow, std::fabs(slow[size_t(i * stride + c)] - r));
            }
            for (int32_t c = n_rep * hd; c < stride; ++c) ASSERT_EQ(fast[size_t(i * stride + c)], -7.0f);
          }
          // Outputs are convex combinations of N(0,1) values: absolute errors of float rounding.
          EXPECT_LE(worst_fast, 2e-5);
          EXPECT_LE(worst_slow, 2e-5);
        }
}

// K/V stored as the KV cache stores them (f32, f16, bf16, q8_0; K position-major or
// transposed): the tiled kernel reads the typed blocks directly and agrees with the reference
// run on their widened values. Block sizes: 16 and 32 (a transposed K read in place), 5 (16-key
// groups straddle blocks: gathered).
TEST(attention, typed_kv_blocks_match_the_reference) {
  uint32_t seed = 41;
  for (tk::dtype t : {tk::dtype::f32, tk::dtype::f16, tk::dtype::bf16, tk::dtype::q8_0})
    for (cpu::k_order ko : {cpu::k_order::position_major, cpu::k_order::dim_major})
      for (int32_t bs : {16, 32, 5})
        for (int32_t hd : {32, 64, 128})
          for (auto [pos0, n_tok] : {std::pair{0, 1}, {0, 40}, {63, 2}, {130, 33}, {200, 1}}) {
            if (t == tk::dtype::q8_0 && ko == cpu::k_order::dim_major) continue;  // refused: next test
            SCOPED_TRACE(std::string(tk::to_string(t)) + (ko == cpu::k_order::dim_major ? " dim-major" : " rows") +
                         " bs=" + std::to_string(bs) + " hd=" + std::to_string(hd) + " pos0=" + std::to_string(pos0) +
                         " n_tok=" + std::to_string(n_tok));
            const int32_t n_rep = 4;
            const attention_problem p(n_tok, n_rep, pos0, bs, hd, seed++);
            const int64_t row = tk::row_bytes(t, hd);
            // Each block's K and V rows in type t; slots past the last position hold NaN bytes
            // (a reused block's leftovers may be anything): the kernel must not let them in.
            std::vector<std::vector<uint8_t>> kt(p.kb.size()), vt(p.vb.size());
            std::vector<const void*> kb, vb;
            const int32_t n_pos = pos0 + n_tok;
            for (size_t b = 0; b < p.kb.size(); ++b) {
              kt[b].assign(size_t(bs * row), 0xff);
              vt[b].assign(size_t(bs * row), 0xff);
              for (int32_t r = 0; r < bs && int32_t(b) * bs + r < n_pos; ++r) {
                cpu::store_k_row(t, ko, p.kb[b] + int64_t(r) * hd, kt[b].data(), r, bs, hd);
                tk::quantize_row(t, p.vb[b] + int64_t(r) * hd, vt[b].data() + r * row, hd);
                std::vector<float> back(static_cast<size_t>(hd)), want(static_cast<size_t>(hd));
                cpu::load_k_row(t, ko, kt[b].data(), r, bs, hd, back.data());
                std::vector<uint8_t> q(static_cast<size_t>(row));
                tk::quantize_row(t, p.kb[b] + int64_t(r) * hd, q.data(), hd);
                tk::dequantize_row(t, q.data(), want.data(), hd);
                ASSERT_EQ(back, want) << "a stored K row loads back as its rounded values";
              }
              kb.push_back(kt[b].data());
              vb.push_back(vt[b].data());
            }
            const float scale = 1.0f / std::sqrt(float(hd));
            const int64_t stride = int64_t(n_rep) * hd;
            std::vector<float> fast(size_t(n_tok) * stride), slow(fast);
            cpu::attention_causal(p.q.data(), stride, n_tok, n_rep, pos0, kb.data(), vb.data(), t, ko, bs, hd, scale,
                                  fast.data(), stride);
            cpu::attention_causal_reference(p.q.data(), stride, n_tok, n_rep, pos0, kb.data(), vb.data(), t, ko, bs, hd,
                                            scale, slow.data(), stride);
            const std::vector<double> exact = p.reference(scale);
            double worst = 0, moved = 0;
            for (size_t i = 0; i < fast.size(); ++i) {
              ASSERT_TRUE(std::isfinite(fast[i])) << i;
              worst = std::max(worst, std::fabs(double(fast[i]) - slow[i]));
              moved = std::max(moved, std::fabs(double(slow[i]) - exact[i]));
            }
            EXPECT_LE(worst, 2e-5);
            if (t == tk::dtype::f32) {
              EXPECT_LE(moved, 2e-5);
            } else {
              EXPECT_GT(moved, 1e-5) << "the narrower type changed nothing: was it used?";
              // f16 keeps 11 bits, bf16 8; q8_0 about 8 relative to a 32-block's largest
              // value, which for these N(0,1) rows is coarser than bf16 at the median.
              const double tol = t == tk::dtype::f16 ? 5e-3 : t == tk::dtype::bf16 ? 5e-2 : 8e-2;
              EXPECT_LE(moved, tol) << "rounding K/V moves the output by its precision";
            }
          }
}

// A transposed K holds a row's elements block_size apart: it is f32, f16 or bf16, never q8_0
// (whose scales belong to 32 elements of one row).
TEST(attention, q8_0_k_is_kept_position_major) {
  EXPECT_EQ(cpu::kv_k_order(tk::dtype::q8_0), cpu::k_order::position_major);
  for (tk::dtype t : {tk::dtype::f32, tk::dtype::f16, tk::dtype::bf16})
    EXPECT_EQ(cpu::kv_k_order(t), cpu::k_order::dim_major);
  std::vector<float> q(64, 1.0f), out(64);
  std::vector<uint8_t> blk(size_t(16 * tk::row_bytes(tk::dtype::q8_0, 64)));
  const void* b = blk.data();
  EXPECT_THROW(cpu::attention_causal(q.data(), 64, 1, 1, 0, &b, &b, tk::dtype::q8_0, cpu::k_order::dim_major, 16, 64,
                                     0.125f, out.data(), 64),
               std::invalid_argument);
  EXPECT_THROW(cpu::store_k_row(tk::dtype::q8_0, cpu::k_order::dim_major, q.data(), blk.data(), 0, 16, 64),
               std::invalid_argument);
}

// Gemma 3's sliding layers: both kernels skip what lies behind the window, whole chunks of 64
// keys included, and agree with the definition.
TEST(attention, sliding_window_matches_double_reference) {
  uint32_t seed = 99;
  for (int32_t hd : {16, 32, 8})
    for (int32_t window : {1, 5, 8, 64, 100})
      for (auto [pos0, n_tok] : {std::pair{0, 1}, {0, 20}, {3, 1}, {70, 1}, {130, 33}, {200, 50}}) {
        SCOPED_TRACE("hd=" + std::to_string(hd) + " window=" + std::to_string(window) +
                     " pos0=" + std::to_string(pos0) + " n_tok=" + std::to_string(n_tok));
        const int32_t n_rep = 2, bs = 16;
        const attention_problem p(n_tok, n_rep, pos0, bs, hd, seed++);
        const float scale = 1.0f / std::sqrt(float(hd));
        const std::vector<double> ref = p.reference(scale, window), full = p.reference(scale);
        const int64_t stride = int64_t(n_rep) * hd;
        std::vector<float> fast(size_t(n_tok) * stride), slow(fast);
        cpu::attention_causal(p.q.data(), stride, n_tok, n_rep, pos0, p.kb.data(), p.vb.data(), bs, hd, scale,
                              fast.data(), stride, window);
        cpu::attention_causal_reference(p.q.data(), stride, n_tok, n_rep, pos0, p.kb.data(), p.vb.data(), bs, hd, scale,
                                        slow.data(), stride, window);
        double worst_fast = 0, worst_slow = 0, moved = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          worst_fast = std::max(worst_fast, std::fabs(fast[i] - ref[i]));
          worst_slow = std::max(worst_slow, std::fabs(slow[i] - ref[i]));
          moved = std::max(moved, std::fabs(ref[i] - full[i]));
        }
        EXPECT_LE(worst_fast, 2e-5);
        EXPECT_LE(worst_slow, 2e-5);
        if (pos0 + 1 > window) {
          EXPECT_GT(moved, 1e-3) << "the window changes the result";
        }
      }
}

// ---- elementwise ops: the engine's fast variants against the reference ones ----

TEST(ops, silu_mul_fast_matches_silu_mul) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> ud(-30.0f, 30.0f);
  for (int64_t n : {1, 15, 16, 17, 1000}) {
    const auto sz = static_cast<size_t>(n);
    std::vector<float> g(sz), u(sz), ref(sz), fast(sz, -1.0f);
    for (int64_t i = 0; i < n; ++i) {
      g[size_t(i)] = i % 5 == 0 ? ud(rng) / 10.0f : ud(rng);
      u[size_t(i)] = ud(rng);
    }
    if (n == 1000) g[0] = -200.0f, g[1] = 200.0f, g[2] = 0.0f, g[3] = -88.5f;  // saturation, 0
    cpu::silu_mul(g.data(), u.data(), ref.data(), n);
    cpu::silu_mul_fast(g.data(), u.data(), fast.data(), n);
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_NEAR(fast[i], ref[i], 1e-6f * std::fabs(ref[i]) + 1e-30f) << "i=" << i << " g=" << g[i];
  }
}

// RoPE fused into the K write stores bitwise what rope_apply(_neox) then store_k_row store, in
// every KV dtype and K order.
TEST(attention, roped_k_write_equals_rope_then_store) {
  const int32_t hd = 64, bs = 16;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> k(static_cast<size_t>(hd)), cs(static_cast<size_t>(hd));
  for (auto& v : k) v = u(rng);
  const int32_t pos = 1234;
  cpu::rope_table(&pos, 1, hd, 10000.0f, cs.data());
  for (tk::dtype t : {tk::dtype::f32, tk::dtype::f16, tk::dtype::bf16, tk::dtype::q8_0})
    for (cpu::rope_style style : {cpu::rope_style::normal, cpu::rope_style::neox}) {
      const cpu::k_order o = cpu::kv_k_order(t);
      const size_t bytes = size_t(tk::row_bytes(t, hd)) * bs;
      std::vector<uint8_t> a(bytes, 0), b(bytes, 0);
      std::vector<float> turned = k;
      (style == cpu::rope_style::neox ? cpu::rope_apply_neox : cpu::rope_apply)(turned.data(), cs.data(), 1, 1, hd);
      cpu::store_k_row(t, o, turned.data(), a.data(), 5, bs, hd);
      cpu::store_k_row_roped(t, o, style, k.data(), cs.data(), b.data(), 5, bs, hd);
      EXPECT_EQ(a, b) << tk::to_string(t) << " style " << int(style);
      EXPECT_NE(turned, k);  // the rotation did something at this position
    }
}

TEST(ops, rope_table_and_apply_equal_rope) {
  const int64_t T = 9, H = 3, D = 16;
  std::vector<int32_t> pos = {0, 1, 2, 7, 100, 1000, 2047, 5, 5};
  std::vector<float> x(size_t(T * H * D));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(double(i)));
  std::vector<float> a = x, b = x, cs(size_t(T * D));
  cpu::rope(a.data(), pos.data(), T, H, D, 10000.0f);
  cpu::rope_table(pos.data(), T, D, 10000.0f, cs.data());
  cpu::rope_apply(b.data(), cs.data(), T, H, D);
  EXPECT_EQ(a, b);  // the same arithmetic, bit for bit
}

TEST(ops, rms_norm_matches_double) {
  for (int64_t dim : {1, 31, 32, 768, 1001}) {
    const auto sz = static_cast<size_t>(dim);
    std::vector<float> x(2 * sz), w(sz), y(2 * sz);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::cos(double(i) * 0.37)) * 3.0f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f + float(i % 7) / 7.0f;
    cpu::rms_norm(x.data(), w.data(), y.data(), 2, dim, 1e-5f);
    for (int64_t r = 0; r < 2; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += double(x[size_t(r * dim + i)]) * x[size_t(r * dim + i)];
      const double k = 1.0 / std::sqrt(ss / double(dim) + 1e-5);
      for (int64_t i = 0; i < dim; ++i)
        ASSERT_NEAR(y[size_t(r * dim + i)], x[size_t(r * dim + i)] * k * w[size_t(i)], 1e-5) << dim;
    }
  }
}

}  // namespace

namespace {
// Rows converted to f16 (the f16 KV cache's writes, vectorised where F16C is) round exactly as
// the scalar f32_to_f16: nearest-even, subnormals, overflow to infinity, NaN stays NaN.
TEST(tensor_types, f16_rows_round_as_the_scalar_conversion) {
  std::vector<float> x = f16_conversion_cases(17, 100000);
  x.resize(x.size() / 8 * 8 + 3);  // a scalar tail too
  std::vector<uint16_t> row(x.size());
  tk::quantize_row(tk::dtype::f16, x.data(), row.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t want = tk::f32_to_f16(x[i]);
    if (std::isnan(x[i])) {
      EXPECT_TRUE((row[i] & 0x7c00u) == 0x7c00u && (row[i] & 0x3ffu) != 0) << i;
      EXPECT_EQ(row[i] & 0x8000u, want & 0x8000u) << i;
    } else {
      ASSERT_EQ(row[i], want) << std::hexfloat << x[i];
    }
  }
}
}  // namespace
