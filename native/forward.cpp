// The forward pass of a Llama-family decoder, llama2.c style: one function per stage, explicit
// shapes. T = tokens in this chunk, D = hidden size, H/Hkv = query/KV heads, hd = head dim,
// F = MLP width, V = vocab, S = positions attended (segments + cached + current).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include "blend.h"
#include "context.h"
#include "kernels/kernels.h"
#include "kv_ops.h"
#include "threadpool.h"
#ifdef DKI_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace dki {

namespace {

// Several projections of the same input in one parallel loop (q/k/v, gate/up): one thread
// synchronisation instead of one per matrix, and the rows of all of them balance across threads.
struct Projection {
  const Matrix* W;
  float* y;  // [T, W.rows]
};

// y = x · Wᵀ for each projection, x [T, cols]. When a weight is Q8_0 the input is quantised to
// Q8_0 once (into xq) and multiplied in integers, as llama.cpp does: the two engines then round
// alike, which is what makes their greedy outputs agree on a Q8_0 file.
void linear_multi(std::initializer_list<Projection> projs, const float* x, int T, std::vector<unsigned char>& xq) {
  const int cols = projs.begin()->W->cols;
  int total = 0;
  bool any_q8 = false;
  for (const auto& p : projs) {
    total += p.W->rows;
    any_q8 |= p.W->dtype == DType::Q8_0;
  }
  const size_t q8_row = dtype_bytes(DType::Q8_0, cols);
  if (any_q8) {
    xq.resize(size_t(T) * q8_row);
    thread_pool().parallel_for(T, 1, [&](int t0, int t1) {
      for (int t = t0; t < t1; t++) kernels().quantize_q8(x + size_t(t) * cols, cols, xq.data() + t * q8_row);
    });
  }
  thread_pool().parallel_for(total, 16, [&](int r0, int r1) {
    const Kernels& K = kernels();
    int base = 0;
    for (const auto& p : projs) {
      const int lo = std::max(r0 - base, 0), hi = std::min(r1 - base, p.W->rows);
      if (lo < hi) {
        if (p.W->dtype == DType::Q8_0)
          K.matmul_q8(static_cast<const unsigned char*>(p.W->data), cols, lo, hi, xq.data(), T, p.y, p.W->rows);
        else
          K.matmul(p.W->data, p.W->dtype, cols, lo, hi, x, cols, T, p.y, p.W->rows);
      }
      base += p.W->rows;
    }
  });
}

void linear(const Matrix& W, const float* x, int T, float* y, std::vector<unsigned char>& xq) { linear_multi({{&W, y}}, x, T, xq); }

void add_bias(float* y, const std::vector<float>& b, int T) {
  if (b.empty()) return;
  const int n = int(b.size());
  for (int t = 0; t < T; t++)
    for (int i = 0; i < n; i++) y[size_t(t) * n + i] += b[i];
}

// out[t] = x[t] / sqrt(mean(x[t]²) + eps) * w
void rmsnorm(const float* x, const std::vector<float>& w, float eps, int T, int D, float* out) {
  for (int t = 0; t < T; t++) {
    const float* xt = x + size_t(t) * D;
    double ss = 0;
    for (int i = 0; i < D; i++) ss += double(xt[i]) * xt[i];
    const float inv = float(1.0 / std::sqrt(ss / D + eps));
    float* ot = out + size_t(t) * D;
    for (int i = 0; i < D; i++) ot[i] = xt[i] * inv * w[i];
  }
}

// Rotary embedding of T rows of n_heads heads at the angles of cos/sin ([T, hd/2]).
void rope(float* x, int T, int n_heads, int hd, const float* cos, const float* sin, bool interleaved) {
  const int half = hd / 2;
  for (int t = 0; t < T; t++)
    for (int h = 0; h < n_heads; h++)
      rotate_pairs(x + (size_t(t) * n_heads + h) * hd, hd, cos + size_t(t) * half, sin + size_t(t) * half, interleaved);
}

void check_segment_tokens(int64_t total) {
  if (total > kMaxSegmentTokens)
    throw Error("segments hold " + std::to_string(total) + " tokens together; at most " + std::to_string(kMaxSegmentTokens) + " can be injected");
}

}  // namespace

Context::Context(std::shared_ptr<const Model> model, int max_tokens) : model_(std::move(model)), max_tokens_(max_tokens) {
  if (max_tokens < 1) throw Error("context size must be at least 1 token");
  if (model_->device_weights()) {
#ifdef DKI_CUDA
    cuda_ = std::make_shared<CudaForward>(model_->device_weights(), *model_, max_tokens);
    return;
#endif
  }
  const ModelConfig& c = model_->config();
  const size_t cache = size_t(c.n_layers) * c.n_kv_heads * max_tokens * c.head_dim;
  // The whole window must fit even though it is backed lazily: filling it must not end in the
  // OOM killer halfway through a generation.
  check_host_bytes(2 * cache * sizeof(float), "a " + std::to_string(max_tokens) + "-token context's K/V cache");
  k_cache_ = LazyFloats(cache);
  v_cache_ = LazyFloats(cache);
}

