// CPU matmul: runtime ISA dispatch, the portable scalar path and the pieces every ISA shares
// (per-thread scratch, the OpenBLAS prefill path).
//
// Two regimes (see matmul.h): decode (m <= decode_max_m) streams each weight row once and dots
// it with every input row, which is bound by memory bandwidth; prefill (larger m) is a GEMM,
// bound by FMA throughput. The ISA translation units implement both for their instruction set.
#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/ops.h"

namespace tandem::kernels::cpu {
namespace detail {
namespace {

// ---- scalar path ----

// x: [m, k] f32 and (for q8_0 weights) xq: [m, k/32] blocks; y: [m, w.rows]; rows [r0, r1).
void decode_rows_scalar(const weight_view& w, const float* x, const block_q8_0* xq, int64_t m, float* y, int64_t r0,
                        int64_t r1) {
  const int64_t k = w.cols, n = w.rows;
  if (w.type == dtype::q8_0) {
    const int64_t nb = k / q8_0_block;
    for (int64_t r = r0; r < r1; ++r) {
      const auto* wb = reinterpret_cast<const block_q8_0*>(row_ptr(w, r));
      for (int64_t i = 0; i < m; ++i) {
        const block_q8_0* xb = xq + i * nb;
        float sum = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          int32_t s = 0;  // exact: 32 products of |v| <= 128
          for (int j = 0; j < q8_0_block; ++j) s += int32_t(wb[b].qs[j]) * xb[b].qs[j];
          sum += f16_to_f32(wb[b].d) * f16_to_f32(xb[b].d) * float(s);
        }
        y[i * n + r] = sum;
      }
    }
    return;
  }
  auto* row = static_cast<float*>(thread_scratch(scratch_tmp, size_t(k) * sizeof(float)));
  for (int64_t r = r0; r < r1; ++r) {
    dequantize_row(w.type, row_ptr(w, r), row, k);
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * k;
      float part[8] = {};  // independent partial sums: shorter dependency chains, less rounding
      int64_t c = 0;
      for (; c + 8 <= k; c += 8)
        for (int j = 0; j < 8; ++j) part[j] += row[c + j] * xi[c + j];
      for (; c < k; ++c) part[0] += row[c] * xi[c];
      y[i * n + r] = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    }
  }
}

// Makes OpenBLAS single-threaded (once): our pool owns the cores.
void init_blas_threads() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Rows [r0, r1) of W against all m rows of x through cblas_sgemm. y: [m, w.rows].
void blas_rows(const weight_view& w, const float* x, int64_t m, float* y, int64_t r0, int64_t r1, dequant_fn dequant) {
  const int64_t k = w.cols, n = w.rows;
  auto sgemm = [&](const float* wp, int64_t rows, float* yp) {  // yp[m, rows] = x · wpᵀ
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(rows), int(k), 1.0f, x, int(k), wp, int(k), 0.0f,
                yp, int(n));
  };
  if (w.type == dtype::f32) {
    sgemm(reinterpret_cast<const float*>(row_ptr(w, r0)), r1 - r0, y + r0);
    return;
  }
  // A panel of ~1 MiB of f32 weights: big enough for OpenBLAS's own blocking, stays in L2/L3.
  const int64_t panel = std::clamp<int64_t>((int64_t(1) << 18) / std::max<int64_t>(k, 1), 16, 256);
  auto* buf = static_cast<float*>(thread_scratch(scratch_panel, size_t(panel * k) * sizeof(float)));
  for (int64_t p = r0; p < r1; p += panel) {
    const int64_t rows = std::min(panel, r1 - p);
    for (int64_t r = 0; r < rows; ++r) dequant(w.type, row_ptr(w, p + r), buf + r * k, k);
    sgemm(buf, rows, y + p);
  }
}

}  // namespace

namespace {
struct scratch_set {
  void* ptr[scratch_slots] = {};
  size_t cap[scratch_slots] = {};
  scratch_set() = default;
  scratch_set(const scratch_set&) = delete;
  scratch_set& operator=(const scratch_set&) = delete;
  ~scratch_set() {
    for (void* p : ptr) std::free(p);
  }
};
}  // namespace

