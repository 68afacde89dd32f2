#include "kernels/cpu/cpu_features.h"

#include <cstdlib>
#include <string_view>

namespace tandem::kernels::cpu::detail {
namespace {

struct features {
  bool avx2, avx512, avx512_bf16;
};

const features& detected() {
  static const features f = [] {
    __builtin_cpu_init();
    features r{};
    r.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    r.avx512 = r.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    r.avx512_bf16 = r.avx512 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
    return r;
  }();
  return f;
}

}  // namespace

const char* isa_label(isa level) {
  switch (level) {
    case isa::scalar: return "scalar";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
    case isa::avx512_bf16: return "avx512_bf16";
  }
  return "?";
}

bool cpu_has(isa level) {
  switch (level) {
    case isa::scalar: return true;
    case isa::avx2: return detected().avx2;
    case isa::avx512: return detected().avx512;
    case isa::avx512_bf16: return detected().avx512_bf16;
  }
  return false;
}

isa best_isa() {
  // A name TANDEM_ISA does not know, or a level above the CPU's, leaves the detected one.
  static const isa level = [] {
    isa best = isa::scalar;
    for (isa l : {isa::avx2, isa::avx512, isa::avx512_bf16})
      if (cpu_has(l)) best = l;
    const char* env = std::getenv("TANDEM_ISA");
    if (!env) return best;
    for (isa l : {isa::scalar, isa::avx2, isa::avx512, isa::avx512_bf16})
      if (std::string_view(env) == isa_label(l) && int(l) <= int(best)) return l;
    return best;
  }();
  return level;
}

bool isa_supported(isa level) { return int(level) <= int(best_isa()); }

}  // namespace tandem::kernels::cpu::detail