void Context::reset(int pos_base) {
  n_past_ = 0;
  pos_base_ = pos_base;
  tokens_.clear();
}

void Context::truncate(int n) {
  if (n < 0 || n > n_past_) throw Error("truncate(" + std::to_string(n) + ") outside the " + std::to_string(n_past_) + " cached tokens");
  n_past_ = n;
  tokens_.resize(n);
}

void Context::set_attention_probe(int layer) {
  if (layer < -1 || layer >= model_->config().n_layers)
    throw Error("attention probe layer " + std::to_string(layer) + " is outside 0.." + std::to_string(model_->config().n_layers - 1));
  probe_layer_ = layer;
  probe_entropy_.assign(layer < 0 ? 0 : model_->config().n_heads, 0.f);
}

void Context::reserve_segments(int64_t tokens) {
  check_segment_tokens(tokens);
#ifdef DKI_CUDA
  if (cuda_) cuda_->reserve_segments(tokens);
#endif
}

void Context::set_segments(std::vector<Segment> segments) {
  const ModelConfig& c = model_->config();
  int64_t total = 0;
  for (const auto& s : segments) total += s.block->n_tokens;
  check_segment_tokens(total);
  for (const auto& s : segments) {
    const KVBlock& b = *s.block;
    if (b.fingerprint != model_->fingerprint()) throw Error("K/V block was computed by another model (fingerprint mismatch)");
    if (b.n_layers != c.n_layers || b.n_kv_heads != c.n_kv_heads || b.head_dim != c.head_dim)
      throw Error("K/V block shape does not match this model");
    if (!(s.alpha >= 0) || !std::isfinite(s.alpha)) throw Error("segment alpha must be a finite number >= 0");
    // ln 0 = -inf would be added to every score of the segment: leaving it out does the same.
    if (s.logit_scaling && s.alpha == 0) throw Error("segment alpha must be > 0 with logit scaling (ln 0 is -inf)");
    if (!(s.temperature > 0) || !std::isfinite(s.temperature)) throw Error("segment temperature must be a finite number > 0");
    if (cuda_ && s.temperature != 1.f)
      throw Error("segment temperature (APE, blockFix \"ape\") runs on the CPU only; this model is loaded on CUDA: use temperature 1 there");
    const int64_t start = int64_t(b.start_pos) + s.shift;
    if (start < -kMaxPosition || start > kMaxPosition)
      throw Error("a segment shifted to position " + std::to_string(start) + " is outside ±" + std::to_string(kMaxPosition));
    if (!cuda_) host_kv(b, "setSegments");  // the CPU backend reads blocks from host memory
  }
  std::vector<std::vector<float>> turns(segments.size());
  for (size_t i = 0; i < segments.size(); i++) {
    Segment& s = segments[i];
    // The GPU rotates a shifted block's keys as it copies them into its segment buffer.
    if (s.shift == 0 || cuda_) continue;
    turns[i] = rotation_by(-int64_t(s.shift), model_->inv_freq());
  }
#ifdef DKI_CUDA
  if (cuda_) cuda_->set_segments(segments);
#endif
  segments_ = std::move(segments);
  segment_turns_ = std::move(turns);
  segments_checked_ = segments_.empty();
  attended_.clear();
  attended_turns_.clear();
  if (!cuda_) plan_attended();
}

// DKISystem injects one block per memory, ~10–30 tokens each. The CPU attention makes a scores and
// a weighted-sum call per segment for every query, head and layer, and a short segment fills its
// 16-key vectors only partly, so many short blocks cost far more than one block of their tokens.
// A run of short segments that sit next to each other (each starts where the one before ends) with
// the same α, scaling and temperature is attended as one block: the keys rotated to where they
// sit, copied once per setSegments. At most kCoalesceTokens are copied a call, so a huge injection
// costs a bounded amount of memory more.
namespace {
constexpr int kShortSegment = 64;
constexpr int64_t kCoalesceTokens = 8192;
}  // namespace

