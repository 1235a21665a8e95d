// A K/V block: every layer's keys and values for a run of tokens, the unit of DKI memory.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace dki {

struct KVBlock {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0, n_tokens = 0;
  // Position of the first token when its keys were rotated (negative for preference blocks
  // placed before the prompt).
  int start_pos = 0;
  uint64_t fingerprint = 0;  // of the model that computed it
  std::vector<int32_t> tokens;
  // [layer][kv_head][token][head_dim], fp32
  std::vector<float> k, v;

  size_t layer_stride() const { return size_t(n_kv_heads) * n_tokens * head_dim; }
  const float* k_layer(int l) const { return k.data() + l * layer_stride(); }
  const float* v_layer(int l) const { return v.data() + l * layer_stride(); }
};

// Rotates one head vector by the angles whose cos/sin are given (hd/2 of each). Hugging Face
// pairs dimension i with i + hd/2 ("rotate half"); interleaved layouts pair 2i with 2i+1.
inline void rotate_pairs(float* v, int hd, const float* c, const float* s, bool interleaved) {
  const int half = hd / 2;
  const int stride = interleaved ? 1 : half;  // distance between the two members of a pair
  for (int i = 0; i < half; i++) {
    const int a = interleaved ? 2 * i : i;
    const float x = v[a], y = v[a + stride];
    v[a] = x * c[i] - y * s[i];
    v[a + stride] = y * c[i] + x * s[i];
  }
}

// A block injected into attention: scaling "value" multiplies its V by alpha (keys untouched);
// "logit" adds ln(alpha) to its attention scores instead.
struct Segment {
  std::shared_ptr<const KVBlock> block;
  float alpha = 1.f;
  bool logit_scaling = false;
};

}  // namespace dki
