// The forward pass on a GPU: the same stages as forward.cpp, in the same order, on device
// buffers. Projections of a few tokens (decode) are GEMV kernels that stream each weight once,
// with q/k/v in one launch, the RMSNorms folded into the projections that read them, the MLP's
// gate in its projections and the residual adds in the output projections; longer chunks
// (prefill) are cuBLAS GEMMs with fp32 accumulation. In decode the q/k/v GEMV also rotates q and
// k and stores k and v in the cache, and the split attention merges its own splits: still 5
// launches a layer, so a step is captured once as a CUDA graph and replayed, with its inputs
// (n_past, token ids, rotary angles) in device memory that one copy refreshes per step.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <tuple>

#include "context.h"
#include "resources.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/device_kernels.cuh"
#include "cuda/device_kv.cuh"
#include "cuda/device_weights.cuh"

namespace dki {

namespace {
uint64_t bytes_of(const DeviceMatrix& m) { return dtype_bytes(m.dtype, uint64_t(m.rows) * m.cols); }

// Environment variable `name` when it is one of `allowed`, null when unset; any other value is
// an error naming the variable and what it takes (`expected`).
const char* env_choice(const char* name, std::initializer_list<const char*> allowed, const char* expected) {
  const char* v = std::getenv(name);
  if (!v) return nullptr;
  for (const char* a : allowed)
    if (std::strcmp(v, a) == 0) return v;
  throw Error(std::string(name) + " must be " + expected + ", not \"" + v + "\"");
}
}  // namespace

struct CudaForward::Impl {
  std::shared_ptr<const CudaWeights> w;
  ModelConfig cfg;
  std::vector<double> inv_freq;
  int max_tokens = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;

  // Own K/V, [layer][kv_head][max_tokens][hd] fp32 like the CPU cache.
  DeviceBuffer k_cache, v_cache;
  // A chunk's inputs, packed as StepLayout says, and their page-locked host staging.
  DeviceBuffer step;
  PinnedBuffer step_host;
  // Scratch for one chunk of up to kMaxCudaChunk tokens (fewer if the context is shorter).
  DeviceBuffer x, xn, q, k, v, attn, gate, up, logits, probe;
  DeviceBuffer attn_partial;  // split-K attention state of decode steps and short prefills
  DeviceBuffer attn_done;     // and the count of each row's splits that have finished (int, zeroed)
  DeviceBuffer x_half;   // a GEMM's input in the weight's half type
  DeviceBuffer scalars;  // GemmScalars: alpha and beta of every GEMM
  DeviceBuffer w_f16;    // a Q8_0 weight dequantised for a GEMM
  // Injected segments, concatenated: [layer][kv_head][S_seg][hd], per-column bias and value scale.
  DeviceBuffer seg_k, seg_v, seg_bias, seg_vscale;
  DeviceBuffer seg_table, seg_turns;  // where each block goes and its keys' rotation, while they are placed
  int S_seg = 0;
  // The blocks whose K/V seg_k/seg_v hold now, in order, with the shift their keys were rotated
  // by. Held so that their addresses cannot be reused by other blocks: the same blocks set again
  // at the same places (a user's memory on every turn) are not copied again.
  std::vector<std::pair<std::shared_ptr<const KVBlock>, int>> uploaded;
  std::vector<float> uploaded_bias, uploaded_vscale;  // what seg_bias and seg_vscale hold
  // Segments set since the last chunk, uploaded when the next chunk runs: on the worker thread
  // that runs it, not on the JS thread that sets them.
  std::vector<Segment> pending;
  bool segments_changed = false;

  // Decode steps replay a graph captured for one set of launch arguments (GraphKey); another set
  // (new segments, another row count, the probe switched) captures again. DKI_CUDA_GRAPHS=0
  // launches every kernel directly instead. A failed capture launches that step directly and is
  // tried again at the next step (another thread's cudaFree can spoil one); the third failure
  // turns graphs off for the context.
  bool use_graphs = true;
  int failed_captures = 0;
  // Prefill attention through the register-tiled kernel (the default: 2.5-6x the warp kernel on
  // an H200); DKI_CUDA_ATTENTION=warp at creation keeps the kernel that sums a dot per warp.
  bool tiled_attention = true;
  // A short prefill after a long injected memory splits its columns across blocks (the default);
  // DKI_CUDA_SPLIT_PREFILL=off at creation keeps one block per head (for comparison).
  bool split_prefill = true;
  cudaGraphExec_t graph = nullptr;
  using GraphKey = std::tuple<int, int, int, const void*, const void*, int, const void*>;
  GraphKey graph_key{};