void Context::plan_attended() {
  const ModelConfig& c = model_->config();
  const auto start = [](const Segment& s) { return int64_t(s.block->start_pos) + s.shift; };
  const auto joins = [&](const Segment& a, const Segment& b) {
    return b.block->n_tokens < kShortSegment && b.alpha == a.alpha && b.logit_scaling == a.logit_scaling && b.temperature == a.temperature &&
           start(b) == start(a) + a.block->n_tokens;
  };
  int64_t copied = 0;
  for (size_t i = 0; i < segments_.size();) {
    size_t j = i + 1;
    int64_t run = segments_[i].block->n_tokens;
    if (run < kShortSegment)
      while (j < segments_.size() && joins(segments_[j - 1], segments_[j]) && copied + run + segments_[j].block->n_tokens <= kCoalesceTokens) run += segments_[j++].block->n_tokens;
    if (j - i == 1) {
      attended_.push_back(segments_[i]);
      attended_turns_.push_back(segment_turns_[i]);
    } else {
      // Laid out from where the first block sits; the others follow it, which is where they sit
      // too (the run is adjacent): each block copied once, its keys rotated as they land.
      std::vector<BlockPtr> run_blocks;
      const Segment& first = segments_[i];
      for (size_t k = i; k < j; k++) run_blocks.push_back(segments_[k].block);
      Segment m = first;
      m.block = concat_blocks(run_blocks, model_->inv_freq(), c.rope_interleaved, int(start(first)));
      m.shift = 0;
      attended_.push_back(m);
      attended_turns_.emplace_back();
      copied += run;
    }
    i = j;
  }
}

void Context::check_segments() const {
  const ModelConfig& c = model_->config();
  for (size_t i = 0; i < segments_.size(); i++) {
    const Segment& s = segments_[i];
    const KVBlock& b = *s.block;
    const float vmax = known_value_abs_max(b);
    const std::string which = "injected segment " + std::to_string(i) + " (" + std::to_string(b.n_tokens) + " tokens)";
    if (vmax == INFINITY) {
      std::string where;
      if (b.on_host()) {
        const int64_t k_bad = first_non_finite(b.k.data(), b.k.size());
        const size_t at = size_t(k_bad >= 0 ? k_bad : first_non_finite(b.v.data(), b.v.size()));
        where = std::string(k_bad >= 0 ? " (a key" : " (a value") + " in layer " + std::to_string(at / b.layer_stride()) + " of " +
                std::to_string(c.n_layers) + ")";
      }
      throw NonFiniteError(which + " holds NaN or ±inf" + where + "; it cannot be injected", int(i), -1);
    }
    // |Σ α·p·v| ≤ α·max|v| since the segment's probabilities sum to at most 1: below FLT_MAX, no
    // scaled value or weighted sum of them overflows.
    if (!s.logit_scaling && scaled_overflows(s.alpha, vmax)) throw NonFiniteError(which + ": " + scaled_overflow_words(s.alpha, vmax), int(i), -1);
  }
}

void Context::check_probe(int n) const {
  const int64_t head = first_non_finite(probe_entropy_.data(), probe_entropy_.size());
  if (head < 0) return;
  throw NonFiniteError("the attention of layer " + std::to_string(probe_layer_) + " at token " + std::to_string(n - 1) + " of " + std::to_string(n) +
                           " in this eval is not finite (query head " + std::to_string(head) + ")",
                       -1, n - 1);
}

void Context::check_logits(const std::vector<float>& logits, int n, LogitsMode mode) const {
  const int64_t bad = first_non_finite(logits.data(), logits.size());
  if (bad < 0) return;
  const size_t V = model_->config().vocab_size;
  const int row = mode == LogitsMode::All ? int(size_t(bad) / V) : n - 1;
  const float v = logits[size_t(bad)];
  throw NonFiniteError("the logits of token " + std::to_string(row) + " of " + std::to_string(n) + " in this eval are not finite (" +
                           (std::isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf") + " at vocabulary id " + std::to_string(size_t(bad) % V) + ")",
                       -1, row);
}

StageProfile Context::stage_profile() const {
#ifdef DKI_CUDA
  if (cuda_) return cuda_->profile();
#endif
  return {};
}

