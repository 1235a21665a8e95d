#include "cuda/cublas_api.cuh"

#include <dlfcn.h>

#include <string>

#include "common.h"

// Set by CMakeLists.txt from the cuBLAS found at configure time (empty when unknown).
#ifndef DKI_CUBLAS_PATH
#define DKI_CUBLAS_PATH ""
#endif
#ifndef DKI_CUBLASLT_PATH
#define DKI_CUBLASLT_PATH ""
#endif
#define DKI_STRINGIFY2(x) #x
#define DKI_STRINGIFY(x) DKI_STRINGIFY2(x)

namespace dki {

namespace {

CublasApi load() {
  // libcublas needs libcublasLt; loading the configured one first (globally) satisfies that need
  // even where the loader would not find it by name.
  if (*DKI_CUBLASLT_PATH) dlopen(DKI_CUBLASLT_PATH, RTLD_NOW | RTLD_GLOBAL);
  std::string tried;
  void* lib = nullptr;
  for (const char* name : {DKI_CUBLAS_PATH, "libcublas.so." DKI_STRINGIFY(CUBLAS_VER_MAJOR)}) {
    if (!*name) continue;
    if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    tried += std::string(tried.empty() ? "" : "; ") + dlerror();
  }
  if (!lib) throw Error("cannot load cuBLAS (" + tried + ")");
  const auto sym = [&](const char* name) {
    void* p = dlsym(lib, name);
    if (!p) throw Error(std::string("cuBLAS has no ") + name);
    return p;
  };
  CublasApi a;
  a.create = reinterpret_cast<decltype(a.create)>(sym("cublasCreate_v2"));
  a.destroy = reinterpret_cast<decltype(a.destroy)>(sym("cublasDestroy_v2"));
  a.set_stream = reinterpret_cast<decltype(a.set_stream)>(sym("cublasSetStream_v2"));
  a.set_math_mode = reinterpret_cast<decltype(a.set_math_mode)>(sym("cublasSetMathMode"));
  a.set_pointer_mode = reinterpret_cast<decltype(a.set_pointer_mode)>(sym("cublasSetPointerMode_v2"));
  a.gemm_ex = reinterpret_cast<decltype(a.gemm_ex)>(sym("cublasGemmEx"));
  a.status_string = reinterpret_cast<decltype(a.status_string)>(sym("cublasGetStatusString"));
  return a;
}

}  // namespace

const CublasApi& cublas_api() {
  static const CublasApi api = load();  // a throw leaves it unset, to be tried again
  return api;
}

}  // namespace dki
