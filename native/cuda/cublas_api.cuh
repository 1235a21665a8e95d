// cuBLAS, loaded when the first CUDA context needs it rather than with the addon. Loading
// libcublasLt alone makes ~150 MB resident, which a CUDA build running on the CPU (no GPU, or
// device "cpu") should not pay; and an addon built with CUDA still loads, and runs on the CPU, on
// a machine where cuBLAS is missing.
#pragma once
#include <cublas_v2.h>

namespace dki {

struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
  cublasStatus_t (*set_pointer_mode)(cublasHandle_t, cublasPointerMode_t);
  // The C entry point (C++ also sees an inline overload with a cudaDataType compute type).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int m, int n, int k, const void* alpha, const void* A,
                            cudaDataType A_type, int lda, const void* B, cudaDataType B_type, int ldb, const void* beta, void* C,
                            cudaDataType C_type, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo);
  const char* (*status_string)(cublasStatus_t);
};

// The library's entry points, loaded on first use: the cuBLAS the addon was built against (its
// path recorded at configure time), else libcublas.so.<major> from the loader's search path.
// Throws an Error saying what was tried when neither loads.
const CublasApi& cublas_api();

}  // namespace dki