void Context::eval(const int32_t* tokens, int n, LogitsMode mode, std::vector<float>& logits) {
  const ModelConfig& c = model_->config();
  if (n <= 0) throw Error("eval needs at least one token");
  if (n_past_ + n > max_tokens_)
    throw Error("context is full: " + std::to_string(n_past_) + " cached + " + std::to_string(n) + " new tokens exceed its " +
                std::to_string(max_tokens_) + "-token window");
  for (int i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      throw Error("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) + " is outside the vocabulary (0.." +
                  std::to_string(c.vocab_size - 1) + ")");
  const size_t V = c.vocab_size;
  // Every row's logits, then JavaScript's copy of them: 20000 positions of a 49152-token
  // vocabulary are 7.9 GB, refused here rather than by the OOM killer.
  if (mode == LogitsMode::All)
    check_host_bytes(2 * uint64_t(n) * V * sizeof(float), "holding the logits of " + std::to_string(n) + " positions (and JavaScript's copy of them)");
  if (!segments_checked_) {
    check_segments();
    segments_checked_ = true;
  }
  logits.assign(mode == LogitsMode::None ? 0 : mode == LogitsMode::Last ? V : V * n, 0.f);
  const int max_chunk = cuda_ ? kMaxCudaChunk : kMaxChunk;  // cuda_ is null in CPU-only builds
  // All or nothing: an eval cancelled or failed after some chunks leaves the context as it was.
  const int n_past_before = n_past_;
  try {
    eval_chunks(tokens, n, mode, max_chunk, V, logits);
    if (mode != LogitsMode::None) check_logits(logits, n, mode);
    if (probe_layer_ >= 0) check_probe(n);
  } catch (...) {
    n_past_ = n_past_before;
    tokens_.resize(size_t(n_past_before));
    throw;
  }
}

void Context::eval_chunks(const int32_t* tokens, int n, LogitsMode mode, int max_chunk, size_t V, std::vector<float>& logits) {
  for (int done = 0; done < n;) {
    if (cancel_.load()) throw Error("cancelled");
    const int T = std::min(max_chunk, n - done);
    const bool last_chunk = done + T == n;
    float* out = nullptr;
    LogitsMode chunk_mode = LogitsMode::None;
    if (mode == LogitsMode::All) {
      out = logits.data() + done * V;
      chunk_mode = LogitsMode::All;
    } else if (mode == LogitsMode::Last && last_chunk) {
      out = logits.data();
      chunk_mode = LogitsMode::Last;
    }
    eval_chunk(tokens + done, T, chunk_mode, out);
    done += T;
  }
}

void Context::eval_chunk(const int32_t* tokens, int T, LogitsMode mode, float* logits) {
#ifdef DKI_CUDA
  if (cuda_) {
    const int rows = mode == LogitsMode::None ? 0 : mode == LogitsMode::Last ? 1 : T;
    cuda_->eval_chunk(tokens, T, n_past_, pos_base_ + n_past_, rows, logits, probe_layer_, probe_entropy_.data());
    tokens_.insert(tokens_.end(), tokens, tokens + T);
    n_past_ += T;
    return;
  }
#endif
  const Model& m = *model_;
  const ModelConfig& c = m.config();
  const int D = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
  const int q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd, half = hd / 2;
  x_.resize(size_t(T) * D);
  xn_.resize(size_t(T) * D);
  q_.resize(size_t(T) * q_dim);
  k_.resize(size_t(T) * kv_dim);
  v_.resize(size_t(T) * kv_dim);
  attn_.resize(size_t(T) * q_dim);
  gate_.resize(size_t(T) * F);
  up_.resize(size_t(T) * F);
  cos_.resize(size_t(T) * half);
  sin_.resize(size_t(T) * half);

  // Embedding lookup: x[t] = E[token t]
  const Matrix& E = m.embeddings();
  for (int t = 0; t < T; t++)
    for (int i = 0; i < D; i++) x_[size_t(t) * D + i] = load_as_f32(E.data, E.dtype, size_t(tokens[t]) * D + i);

  // Rotation angles of this chunk's positions, computed in double then rounded once.
  const auto& inv_freq = m.inv_freq();
  for (int t = 0; t < T; t++) {
    const double pos = double(pos_base_ + n_past_ + t);
    for (int i = 0; i < half; i++) {
      cos_[size_t(t) * half + i] = float(std::cos(pos * inv_freq[i]));
      sin_[size_t(t) * half + i] = float(std::sin(pos * inv_freq[i]));
    }
  }

  for (int l = 0; l < c.n_layers; l++) {
    const LayerWeights& L = m.layers()[l];
    // Attention block: x += Wo · attention(rope(Wq·xn), rope(Wk·xn), Wv·xn)
    rmsnorm(x_.data(), L.attn_norm, c.rms_norm_eps, T, D, xn_.data());
    linear_multi({{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}}, xn_.data(), T, xq_);
    add_bias(q_.data(), L.bq, T);
    add_bias(k_.data(), L.bk, T);
    add_bias(v_.data(), L.bv, T);
    rope(q_.data(), T, c.n_heads, hd, cos_.data(), sin_.data(), c.rope_interleaved);
    rope(k_.data(), T, c.n_kv_heads, hd, cos_.data(), sin_.data(), c.rope_interleaved);
    // Append this chunk's K/V to the cache ([T, Hkv, hd] → [Hkv, pos, hd]).
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < c.n_kv_heads; h++) {
        const size_t dst = ((size_t(l) * c.n_kv_heads + h) * max_tokens_ + n_past_ + t) * hd;
        std::copy_n(&k_[(size_t(t) * c.n_kv_heads + h) * hd], hd, &k_cache_[dst]);
        std::copy_n(&v_[(size_t(t) * c.n_kv_heads + h) * hd], hd, &v_cache_[dst]);
      }
    }
    attention(l, T);
    linear(L.wo, attn_.data(), T, xn_.data(), xq_);
    for (size_t i = 0; i < size_t(T) * D; i++) x_[i] += xn_[i];

    // MLP block: x += W_down · (silu(W_gate·xn) ⊙ W_up·xn)
    rmsnorm(x_.data(), L.ffn_norm, c.rms_norm_eps, T, D, xn_.data());
    linear_multi({{&L.w_gate, gate_.data()}, {&L.w_up, up_.data()}}, xn_.data(), T, xq_);
    thread_pool().parallel_for(T * F, 256, [&](int b, int e) { kernels().silu_mul(&gate_[b], &up_[b], size_t(e - b)); });
    linear(L.w_down, gate_.data(), T, xn_.data(), xq_);
    for (size_t i = 0; i < size_t(T) * D; i++) x_[i] += xn_[i];
  }
  tokens_.insert(tokens_.end(), tokens, tokens + T);
  n_past_ += T;

  if (mode == LogitsMode::None) return;
  // Final norm and LM head, only for the rows whose logits are wanted.
  const int first = mode == LogitsMode::Last ? T - 1 : 0;
  const int rows = T - first;
  rmsnorm(x_.data() + size_t(first) * D, m.final_norm(), c.rms_norm_eps, rows, D, xn_.data());
  linear(m.lm_head(), xn_.data(), rows, logits, xq_);
}

