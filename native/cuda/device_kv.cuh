// The definition behind kv_block.h's DeviceKV: a block's K and V in one GPU's memory.
#pragma once
#include "cuda/cuda_check.h"

namespace dki {

struct DeviceKV {
  int device = 0;
  size_t elements = 0;  // of K, and of V: [layer][kv_head][token][head_dim] fp32
  DeviceBuffer k, v;

  DeviceKV(int dev, size_t n) : device(dev), elements(n) {
    k.allocate(n * sizeof(float), "a K/V block's keys");
    v.allocate(n * sizeof(float), "a K/V block's values");
  }
};

}  // namespace dki
