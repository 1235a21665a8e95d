// The CUDA backend as the rest of the engine sees it: plain C++, no CUDA headers, so context.h,
// model.h and the binding can name it. Compiled and linked only in DKI_CUDA builds (CMake with
// -DDKI_CUDA=ON); the node-gyp CPU build never includes this file.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv_block.h"

namespace dki {

class Model;
struct ModelConfig;

// Devices the CUDA runtime sees; 0 with the reason in *why when there is none or no driver.
int cuda_device_count(std::string* why);
// "NVIDIA H100 80GB HBM3, 79.1 GiB, compute 9.0" for device `device`.
std::string cuda_device_name(int device);

// A model's weights in device memory, uploaded once. Q8_0 matrices stay Q8_0 on the device.
struct CudaWeights;
std::shared_ptr<CudaWeights> cuda_upload(const Model& m, int device);
uint64_t cuda_weight_bytes(const CudaWeights& w);

// One context's device state: its own K/V cache, the injected segments' K/V, scratch buffers,
// a stream and a cuBLAS handle. The Context (context.h) keeps the bookkeeping (tokens, n_past,
// positions) and calls this for the arithmetic.
class CudaForward {
 public:
  CudaForward(std::shared_ptr<const CudaWeights> weights, const Model& model, int max_tokens);
  ~CudaForward();
  CudaForward(const CudaForward&) = delete;
  CudaForward& operator=(const CudaForward&) = delete;

  // Uploads the segments' K/V; the same blocks set again (other α allowed) are not copied again.
  void set_segments(const std::vector<Segment>& segments);

  // Runs T ≤ kMaxChunk tokens at positions pos0.. after n_past cached ones. logits receives the
  // last row (rows == 1) or every row (rows == T), or nothing (rows == 0). When probe is not
  // null it receives each query head's attention entropy at the chunk's last token in layer
  // probe_layer.
  void eval_chunk(const int32_t* tokens, int T, int n_past, int pos0, int rows, float* logits, int probe_layer, float* probe);

  // Copies cached tokens [from, to) into k and v, laid out as a KVBlock ([layer][kv_head][token][hd]).
  void export_kv(int from, int to, float* k, float* v) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dki