// Causal grouped-query attention of the chunk's T queries over
// [segment tokens ; cached tokens ; chunk tokens up to and including itself].
void Context::attention(int l, int T) {
  const ModelConfig& c = model_->config();
  const int hd = c.head_dim, H = c.n_heads, group = c.n_heads / c.n_kv_heads;
  const float scale = 1.f / std::sqrt(float(hd));
  const int past = n_past_;
  int n_seg_tokens = 0;
  for (const auto& s : attended_) n_seg_tokens += s.block->n_tokens;
  const int max_s = n_seg_tokens + past + T;

  // Work items are blocks of up to kQueryBlock consecutive queries of one head, head-major: each
  // thread gets whole heads, so the causal triangle's cost (later tokens attend to more) is split
  // evenly, and a block's weighted sums read each value row once for all its queries.
  constexpr int kQueryBlock = 4;
  const int blocks = (T + kQueryBlock - 1) / kQueryBlock;
  thread_pool().parallel_for(H * blocks, 1, [&](int begin, int end) {
    const Kernels& K = kernels();
    thread_local std::vector<float> probs;  // [kQueryBlock][max_s]
    thread_local std::vector<float> turned;  // a query turned back by a segment's shift
    probs.resize(size_t(kQueryBlock) * max_s);
    turned.resize(hd);
    for (int item = begin; item < end; item++) {
      const int h = item / blocks, t0 = (item % blocks) * kQueryBlock, kvh = h / group;
      const int nq = std::min(kQueryBlock, T - t0);
      const float* kc = &k_cache_[(size_t(l) * c.n_kv_heads + kvh) * max_tokens_ * hd];
      const float* vc = &v_cache_[(size_t(l) * c.n_kv_heads + kvh) * max_tokens_ * hd];
      for (int q_i = 0; q_i < nq; q_i++) {
        const int t = t0 + q_i;
        const float* q = &q_[(size_t(t) * H + h) * hd];
        float* scores = &probs[size_t(q_i) * max_s];
        // Scores: q·k / sqrt(hd) (over T on a segment's columns), plus ln(alpha) on the columns of logit-scaled segments.
        int j = 0;
        for (size_t si = 0; si < attended_.size(); si++) {
          const Segment& s = attended_[si];
          const KVBlock& b = *s.block;
          const std::vector<float>& turn = attended_turns_[si];
          const float* qs = q;
          if (!turn.empty()) {
            std::copy_n(q, hd, turned.data());
            rotate_pairs(turned.data(), hd, turn.data(), turn.data() + hd / 2, c.rope_interleaved);
            qs = turned.data();
          }
          // A temperature T divides the segment's scores: q·k/(sqrt(hd)·T).
          K.scores(qs, b.k_layer(l) + size_t(kvh) * b.n_tokens * hd, b.n_tokens, hd, s.temperature == 1.f ? scale : scale / s.temperature, &scores[j]);
          if (s.logit_scaling) {
            const float bias = std::log(s.alpha);
            for (int i = 0; i < b.n_tokens; i++) scores[j + i] += bias;
          }
          j += b.n_tokens;
        }
        const int own = past + t + 1;
        K.scores(q, kc, own, hd, scale, &scores[j]);
        const int S = j + own;
        // Softmax over all S columns.
        const float inv = float(1.0 / K.softmax_exp(scores, S));
        if (l == probe_layer_ && t == T - 1) {
          double h_ent = 0;
          for (int i = 0; i < S; i++) {
            const double p = scores[i] * inv;
            if (!(p <= 0)) h_ent -= p * std::log(p);  // 0·ln 0 = 0; a NaN p makes the entropy NaN, as on the GPU
          }
          probe_entropy_[h] = float(h_ent);
        }
        // Probabilities; value-scaled segments contribute alpha·V.
        for (int i = 0; i < S; i++) scores[i] *= inv;
        j = 0;
        for (const auto& s : attended_) {
          if (!s.logit_scaling && s.alpha != 1.f)
            for (int i = 0; i < s.block->n_tokens; i++) scores[j + i] *= s.alpha;
          j += s.block->n_tokens;
        }
      }
      // Weighted values, for the whole block where its queries see the same keys: every segment,
      // and the cached and chunk tokens up to the first query; each later query then adds the
      // few tokens only it sees. Per output the sum runs over the keys in order either way.
      float* out = &attn_[(size_t(t0) * H + h) * hd];
      const int ldo = H * hd;
      for (int q_i = 0; q_i < nq; q_i++) std::fill(out + size_t(q_i) * ldo, out + size_t(q_i) * ldo + hd, 0.f);
      int j = 0;
      for (const auto& s : attended_) {
        const KVBlock& b = *s.block;
        K.weighted_sum_rows(&probs[j], max_s, nq, b.v_layer(l) + size_t(kvh) * b.n_tokens * hd, b.n_tokens, hd, out, ldo);
        j += b.n_tokens;
      }
      const int shared = past + t0 + 1;
      K.weighted_sum_rows(&probs[j], max_s, nq, vc, shared, hd, out, ldo);
      for (int q_i = 1; q_i < nq; q_i++)
        K.weighted_sum(&probs[size_t(q_i) * max_s + j + shared], vc + size_t(shared) * hd, q_i, hd, out + size_t(q_i) * ldo);
    }
  });
}

