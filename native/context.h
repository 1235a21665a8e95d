// An inference context: one sequence's own K/V cache plus the segments injected into it.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "kv_block.h"
#include "model.h"
#include "resources.h"

namespace dki {

class CudaForward;  // cuda/cuda_backend.h

enum class LogitsMode { None = 0, Last = 1, All = 2 };

// Where a GPU context's one-token steps (decode) spend their time, stage by stage: filled when the
// context was made with DKI_CUDA_PROFILE=1 (cuda/device_forward.cu).
struct StageTime {
  std::string stage;
  double ms = 0;       // GPU time, summed over the profile's steps
  uint64_t bytes = 0;  // weight bytes the stage reads per step
};
struct StageProfile {
  bool on = false;
  int steps = 0;
  std::vector<StageTime> stages;  // in the order a step runs them
};

class Context {
 public:
  Context(std::shared_ptr<const Model> model, int max_tokens);

  const Model& model() const { return *model_; }
  int n_past() const { return n_past_; }
  int max_tokens() const { return max_tokens_; }
  int pos_base() const { return pos_base_; }

  // Forget the own tokens; the next token sits at position pos_base.
  void reset(int pos_base);
  // Keep only the first n own tokens (rewind after a rejected continuation).
  void truncate(int n);
  void set_segments(std::vector<Segment> segments);
  // Checks that `tokens` of segments can be injected and, on a GPU, allocates their device
  // memory: called before the segments are prepared (remapped), so that a too-large injection
  // is refused before it costs a copy of every block.
  void reserve_segments(int64_t tokens);

  // Runs tokens through the model after the n_past already cached, appending their K/V.
  // logits receives nothing, the last row, or every row ([n, vocab]).
  void eval(const int32_t* tokens, int n, LogitsMode mode, std::vector<float>& logits);

  // Copies own tokens [from, to) out as a block (keys stay rotated at their positions). On a GPU
  // context, on_device keeps the copy in device memory (no trip through the host).
  std::shared_ptr<KVBlock> export_block(int from, int to, bool on_device = false) const;

  // Records, for layer `layer` (-1: none), the attention entropy of each query head at the
  // last token of every eval: a model-uncertainty signal for gating.
  void set_attention_probe(int layer);
  const std::vector<float>& attention_entropy() const { return probe_entropy_; }

  // The stage profile of a GPU context made with DKI_CUDA_PROFILE=1 (on is false otherwise).
  StageProfile stage_profile() const;

  // Asks a running or queued eval to stop at the next chunk boundary (it then throws "cancelled"
  // and leaves the context as it was). clear_cancel() is called when an eval is queued, so a
  // cancel between queueing and starting is not lost.
  void cancel() { cancel_.store(true); }
  void clear_cancel() { cancel_.store(false); }

 private:
  void eval_chunks(const int32_t* tokens, int n, LogitsMode mode, int max_chunk, size_t V, std::vector<float>& logits);
  // Refuses, by index, a segment holding NaN/inf or whose α-scaled values overflow float32; done
  // by the first eval after set_segments, on its worker thread (a scan of a large block must not
  // hold up JavaScript), and remembered in each block.
  void check_segments() const;
  // Refuses logits holding NaN/inf, naming the eval row: a NaN weight or an overflow upstream
  // would otherwise sample token 0 forever.
  void check_logits(const std::vector<float>& logits, int n, LogitsMode mode) const;
  // The same for the attention probe's entropies (a gating signal that would otherwise be NaN).
  void check_probe(int n) const;
  void eval_chunk(const int32_t* tokens, int T, LogitsMode mode, float* logits);
  void attention(int layer, int T);

  std::shared_ptr<const Model> model_;
  int max_tokens_;
  int n_past_ = 0;
  int pos_base_ = 0;
  std::vector<Segment> segments_;
  bool segments_checked_ = true;
  // Per segment: cos then sin of −shift·inv_freq ([head_dim]), empty for a shift of 0 (or on a GPU).
  std::vector<std::vector<float>> segment_turns_;
  // What the CPU attention reads: segments_, with runs of short adjacent ones merged (see
  // plan_attended), and their turns. segments_ itself stays as given, for the checks that name a segment.
  std::vector<Segment> attended_;
  std::vector<std::vector<float>> attended_turns_;
  void plan_attended();
  std::atomic<bool> cancel_{false};
  std::vector<int32_t> tokens_;  // own tokens, for export_block
  int probe_layer_ = -1;
  std::vector<float> probe_entropy_;  // per query head

  // Own K/V: [layer][kv_head][max_tokens][head_dim]; on the GPU instead when cuda_ is set. Backed
  // lazily (LazyFloats): a row's pages exist once tokens reach them, so a large window costs
  // the memory of the tokens it holds.
  LazyFloats k_cache_, v_cache_;
  // The device half of a context whose model runs on a GPU (DKI_CUDA builds only).
  std::shared_ptr<CudaForward> cuda_;

  // Scratch for one chunk of T tokens.
  std::vector<float> x_, xn_, q_, k_, v_, attn_, gate_, up_, cos_, sin_;
  std::vector<unsigned char> xq_;  // the input of a Q8_0 projection, quantised to Q8_0
};

// A context's own tokens at most, and those of all injected segments together: every count of
// attended columns fits an int.
constexpr int kMaxContextTokens = 1 << 24;
constexpr int kMaxSegmentTokens = 1 << 24;
// A context's first own position (reset's posBase) stays within ±this.
constexpr int kMaxPositionBase = 1 << 24;

// Largest number of tokens processed in one pass; longer inputs are split.
constexpr int kMaxChunk = 256;
// The same on the CUDA backend, whose GEMMs and attention need many tokens at once to fill the GPU.
constexpr int kMaxCudaChunk = 1024;

}  // namespace dki
