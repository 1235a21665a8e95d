// A Llama-family decoder's configuration and weights. Weights stay in the memory-mapped files
// (F32/F16/BF16, row-major [out, in] as Hugging Face stores them); only the small 1-D tensors
// (norms, biases) are copied to fp32.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "mapped_file.h"

namespace dki {

// The largest shapes the engine takes: far above any released model (Llama 3 405B has hidden
// 16384, MLP 53248, 128 heads of 128), and small enough that every product the forward pass
// forms fits an int. JavaScript gets them as `limits` (hf-config.ts checks files against the
// same numbers before any work sized by them).
namespace limits {
constexpr int kVocab = 1 << 24, kHidden = 1 << 17, kIntermediate = 1 << 19;
constexpr int kLayers = 1024, kHeads = 1024, kHeadDim = 1024;
constexpr int kHeadsTimesHeadDim = 1 << 18;
}  // namespace limits

struct ModelConfig {
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  // llama3 rope scaling; factor 0 = none
  double rope_factor = 0.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0, rope_original_max_pos = 8192.0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  // Rotary pairs (2i, 2i+1) instead of Hugging Face's (i, i+hd/2): llama GGUF files store q/k
  // rows permuted for this layout, and the engine uses them as they are.
  bool rope_interleaved = false;
};

// Where one tensor lives, as the loader (TypeScript) read it from the file header. Every field
// is checked again here against the mapped file before use.
struct TensorSpec {
  std::string name;
  std::string file;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

// Quantises n floats (n a multiple of 32) into llama.cpp block_q8_0 layout, exactly as its
// quantize_row_q8_0_ref: d = max|x| / 127 (stored as fp16), q = round(x / d).
void quantize_row_q8_0(const float* x, int n, unsigned char* out);

// A model's weights in GPU memory (cuda/cuda_backend.h); only DKI_CUDA builds ever make one.
struct CudaWeights;

struct Matrix {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int rows = 0, cols = 0;
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> bq, bk, bv;  // empty without attention bias
  Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
};

class Model {
 public:
  // quantize = DType::Q8_0 converts every matrix to Q8_0 at load time (then the files are
  // unmapped); any other value uses the weights as stored. check_tensors reads every weight
  // once and refuses the model at the first NaN/inf (norms and biases, copied at load, are
  // always checked; the matrices only on request, as reading them all costs a pass over the file).
  Model(const ModelConfig& cfg, const std::vector<TensorSpec>& tensors, DType quantize = DType::F32, bool check_tensors = false);

  const ModelConfig& config() const { return cfg_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const Matrix& embeddings() const { return embed_; }
  const Matrix& lm_head() const { return cfg_.tie_word_embeddings ? embed_ : lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  // Rotary inverse frequencies, headDim/2 of them (llama3 scaling already applied).
  const std::vector<double>& inv_freq() const { return inv_freq_; }

  // Identifies the weights: K/V blocks computed by another model are refused.
  uint64_t fingerprint() const { return fingerprint_; }
  uint64_t param_count() const { return param_count_; }
  uint64_t weight_bytes() const { return weight_bytes_; }

  // The weights' device copy when the model runs on a GPU (null on the CPU). Contexts of such
  // a model keep their K/V on that device and run every token there.
  const std::shared_ptr<const CudaWeights>& device_weights() const { return device_weights_; }
  void set_device_weights(std::shared_ptr<const CudaWeights> w) { device_weights_ = std::move(w); }

 private:
  const TensorSpec& find(const std::string& name) const;
  // The mapped file at `path`, or null.
  const MappedFile* mapped(const std::string& path) const;
  Matrix matrix(const std::string& name, int rows, int cols);
  void quantize_all_q8_0();
  // Checksums of every tensor's bytes, in pieces of up to 8 MiB, in spec order.
  std::vector<uint64_t> tensor_digests() const;
  std::vector<float> vector_f32(const std::string& name, int n);
  const unsigned char* checked_data(const TensorSpec& t, const std::vector<int64_t>& shape);
  // Throws for a tensor the config leaves unread: config and weights disagree.
  void refuse_unused() const;
  // Throws naming the first tensor (in file order) and element holding NaN or ±inf.
  void refuse_non_finite() const;

  ModelConfig cfg_;
  std::vector<TensorSpec> specs_;
  std::vector<bool> used_;  // per spec: read by the loader (checked_data); for refuse_unused
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<std::vector<unsigned char>> owned_;  // quantised copies, when quantising at load
  std::vector<LayerWeights> layers_;
  Matrix embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<double> inv_freq_;
  uint64_t fingerprint_ = 0;
  uint64_t param_count_ = 0;
  uint64_t weight_bytes_ = 0;
  std::shared_ptr<const CudaWeights> device_weights_;
};

}  // namespace dki