namespace {
// 8 at a time with F16C: nearest-even to f16 (as f32_to_f16) and back (exact).
__attribute__((target("avx,f16c"))) int64_t round_scales_f16c(float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(d + i), _MM_FROUND_TO_NEAREST_INT)));
  return i;
}
// (F16C comes with AVX2 on every CPU but Ivy Bridge, which takes the exact scalar loop.)
const bool have_f16c = detail::cpu_has(detail::isa::avx2);
}  // namespace

void round_scales_f16(float* d, int64_t n) {
  const int64_t done = have_f16c ? round_scales_f16c(d, n) : 0;
  for (int64_t i = done; i < n; ++i) d[i] = f16_to_f32(f32_to_f16(d[i]));
}

void* thread_scratch(scratch_slot slot, size_t bytes) {
  thread_local scratch_set s;
  if (s.cap[slot] < bytes) {
    std::free(s.ptr[slot]);
    s.ptr[slot] = nullptr;
    s.cap[slot] = 0;
    // aligned_alloc wants a size that is a multiple of the alignment.
    const size_t cap = (std::max(bytes, size_t(4096)) + 63) & ~size_t(63);
    s.ptr[slot] = std::aligned_alloc(64, cap);
    if (!s.ptr[slot]) throw std::bad_alloc();
    s.cap[slot] = cap;
  }
  return s.ptr[slot];
}

int64_t decode_max_m(isa level, dtype t) {
  // Crossovers measured with 12 layers of bench-76m weights (out of cache), one thread. The
  // decode kernels read each weight once but run out of FMA issue (f32, f16) or memory
  // parallelism as m grows; q8_0 decode reads 4x fewer bytes per weight and stays ahead longest;
  // on avx512_bf16, weights with panels never get here (matmul_panels), so its figures are for
  // views without them, which take the f32 GEMM as on avx512.
  switch (level) {
    case isa::avx512_bf16: return t == dtype::q8_0 ? 16 : t == dtype::f16 ? 12 : t == dtype::f32 ? 4 : 8;
    case isa::avx512:  // q8_0 decode runs the AVX2 kernel: keep the AVX2 crossover
      return t == dtype::q8_0 ? decode_max_m(isa::avx2, t) : t == dtype::f32 ? 4 : 8;
    case isa::avx2:  // prefill is OpenBLAS with dequantized panels
      return t == dtype::q8_0 ? 16 : 8;
    case isa::scalar: return 2;
  }
  return 1;
}

int64_t decode_grain(const weight_view& w, int threads) {
  // One equal slice per thread, but each at least 128 KiB of weights (~5 us of streaming): a
  // dispatch to spinning pool threads costs ~1.5 us on the test VM (thread_pool.h), so only
  // the smallest matrices run inline on the caller. (With the earlier condition-variable pool,
  // 10-50 us per wake-up, the floor was 1 MiB, which left most bf16/q8_0 decode matrices of
  // bench-76m on one thread.)
  const int64_t bytes = w.rows * row_bytes(w.type, w.cols);
  const int64_t parts = std::clamp<int64_t>(bytes / (int64_t(1) << 17), 1, threads);
  return (w.rows + parts - 1) / parts;
}

void prefill_blas(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool, dequant_fn dequant) {
  init_blas_threads();
  const int64_t k = w.cols, n = w.rows;
  if (n >= 64 * pool.size()) {  // split weight rows: each is dequantized once
    pool.parallel_for(n, 16, [&](int64_t r0, int64_t r1, int) { blas_rows(w, x, m, y, r0, r1, dequant); });
  } else {  // few weight rows: split the input rows instead
    pool.parallel_for(
        m, 16, [&](int64_t i0, int64_t i1, int) { blas_rows(w, x + i0 * k, i1 - i0, y + i0 * n, 0, n, dequant); });
  }
}

