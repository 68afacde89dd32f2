// The CPU/CUDA dispatch point. Runs everywhere; the CUDA-vs-CPU comparisons skip visibly
// ("no CUDA device: ...") where no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#ifdef TANDEM_HAVE_CUDA
#include "kernels/cuda/launchers.h"
#endif

namespace tk = tandem::kernels;
using tk::backend_kind;

namespace {

int device_count() {
#ifdef TANDEM_HAVE_CUDA
  return tk::cuda::cuda_device_count();
#else
  return 0;
#endif
}

std::string no_device_reason() {
#ifdef TANDEM_HAVE_CUDA
  return tk::cuda::cuda_unavailable_reason();
#else
  return "tandem was built without CUDA";
#endif
}

}  // namespace

TEST(Backend, ToString) {
  EXPECT_EQ(tk::to_string(backend_kind::cpu), "cpu");
  EXPECT_EQ(tk::to_string(backend_kind::cuda), "cuda");
}

TEST(Backend, CpuIsFirstDevice) {
  const auto devs = tk::list_devices();
  ASSERT_FALSE(devs.empty());
  EXPECT_EQ(devs[0].kind, backend_kind::cpu);
  EXPECT_EQ(devs[0].index, 0);
  EXPECT_FALSE(devs[0].name.empty());
  EXPECT_GT(devs[0].memory_bytes, 0u);
  EXPECT_EQ(devs.size(), size_t(1 + device_count()));
  for (size_t i = 1; i < devs.size(); ++i) {
    EXPECT_EQ(devs[i].kind, backend_kind::cuda);
    EXPECT_EQ(devs[i].index, int(i - 1));
  }
}

TEST(Backend, CudaCompiledMatchesBuild) {
#ifdef TANDEM_HAVE_CUDA
  EXPECT_TRUE(tk::cuda_compiled());
#else
  EXPECT_FALSE(tk::cuda_compiled());
#endif
}

TEST(Backend, CpuDispatchMatchesReference) {
  std::vector<float> x{1, -2, 3, 0.5f}, w{0.5f, 1, 2, -1}, y(4), ref(4);
  tk::rms_norm(backend_kind::cpu, x.data(), w.data(), y.data(), 2, 2, 1e-6f);
  tk::cpu::rms_norm(x.data(), w.data(), ref.data(), 2, 2, 1e-6f);
  EXPECT_EQ(y, ref);
}

// Without a GPU the CUDA backend must degrade to a clean "0 devices" and exceptions.
TEST(Backend, NoGpuDispatchThrows) {
  if (device_count() > 0) GTEST_SKIP() << "a CUDA device is present: no-GPU behaviour untestable";
  EXPECT_EQ(device_count(), 0);
  EXPECT_FALSE(no_device_reason().empty());
  std::printf("cuda unavailable: %s\n", no_device_reason().c_str());
  float x = 1, y = 1;
  int32_t pos = 0;
  // Each op must throw runtime_error (never crash); the message names the cause.
  auto expect_clear_error = [](auto&& op) {
    try {
      op();
      ADD_FAILURE() << "cuda dispatch without a GPU did not throw";
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
#ifdef TANDEM_HAVE_CUDA
      EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
#else
      EXPECT_EQ(msg, "tandem was built without CUDA");
#endif
    }
  };
  expect_clear_error([&] { tk::rms_norm(backend_kind::cuda, &x, &x, &y, 1, 1, 1e-6f); });
  expect_clear_error([&] { tk::silu_mul(backend_kind::cuda, &x, &x, &y, 1); });
  expect_clear_error([&] { tk::add_inplace(backend_kind::cuda, &x, &y, 1); });
  expect_clear_error([&] { tk::rope(backend_kind::cuda, &x, &pos, 1, 1, 2, 10000.0f); });
}

#ifdef TANDEM_HAVE_CUDA
namespace {

namespace cu = tk::cuda;

// Test-local owner of a device copy of a host vector.
template <class T>
struct device_vec {
  size_t n;
  T* p;
  explicit device_vec(const std::vector<T>& h) : n(h.size()), p(static_cast<T*>(cu::device_alloc(n * sizeof(T)))) {
    cu::copy_to_device(p, h.data(), n * sizeof(T));
  }
  ~device_vec() { cu::device_free(p); }
  device_vec(const device_vec&) = delete;
  device_vec& operator=(const device_vec&) = delete;
  std::vector<T> to_host() const {
    std::vector<T> h(n);
    cu::copy_to_host(h.data(), p, n * sizeof(T));
    return h;
  }
};

std::vector<float> random_vec(size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& f : v) f = d(rng);
  return v;
}