std::shared_ptr<KVBlock> Context::export_block(int from, int to, bool on_device) const {
  check_token_range("block range", from, to, n_past_, "the context's cached");
  if (on_device && !cuda_) throw Error("exportBlock: this context runs on the CPU; a block can stay on a GPU only for a model loaded with device \"cuda\"");
  const ModelConfig& c = model_->config();
  auto b = std::make_shared<KVBlock>();
  b->n_layers = c.n_layers;
  b->n_kv_heads = c.n_kv_heads;
  b->head_dim = c.head_dim;
  b->n_tokens = to - from;
  b->start_pos = pos_base_ + from;
  b->fingerprint = model_->fingerprint();
  b->tokens.assign(tokens_.begin() + from, tokens_.begin() + to);
#ifdef DKI_CUDA
  if (cuda_ && on_device) {
    b->device = cuda_->export_kv_device(from, to);
    return b;
  }
#endif
  b->k.resize(size_t(c.n_layers) * b->layer_stride());
  b->v.resize(b->k.size());
#ifdef DKI_CUDA
  if (cuda_) {
    cuda_->export_kv(from, to, b->k.data(), b->v.data());
    return b;
  }
#endif
  const int hd = c.head_dim;
  for (int l = 0; l < c.n_layers; l++)
    for (int h = 0; h < c.n_kv_heads; h++) {
      const size_t src = ((size_t(l) * c.n_kv_heads + h) * max_tokens_ + from) * hd;
      const size_t dst = (size_t(l) * c.n_kv_heads + h) * size_t(b->n_tokens) * hd;
      std::copy_n(&k_cache_[src], size_t(b->n_tokens) * hd, &b->k[dst]);
      std::copy_n(&v_cache_[src], size_t(b->n_tokens) * hd, &b->v[dst]);
    }
  return b;
}

namespace {

// Checks that b can take part in a blend with model m: computed by it, in host memory.
void check_blend_block(const Model& m, const KVBlock& b, const std::string& which) {
  const ModelConfig& c = m.config();
  if (b.fingerprint != m.fingerprint()) throw Error("blendBlocks: " + which + " was computed by another model (fingerprint mismatch)");
  if (b.n_layers != c.n_layers || b.n_kv_heads != c.n_kv_heads || b.head_dim != c.head_dim) throw Error("blendBlocks: " + which + "'s shape does not match the model");
  if (b.n_tokens < 1) throw Error("blendBlocks: " + which + " holds no tokens");
  host_kv(b, "blendBlocks");
}

// Attention of the memory tokens rows[a] (their queries q, [A][H][hd]) over the prefix's K/V of
// layer l and memory tokens 0..rows[a] (mk, mv: [Hkv][N][hd]); out: [A][H·hd].
void attention_rows(const KVBlock* prefix, int l, const std::vector<int>& rows, const float* mk, const float* mv, int N, const ModelConfig& c, float scale,
                    const float* q, float* out) {
  const int hd = c.head_dim, H = c.n_heads, group = c.n_heads / c.n_kv_heads;
  const int P = prefix ? prefix->n_tokens : 0;
  thread_pool().parallel_for(int(rows.size()) * H, 1, [&](int begin, int end) {
    const Kernels& K = kernels();
    thread_local std::vector<float> s;
    s.resize(size_t(P) + N);
    for (int item = begin; item < end; item++) {
      const int a = item / H, h = item % H, kvh = h / group, n = rows[a] + 1;
      const float* qa = q + (size_t(a) * H + h) * hd;
      if (P > 0) K.scores(qa, prefix->k_layer(l) + size_t(kvh) * P * hd, P, hd, scale, s.data());
      K.scores(qa, mk + size_t(kvh) * N * hd, n, hd, scale, s.data() + P);
      const float inv = float(1.0 / K.softmax_exp(s.data(), P + n));
      for (int i = 0; i < P + n; i++) s[i] *= inv;
      float* o = out + (size_t(a) * H + h) * hd;
      std::fill(o, o + hd, 0.f);
      if (P > 0) K.weighted_sum(s.data(), prefix->v_layer(l) + size_t(kvh) * P * hd, P, hd, o);
      K.weighted_sum(s.data() + P, mv + size_t(kvh) * N * hd, n, hd, o);
    }
  });
}

}  // namespace

