#include "model.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "checksum.h"
#include "resources.h"
#include "threadpool.h"

namespace dki {

namespace {

void check_config(const ModelConfig& c) {
  auto in_range = [](int v, int max, const char* name) {
    if (v <= 0 || v > max)
      throw Error(std::string("model config: ") + name + " must be from 1 to " + std::to_string(max) + ", got " + std::to_string(v));
  };
  in_range(c.vocab_size, limits::kVocab, "vocab_size");
  in_range(c.hidden_size, limits::kHidden, "hidden_size");
  in_range(c.intermediate_size, limits::kIntermediate, "intermediate_size");
  in_range(c.n_layers, limits::kLayers, "num_hidden_layers");
  in_range(c.n_heads, limits::kHeads, "num_attention_heads");
  in_range(c.n_kv_heads, limits::kHeads, "num_key_value_heads");
  in_range(c.head_dim, limits::kHeadDim, "head_dim");
  if (int64_t(c.n_heads) * c.head_dim > limits::kHeadsTimesHeadDim)
    throw Error("model config: num_attention_heads × head_dim = " + std::to_string(int64_t(c.n_heads) * c.head_dim) + " is over " +
                std::to_string(limits::kHeadsTimesHeadDim));
  if (c.n_heads % c.n_kv_heads != 0) throw Error("model config: num_attention_heads is not a multiple of num_key_value_heads");
  if (c.head_dim % 2 != 0) throw Error("model config: head_dim must be even for rotary embeddings");
  if (!(c.rope_theta > 0)) throw Error("model config: rope_theta must be positive");
  if (!(c.rms_norm_eps > 0)) throw Error("model config: rms_norm_eps must be positive");
}

// FNV-1a over 64-bit words: fast enough to fingerprint samples of every tensor at load time.
struct Hasher {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  }
  template <typename T>
  void value(const T& v) { bytes(&v, sizeof v); }
};

}  // namespace

// Tensors are hashed in pieces of this size, so that threads share a large tensor.
static constexpr uint64_t kDigestPiece = 8 << 20;

static uint64_t pieces_of(const TensorSpec& t) { return t.nbytes == 0 ? 0 : (t.nbytes + kDigestPiece - 1) / kDigestPiece; }

std::vector<uint64_t> Model::tensor_digests() const {
  struct Piece {
    const unsigned char* data;
    uint64_t n;
  };
  std::vector<Piece> pieces;
  for (const auto& t : specs_) {
    const MappedFile* file = mapped(t.file);
    // Every tensor the forward pass uses was checked against its file already; one that is not
    // used and lies outside its file is hashed as empty.
    const bool inside = file && t.offset <= file->size() && t.nbytes <= file->size() - t.offset;
    for (uint64_t k = 0; k < pieces_of(t); k++) {
      const uint64_t at = k * kDigestPiece;
      pieces.push_back(inside ? Piece{file->data() + t.offset + at, std::min(kDigestPiece, t.nbytes - at)} : Piece{nullptr, 0});
    }
  }
  std::vector<uint64_t> digests(pieces.size());
  thread_pool().parallel_for(int(pieces.size()), 1, [&](int a, int b) {
    for (int i = a; i < b; i++) {
      Checksum64 c;
      c.update(pieces[i].data, pieces[i].n);
      digests[i] = c.digest();
    }
  });
  return digests;
}

const MappedFile* Model::mapped(const std::string& path) const {
  for (const auto& f : files_)
    if (f->path() == path) return f.get();
  return nullptr;
}

const TensorSpec& Model::find(const std::string& name) const {
  for (const auto& t : specs_)
    if (t.name == name) return t;
  throw Error("tensor \"" + name + "\" is missing");
}