  // DKI_CUDA_PROFILE=1 at creation: events between the stages of every one-token step (event
  // nodes in its graph) time each stage on the GPU; profile() sums them over the steps. The
  // events cost some time of their own: compare the total with an unprofiled run.
  struct Profile {
    bool marking = false;             // the record() under way marks its stages
    std::vector<cudaEvent_t> events;  // events[0] opens a step, events[i] closes its i-th stage
    std::vector<int> stage_of;        // stage of events[i + 1], as the last record() laid them out
    StageProfile sums;                // sums.on: profiling was asked for
    mutable std::mutex mutex;         // profile() reads on the JS thread while a step may end
  } prof;

  ~Impl() {
    if (!w) return;
    cudaSetDevice(w->device);
    for (cudaEvent_t e : prof.events) cudaEventDestroy(e);
    if (graph) cudaGraphExecDestroy(graph);
    if (blas) cublas_api().destroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }

  // Where a chunk of T tokens finds its inputs in `step` (and `step_host`): n_past, the token
  // ids, then cos and sin of each token's rotary angles ([T, hd/2] each), 16-byte aligned.
  struct StepLayout {
    size_t tokens, cos, sin, bytes;
  };
  StepLayout step_layout(int T) const {
    const auto align = [](size_t n) { return (n + 15) / 16 * 16; };
    const size_t angles = size_t(T) * (cfg.head_dim / 2) * sizeof(float);
    StepLayout L;
    L.tokens = 16;
    L.cos = align(L.tokens + size_t(T) * sizeof(int32_t));
    L.sin = L.cos + align(angles);
    L.bytes = L.sin + angles;
    return L;
  }

  // Enqueues the whole forward pass of a T-token chunk whose inputs are in `step`: no host
  // memory is touched, so the same calls can be captured into a graph.
  // `columns`: the columns the chunk's last query attends to, which sets a short prefill's splits.
  void record(int T, int rows, int probe_layer, bool probe, int columns);
  // Column splits of a prefill chunk of T tokens whose last query sees `columns` columns.
  int prefill_splits(int T, int columns) const;
  // record() captured as an instantiated graph, or null if that failed.
  cudaGraphExec_t capture(int T, int rows, int probe_layer, bool probe);

  // Uploads `pending` into seg_k/seg_v/seg_bias/seg_vscale and sets S_seg.
  void upload_segments();
  // Makes the four segment buffers hold S tokens; true when they were replaced (and so hold nothing).
  bool fit_segments(size_t S);

  // Profiling: the step's opening event, then one after each stage (which streams `bytes` of weights).
  void open_step(int T);
  void mark(const char* stage, uint64_t bytes);
  void record_event(size_t i);
  void add_step();

  // Own tokens [from, to) of the cache into block-layout k and v (host or device memory).
  void copy_out(int from, int to, float* k, float* v, cudaMemcpyKind kind) const;

  float* cache_layer(const DeviceBuffer& c, int l) const { return c.get<float>() + size_t(l) * cfg.n_kv_heads * max_tokens * cfg.head_dim; }

  // y[T, W.rows] = x[T, W.cols] · Wᵀ, or y += that (the residual stream) when accumulating.
  void linear(const DeviceMatrix& W, const float* x_dev, int T, float* y, bool accumulate = false) {
    if (T <= kGemvMaxTokens) {
      GemvBatch b;
      b.part[0] = {W, nullptr, y};
      b.n_parts = 1, b.cols = W.cols, b.x = x_dev, b.accumulate = accumulate;
      return launch_gemv(b, T, stream);
    }
    if (W.dtype == DType::F32) return gemm(W.data, CUDA_R_32F, W, x_dev, T, y, &scalars.get<GemmScalars>()->one, accumulate);
    // cuBLAS multiplies equal input types. Rounding the activations once to BF16 would cost
    // ~0.5 in the logits of the test models; as hi + lo they keep ~16 bits, for twice the GEMM
    // work (prefill is far from compute-bound on the test shapes; see bench/results/gpu-cuda*.md).
    // Q8_0 weights are dequantised to F16 first.
    const DType half = W.dtype == DType::BF16 ? DType::BF16 : DType::F16;
    const void* A = W.data;
    if (W.dtype == DType::Q8_0) {
      launch_dequant_q8_to_f16(W.data, size_t(W.rows) * W.cols, w_f16.get(), stream);
      A = w_f16.get();
    }
    const size_t n_in = size_t(T) * W.cols;
    char* hi = x_half.get<char>();
    char* lo = hi + n_in * 2;
    GemmScalars* sc = scalars.get<GemmScalars>();
    launch_split_half(x_dev, n_in, half, hi, lo, sc, stream);  // x·s, and alpha = 1/s
    const cudaDataType_t type = half == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    gemm(A, type, W, hi, T, y, &sc->alpha, accumulate);
    gemm(A, type, W, lo, T, y, &sc->alpha, true);
  }

