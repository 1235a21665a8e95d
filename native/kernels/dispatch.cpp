// Picks the kernel table at run time from what the CPU reports, or what DKI_SIMD asks for.
#include <atomic>
#include <cstdlib>

#include "kernels.h"

namespace dki {
namespace {

bool cpu_has_avx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

const Kernels* pick(const std::string& name) {
  if (name == "scalar") return &kernels_scalar();
  if (name == "avx2") {
    if (!cpu_has_avx2()) throw Error("SIMD path \"avx2\" is not supported by this CPU (needs AVX2, FMA and F16C)");
    return &kernels_avx2();
  }
  if (name == "auto" || name.empty()) return cpu_has_avx2() ? &kernels_avx2() : &kernels_scalar();
  throw Error("unknown SIMD path \"" + name + "\" (expected auto, scalar or avx2)");
}

std::atomic<const Kernels*>& active() {
  static std::atomic<const Kernels*> k{[] {
    const char* env = std::getenv("DKI_SIMD");
    return pick(env ? env : "auto");
  }()};
  return k;
}

}  // namespace

const Kernels& kernels() { return *active().load(std::memory_order_relaxed); }

void set_simd(const std::string& name) { active().store(pick(name)); }

std::vector<std::string> available_simd() {
  std::vector<std::string> out{"scalar"};
  if (cpu_has_avx2()) out.push_back("avx2");
  return out;
}

}  // namespace dki