void matmul_scalar(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool, bool gemm) {
  if (gemm) {
    prefill_blas(w, x, m, y, pool, &dequantize_row);
    return;
  }
  const block_q8_0* xq = nullptr;
  if (w.type == dtype::q8_0) {  // quantize x once per call, like ggml's vec_dot_q8_0_q8_0
    const int64_t nb = w.cols / q8_0_block;
    auto* q = static_cast<block_q8_0*>(thread_scratch(scratch_x, size_t(m * nb) * sizeof(block_q8_0)));
    for (int64_t i = 0; i < m; ++i) quantize_row_q8_0(x + i * w.cols, q + i * nb, w.cols);
    xq = q;
  }
  pool.parallel_for(w.rows, decode_grain(w, pool.size()), [&](int64_t r0, int64_t r1, int) {
    for_cache_tiles(w, r0, r1, [&](int64_t t0, int64_t t1) { decode_rows_scalar(w, x, xq, m, y, t0, t1); });
  });
}

void matmul_with_isa(isa level, const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool,
                     matmul_mode mode) {
  if (!isa_supported(level)) throw std::invalid_argument(std::string("matmul: this CPU lacks ") + isa_label(level));
  if (w.cols % block_elems(w.type) != 0)  // a row is whole blocks
    throw std::invalid_argument("matmul: " + std::string(to_string(w.type)) + " weights need cols % " +
                                std::to_string(block_elems(w.type)) + " == 0");
  if (m <= 0 || w.rows <= 0) return;
  if (w.cols <= 0) {  // empty dot products
    std::fill(y, y + m * w.rows, 0.0f);
    return;
  }
  // The panel kernels are both exact and the fastest this level has (docs/performance.md),
  // so both modes take them; `fastest` differs only on levels without panels.
  if (level == isa::avx512_bf16 && w.panels) return matmul_panels(w, matmul_input{x}, m, y, pool);
  if (is_dequantized_on_the_fly(w.type)) {
    // Integer kernels where AVX2 is (exact, batch-invariant); `fastest` with a large batch and
    // the scalar level dequantize tiles for the f32 paths (OpenBLAS GEMM on prefill).
    const bool big = mode == matmul_mode::fastest && m > decode_max_m(level, dtype::q8_0);
    if ((level == isa::avx2 || level == isa::avx512) && !big) return matmul_kquant_avx2(w, x, m, y, pool);
    return matmul_dequantized(level, w, x, m, y, pool, mode);
  }
  const bool gemm = mode == matmul_mode::fastest && m > decode_max_m(level, w.type);
  if (w.type == dtype::bf16 && !gemm) {
    // As the panel kernels and llama.cpp's BF16 dot: x rounded to bf16 for bf16 weights, on every
    // level, so that each product is exact and only the summation order differs between them.
    auto* xr = static_cast<float*>(thread_scratch(scratch_x_bf16, size_t(m * w.cols) * sizeof(float)));
    for (int64_t i = 0; i < m * w.cols; ++i) xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
    x = xr;
  }
  switch (level) {
    case isa::scalar: return matmul_scalar(w, x, m, y, pool, gemm);
    case isa::avx2: return matmul_avx2(w, x, m, y, pool, gemm);
    case isa::avx512: return matmul_avx512(w, x, m, y, pool, false, gemm);
    case isa::avx512_bf16: return matmul_avx512(w, x, m, y, pool, true, gemm);
  }
}

void form_row(const matmul_input& in, int64_t i, int64_t k, float* out) {
  const float* x = in.x + i * k;
  switch (in.op) {
    case input_op::none:
      if (out != x) std::copy(x, x + k, out);
      return;
    case input_op::rms_norm: return rms_norm(x, in.aux, out, 1, k, in.eps);
    case input_op::silu_mul: return silu_mul_fast(x, in.aux + i * k, out, k);
    case input_op::gelu_mul: return gelu_mul(x, in.aux + i * k, out, k);
  }
}

}  // namespace detail

void matmul(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool, matmul_mode mode) {
  detail::matmul_with_isa(detail::best_isa(), w, x, m, y, pool, mode);
}