std::shared_ptr<KVBlock> blend_blocks(const Model& m, const KVBlock* prefix, const std::vector<BlockPtr>& blocks, double ratio) {
  const ModelConfig& c = m.config();
  if (m.device_weights()) throw Error("blendBlocks (CacheBlend) runs on the CPU only; this model is loaded on CUDA");
  if (blocks.empty()) throw Error("blendBlocks needs at least one block");
  if (!(ratio >= 0 && ratio <= 1)) throw Error("blendBlocks: ratio must be a number in [0, 1], got " + std::to_string(ratio));
  for (size_t i = 0; i < blocks.size(); i++) check_blend_block(m, *blocks[i], "block " + std::to_string(i));
  const int P = prefix ? prefix->n_tokens : 0;
  if (prefix) {
    check_blend_block(m, *prefix, "the prefix");
    if (int64_t(prefix->start_pos) + P != blocks[0]->start_pos)
      throw Error("blendBlocks: the prefix sits at [" + std::to_string(prefix->start_pos) + ", " + std::to_string(int64_t(prefix->start_pos) + P) +
                  ") but the first block starts at " + std::to_string(blocks[0]->start_pos) + "; it must end right where the blocks begin");
  }
  // The separate encodings, each moved to where it sits in the joint sequence: what every token
  // not selected keeps, and the result's starting point (copied: concat may hand back its input).
  auto out = std::make_shared<KVBlock>(*concat_blocks(blocks, m.inv_freq(), c.rope_interleaved));
  const int N = out->n_tokens;
  const int n_sel = std::min(N, int(std::ceil(ratio * N - 1e-9)));
  if (n_sel == 0) return out;

  const int D = c.hidden_size, F = c.intermediate_size, hd = c.head_dim, H = c.n_heads, Hkv = c.n_kv_heads;
  const int q_dim = H * hd, kv_dim = Hkv * hd, half = hd / 2, L = c.n_layers;
  // The layer whose deviations choose the tokens: the first whose K/V depend on the context.
  const int select_layer = std::min(1, L - 1);
  const size_t layer_kv = size_t(Hkv) * N * hd;
  check_host_bytes((size_t(N) * (3 * D + 2 * q_dim + 2 * kv_dim + 2 * F + hd) + 2 * size_t(select_layer + 1) * layer_kv) * sizeof(float),
                   "blending " + std::to_string(N) + " memory tokens");
  std::vector<float> x(size_t(N) * D), xn(size_t(N) * D), q(size_t(N) * q_dim), k(size_t(N) * kv_dim), v(size_t(N) * kv_dim);
  std::vector<float> attn(size_t(N) * q_dim), gate(size_t(N) * F), up(size_t(N) * F), cs(size_t(N) * hd);
  std::vector<unsigned char> xq;
  // K/V of the joint layers (0..select_layer) for every token, [layer][Hkv][N][hd]: which of
  // them the result keeps is known only once the tokens are selected.
  std::vector<float> joint_k((select_layer + 1) * layer_kv), joint_v(joint_k.size());
  // rows[a]: the memory token that row a of the scratch holds (every token, then the selected).
  std::vector<int> rows(N);
  std::iota(rows.begin(), rows.end(), 0);

  const Matrix& E = m.embeddings();
  for (int t = 0; t < N; t++)
    for (int i = 0; i < D; i++) x[size_t(t) * D + i] = load_as_f32(E.data, E.dtype, size_t(out->tokens[t]) * D + i);
  const float scale = 1.f / std::sqrt(float(hd));

  for (int l = 0; l < L; l++) {
    const LayerWeights& W = m.layers()[l];
    const int A = int(rows.size());
    const bool joint = l <= select_layer;
    // Where this layer's keys and values of the memory live: the joint scratch, or the result
    // itself, whose unselected rows hold the cached K/V the selected tokens attend to.
    float* mk = joint ? joint_k.data() + l * layer_kv : out->k.data() + l * layer_kv;
    float* mv = joint ? joint_v.data() + l * layer_kv : out->v.data() + l * layer_kv;
    for (int a = 0; a < A; a++) {
      const double pos = double(out->start_pos) + rows[a];
      for (int i = 0; i < half; i++) {
        cs[size_t(a) * hd + i] = float(std::cos(pos * m.inv_freq()[i]));
        cs[size_t(a) * hd + half + i] = float(std::sin(pos * m.inv_freq()[i]));
      }
    }
    rmsnorm(x.data(), W.attn_norm, c.rms_norm_eps, A, D, xn.data());
    linear_multi({{&W.wq, q.data()}, {&W.wk, k.data()}, {&W.wv, v.data()}}, xn.data(), A, xq);
    add_bias(q.data(), W.bq, A);
    add_bias(k.data(), W.bk, A);
    add_bias(v.data(), W.bv, A);
    for (int a = 0; a < A; a++) {
      const float* co = &cs[size_t(a) * hd];
      for (int h = 0; h < H; h++) rotate_pairs(&q[(size_t(a) * H + h) * hd], hd, co, co + half, c.rope_interleaved);
      for (int h = 0; h < Hkv; h++) rotate_pairs(&k[(size_t(a) * Hkv + h) * hd], hd, co, co + half, c.rope_interleaved);
      for (int h = 0; h < Hkv; h++) {
        const size_t dst = (size_t(h) * N + rows[a]) * hd;
        std::copy_n(&k[(size_t(a) * Hkv + h) * hd], hd, mk + dst);
        std::copy_n(&v[(size_t(a) * Hkv + h) * hd], hd, mv + dst);
      }
    }
    if (l == select_layer) {
      // Each token's squared distance between its joint and its cached K and V at this layer.
      const float* ck = out->k.data() + l * layer_kv;
      const float* cv = out->v.data() + l * layer_kv;
      std::vector<double> dev(N, 0.0);
      for (int h = 0; h < Hkv; h++)
        for (int t = 0; t < N; t++)
          for (int d = 0; d < hd; d++) {
            const size_t i = (size_t(h) * N + t) * hd + d;
            dev[t] += double(mk[i] - ck[i]) * (mk[i] - ck[i]) + double(mv[i] - cv[i]) * (mv[i] - cv[i]);
          }
      std::vector<int> order(N);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return dev[a] > dev[b]; });
      std::vector<int> chosen(order.begin(), order.begin() + n_sel);
      std::sort(chosen.begin(), chosen.end());
      // The selected tokens take their joint K/V at the joint layers.
      for (int jl = 0; jl <= select_layer; jl++)
        for (int h = 0; h < Hkv; h++)
          for (int t : chosen) {
            const size_t i = jl * layer_kv + (size_t(h) * N + t) * hd;
            std::copy_n(&joint_k[i], hd, &out->k[i]);
            std::copy_n(&joint_v[i], hd, &out->v[i]);
          }
      if (l == L - 1) break;
      attention_rows(prefix, l, rows, mk, mv, N, c, scale, q.data(), attn.data());
      // Only the selected rows go on: compact them to the front of the scratch, in order.
      std::vector<int> keep;
      for (int a = 0; a < A; a++)
        if (std::binary_search(chosen.begin(), chosen.end(), rows[a])) keep.push_back(a);
      for (size_t b = 0; b < keep.size(); b++) {
        std::copy_n(&attn[size_t(keep[b]) * q_dim], q_dim, &attn[b * q_dim]);
        std::copy_n(&x[size_t(keep[b]) * D], D, &x[b * D]);
      }
      rows = chosen;
    } else {
      if (l == L - 1) break;
      attention_rows(prefix, l, rows, mk, mv, N, c, scale, q.data(), attn.data());
    }
    const int R = int(rows.size());
    linear(W.wo, attn.data(), R, xn.data(), xq);
    for (size_t i = 0; i < size_t(R) * D; i++) x[i] += xn[i];
    rmsnorm(x.data(), W.ffn_norm, c.rms_norm_eps, R, D, xn.data());
    linear_multi({{&W.w_gate, gate.data()}, {&W.w_up, up.data()}}, xn.data(), R, xq);
    thread_pool().parallel_for(R * F, 256, [&](int b, int e) { kernels().silu_mul(&gate[b], &up[b], size_t(e - b)); });
    linear(W.w_down, gate.data(), R, xn.data(), xq);
    for (size_t i = 0; i < size_t(R) * D; i++) x[i] += xn[i];
  }
  return out;
}

}  // namespace dki
