// A model's weights in device memory (the definition behind cuda_backend.h's CudaWeights).
#pragma once
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/device_kernels.cuh"

namespace dki {

struct CudaWeights {
  struct Layer {
    const float *attn_norm = nullptr, *ffn_norm = nullptr;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // null without attention bias
    DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  int device = 0;
  std::vector<Layer> layers;
  DeviceMatrix embed, lm_head;
  const float* final_norm = nullptr;
  // Elements of the largest Q8_0 matrix: the F16 scratch a Q8_0 GEMM dequantises into.
  size_t max_q8_elements = 0;
  uint64_t bytes = 0;
  std::vector<DeviceBuffer> buffers;  // owns every pointer above
};

}  // namespace dki