// 1e-5 relative, floored at magnitude 1: outputs are O(1), and RoPE's a*c - b*s may cancel to
// near zero where the GPU's fused multiply-add rounds differently from the CPU.
void expect_close(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * std::max(1.0f, std::fabs(want[i]))) << "at " << i;
}

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cu::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cu::cuda_unavailable_reason();
  }
  void TearDown() override {
    if (!IsSkipped()) cu::device_synchronize("test teardown");
  }
};

}  // namespace

TEST_F(CudaVsCpu, RmsNorm) {
  for (int64_t dim : {1, 5, 31, 1000, 4096, 5120}) {
    const int64_t rows = 7;
    const auto x = random_vec(size_t(rows * dim), -3, 3, 1), w = random_vec(size_t(dim), -2, 2, 2);
    std::vector<float> ref(x.size());
    tk::cpu::rms_norm(x.data(), w.data(), ref.data(), rows, dim, 1e-5f);
    device_vec<float> dx(x), dw(w), dy(ref);
    tk::rms_norm(backend_kind::cuda, dx.p, dw.p, dy.p, rows, dim, 1e-5f);
    SCOPED_TRACE("dim " + std::to_string(dim));
    expect_close(dy.to_host(), ref);
  }
}

TEST_F(CudaVsCpu, SiluMul) {
  const size_t n = 1'000'003;  // not a multiple of the block size
  const auto g = random_vec(n, -20, 20, 3), u = random_vec(n, -2, 2, 4);
  std::vector<float> ref(n);
  tk::cpu::silu_mul(g.data(), u.data(), ref.data(), int64_t(n));
  device_vec<float> dg(g), du(u), dout(ref);
  tk::silu_mul(backend_kind::cuda, dg.p, du.p, dout.p, int64_t(n));
  expect_close(dout.to_host(), ref);
}

TEST_F(CudaVsCpu, AddInplace) {
  const size_t n = 20'000'001;  // more than max grid * block: exercises the grid-stride loop
  auto x = random_vec(n, -5, 5, 5);
  const auto y = random_vec(n, -5, 5, 6);
  device_vec<float> dx(x), dy(y);
  tk::cpu::add_inplace(x.data(), y.data(), int64_t(n));
  tk::add_inplace(backend_kind::cuda, dx.p, dy.p, int64_t(n));
  expect_close(dx.to_host(), x);
}

TEST_F(CudaVsCpu, Rope) {
  const std::vector<int32_t> pos{0, 1, 17, 511, 4095, 32767};
  for (int64_t head_dim : {64, 128, 6}) {
    for (float base : {10000.0f, 500000.0f}) {
      const int64_t n_tokens = int64_t(pos.size()), n_heads = 3;
      auto x = random_vec(size_t(n_tokens * n_heads * head_dim), -2, 2, 7);
      device_vec<float> dx(x);
      device_vec<int32_t> dpos(pos);
      tk::cpu::rope(x.data(), pos.data(), n_tokens, n_heads, head_dim, base);
      tk::rope(backend_kind::cuda, dx.p, dpos.p, n_tokens, n_heads, head_dim, base);
      SCOPED_TRACE("head_dim " + std::to_string(head_dim) + " base " + std::to_string(base));
      expect_close(dx.to_host(), x);
    }
  }
}

TEST_F(CudaVsCpu, ZeroSizesAreNoOps) {
  tk::rms_norm(backend_kind::cuda, nullptr, nullptr, nullptr, 0, 16, 1e-5f);
  tk::silu_mul(backend_kind::cuda, nullptr, nullptr, nullptr, 0);
  tk::add_inplace(backend_kind::cuda, nullptr, nullptr, 0);
  tk::rope(backend_kind::cuda, nullptr, nullptr, 0, 4, 64, 10000.0f);
}

// Device errors must reach the caller as exceptions, with the CUDA message.
TEST_F(CudaVsCpu, DeviceErrorsThrow) {
  EXPECT_THROW(cu::device_alloc(size_t(1) << 60), std::runtime_error);
  EXPECT_THROW(cu::cuda_device_name(cu::cuda_device_count()), std::runtime_error);
  // Neither failure is sticky: the device stays usable and later launches do not re-report it.
  device_vec<float> x(std::vector<float>{1, 2}), y(std::vector<float>{3, 4});
  EXPECT_NO_THROW(tk::add_inplace(backend_kind::cuda, x.p, y.p, 2));
  EXPECT_NO_THROW(cu::device_synchronize("after failed calls"));
  EXPECT_EQ(x.to_host(), (std::vector<float>{4, 6}));
}

TEST_F(CudaVsCpu, DeviceInfo) {
  const auto devs = tk::list_devices();
  ASSERT_EQ(devs.size(), size_t(1 + cu::cuda_device_count()));
  EXPECT_FALSE(devs[1].name.empty());
  EXPECT_GT(devs[1].memory_bytes, size_t(1) << 30);
}
#else
TEST(CudaVsCpu, Skipped) { GTEST_SKIP() << "no CUDA device: tandem was built without CUDA"; }
#endif
