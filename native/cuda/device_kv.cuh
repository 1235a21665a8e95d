// The definition behind kv_block.h's DeviceKV: a block's K and V in one GPU's memory.
#pragma once
#include "cuda/cuda_check.h"

namespace dki {

// GPU `device`'s pool of freed K/V block buffers (buffer_pool.h), capped as the host's is:
// set_kv_pool_bytes sets both (cuda_set_pool_bytes). The caller is on that device. A freed
// block's memory goes straight back to the pool, with no stream to wait for: every function that
// reads or writes a block (device_kv.cu, the forward pass's export and segment upload) waits for
// its stream before it returns, so nothing is ever in flight on a block nobody holds.
BufferPool& device_block_pool(int device);

// `rows` rows of `width` bytes, contiguous at `host`, into rows `pitch` bytes apart at `dst` in
// GPU `device`'s memory, through that GPU's staging lane; returns once they are there.
void upload_rows(int device, const void* host, size_t width, size_t rows, void* dst, size_t pitch);

struct DeviceKV {
  int device = 0;
  size_t elements = 0;  // of K, and of V: [layer][kv_head][token][head_dim] fp32
  DeviceBuffer k, v;

  DeviceKV(int dev, size_t n) : device(dev), elements(n) {
    DKI_CUDA_CHECK(cudaSetDevice(dev));  // cudaMalloc allocates on the current device
    k.allocate_pooled(n * sizeof(float), "a K/V block's keys", device_block_pool(dev));
    v.allocate_pooled(n * sizeof(float), "a K/V block's values", device_block_pool(dev));
  }
};

}  // namespace dki
