// The CUDA backend as the rest of the engine sees it: plain C++, no CUDA headers, so context.h,
// model.h and the binding can name it. Compiled and linked only in DKI_CUDA builds (CMake with
// -DDKI_CUDA=ON); the node-gyp CPU build never includes this file.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv_block.h"
#include "kv_ops.h"

namespace dki {

class Model;
struct ModelConfig;
struct StageProfile;

// Devices the CUDA runtime sees; 0 with the reason in *why when there is none or no driver.
int cuda_device_count(std::string* why);
// "NVIDIA H100 80GB HBM3, 79.1 GiB, compute 9.0" for device `device`.
std::string cuda_device_name(int device);

// A model's weights in device memory, uploaded once. Q8_0 matrices stay Q8_0 on the device.
struct CudaWeights;
std::shared_ptr<CudaWeights> cuda_upload(const Model& m, int device);
uint64_t cuda_weight_bytes(const CudaWeights& w);
int cuda_weights_device(const CudaWeights& w);

// K/V blocks in device memory (kv_block.h's DeviceKV): fp32, the KVBlock layout. Host↔device
// copies go through the GPU's staging lane (a stream of its own and pinned chunks, one transfer
// at a time: device_kv.cu), so they overlap a forward pass running on the same GPU; the calling
// (worker) thread waits for its copy, never the JS thread.
int device_kv_device(const DeviceKV& d);
uint64_t device_kv_bytes(const DeviceKV& d);
// Bytes of freed K/V block buffers each GPU keeps for reuse (kv_block.h's set_kv_pool_bytes sets
// the host's cap and this one).
void cuda_set_pool_bytes(size_t bytes);
// Bytes GPU `device`'s pool keeps now (0 before its first block).
size_t cuda_pool_bytes(int device);
// b with its tensors in GPU `device`'s memory (b itself when they are there already).
std::shared_ptr<const KVBlock> cuda_block_to_device(std::shared_ptr<const KVBlock> b, int device);
// b with its tensors in host memory (b itself when they are there already).
std::shared_ptr<const KVBlock> cuda_block_to_host(std::shared_ptr<const KVBlock> b);
// serialize_block's payload (after the token ids) of a block in GPU memory, computed on its GPU
// and copied to out (payload_bytes long): the same bytes as from the block's host copy.
void cuda_encode_payload(const KVBlock& b, KVStorage storage, unsigned char* out);
// The inverse: the payload of a block shaped like `shape`, decoded into new memory on GPU
// `device`. Only the stored bytes are uploaded (a quarter of fp32 for int8), through pinned
// staging chunks; each chunk is fed to `hash` as it is copied there, so the caller verifies the
// block without a second read of the payload (and drops the result if it fails).
std::shared_ptr<const DeviceKV> cuda_decode_payload(const KVBlock& shape, KVStorage storage, const unsigned char* payload, int device,
                                                    Checksum64& hash);
// kv_ops.h's operations on a block in GPU memory (b.device set); results stay on that GPU.
// Arguments are checked by the kv_ops.h functions that call these.
std::shared_ptr<const KVBlock> cuda_scale_values(const KVBlock& b, float alpha);
// The largest |x| of a device block's keys (keys true) or values; +inf when any is NaN or ±inf.
float cuda_block_abs_max(const KVBlock& b, bool keys);
std::shared_ptr<const KVBlock> cuda_remap_positions(const KVBlock& b, int new_start, const std::vector<double>& inv_freq, bool interleaved);
std::shared_ptr<const KVBlock> cuda_slice_block(const KVBlock& b, int from, int to);
std::shared_ptr<const KVBlock> cuda_concat_blocks(const std::vector<std::shared_ptr<const KVBlock>>& blocks, int total,
                                                   const std::vector<double>& inv_freq, bool interleaved);

// One context's device state: its own K/V cache, the injected segments' K/V, scratch buffers,
// a stream and a cuBLAS handle. The Context (context.h) keeps the bookkeeping (tokens, n_past,
// positions) and calls this for the arithmetic.
class CudaForward {
 public:
  CudaForward(std::shared_ptr<const CudaWeights> weights, const Model& model, int max_tokens);
  ~CudaForward();
  CudaForward(const CudaForward&) = delete;
  CudaForward& operator=(const CudaForward&) = delete;

  // Takes the segments; their K/V go up when the next chunk runs (on its worker thread, not the
  // caller's). The same blocks set again (other α allowed) are not copied again.
  void set_segments(const std::vector<Segment>& segments);
  // Allocates the device memory for `tokens` of injected segments now, on the caller's thread:
  // an injection too large for the GPU fails (CUDA out of memory) before the caller spends host
  // memory on preparing it.
  void reserve_segments(int64_t tokens);

  // Runs T ≤ kMaxCudaChunk tokens at positions pos0.. after n_past cached ones. logits receives the
  // last row (rows == 1) or every row (rows == T), or nothing (rows == 0). When probe is not
  // null it receives each query head's attention entropy at the chunk's last token in layer
  // probe_layer.
  void eval_chunk(const int32_t* tokens, int T, int n_past, int pos0, int rows, float* logits, int probe_layer, float* probe);

  // With DKI_CUDA_PROFILE=1 at creation, each stage's GPU time over the one-token steps so far.
  StageProfile profile() const;

  // Copies cached tokens [from, to) into k and v, laid out as a KVBlock ([layer][kv_head][token][hd]).
  void export_kv(int from, int to, float* k, float* v) const;
  // The same, into new device memory: an exported block that never leaves the GPU.
  std::shared_ptr<const DeviceKV> export_kv_device(int from, int to) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dki