void form_input(const matmul_input& in, int64_t m, int64_t k, float* out, thread_pool& pool) {
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) detail::form_row(in, i, k, out + i * k);
  };
  // Rows are formed on their own: the same values whatever the split.
  if (m * k < (int64_t(1) << 15) || pool.size() == 1) return rows(0, m);
  pool.parallel_for(m, 1, [&](int64_t r0, int64_t r1, int) { rows(r0, r1); });
}

bool fuses_input(const weight_view& w) {
  return detail::best_isa() == detail::isa::avx512_bf16 && w.panels && !detail::panels_read_x_in_place(w.type);
}

void matmul(const weight_view& w, const matmul_input& in, int64_t m, float* y, thread_pool& pool, matmul_mode mode) {
  if (in.op == input_op::none) return matmul(w, in.x, m, y, pool, mode);
  if (fuses_input(w) && m > 0 && w.rows > 0 && w.cols > 0) return detail::matmul_panels(w, in, m, y, pool);
  auto* x = static_cast<float*>(detail::thread_scratch(detail::scratch_input, size_t(m * w.cols) * sizeof(float)));
  form_input(in, m, w.cols, x, pool);
  matmul(w, x, m, y, pool, mode);
}

void matmul_group(std::span<const matmul_output> mats, const matmul_input& in, int64_t m, thread_pool& pool,
                  matmul_mode mode) {
  if (mats.empty()) return;
  const weight_view& w0 = *mats[0].w;
  const bool together = mats.size() > 1 && m > 0 && detail::best_isa() == detail::isa::avx512_bf16 && w0.cols > 0 &&
                        (in.op == input_op::none || fuses_input(w0)) &&
                        std::all_of(mats.begin(), mats.end(), [&](const matmul_output& o) {
                          return o.w->panels && o.w->type == w0.type && o.w->cols == w0.cols && o.w->rows > 0;
                        });
  if (!together) {
    for (const matmul_output& o : mats) matmul(*o.w, in, m, o.y, pool, mode);
    return;
  }
  detail::matmul_panels(mats, in, m, pool);
}

const char* isa_name() {
  switch (detail::best_isa()) {
    case detail::isa::scalar: return "scalar";
    case detail::isa::avx2: return "avx2";
    case detail::isa::avx512:
    case detail::isa::avx512_bf16: return "avx512";
  }
  return "?";
}

}  // namespace tandem::kernels::cpu

namespace tandem::kernels {

panel_memory::~panel_memory() {
  for (void* p : chunks_) std::free(p);
}

void* panel_memory::allocate(size_t bytes) {
  const size_t cap = (std::max<size_t>(bytes, 64) + 63) & ~size_t(63);
  void* p = std::aligned_alloc(64, cap);
  if (!p) throw std::bad_alloc();
  chunks_.push_back(p);
  bytes_ += cap;
  return p;
}

weight_view pack_for_matmul(const weight_view& w, panel_memory& store) {
  if (cpu::detail::best_isa() != cpu::detail::isa::avx512_bf16 || w.rows <= 0 || w.cols <= 0 ||
      w.cols % block_elems(w.type) != 0)
    return w;
  weight_view out = w;
  const int64_t np = (w.rows + cpu::detail::panel_rows - 1) / cpu::detail::panel_rows;
  void* dst = store.allocate(size_t(np * cpu::detail::panel_bytes(w.type, w.cols)));
  cpu::detail::pack_panels(w, dst);
  out.panels = dst;
  return out;
}

int64_t row_align(const weight_view& w) { return w.panels ? cpu::detail::panel_rows : 1; }

weight_view slice_rows(const weight_view& w, int64_t r0, int64_t r1) {
  if (r0 < 0 || r1 < r0 || r1 > w.rows || r0 % row_align(w) != 0)
    throw std::invalid_argument("slice_rows: rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ") of " +
                                std::to_string(w.rows) + " (aligned to " + std::to_string(row_align(w)) + ")");
  weight_view out = w;
  out.data = cpu::detail::row_ptr(w, r0);
  out.rows = r1 - r0;
  if (w.panels)
    out.panels =
        static_cast<const uint8_t*>(w.panels) + r0 / cpu::detail::panel_rows * cpu::detail::panel_bytes(w.type, w.cols);
  return out;
}

}  // namespace tandem::kernels