  // Column-major view: Yᵀ [rows, T] = alpha · W [rows, cols] (row-major = op T of [cols, rows]) · Xᵀ [cols, T]
  // (+ Yᵀ when accumulating). alpha is in device memory.
  void gemm(const void* A, cudaDataType_t type, const DeviceMatrix& W, const void* X, int T, float* y, const float* alpha, bool accumulate) {
    const GemmScalars* sc = scalars.get<GemmScalars>();
    const float* beta = accumulate ? &sc->one : &sc->zero;
    DKI_CUBLAS_CHECK(cublas_api().gemm_ex(blas, CUBLAS_OP_T, CUBLAS_OP_N, W.rows, T, W.cols, alpha, A, type, W.cols, X, type, W.cols, beta, y,
                                  CUDA_R_32F, W.rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // r.q = rope(Wq·xn (+ bias)), and rope(Wk·xn), Wv·xn into r's cache, for xn = rmsnorm(x): in
  // decode one GEMV launch that normalises as it reads x and rotates and stores as it writes; in
  // prefill the norm into xn, three GEMMs into r.q, r.k and r.v, then the rotation and the store.
  void project_qkv(const CudaWeights::Layer& L, const float* x, float* xn, const RopeStoreArgs& r) {
    const int T = r.T;
    float *q = r.q, *k = r.k, *v = r.v;
    if (T <= kGemvMaxTokens) {
      GemvBatch b;
      b.part[0] = {L.wq, L.bq, q};
      b.part[1] = {L.wk, L.bk, k};
      b.part[2] = {L.wv, L.bv, v};
      b.n_parts = 3, b.cols = L.wq.cols, b.x = x, b.norm = L.attn_norm, b.eps = cfg.rms_norm_eps;
      b.rope = r;
      return launch_gemv_qkv_rope(b, T, stream);
    }
    launch_rmsnorm(x, L.attn_norm, cfg.rms_norm_eps, T, cfg.hidden_size, xn, stream);
    linear(L.wq, xn, T, q);
    linear(L.wk, xn, T, k);
    linear(L.wv, xn, T, v);
    if (L.bq) {
      launch_add_bias(q, L.bq, T, L.wq.rows, stream);
      launch_add_bias(k, L.bk, T, L.wk.rows, stream);
      launch_add_bias(v, L.bv, T, L.wv.rows, stream);
    }
    launch_rope_store(r, stream);
  }

  // gate = silu(W_gate·xn) ⊙ (W_up·xn) for xn = rmsnorm(x): one GEMV launch in decode; the
  // norm, two GEMMs and the gate in prefill.
  void mlp_hidden(const CudaWeights::Layer& L, const float* x, float* xn, int T, float* gate, float* up) {
    if (T <= kGemvMaxTokens) {
      GemvBatch b;
      b.part[0] = {L.w_gate, nullptr, gate};
      b.part[1] = {L.w_up, nullptr, up};
      b.n_parts = 2, b.cols = L.w_gate.cols, b.x = x, b.norm = L.ffn_norm, b.eps = cfg.rms_norm_eps;
      return launch_gemv_swiglu(b, T, stream);
    }
    launch_rmsnorm(x, L.ffn_norm, cfg.rms_norm_eps, T, cfg.hidden_size, xn, stream);
    linear(L.w_gate, xn, T, gate);
    linear(L.w_up, xn, T, up);
    launch_swiglu(gate, up, size_t(T) * L.w_gate.rows, stream);
  }
};

CudaForward::CudaForward(std::shared_ptr<const CudaWeights> weights, const Model& model, int max_tokens) : impl_(new Impl) {
  Impl& s = *impl_;
  s.w = std::move(weights);
  s.cfg = model.config();
  s.inv_freq = model.inv_freq();
  s.max_tokens = max_tokens;
  const ModelConfig& c = s.cfg;
  DKI_CUDA_CHECK(cudaSetDevice(s.w->device));
  DKI_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  DKI_CUBLAS_CHECK(cublas_api().create(&s.blas));
  DKI_CUBLAS_CHECK(cublas_api().set_stream(s.blas, s.stream));
  // Plain fp32 math in F32 GEMMs (no TF32), so F32 models match the CPU to ~1e-5.
  DKI_CUBLAS_CHECK(cublas_api().set_math_mode(s.blas, CUBLAS_DEFAULT_MATH));
  // Alpha and beta from device memory: an F16 GEMM's alpha is set by the kernel that scales its input.
  DKI_CUBLAS_CHECK(cublas_api().set_pointer_mode(s.blas, CUBLAS_POINTER_MODE_DEVICE));
  const GemmScalars initial;
  s.scalars.allocate(sizeof initial, "GEMM scalars");
  // On the forward's stream, which the legacy stream of a plain cudaMemcpy does not order (it is
  // non-blocking); a pageable source is staged before the call returns.
  DKI_CUDA_CHECK(cudaMemcpyAsync(s.scalars.get<GemmScalars>(), &initial, sizeof initial, cudaMemcpyHostToDevice, s.stream));

  const size_t f = sizeof(float), T = std::min(kMaxCudaChunk, max_tokens);
  const size_t D = c.hidden_size, F = c.intermediate_size, qd = size_t(c.n_heads) * c.head_dim, kvd = size_t(c.n_kv_heads) * c.head_dim;
  const size_t cache = size_t(c.n_layers) * kvd * max_tokens * f;
  // Every device buffer below, summed before the first is allocated: a window that cannot fit is
  // refused with both numbers instead of failing halfway through the list. The GPU cache is
  // allocated whole (the graphs captured for decode hold its address), so it must fit now.
  // Split attention's partial states and counts: a decode step's rows or a short prefill's.
  const size_t split_rows = size_t(std::max(kGemvMaxTokens, kSplitMaxTokens)) * c.n_heads;
  const size_t partial_bytes = split_rows * kDecodeSplits * (c.head_dim + 3) * f, done_bytes = split_rows * sizeof(int);
  const size_t need = 2 * cache + s.step_layout(int(T)).bytes + partial_bytes + done_bytes + T * (2 * D + 2 * qd + 2 * kvd + 2 * F) * f + size_t(c.n_heads) * f +
                      2 * T * std::max({D, F, qd}) * 2 + s.w->max_q8_elements * 2;
  size_t free_b = 0, total_b = 0;
  DKI_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (need > free_b && drain_device_block_pool(s.w->device)) DKI_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (need > free_b)
    throw SystemError("a " + std::to_string(max_tokens) + "-token context on cuda:" + std::to_string(s.w->device) + " needs " + byte_size(need) +
                " of GPU memory (its K/V cache " + byte_size(2 * cache) + "); " + byte_size(free_b) + " is free of " + byte_size(total_b), "ENOMEM");
  s.k_cache.allocate(cache, "the context's K cache");
  s.v_cache.allocate(cache, "the context's V cache");
  const Impl::StepLayout step = s.step_layout(int(T));
  s.step.allocate(step.bytes, "a chunk's inputs");
  s.step_host.allocate(step.bytes, "a chunk's inputs");
  s.attn_partial.allocate(partial_bytes, "split attention state");
  s.attn_done.allocate(done_bytes, "split attention counts");
  DKI_CUDA_CHECK(cudaMemsetAsync(s.attn_done.get(), 0, s.attn_done.bytes(), s.stream));
  const char* graphs = std::getenv("DKI_CUDA_GRAPHS");
  s.use_graphs = !(graphs && std::strcmp(graphs, "0") == 0);
  const char* attention = env_choice("DKI_CUDA_ATTENTION", {"warp", "tiled"}, "\"warp\" or \"tiled\"");
  s.tiled_attention = !(attention && std::strcmp(attention, "warp") == 0);
  const char* split = env_choice("DKI_CUDA_SPLIT_PREFILL", {"on", "off"}, "\"on\" or \"off\"");
  s.split_prefill = !(split && std::strcmp(split, "off") == 0);
  const char* profile = std::getenv("DKI_CUDA_PROFILE");
  s.prof.sums.on = profile && std::strcmp(profile, "1") == 0;
  // Every event a step records (the opening one, the embedding, five stages a layer, the head),
  // made now rather than while a graph is being captured.
  const size_t step_events = s.prof.sums.on ? 3 + 5 * size_t(c.n_layers) : 0;
  while (s.prof.events.size() < step_events) {
    cudaEvent_t e = nullptr;
    DKI_CUDA_CHECK(cudaEventCreate(&e));  // with timing
    s.prof.events.push_back(e);
  }
  s.x.allocate(T * D * f, "activations");
  s.xn.allocate(T * D * f, "activations");
  s.q.allocate(T * qd * f, "queries");
  s.k.allocate(T * kvd * f, "keys");
  s.v.allocate(T * kvd * f, "values");
  s.attn.allocate(T * qd * f, "attention output");
  s.gate.allocate(T * F * f, "MLP activations");
  s.up.allocate(T * F * f, "MLP activations");
  s.probe.allocate(size_t(c.n_heads) * f, "attention probe");
  s.x_half.allocate(2 * T * std::max({D, F, qd}) * 2, "half-precision GEMM inputs (hi and lo)");
  if (s.w->max_q8_elements) s.w_f16.allocate(s.w->max_q8_elements * 2, "a dequantised Q8_0 matrix");
}

CudaForward::~CudaForward() = default;

void CudaForward::set_segments(const std::vector<Segment>& segments) {
  Impl& s = *impl_;
  for (const auto& seg : segments)
    if (seg.block->device && seg.block->device->device != s.w->device)
      throw Error("setSegments: a K/V block is on cuda:" + std::to_string(seg.block->device->device) + ", this context on cuda:" +
                  std::to_string(s.w->device) + "; move it with toDevice() first");
  s.pending = segments;
  s.segments_changed = true;
}

void CudaForward::Impl::upload_segments() {
  const std::vector<Segment>& segments = pending;
  const ModelConfig& c = cfg;
  int S = 0;
  bool same = segments.size() == uploaded.size();
  for (size_t i = 0; i < segments.size(); i++) {
    S += segments[i].block->n_tokens;
    same = same && segments[i].block == uploaded[i].first && segments[i].shift == uploaded[i].second;
  }
  S_seg = S;
  if (S == 0) {
    segments_changed = false;
    return;
  }
  const size_t hd = c.head_dim, rows = size_t(c.n_layers) * c.n_kv_heads, f = sizeof(float);
  if (fit_segments(S)) same = false;
  bool enqueued = false;
  if (!same) {
    uploaded.clear();  // a failed upload must not leave a stale "same" behind
    // Host blocks go up through the GPU's staging lane, on a stream of its own: nothing on this
    // context's stream may still read the segments they overwrite.
    DKI_CUDA_CHECK(cudaStreamSynchronize(stream));
    // Each block's rows land at token column `off` of the buffers' rows of S tokens, its keys
    // rotated from where it was computed to where it sits (q·R(Δ)k needs R(Δ)k): blocks on this
    // GPU (set_segments checked) in one kernel with the rotation, host blocks first copied into
    // place through pinned chunks and rotated there by the same kernel.
    std::vector<SegmentPlacement> table;
    std::vector<float> turns;
    int off = 0, longest = 0;
    for (const Segment& seg : segments) {
      const KVBlock& b = *seg.block;
      SegmentPlacement p;
      p.n_tokens = b.n_tokens, p.off = off;
      if (seg.shift != 0) {
        p.turn = int(turns.size() / hd);
        const std::vector<float> cs = rotation_by(seg.shift, inv_freq);
        turns.insert(turns.end(), cs.begin(), cs.end());
      }
      if (b.device) {
        p.k = b.device->k.get<float>(), p.v = b.device->v.get<float>(), p.pitch = size_t(b.n_tokens) * hd;
      } else {
        float *to_k = seg_k.get<float>() + off * hd, *to_v = seg_v.get<float>() + off * hd;
        upload_rows(w->device, b.k.data(), size_t(b.n_tokens) * hd * f, rows, to_k, S * hd * f);
        upload_rows(w->device, b.v.data(), size_t(b.n_tokens) * hd * f, rows, to_v, S * hd * f);
        p.k = to_k, p.v = to_v, p.pitch = S * hd;
      }
      off += b.n_tokens;
      if (p.turn < 0 && !b.device) continue;  // in place already
      table.push_back(p);
      longest = std::max(longest, b.n_tokens);
    }
    if (!table.empty()) {
      const size_t table_bytes = table.size() * sizeof(SegmentPlacement), turn_bytes = std::max<size_t>(turns.size(), 1) * f;
      if (seg_table.bytes() < table_bytes) seg_table.allocate(table_bytes, "segment placements");
      if (seg_turns.bytes() < turn_bytes) seg_turns.allocate(turn_bytes, "segment rotations");
      DKI_CUDA_CHECK(cudaMemcpyAsync(seg_table.get(), table.data(), table_bytes, cudaMemcpyHostToDevice, stream));
      if (!turns.empty()) DKI_CUDA_CHECK(cudaMemcpyAsync(seg_turns.get(), turns.data(), turns.size() * f, cudaMemcpyHostToDevice, stream));
      launch_place_segments(seg_table.get<SegmentPlacement>(), int(table.size()), longest, rows, S, int(hd), seg_turns.get<float>(), c.rope_interleaved,
                            seg_k.get<float>(), seg_v.get<float>(), stream);
      enqueued = true;
    }
  }
  // The per-column score bias and value scale, sent again only when they changed (another α).
  std::vector<float> bias(S), vscale(S);
  int off = 0;
  for (const Segment& seg : segments) {
    std::fill_n(bias.begin() + off, seg.block->n_tokens, seg.logit_scaling ? std::log(seg.alpha) : 0.f);
    std::fill_n(vscale.begin() + off, seg.block->n_tokens, seg.logit_scaling ? 1.f : seg.alpha);
    off += seg.block->n_tokens;
  }
  if (!same || bias != uploaded_bias || vscale != uploaded_vscale) {
    uploaded_bias.clear();  // as `uploaded`: nothing stale is left if a copy below fails
    DKI_CUDA_CHECK(cudaMemcpyAsync(seg_bias.get(), bias.data(), S * f, cudaMemcpyHostToDevice, stream));
    DKI_CUDA_CHECK(cudaMemcpyAsync(seg_vscale.get(), vscale.data(), S * f, cudaMemcpyHostToDevice, stream));
    enqueued = true;
  }
  if (enqueued) DKI_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host vectors above die with this call
  uploaded_bias = std::move(bias);
  uploaded_vscale = std::move(vscale);
  uploaded.clear();
  for (const auto& seg : segments) uploaded.emplace_back(seg.block, seg.shift);
  segments_changed = false;
}

bool CudaForward::Impl::fit_segments(size_t S) {
  const size_t f = sizeof(float), kv_bytes = size_t(cfg.n_layers) * cfg.n_kv_heads * S * cfg.head_dim * f;
  if (seg_k.bytes() >= kv_bytes && seg_v.bytes() >= kv_bytes && seg_bias.bytes() >= S * f && seg_vscale.bytes() >= S * f) return false;
  // New buffers hold nothing yet, and an allocation that throws leaves its buffer empty: the
  // segments are uploaded again, whatever was uploaded before, and by the next chunk even when
  // this is a reservation between two chunks with the same segments set. All four are replaced
  // together (the graph key names seg_k and seg_bias for the four).
  uploaded.clear();
  segments_changed = true;
  seg_k.allocate(kv_bytes, "injected segment keys");
  seg_v.allocate(kv_bytes, "injected segment values");
  seg_bias.allocate(S * f, "segment score biases");
  seg_vscale.allocate(S * f, "segment value scales");
  return true;
}

void CudaForward::reserve_segments(int64_t tokens) {
  Impl& s = *impl_;
  DKI_CUDA_CHECK(cudaSetDevice(s.w->device));
  s.fit_segments(size_t(tokens));
}

// A prompt of up to a tile of queries after S columns has H blocks of attention without a
// split, each walking S / 64 column tiles in turn: an H100 has 132 SMs, a 1B model 32 heads.
// Splits of at least kSplitColumns columns keep each block's walk worth its merge.
int CudaForward::Impl::prefill_splits(int T, int columns) const {
  constexpr int kSplitColumns = 128;
  if (!split_prefill || !tiled_attention || T <= kGemvMaxTokens || T > kSplitMaxTokens) return 1;
  return std::clamp(columns / kSplitColumns, 1, kDecodeSplits);
}

void CudaForward::Impl::record(int T, int rows, int probe_layer, bool want_probe, int columns) {
  const ModelConfig& c = cfg;
  const CudaWeights& W = *w;
  const int D = c.hidden_size, hd = c.head_dim;
  cudaStream_t st = stream;
  const StepLayout in = step_layout(T);
  const char* step_p = step.get<char>();
  const int* n_past = reinterpret_cast<const int*>(step_p);
  const int32_t* tok = reinterpret_cast<const int32_t*>(step_p + in.tokens);
  const float* cos = reinterpret_cast<const float*>(step_p + in.cos);
  const float* sin = reinterpret_cast<const float*>(step_p + in.sin);

  float *x_ = x.get<float>(), *xn_ = xn.get<float>(), *q_ = q.get<float>(), *k_ = k.get<float>(), *v_ = v.get<float>();
  float *attn_ = attn.get<float>(), *gate_ = gate.get<float>(), *up_ = up.get<float>();
  open_step(T);
  launch_embed(W.embed, tok, T, x_, st);
  mark("embedding", dtype_bytes(W.embed.dtype, W.embed.cols));

  AttentionArgs a;
  a.q = q_;
  a.out = attn_;
  a.seg_bias = seg_bias.get<float>();
  a.seg_vscale = seg_vscale.get<float>();
  a.S_seg = S_seg;
  a.max_tokens = max_tokens;
  a.n_past = n_past;
  a.T = T, a.H = c.n_heads, a.Hkv = c.n_kv_heads, a.hd = hd;
  a.scale = 1.f / std::sqrt(float(hd));
  a.splits = T <= kGemvMaxTokens ? kDecodeSplits : prefill_splits(T, columns);
  if (a.splits > 1) a.partial = attn_partial.get<float>(), a.done = attn_done.get<int>();
  a.tiled = tiled_attention;

  for (int l = 0; l < c.n_layers; l++) {
    const CudaWeights::Layer& L = W.layers[l];
    // Attention block: x += Wo · attention(rope(Wq·xn), rope(Wk·xn), Wv·xn)
    RopeStoreArgs r;
    r.q = q_, r.k = k_, r.v = v_;
    a.k_cache = r.k_cache = cache_layer(k_cache, l);
    a.v_cache = r.v_cache = cache_layer(v_cache, l);
    r.cos = cos, r.sin = sin, r.n_past = n_past;
    r.T = T, r.H = c.n_heads, r.Hkv = c.n_kv_heads, r.hd = hd, r.max_tokens = max_tokens, r.interleaved = c.rope_interleaved;
    project_qkv(L, x_, xn_, r);
    mark("norm + q/k/v + rotary", bytes_of(L.wq) + bytes_of(L.wk) + bytes_of(L.wv));
    if (S_seg) {
      const size_t seg_layer = size_t(l) * c.n_kv_heads * S_seg * hd;
      a.seg_k = seg_k.get<float>() + seg_layer;
      a.seg_v = seg_v.get<float>() + seg_layer;
    }
    a.entropy = l == probe_layer && want_probe ? probe.get<float>() : nullptr;
    launch_attention(a, st);
    mark("attention", 0);
    linear(L.wo, attn_, T, x_, /*accumulate=*/true);
    mark("output projection", bytes_of(L.wo));

    // MLP block: x += W_down · (silu(W_gate·xn) ⊙ W_up·xn)
    mlp_hidden(L, x_, xn_, T, gate_, up_);
    mark("norm + gate/up + SiLU", bytes_of(L.w_gate) + bytes_of(L.w_up));
    linear(L.w_down, gate_, T, x_, /*accumulate=*/true);
    mark("down projection", bytes_of(L.w_down));
  }

  if (rows > 0) {
    const int first = T - rows;
    launch_rmsnorm(x_ + size_t(first) * D, W.final_norm, c.rms_norm_eps, rows, D, xn_, st);
    linear(W.lm_head, xn_, rows, logits.get<float>());
    mark("norm + LM head", bytes_of(W.lm_head));
  }
  prof.marking = false;
}

void CudaForward::Impl::open_step(int T) {
  prof.marking = prof.sums.on && T == 1;
  if (!prof.marking) return;
  std::lock_guard<std::mutex> lock(prof.mutex);
  prof.stage_of.clear();
  for (StageTime& t : prof.sums.stages) t.bytes = 0;
  record_event(0);
}

void CudaForward::Impl::mark(const char* stage, uint64_t bytes) {
  if (!prof.marking) return;
  std::lock_guard<std::mutex> lock(prof.mutex);
  std::vector<StageTime>& stages = prof.sums.stages;
  size_t i = 0;
  while (i < stages.size() && stages[i].stage != stage) i++;
  if (i == stages.size()) stages.push_back({stage, 0, 0});
  stages[i].bytes += bytes;
  prof.stage_of.push_back(int(i));
  record_event(prof.stage_of.size());
}

void CudaForward::Impl::record_event(size_t i) {
  if (i >= prof.events.size()) throw Error("CUDA profile: step has more stages than events made for it");
  // In a graph capture, an event node that records the event each time the graph runs.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  DKI_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  DKI_CUDA_CHECK(cudaEventRecordWithFlags(prof.events[i], stream, capturing == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault));
}

// After a one-token step has finished: adds its stages' times.
void CudaForward::Impl::add_step() {
  std::lock_guard<std::mutex> lock(prof.mutex);
  for (size_t i = 0; i < prof.stage_of.size(); i++) {
    float ms = 0;
    DKI_CUDA_CHECK(cudaEventElapsedTime(&ms, prof.events[i], prof.events[i + 1]));
    prof.sums.stages[prof.stage_of[i]].ms += ms;
  }
  prof.sums.steps++;
}

StageProfile CudaForward::profile() const {
  std::lock_guard<std::mutex> lock(impl_->prof.mutex);
  return impl_->prof.sums;
}

cudaGraphExec_t CudaForward::Impl::capture(int T, int rows, int probe_layer, bool want_probe) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool ok = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    try {
      record(T, rows, probe_layer, want_probe, /*columns: decode splits regardless*/ 0);
    } catch (...) {  // any exception: a stream left capturing would fail every later call on it
      ok = false;
    }
    // Ends the capture whatever happened inside it.
    ok = cudaStreamEndCapture(stream, &g) == cudaSuccess && ok;
  }
  ok = ok && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess;
  if (g) cudaGraphDestroy(g);
  if (ok) return exec;
  cudaGetLastError();
  if (++failed_captures >= 3) use_graphs = false;
  return nullptr;
}

void CudaForward::eval_chunk(const int32_t* tokens, int T, int n_past, int pos0, int rows, float* logits, int probe_layer, float* probe) {
  Impl& s = *impl_;
  const ModelConfig& c = s.cfg;
  const int half = c.head_dim / 2;
  const size_t V = c.vocab_size;
  cudaStream_t st = s.stream;
  DKI_CUDA_CHECK(cudaSetDevice(s.w->device));
  if (s.segments_changed) s.upload_segments();

  // The chunk's inputs, staged in pinned memory and sent in one copy. Angles in double, exactly
  // as the CPU backend computes them. The previous chunk's copy has finished: every eval_chunk
  // ends with a stream synchronisation.
  const Impl::StepLayout in = s.step_layout(T);
  char* h = s.step_host.get<char>();
  std::memcpy(h, &n_past, sizeof n_past);
  std::memcpy(h + in.tokens, tokens, size_t(T) * sizeof(int32_t));
  float* cos = reinterpret_cast<float*>(h + in.cos);
  float* sin = reinterpret_cast<float*>(h + in.sin);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      const double a = double(pos0 + t) * s.inv_freq[i];
      cos[size_t(t) * half + i] = float(std::cos(a));
      sin[size_t(t) * half + i] = float(std::sin(a));
    }
  DKI_CUDA_CHECK(cudaMemcpyAsync(s.step.get(), h, in.bytes, cudaMemcpyHostToDevice, st));
  if (rows > 0 && s.logits.bytes() < rows * V * sizeof(float)) s.logits.allocate(rows * V * sizeof(float), "logits");
  const bool want_probe = probe && probe_layer >= 0;