const unsigned char* Model::checked_data(const TensorSpec& t, const std::vector<int64_t>& shape) {
  if (t.shape != shape) {
    std::string got, want;
    for (auto d : t.shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
    for (auto d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    throw Error(t.file + ": tensor \"" + t.name + "\" has shape [" + got + "], expected [" + want + "]");
  }
  uint64_t elements = 1;
  for (auto d : shape) elements *= uint64_t(d);
  if (t.dtype == DType::Q8_0 && shape.back() % kQ8Block != 0)
    throw Error(t.file + ": tensor \"" + t.name + "\" is Q8_0 but its rows of " + std::to_string(shape.back()) + " are not a multiple of 32");
  if (t.nbytes != dtype_bytes(t.dtype, elements))
    throw Error(t.file + ": tensor \"" + t.name + "\" has " + std::to_string(t.nbytes) + " bytes, its shape and dtype need " +
                std::to_string(dtype_bytes(t.dtype, elements)));
  const MappedFile* file = mapped(t.file);
  if (!file) throw Error("internal: file " + t.file + " not mapped");
  if (t.offset > file->size() || t.nbytes > file->size() - t.offset)
    throw Error(t.file + ": tensor \"" + t.name + "\" at bytes " + std::to_string(t.offset) + "+" + std::to_string(t.nbytes) +
                " runs past the end of the " + std::to_string(file->size()) + "-byte file");
  const uint64_t align = t.dtype == DType::F32 ? 4 : t.dtype == DType::Q8_0 ? 1 : 2;
  if (t.offset % align != 0)
    throw Error(t.file + ": tensor \"" + t.name + "\" data is not aligned to its element size");
  used_[size_t(&t - specs_.data())] = true;
  param_count_ += elements;
  weight_bytes_ += t.nbytes;
  return file->data() + t.offset;
}

Matrix Model::matrix(const std::string& name, int rows, int cols) {
  const TensorSpec& t = find(name);
  Matrix m;
  m.data = checked_data(t, {rows, cols});
  m.dtype = t.dtype;
  m.rows = rows;
  m.cols = cols;
  return m;
}

static std::string non_finite_tensor(const TensorSpec& t, uint64_t index, float value) {
  return t.file + ": tensor \"" + t.name + "\" holds " + (std::isnan(value) ? "NaN" : value > 0 ? "+inf" : "-inf") + " at element " +
         std::to_string(index) + "; the weights are damaged (or were saved from a diverged run)";
}

std::vector<float> Model::vector_f32(const std::string& name, int n) {
  const TensorSpec& t = find(name);
  const unsigned char* p = checked_data(t, {n});
  std::vector<float> out(n);
  for (int i = 0; i < n; i++) out[i] = load_as_f32(p, t.dtype, i);
  // Norm weights and biases are copied anyway, and one NaN among them turns every logit NaN.
  const int64_t bad = first_non_finite(out.data(), out.size());
  if (bad >= 0) throw Error(non_finite_tensor(t, uint64_t(bad), out[size_t(bad)]));
  return out;
}

void Model::refuse_non_finite() const {
  // Pieces of up to 4M elements (a multiple of Q8_0's 32) so that threads share a large tensor;
  // the first bad element of the first bad piece, in spec order, is the one reported.
  constexpr uint64_t kPiece = uint64_t(1) << 22;
  struct Piece {
    size_t spec;
    uint64_t first, n;
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < specs_.size(); i++) {
    if (!used_[i]) continue;
    uint64_t elements = 1;
    for (auto d : specs_[i].shape) elements *= uint64_t(d);
    for (uint64_t at = 0; at < elements; at += kPiece) pieces.push_back({i, at, std::min(kPiece, elements - at)});
  }
  std::vector<int64_t> found(pieces.size(), -1);
  thread_pool().parallel_for(int(pieces.size()), 1, [&](int a, int b) {
    for (int k = a; k < b; k++) {
      const Piece& pc = pieces[k];
      const TensorSpec& t = specs_[pc.spec];
      const unsigned char* data = mapped(t.file)->data() + t.offset + dtype_bytes(t.dtype, pc.first);
      found[k] = first_non_finite(data, t.dtype, pc.n);
    }
  });
  for (size_t k = 0; k < pieces.size(); k++) {
    if (found[k] < 0) continue;
    const TensorSpec& t = specs_[pieces[k].spec];
    const uint64_t index = pieces[k].first + uint64_t(found[k]);
    throw Error(non_finite_tensor(t, index, load_as_f32(mapped(t.file)->data() + t.offset, t.dtype, index)));
  }
}

void quantize_row_q8_0(const float* x, int n, unsigned char* out) {
  for (int b = 0; b < n / kQ8Block; b++) {
    const float* xb = x + b * kQ8Block;
    float amax = 0.f;
    for (int i = 0; i < kQ8Block; i++) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    unsigned char* ob = out + b * kQ8BlockBytes;
    const uint16_t dh = f32_to_f16(d);
    std::memcpy(ob, &dh, 2);
    for (int i = 0; i < kQ8Block; i++) ob[2 + i] = static_cast<unsigned char>(int8_t(std::lround(xb[i] * id)));
  }
}

void Model::quantize_all_q8_0() {
  std::vector<Matrix*> all{&embed_};
  if (!cfg_.tie_word_embeddings) all.push_back(&lm_head_);
  for (auto& L : layers_)
    for (Matrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) all.push_back(m);
  auto bytes_of = [&all] {
    uint64_t n = 0;
    for (const Matrix* m : all) n += dtype_bytes(m->dtype, uint64_t(m->rows) * m->cols);
    return n;
  };
  const uint64_t mapped_bytes = bytes_of();
  // A matrix already in its final form is used where it is mapped: the files then stay open.
  bool uses_mapped = false;
  for (Matrix* m : all) {
    if (m->dtype == DType::Q8_0) {
      uses_mapped = true;
      continue;
    }
    if (m->cols % kQ8Block != 0) {
      // Rows that do not split into 32-blocks become F16, as llama.cpp's converter does, so a
      // folder quantised here and its Q8_0 GGUF conversion hold the same weights.
      if (m->dtype == DType::F16) {
        uses_mapped = true;
        continue;
      }
      std::vector<unsigned char> h(size_t(m->rows) * m->cols * 2);
      uint16_t* out = reinterpret_cast<uint16_t*>(h.data());
      for (size_t i = 0; i < size_t(m->rows) * m->cols; i++) out[i] = f32_to_f16(load_as_f32(m->data, m->dtype, i));
      owned_.push_back(std::move(h));
      m->data = owned_.back().data();
      m->dtype = DType::F16;
      continue;
    }
    std::vector<unsigned char> q(size_t(m->rows) * (m->cols / kQ8Block) * kQ8BlockBytes);
    const size_t row_bytes = size_t(m->cols / kQ8Block) * kQ8BlockBytes;
    thread_pool().parallel_for(m->rows, 1, [&](int r0, int r1) {
      std::vector<float> row(m->cols);
      for (int r = r0; r < r1; r++) {
        for (int i = 0; i < m->cols; i++) row[i] = load_as_f32(m->data, m->dtype, size_t(r) * m->cols + i);
        quantize_row_q8_0(row.data(), m->cols, q.data() + r * row_bytes);
      }
    });
    owned_.push_back(std::move(q));
    m->data = owned_.back().data();
    m->dtype = DType::Q8_0;
  }
  weight_bytes_ = weight_bytes_ - mapped_bytes + bytes_of();
  // Norms and biases were copied at load; with every matrix in owned_, nothing reads the files.
  if (!uses_mapped) files_.clear();
}

void Model::refuse_unused() const {
  for (size_t i = 0; i < specs_.size(); i++) {
    const std::string& name = specs_[i].name;
    if (used_[i]) continue;
    // Left out by transformers too: old Llama checkpoints' rotary buffers, a tied model's copy of
    // the embeddings.
    const std::string inv_freq = "rotary_emb.inv_freq";
    if (name.size() >= inv_freq.size() && name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0) continue;
    if (name == "lm_head.weight" && cfg_.tie_word_embeddings) continue;
    throw Error(specs_[i].file + ": tensor \"" + name + "\" is not used by a model of this config (" + std::to_string(cfg_.n_layers) +
                " layers, attention biases " + (cfg_.attention_bias ? "on" : "off") + "): config and weights disagree");
  }
}

Model::Model(const ModelConfig& cfg, const std::vector<TensorSpec>& tensors, DType quantize, bool check_tensors)
    : cfg_(cfg), specs_(tensors), used_(tensors.size()) {
  check_config(cfg_);
  std::map<std::string, bool> opened;
  for (const auto& t : specs_) {
    if (!opened[t.file]) {
      files_.push_back(std::make_unique<MappedFile>(t.file));
      opened[t.file] = true;
    }
  }
  const int D = cfg_.hidden_size, F = cfg_.intermediate_size;
  const int q_dim = cfg_.n_heads * cfg_.head_dim, kv_dim = cfg_.n_kv_heads * cfg_.head_dim;
  embed_ = matrix("model.embed_tokens.weight", cfg_.vocab_size, D);
  layers_.resize(cfg_.n_layers);
  for (int l = 0; l < cfg_.n_layers; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = layers_[l];
    L.attn_norm = vector_f32(p + "input_layernorm.weight", D);
    L.ffn_norm = vector_f32(p + "post_attention_layernorm.weight", D);
    L.wq = matrix(p + "self_attn.q_proj.weight", q_dim, D);
    L.wk = matrix(p + "self_attn.k_proj.weight", kv_dim, D);
    L.wv = matrix(p + "self_attn.v_proj.weight", kv_dim, D);
    L.wo = matrix(p + "self_attn.o_proj.weight", D, q_dim);
    if (cfg_.attention_bias) {
      L.bq = vector_f32(p + "self_attn.q_proj.bias", q_dim);
      L.bk = vector_f32(p + "self_attn.k_proj.bias", kv_dim);
      L.bv = vector_f32(p + "self_attn.v_proj.bias", kv_dim);
    }
    L.w_gate = matrix(p + "mlp.gate_proj.weight", F, D);
    L.w_up = matrix(p + "mlp.up_proj.weight", F, D);
    L.w_down = matrix(p + "mlp.down_proj.weight", D, F);
  }
  final_norm_ = vector_f32("model.norm.weight", D);
  if (!cfg_.tie_word_embeddings) lm_head_ = matrix("lm_head.weight", cfg_.vocab_size, D);
  refuse_unused();
  // Before quantising: a NaN weight would still be NaN after it, but named less usefully.
  if (check_tensors) refuse_non_finite();

  // Rotary frequencies, with the llama3 long-context adjustment when configured
  // (transformers' _compute_llama3_parameters).
  const int half = cfg_.head_dim / 2;
  inv_freq_.resize(half);
  for (int i = 0; i < half; i++) {
    double f = 1.0 / std::pow(cfg_.rope_theta, double(2 * i) / cfg_.head_dim);
    if (cfg_.rope_factor > 0) {
      const double low_wavelen = cfg_.rope_original_max_pos / cfg_.rope_low_freq_factor;
      const double high_wavelen = cfg_.rope_original_max_pos / cfg_.rope_high_freq_factor;
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / cfg_.rope_factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (cfg_.rope_original_max_pos / wavelen - cfg_.rope_low_freq_factor) /
                              (cfg_.rope_high_freq_factor - cfg_.rope_low_freq_factor);
        f = (1 - smooth) * f / cfg_.rope_factor + smooth * f;
      }
    }
    inv_freq_[i] = f;
  }

  // Fingerprint: the config plus, for every tensor, its name, dtype, shape and the checksum of
  // all its bytes. A sample of each tensor missed changes confined to rows it did not read (a
  // fine-tune of a few token embeddings), and K/V blocks of one model would have been injected
  // into the other. The pieces are hashed in parallel; the pages read here are the ones the
  // first forward pass would fault in anyway.
  const std::vector<uint64_t> digests = tensor_digests();
  size_t next_digest = 0;
  Hasher h;
  h.value(cfg_.vocab_size); h.value(cfg_.hidden_size); h.value(cfg_.intermediate_size); h.value(cfg_.n_layers);
  h.value(cfg_.n_heads); h.value(cfg_.n_kv_heads); h.value(cfg_.head_dim); h.value(cfg_.rope_theta);
  h.value(cfg_.rope_factor); h.value(cfg_.rms_norm_eps); h.value(cfg_.tie_word_embeddings); h.value(cfg_.attention_bias);
  h.value(cfg_.rope_interleaved);
  for (const auto& t : specs_) {
    h.bytes(t.name.data(), t.name.size());
    h.value(int(t.dtype));
    for (auto d : t.shape) h.value(d);
    for (uint64_t piece = 0; piece < pieces_of(t); piece++) h.value(digests[next_digest++]);
  }
  if (quantize == DType::Q8_0) {
    h.bytes("q8_0", 4);
    quantize_all_q8_0();
  }
  fingerprint_ = h.h;
}

}  // namespace dki