  const int columns = s.S_seg + n_past + T;
  if (T > kGemvMaxTokens || !s.use_graphs) {
    s.record(T, rows, probe_layer, want_probe, columns);
  } else {
    const Impl::GraphKey key{T, rows, s.S_seg, s.seg_k.get(), s.seg_bias.get(), want_probe ? probe_layer : -1, s.logits.get()};
    if (!s.graph || key != s.graph_key) {
      if (s.graph) cudaGraphExecDestroy(s.graph);
      s.graph = s.capture(T, rows, probe_layer, want_probe);
      s.graph_key = key;
    }
    if (s.graph) DKI_CUDA_CHECK(cudaGraphLaunch(s.graph, st));
    else s.record(T, rows, probe_layer, want_probe, columns);  // the capture failed
  }

  if (rows > 0) DKI_CUDA_CHECK(cudaMemcpyAsync(logits, s.logits.get(), rows * V * sizeof(float), cudaMemcpyDeviceToHost, st));
  if (want_probe) DKI_CUDA_CHECK(cudaMemcpyAsync(probe, s.probe.get(), size_t(c.n_heads) * sizeof(float), cudaMemcpyDeviceToHost, st));
  DKI_CUDA_CHECK(cudaStreamSynchronize(st));
  if (s.prof.sums.on && T == 1) s.add_step();
}

// Rows (layer, kv_head) of the cache are max_tokens·hd floats apart; a block's are n·hd.
void CudaForward::Impl::copy_out(int from, int to, float* k, float* v, cudaMemcpyKind kind) const {
  const size_t hd = cfg.head_dim, n = size_t(to - from), heads = size_t(cfg.n_layers) * cfg.n_kv_heads, f = sizeof(float);
  DKI_CUDA_CHECK(cudaSetDevice(w->device));
  try {
    DKI_CUDA_CHECK(cudaMemcpy2DAsync(k, n * hd * f, k_cache.get<float>() + from * hd, max_tokens * hd * f, n * hd * f, heads, kind, stream));
    DKI_CUDA_CHECK(cudaMemcpy2DAsync(v, n * hd * f, v_cache.get<float>() + from * hd, max_tokens * hd * f, n * hd * f, heads, kind, stream));
    DKI_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    cudaStreamSynchronize(stream);  // before the caller frees k and v
    throw;
  }
}

void CudaForward::export_kv(int from, int to, float* k, float* v) const { impl_->copy_out(from, to, k, v, cudaMemcpyDeviceToHost); }

std::shared_ptr<const DeviceKV> CudaForward::export_kv_device(int from, int to) const {
  const Impl& s = *impl_;
  DKI_CUDA_CHECK(cudaSetDevice(s.w->device));
  auto d = std::make_shared<DeviceKV>(s.w->device, size_t(s.cfg.n_layers) * s.cfg.n_kv_heads * (to - from) * s.cfg.head_dim);
  s.copy_out(from, to, d->k.get<float>(), d->v.get<float>(), cudaMemcpyDeviceToDevice);
  return d;
}

}  // namespace dki
