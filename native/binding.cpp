// Node-API surface of the engine: thin and strict. Every argument is type-checked here; all
// policy (file discovery, tokenisation, generation loop, stop strings) lives in TypeScript.
// Heavy calls run on libuv worker threads and return Promises.
#include <napi.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "blend.h"
#include "context.h"
#include "file_lock.h"
#include "kernels/kernels.h"
#include "kv_ops.h"
#include "model.h"
#include "resources.h"
#include "sampler.h"
#include "threadpool.h"
#ifdef DKI_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace {

using namespace dki;

// Heavy work is serialised: the thread pool already uses every core, and the pool must not be
// resized (nor the kernels switched) under a running loop.
std::mutex g_compute;

// Engine settings (threads, SIMD path, prefetch, decode streams) asked for while work holds the
// compute lock are applied when the lock is next taken, in the order asked: the JS thread never
// waits behind an eval or a model load to change them (it used to, for seconds). Idle, they
// apply at once.
class PendingSettings {
 public:
  void request(std::function<void()> setting) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back(std::move(setting));
    }
    std::unique_lock<std::mutex> compute(g_compute, std::try_to_lock);
    if (compute.owns_lock()) apply();
  }
  // The caller holds g_compute. Settings were checked when asked for; only starting a pool's
  // threads can still fail (the old pool then stays), and that must not stop the others.
  void apply() noexcept {
    std::vector<std::function<void()>> todo;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      todo.swap(pending_);
    }
    for (auto& f : todo) {
      try {
        f();
      } catch (...) {
      }
    }
  }

 private:
  std::mutex mutex_;
  std::vector<std::function<void()>> pending_;
};
PendingSettings g_settings;

// Held by every piece of heavy work: one at a time. The settings asked for meanwhile are applied
// when the lock is taken and again when the work ends, so they hold as soon as nothing runs.
class ComputeLock {
 public:
  ComputeLock() : lock_(g_compute) { g_settings.apply(); }
  ~ComputeLock() { g_settings.apply(); }
  ComputeLock(const ComputeLock&) = delete;
  ComputeLock& operator=(const ComputeLock&) = delete;

 private:
  std::lock_guard<std::mutex> lock_;
};

[[noreturn]] void throw_type(Napi::Env env, const std::string& msg) { throw Napi::TypeError::New(env, msg); }

// f(), with a dki::Error (the engine refusing an input or a state) thrown on as a JS error of
// class E, its message unchanged. A failed system call (SystemError) also carries its errno's name
// in `code`, as Node's own errors do, so callers can tell "held by someone else" from "cannot
// lock here at all".
template <class E = Napi::Error, class F>
auto js_errors(Napi::Env env, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const SystemError& e) {
    E err = E::New(env, e.what());
    if (!e.code.empty()) err.Value().Set("code", e.code);
    throw err;
  } catch (const dki::Error& e) {
    throw E::New(env, e.what());
  }
}

// Argument 0 as a storage form ("f32", "f16", "bf16", "int8").
KVStorage storage_arg(const Napi::CallbackInfo& info, const char* usage) {
  if (info.Length() < 1 || !info[0].IsString()) throw_type(info.Env(), usage);
  return js_errors(info.Env(), [&] { return parse_storage(info[0].As<Napi::String>()); });
}

double get_number(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  if (!v.IsNumber()) throw_type(o.Env(), std::string("\"") + key + "\" must be a number");
  return v.As<Napi::Number>().DoubleValue();
}

int get_int(const Napi::Object& o, const char* key) {
  double d = get_number(o, key);
  if (d != double(int64_t(d)) || d < -2147483648.0 || d > 2147483647.0) throw_type(o.Env(), std::string("\"") + key + "\" must be an integer");
  return int(d);
}

// Argument i as an integer from lo to hi: a TypeError with the call's usage when it is not a
// number, a RangeError naming it when it is not such an integer (NaN, 1.5, 2^32 + 1, ...).
int int_arg(const Napi::CallbackInfo& info, size_t i, const char* usage, const char* name, int64_t lo, int64_t hi) {
  if (info.Length() <= i || !info[i].IsNumber()) throw_type(info.Env(), usage);
  const double d = info[i].As<Napi::Number>().DoubleValue();
  if (!(d >= double(lo) && d <= double(hi)) || d != std::floor(d)) {
    char got[32];
    snprintf(got, sizeof got, "%.17g", d);
    throw Napi::RangeError::New(info.Env(), std::string(name) + " must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " + got);
  }
  return int(d);
}

constexpr int64_t kIntMax = 2147483647;
constexpr int64_t kMaxDevice = 1023;

bool get_bool(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  if (!v.IsBoolean()) throw_type(o.Env(), std::string("\"") + key + "\" must be a boolean");
  return v.As<Napi::Boolean>().Value();
}

std::string get_string(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  if (!v.IsString()) throw_type(o.Env(), std::string("\"") + key + "\" must be a string");
  return v.As<Napi::String>().Utf8Value();
}

// Which class wrapped a native object. InstanceOf follows prototypes that a script can change, so
// an object is unwrapped as a class only when it carries that class's tag (set at construction).
constexpr napi_type_tag kModelTag = {0x646b692d6d6f6465, 0x6c00000000000001};
constexpr napi_type_tag kBlockTag = {0x646b692d6b76626c, 0x6f636b0000000001};
constexpr napi_type_tag kContextTag = {0x646b692d636f6e74, 0x6578740000000001};
constexpr napi_type_tag kSamplerTag = {0x646b692d73616d70, 0x6c65720000000001};

void tag(Napi::Env env, Napi::Object o, const napi_type_tag& t) { NAPI_THROW_IF_FAILED_VOID(env, napi_type_tag_object(env, o, &t)); }

// o as wrapper class W when it carries W's tag, else a TypeError naming what was expected.
template <class W>
W* unwrap_as(Napi::Env env, Napi::Value v, const napi_type_tag& t, const std::string& expected) {
  bool ok = false;
  if (v.IsObject() && napi_check_object_type_tag(env, v, &t, &ok) != napi_ok) ok = false;
  if (!ok) throw_type(env, expected);
  return W::Unwrap(v.As<Napi::Object>());
}

// The classes this environment made (the main thread and each worker thread that loads the
// addon have their own: a constructor of one must never be used in another).
struct Classes {
  Napi::FunctionReference model, block;
  // File locks this environment took and has not let go of. A worker thread that ends without
  // unlockFile would otherwise keep its lock until the whole process exits; its environment's
  // teardown deletes this, which lets go of them.
  std::set<int> locks;
  ~Classes() {
    for (int fd : locks) {
      try {
        unlock_file(fd);
      } catch (...) {  // at teardown there is no one to tell
      }
    }
  }
};
Classes& classes(Napi::Env env) { return *env.GetInstanceData<Classes>(); }

// A Promise-returning worker: Run() executes off the main thread, Resolve() builds the value.
class PromiseWorker : public Napi::AsyncWorker {
 public:
  explicit PromiseWorker(Napi::Env env) : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise promise() { return deferred_.Promise(); }

 protected:
  virtual void Run() = 0;
  virtual Napi::Value Resolve(Napi::Env env) { return env.Undefined(); }
  virtual void Finally() {}

 private:
  void Execute() override {
    try {
      Run();
    } catch (const NonFiniteError& e) {
      non_finite_ = true;
      segment_ = e.segment;
      row_ = e.row;
      SetError(e.what());
    } catch (const std::exception& e) {
      SetError(e.what());
    }
  }
  void OnOK() override {
    Finally();
    // Building the value can fail too (a Buffer or array larger than Node allows): the promise
    // then rejects, rather than the error escaping with the promise left pending.
    Napi::Value v;
    try {
      v = Resolve(Env());
    } catch (const Napi::Error& e) {
      deferred_.Reject(e.Value());
      return;
    } catch (const std::exception& e) {
      deferred_.Reject(Napi::Error::New(Env(), e.what()).Value());
      return;
    }
    deferred_.Resolve(v);
  }
  void OnError(const Napi::Error& e) override {
    Finally();
    // A NaN/inf found on the way: JavaScript gets where (the eval row, the injected segment) to
    // word the error for its caller (the generation step, the segment as the caller numbered it).
    if (non_finite_) {
      Napi::Object err = e.Value();
      err.Set("code", "ERR_DKI_NOT_FINITE");
      err.Set("segment", segment_);
      err.Set("row", row_);
    }
    deferred_.Reject(e.Value());
  }
  // A worker thread's environment that is being torn down (worker.terminate() during a call)
  // cannot open a handle scope: nobody can see the promise any more, so the result is dropped
  // instead of the throw ending the whole process.
  void OnWorkComplete(Napi::Env env, napi_status status) override {
    try {
      Napi::AsyncWorker::OnWorkComplete(env, status);
    } catch (const Napi::Error&) {
      Destroy();
    }
  }
  Napi::Promise::Deferred deferred_;
  bool non_finite_ = false;
  int segment_ = -1, row_ = -1;
};

// ---------------------------------------------------------------- Model

class ModelWrap : public Napi::ObjectWrap<ModelWrap> {
 public:
  static void Init(Napi::Env env, Napi::Object exports) {
    Napi::Function f = DefineClass(env, "NativeModel",
                                   {InstanceMethod("info", &ModelWrap::Info), InstanceMethod("dispose", &ModelWrap::Dispose)});
    classes(env).model = Napi::Persistent(f);
    exports.Set("NativeModel", f);
  }
  explicit ModelWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ModelWrap>(info) { tag(info.Env(), info.This().As<Napi::Object>(), kModelTag); }
  static ModelWrap* from(Napi::Env env, Napi::Value v, const std::string& expected) { return unwrap_as<ModelWrap>(env, v, kModelTag, expected); }

  std::shared_ptr<const Model> model(Napi::Env env) const {
    if (!model_) throw Napi::Error::New(env, "model has been disposed");
    return model_;
  }
  void set(std::shared_ptr<const Model> m) { model_ = std::move(m); }

 private:
  Napi::Value Info(const Napi::CallbackInfo& info) {
    auto m = model(info.Env());
    Napi::Object o = Napi::Object::New(info.Env());
    char fp[17];
    snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(m->fingerprint()));
    o.Set("fingerprint", fp);
    o.Set("paramCount", double(m->param_count()));
    o.Set("weightBytes", double(m->weight_bytes()));
    o.Set("device", "cpu");
    o.Set("deviceBytes", 0.0);
    o.Set("deviceIndex", -1);
#ifdef DKI_CUDA
    if (const auto& dw = m->device_weights()) {
      o.Set("device", "cuda");
      o.Set("deviceBytes", double(cuda_weight_bytes(*dw)));
      o.Set("deviceIndex", cuda_weights_device(*dw));
    }
#endif
    return o;
  }
  // Drops this handle's reference; contexts that still use the model keep it alive.
  Napi::Value Dispose(const Napi::CallbackInfo& info) {
    model_.reset();
    return info.Env().Undefined();
  }
  std::shared_ptr<const Model> model_;
};

class LoadWorker : public PromiseWorker {
 public:
  // cuda_device < 0: the model runs on the CPU; otherwise its weights go to that GPU.
  LoadWorker(Napi::Env env, ModelConfig cfg, std::vector<TensorSpec> specs, DType quantize, int cuda_device, bool check_tensors)
      : PromiseWorker(env), cfg_(cfg), specs_(std::move(specs)), quantize_(quantize), cuda_device_(cuda_device), check_tensors_(check_tensors) {}
  void Run() override {
    ComputeLock lock;  // quantising uses the thread pool
    auto m = std::make_shared<Model>(cfg_, specs_, quantize_, check_tensors_);
#ifdef DKI_CUDA
    if (cuda_device_ >= 0) m->set_device_weights(cuda_upload(*m, cuda_device_));
#endif
    model_ = std::move(m);
  }
  Napi::Value Resolve(Napi::Env env) override {
    Napi::Object obj = classes(env).model.New({});
    ModelWrap::Unwrap(obj)->set(model_);
    return obj;
  }

 private:
  ModelConfig cfg_;
  std::vector<TensorSpec> specs_;
  DType quantize_;
  int cuda_device_;
  bool check_tensors_;
  std::shared_ptr<const Model> model_;
};

// loadModel({ config, tensors: [{ name, file, dtype, shape, offset, nbytes }], quantize?: "none" | "q8_0", checkTensors?: boolean })
// → Promise<NativeModel>
Napi::Value LoadModel(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsObject()) throw_type(env, "loadModel expects a spec object");
  Napi::Object spec = info[0].As<Napi::Object>();
  if (!spec.Get("config").IsObject()) throw_type(env, "spec.config must be an object");
  Napi::Object c = spec.Get("config").As<Napi::Object>();
  ModelConfig cfg;
  cfg.vocab_size = get_int(c, "vocabSize");
  cfg.hidden_size = get_int(c, "hiddenSize");
  cfg.intermediate_size = get_int(c, "intermediateSize");
  cfg.n_layers = get_int(c, "numLayers");
  cfg.n_heads = get_int(c, "numHeads");
  cfg.n_kv_heads = get_int(c, "numKvHeads");
  cfg.head_dim = get_int(c, "headDim");
  cfg.rms_norm_eps = float(get_number(c, "rmsNormEps"));
  cfg.rope_theta = get_number(c, "ropeTheta");
  cfg.tie_word_embeddings = get_bool(c, "tieWordEmbeddings");
  cfg.attention_bias = get_bool(c, "attentionBias");
  cfg.rope_interleaved = c.Has("ropeInterleaved") && !c.Get("ropeInterleaved").IsUndefined() && get_bool(c, "ropeInterleaved");
  Napi::Value rs = c.Get("ropeScaling");
  if (rs.IsObject()) {
    Napi::Object r = rs.As<Napi::Object>();
    cfg.rope_factor = get_number(r, "factor");
    cfg.rope_low_freq_factor = get_number(r, "lowFreqFactor");
    cfg.rope_high_freq_factor = get_number(r, "highFreqFactor");
    cfg.rope_original_max_pos = get_number(r, "originalMaxPositionEmbeddings");
  }
  if (!spec.Get("tensors").IsArray()) throw_type(env, "spec.tensors must be an array");
  Napi::Array arr = spec.Get("tensors").As<Napi::Array>();
  std::vector<TensorSpec> specs;
  for (uint32_t i = 0; i < arr.Length(); i++) {
    if (!arr.Get(i).IsObject()) throw_type(env, "spec.tensors entries must be objects");
    Napi::Object t = arr.Get(i).As<Napi::Object>();
    TensorSpec s;
    s.name = get_string(t, "name");
    s.file = get_string(t, "file");
    std::string dt = get_string(t, "dtype");
    if (dt == "F32") s.dtype = DType::F32;
    else if (dt == "F16") s.dtype = DType::F16;
    else if (dt == "BF16") s.dtype = DType::BF16;
    else if (dt == "Q8_0") s.dtype = DType::Q8_0;
    else throw_type(env, "tensor " + s.name + ": unsupported dtype " + dt);
    double off = get_number(t, "offset"), nb = get_number(t, "nbytes");
    if (off < 0 || nb < 0 || off != double(uint64_t(off)) || nb != double(uint64_t(nb))) throw_type(env, "tensor " + s.name + ": bad offset/nbytes");
    s.offset = uint64_t(off);
    s.nbytes = uint64_t(nb);
    if (!t.Get("shape").IsArray()) throw_type(env, "tensor " + s.name + ": shape must be an array");
    Napi::Array sh = t.Get("shape").As<Napi::Array>();
    for (uint32_t j = 0; j < sh.Length(); j++) {
      Napi::Value d = sh.Get(j);
      if (!d.IsNumber() || d.As<Napi::Number>().DoubleValue() < 0) throw_type(env, "tensor " + s.name + ": bad shape");
      s.shape.push_back(int64_t(d.As<Napi::Number>().DoubleValue()));
    }
    specs.push_back(std::move(s));
  }
  DType quantize = DType::F32;
  if (spec.Has("quantize") && !spec.Get("quantize").IsUndefined()) {
    std::string q = get_string(spec, "quantize");
    if (q == "q8_0") quantize = DType::Q8_0;
    else if (q != "none") throw_type(env, "quantize must be \"none\" or \"q8_0\", got \"" + q + "\"");
  }
  int cuda_device = -1;
  if (spec.Has("device") && !spec.Get("device").IsUndefined()) {
    std::string d = get_string(spec, "device");
    if (d == "cuda") cuda_device = spec.Has("deviceIndex") && !spec.Get("deviceIndex").IsUndefined() ? get_int(spec, "deviceIndex") : 0;
    else if (d != "cpu") throw_type(env, "device must be \"cpu\" or \"cuda\", got \"" + d + "\"");
  }
#ifndef DKI_CUDA
  if (cuda_device >= 0)
    throw Napi::Error::New(env, "this build of dki-engine has no CUDA backend (npm install builds the CPU engine): run `npm run build:cuda` "
                                "on a machine with the CUDA toolkit");
#endif
  const bool check_tensors = spec.Has("checkTensors") && !spec.Get("checkTensors").IsUndefined() && get_bool(spec, "checkTensors");
  auto* w = new LoadWorker(env, cfg, std::move(specs), quantize, cuda_device, check_tensors);
  Napi::Promise p = w->promise();
  w->Queue();
  return p;
}

// ---------------------------------------------------------------- K/V block

// V8 is told how much native memory the live K/V blocks of this environment hold, so blocks that
// are never disposed get collected under memory pressure. It is told in steps of kReportStep:
// reporting every block (94 MB for 2048 tokens at the 135M shape) made V8 run a full collection
// on nearly every restore, which cost more than the restore itself.
class ExternalBlockBytes {
 public:
  static constexpr int64_t kReportStep = int64_t(256) << 20;

  // Called on the environment's own JS thread, at creation, dispose and finalisation of a block.
  static void add(napi_env env, int64_t bytes) {
    Counts& c = counts(env);
    c.live += bytes;
    if (c.live - c.reported >= kReportStep || c.reported - c.live >= kReportStep) {
      int64_t ignored;
      napi_adjust_external_memory(env, c.live - c.reported, &ignored);
      c.reported = c.live;
    }
  }

 private:
  struct Counts {
    int64_t live = 0, reported = 0;
  };
  // Per environment (the main thread and each worker thread that loads the addon). Entries are
  // never removed: an environment may finalise its blocks during its own teardown.
  static Counts& counts(napi_env env) {
    static std::mutex m;
    static std::map<napi_env, Counts>* all = new std::map<napi_env, Counts>;
    std::lock_guard<std::mutex> lock(m);
    return (*all)[env];
  }
};

class BlockWrap : public Napi::ObjectWrap<BlockWrap> {
 public:
  static void Init(Napi::Env env, Napi::Object exports) {
    Napi::Function f = DefineClass(env, "NativeKVBlock",
                                   {InstanceMethod("info", &BlockWrap::Info), InstanceMethod("dispose", &BlockWrap::Dispose),
                                    InstanceMethod("scaleValues", &BlockWrap::ScaleValues), InstanceMethod("slice", &BlockWrap::Slice),
                                    InstanceMethod("serialize", &BlockWrap::Serialize), InstanceMethod("storageBytes", &BlockWrap::StorageBytes), InstanceMethod("serializedBytes", &BlockWrap::SerializedBytes),
                                    InstanceMethod("keys", &BlockWrap::Keys), InstanceMethod("values", &BlockWrap::Values), InstanceMethod("valueAbsMax", &BlockWrap::ValueAbsMax),
                                    InstanceMethod("toDevice", &BlockWrap::ToDevice), InstanceMethod("toHost", &BlockWrap::ToHost)});
    classes(env).block = Napi::Persistent(f);
    exports.Set("NativeKVBlock", f);
  }
  explicit BlockWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<BlockWrap>(info) { tag(info.Env(), info.This().As<Napi::Object>(), kBlockTag); }
  ~BlockWrap() override { release(); }
  static BlockWrap* from(Napi::Env env, Napi::Value v, const std::string& expected) { return unwrap_as<BlockWrap>(env, v, kBlockTag, expected); }
  static Napi::Object Wrap(Napi::Env env, std::shared_ptr<const KVBlock> b) {
    Napi::Object obj = classes(env).block.New({});
    BlockWrap* w = Unwrap(obj);
    // GPU memory counts too: a device block left to the collector holds scarce device memory.
    w->external_ = int64_t(host_bytes(*b) + device_bytes(*b));
    ExternalBlockBytes::add(obj.Env(), w->external_);
    w->env_ = obj.Env();
    w->block_ = std::move(b);
    return obj;
  }
  std::shared_ptr<const KVBlock> block(Napi::Env env) const {
    if (!block_) throw Napi::Error::New(env, "K/V block has been disposed");
    return block_;
  }

 private:
  Napi::Value Info(const Napi::CallbackInfo& info) {
    auto b = block(info.Env());
    Napi::Env env = info.Env();
    Napi::Object o = Napi::Object::New(env);
    o.Set("nLayers", b->n_layers);
    o.Set("nKvHeads", b->n_kv_heads);
    o.Set("headDim", b->head_dim);
    o.Set("nTokens", b->n_tokens);
    o.Set("startPos", b->start_pos);
    char fp[17];
    snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(b->fingerprint));
    o.Set("fingerprint", fp);
    Napi::Int32Array toks = Napi::Int32Array::New(env, b->tokens.size());
    std::copy(b->tokens.begin(), b->tokens.end(), toks.Data());
    o.Set("tokens", toks);
    o.Set("byteSize", double(host_bytes(*b)));
    o.Set("deviceBytes", double(device_bytes(*b)));
    o.Set("device", device_of(*b));
    return o;
  }
  static size_t host_bytes(const KVBlock& b) { return (b.k.size() + b.v.size()) * sizeof(float); }
  static size_t device_bytes(const KVBlock& b) {
#ifdef DKI_CUDA
    if (b.device) return device_kv_bytes(*b.device);
#endif
    return 0;
  }
  // The GPU that holds the block's tensors, or -1 for host memory.
  static int device_of(const KVBlock& b) {
#ifdef DKI_CUDA
    if (b.device) return device_kv_device(*b.device);
#endif
    return -1;
  }
  Napi::Value Dispose(const Napi::CallbackInfo& info) {
    release();
    return info.Env().Undefined();
  }
  void release() {
    if (external_ && env_) ExternalBlockBytes::add(env_, -external_);
    external_ = 0;
    block_.reset();
  }

 public:
  // scaleValues(alpha) → Promise<NativeKVBlock>
  Napi::Value ScaleValues(const Napi::CallbackInfo& info) {
    auto b = block(info.Env());
    if (info.Length() < 1 || !info[0].IsNumber()) throw_type(info.Env(), "scaleValues(alpha: number)");
    const float alpha = info[0].As<Napi::Number>().FloatValue();
    return RunBlockOp(info.Env(), [b, alpha] { return scale_values(*b, alpha); });
  }
  // slice(from, to) → Promise<NativeKVBlock>
  Napi::Value Slice(const Napi::CallbackInfo& info) {
    auto b = block(info.Env());
    const char* usage = "slice(from: number, to: number)";
    const int from = int_arg(info, 0, usage, "from", 0, kIntMax), to = int_arg(info, 1, usage, "to", 0, kIntMax);
    return RunBlockOp(info.Env(), [b, from, to] { return slice_block(*b, from, to); });
  }
  // serialize(storage: "f32" | "f16" | "bf16" | "int8") → Promise<Buffer>
  Napi::Value Serialize(const Napi::CallbackInfo& info);
  // storageBytes(storage) → payload bytes in that form; serializedBytes(storage) → the length of
  // serialize(storage): header, token ids and payload.
  Napi::Value StorageBytes(const Napi::CallbackInfo& info) {
    auto b = block(info.Env());
    return Napi::Number::New(info.Env(), double(storage_bytes(*b, storage_arg(info, "storageBytes(storage: string)"))));
  }
  Napi::Value SerializedBytes(const Napi::CallbackInfo& info) {
    auto b = block(info.Env());
    return Napi::Number::New(info.Env(), double(serialized_bytes(*b, storage_arg(info, "serializedBytes(storage: string)"))));
  }
  // valueAbsMax() → the largest |value|, +inf when a key or value is NaN or ±inf. Scanned once
  // (on the block's device), then remembered by the block: injection reads the same figure.
  Napi::Value ValueAbsMax(const Napi::CallbackInfo& info) {
    auto b = block(info.Env());
    return Napi::Number::New(info.Env(), double(js_errors(info.Env(), [&] { return known_value_abs_max(*b); })));
  }
  // keys() / values(): copies of the fp32 tensors, [layer][kv_head][token][head_dim], for tests and analysis.
  Napi::Value Keys(const Napi::CallbackInfo& info) { return Copy(info.Env(), host_tensors(info.Env(), "keys").k); }
  Napi::Value Values(const Napi::CallbackInfo& info) { return Copy(info.Env(), host_tensors(info.Env(), "values").v); }

  // toDevice(deviceIndex) → Promise<NativeKVBlock>: the block in that GPU's memory.
  Napi::Value ToDevice(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    auto b = block(env);
    [[maybe_unused]] const int device = int_arg(info, 0, "toDevice(deviceIndex: number)", "deviceIndex", 0, kMaxDevice);
#ifdef DKI_CUDA
    return RunBlockOp(env, [b, device] { return cuda_block_to_device(b, device); });
#else
    throw Napi::Error::New(env, "toDevice: this addon was built without the CUDA backend (npm run build:cuda builds it)");
#endif
  }
  // toHost() → Promise<NativeKVBlock>: the block in host memory.
  Napi::Value ToHost(const Napi::CallbackInfo& info) {
    auto b = block(info.Env());
#ifdef DKI_CUDA
    return RunBlockOp(info.Env(), [b] { return cuda_block_to_host(b); });
#else
    return RunBlockOp(info.Env(), [b] { return b; });  // without CUDA every block is on the host
#endif
  }

  static Napi::Value RunBlockOp(Napi::Env env, std::function<BlockPtr()> op);

 private:
  const KVBlock& host_tensors(Napi::Env env, const char* op) const {
    return js_errors(env, [&]() -> const KVBlock& { return host_kv(*block(env), op); });
  }
  static Napi::Value Copy(Napi::Env env, const KVStore& v) {
    Napi::Float32Array a = Napi::Float32Array::New(env, v.size());
    std::copy(v.begin(), v.end(), a.Data());
    return a;
  }
  std::shared_ptr<const KVBlock> block_;
  int64_t external_ = 0;
  napi_env env_ = nullptr;
};

class BlockOpWorker : public PromiseWorker {
 public:
  BlockOpWorker(Napi::Env env, std::function<BlockPtr()> op) : PromiseWorker(env), op_(std::move(op)) {}
  void Run() override { result_ = op_(); }
  Napi::Value Resolve(Napi::Env env) override { return BlockWrap::Wrap(env, result_); }

 private:
  std::function<BlockPtr()> op_;
  BlockPtr result_;
};

Napi::Value BlockWrap::RunBlockOp(Napi::Env env, std::function<BlockPtr()> op) {
  auto* w = new BlockOpWorker(env, std::move(op));
  Napi::Promise p = w->promise();
  w->Queue();
  return p;
}

class SerializeWorker : public PromiseWorker {
 public:
  SerializeWorker(Napi::Env env, BlockPtr b, KVStorage s, std::string name)
      : PromiseWorker(env), block_(std::move(b)), storage_(s), name_(std::move(name)) {}
  void Run() override {
    ComputeLock lock;  // conversion uses the thread pool
    bytes_ = serialize_block(*block_, storage_);
  }
  // The bytes move into the Buffer (freed with it) rather than being copied on the main thread.
  // Plain Node-API here: when Node refuses the Buffer (larger than it allows, 4 GiB on Node 20)
  // it has already called the finaliser, which node-addon-api's wrapper would then free again.
  Napi::Value Resolve(Napi::Env env) override {
    const size_t n = bytes_.size();
    auto* owned = new std::vector<unsigned char>(std::move(bytes_));
    const auto finalize = [](napi_env, void*, void* hint) { delete static_cast<std::vector<unsigned char>*>(hint); };
    napi_value buffer = nullptr;
    if (napi_create_external_buffer(env, n, owned->data(), finalize, owned, &buffer) != napi_ok) {
      napi_value ignored;
      napi_get_and_clear_last_exception(env, &ignored);
      throw Napi::RangeError::New(env, "serialize: the " + name_ + " form of this block is " + std::to_string(n) +
                                           " bytes, more than a Node Buffer can hold; serialize a slice, or a smaller storage (f16, int8)");
    }
    return Napi::Value(env, buffer);
  }

 private:
  BlockPtr block_;
  KVStorage storage_;
  std::string name_;
  std::vector<unsigned char> bytes_;
};

Napi::Value BlockWrap::Serialize(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto b = block(env);
  const KVStorage s = storage_arg(info, "serialize(storage: string)");
  auto* w = new SerializeWorker(env, b, s, info[0].As<Napi::String>());
  Napi::Promise p = w->promise();
  w->Queue();
  return p;
}

std::shared_ptr<const Model> model_arg(const Napi::CallbackInfo& info, size_t i) {
  const Napi::Value v = info.Length() > i ? info[i] : info.Env().Undefined();
  return ModelWrap::from(info.Env(), v, "argument " + std::to_string(i + 1) + " must be a NativeModel")->model(info.Env());
}

BlockPtr block_arg(Napi::Env env, Napi::Value v) { return BlockWrap::from(env, v, "expected a NativeKVBlock")->block(env); }

void check_owner(Napi::Env env, const Model& m, const KVBlock& b) {
  if (b.fingerprint != m.fingerprint()) throw Napi::Error::New(env, "K/V block was computed by another model (fingerprint mismatch)");
}

// remapBlock(model, block, newStart) → Promise<NativeKVBlock>
Napi::Value RemapBlock(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto m = model_arg(info, 0);
  const int start = int_arg(info, 2, "remapBlock(model, block, newStart: number)", "newStart", -kMaxPosition, kMaxPosition);
  BlockPtr b = block_arg(env, info[1]);
  check_owner(env, *m, *b);
  return BlockWrap::RunBlockOp(env, [m, b, start] { return remap_positions(*b, start, m->inv_freq(), m->config().rope_interleaved); });
}

// concatBlocks(model, blocks[]) → Promise<NativeKVBlock>
Napi::Value ConcatBlocks(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto m = model_arg(info, 0);
  if (info.Length() < 2 || !info[1].IsArray()) throw_type(env, "concatBlocks(model, blocks: NativeKVBlock[])");
  Napi::Array arr = info[1].As<Napi::Array>();
  std::vector<BlockPtr> blocks;
  for (uint32_t i = 0; i < arr.Length(); i++) {
    blocks.push_back(block_arg(env, arr.Get(i)));
    check_owner(env, *m, *blocks.back());
  }
  return BlockWrap::RunBlockOp(env, [m, blocks] { return concat_blocks(blocks, m->inv_freq(), m->config().rope_interleaved); });
}

// blendBlocks(model, prefix: NativeKVBlock | null, blocks: NativeKVBlock[], ratio) → Promise<NativeKVBlock>
// CacheBlend (blend.h), on the engine's thread pool.
Napi::Value BlendBlocks(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* usage = "blendBlocks(model, prefix: NativeKVBlock | null, blocks: NativeKVBlock[], ratio: number)";
  auto m = model_arg(info, 0);
  if (info.Length() < 4 || !info[2].IsArray() || !info[3].IsNumber()) throw_type(env, usage);
  const BlockPtr prefix = info[1].IsNull() ? nullptr : block_arg(env, info[1]);
  if (prefix) check_owner(env, *m, *prefix);
  Napi::Array arr = info[2].As<Napi::Array>();
  std::vector<BlockPtr> blocks;
  for (uint32_t i = 0; i < arr.Length(); i++) {
    blocks.push_back(block_arg(env, arr.Get(i)));
    check_owner(env, *m, *blocks.back());
  }
  const double ratio = info[3].As<Napi::Number>().DoubleValue();
  if (!(ratio >= 0 && ratio <= 1)) throw Napi::RangeError::New(env, "blendBlocks: ratio must be a number in [0, 1]");
  return BlockWrap::RunBlockOp(env, [m, prefix, blocks, ratio]() -> BlockPtr {
    ComputeLock lock;  // the recompute uses the thread pool
    return blend_blocks(*m, prefix.get(), blocks, ratio);
  });
}

// Reads the bytes on a worker thread. In place (`copy` false: a reference keeps them alive), or
// from a copy made here on the calling thread: nothing in Node-API can stop a caller's
// ArrayBuffer being transferred or resized while the worker reads it, so only bytes the package
// alone holds are read in place. The copy goes to pooled K/V buffer memory, which is already
// mapped (a fresh allocation's page faults cost more than the copy).
class DeserializeWorker : public PromiseWorker {
 public:
  DeserializeWorker(Napi::Env env, Napi::Uint8Array bytes, std::shared_ptr<const Model> model, int device, bool copy)
      : PromiseWorker(env), size_(bytes.ByteLength()), model_(std::move(model)), device_(device) {
    if (copy) {
      copy_ = Copy(static_cast<unsigned char*>(kv_buffer_alloc(size_)), FreeCopy{size_});
      if (size_ > 0) std::memcpy(copy_.get(), bytes.Data(), size_);
      data_ = copy_.get();
    } else {
      ref_ = Napi::Persistent(bytes);
      data_ = bytes.Data();
    }
  }
  void Run() override {
    {
      ComputeLock lock;  // conversion uses the thread pool
      block_ = deserialize_block(data_, size_, model_ ? model_->fingerprint() : 0, device_);
    }
    if (model_) {
      const ModelConfig& c = model_->config();
      if (block_->n_layers != c.n_layers || block_->n_kv_heads != c.n_kv_heads || block_->head_dim != c.head_dim)
        throw Error("K/V block shape does not match this model");
    }
  }
  Napi::Value Resolve(Napi::Env env) override { return BlockWrap::Wrap(env, block_); }

 private:
  struct FreeCopy {
    size_t size;
    void operator()(unsigned char* p) const { kv_buffer_free(p, size); }
  };
  using Copy = std::unique_ptr<unsigned char, FreeCopy>;
  Napi::Reference<Napi::Uint8Array> ref_;
  Copy copy_{nullptr, FreeCopy{0}};
  const unsigned char* data_ = nullptr;
  size_t size_;
  std::shared_ptr<const Model> model_;
  int device_;
  BlockPtr block_;
};

// deserializeBlock(model | null, bytes: Uint8Array, deviceIndex = -1, copy = true) → Promise<NativeKVBlock>;
// null skips the model check; deviceIndex ≥ 0 decodes into that GPU's memory; copy false reads
// the bytes in place (the caller guarantees they stay as they are until the promise settles).
Napi::Value DeserializeBlock(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::shared_ptr<const Model> m;
  if (info.Length() > 0 && !info[0].IsNull()) {
    m = model_arg(info, 0);
  }
  const char* usage = "deserializeBlock(model | null, bytes: Uint8Array, deviceIndex?: number, copy?: boolean)";
  if (info.Length() < 2 || !info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) throw_type(env, usage);
  int device = -1;
  if (info.Length() > 2 && !info[2].IsUndefined()) device = int_arg(info, 2, usage, "deviceIndex", -1, kMaxDevice);
  if (info.Length() > 3 && !info[3].IsUndefined() && !info[3].IsBoolean()) throw_type(env, usage);
  const bool copy = info.Length() <= 3 || info[3].IsUndefined() || info[3].As<Napi::Boolean>().Value();
  DeserializeWorker* w;
  try {
    w = new DeserializeWorker(env, info[1].As<Napi::Uint8Array>(), m, device, copy);
  } catch (const std::bad_alloc&) {
    throw Napi::Error::New(env, "out of memory copying " + std::to_string(info[1].As<Napi::Uint8Array>().ByteLength()) + " bytes to deserialize");
  }
  Napi::Promise p = w->promise();
  w->Queue();
  return p;
}

// ---------------------------------------------------------------- Context

class ContextWrap : public Napi::ObjectWrap<ContextWrap> {
 public:
  static void Init(Napi::Env env, Napi::Object exports) {
    Napi::Function f = DefineClass(env, "NativeContext",
                                   {
                                       InstanceMethod("eval", &ContextWrap::Eval),
                                       InstanceMethod("reset", &ContextWrap::Reset),
                                       InstanceMethod("truncate", &ContextWrap::Truncate),
                                       InstanceMethod("cancel", &ContextWrap::Cancel),
                                       InstanceMethod("reserveSegments", &ContextWrap::ReserveSegments),
                                       InstanceMethod("setSegments", &ContextWrap::SetSegments),
                                       InstanceMethod("exportBlock", &ContextWrap::ExportBlock),
                                       InstanceMethod("dispose", &ContextWrap::Dispose),
                                       InstanceMethod("setAttentionProbe", &ContextWrap::SetAttentionProbe),
                                       InstanceMethod("attentionEntropy", &ContextWrap::AttentionEntropy),
                                       InstanceMethod("cudaProfile", &ContextWrap::CudaProfile),
                                       InstanceAccessor("nPast", &ContextWrap::NPast, nullptr),
                                       InstanceAccessor("maxTokens", &ContextWrap::MaxTokens, nullptr),
                                       InstanceAccessor("posBase", &ContextWrap::PosBase, nullptr),
                                   });
    exports.Set("NativeContext", f);
  }

  // new NativeContext(model, maxTokens)
  explicit ContextWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ContextWrap>(info) {
    Napi::Env env = info.Env();
    tag(env, info.This().As<Napi::Object>(), kContextTag);
    if (info.Length() < 2 || !info[0].IsObject() || !info[1].IsNumber()) throw_type(env, "NativeContext(model, maxTokens)");
    ModelWrap* m = ModelWrap::from(env, info[0], "first argument must be a NativeModel");
    const double n = info[1].As<Napi::Number>().DoubleValue();
    if (!(n >= 1 && n <= kMaxContextTokens) || n != double(int(n)))
      throw Napi::RangeError::New(env, "maxTokens must be an integer in 1.." + std::to_string(kMaxContextTokens));
    try {
      // A window refused for its memory (host or GPU) carries code "ENOMEM" (SystemError).
      ctx_ = js_errors(env, [&] { return std::make_unique<Context>(m->model(env), int(n)); });
    } catch (const std::bad_alloc&) {
      Napi::Error err = Napi::Error::New(env, "out of memory allocating a " + std::to_string(int(n)) + "-token K/V cache");
      err.Value().Set("code", "ENOMEM");
      throw err;
    }
  }

  Context& ctx(Napi::Env env) {
    if (!ctx_) throw Napi::Error::New(env, "context has been disposed");
    if (busy_) throw Napi::Error::New(env, "context is busy: await the previous call first");
    return *ctx_;
  }
  void set_busy(bool b) { busy_ = b; }

 private:
  class EvalWorker : public PromiseWorker {
   public:
    // out: a Float32Array of exactly the logits' size to fill instead of allocating one (the
    // generation loop reuses one per step), or empty.
    EvalWorker(Napi::Env env, ContextWrap* self, std::vector<int32_t> tokens, LogitsMode mode, Napi::Float32Array out)
        : PromiseWorker(env), self_(self), tokens_(std::move(tokens)), mode_(mode) {
      self_->Ref();
      self_->set_busy(true);
      if (!out.IsEmpty()) out_ = Napi::Persistent(out);
    }
    void Run() override {
      ComputeLock lock;
      self_->ctx_->eval(tokens_.data(), int(tokens_.size()), mode_, logits_);
    }
    Napi::Value Resolve(Napi::Env env) override {
      if (mode_ == LogitsMode::None) return env.Null();
      Napi::Float32Array out = out_.IsEmpty() ? Napi::Float32Array::New(env, logits_.size()) : out_.Value();
      if (out.ElementLength() != logits_.size() || out.Data() == nullptr)
        throw Napi::Error::New(env, "eval: the out array was detached or resized while the eval ran");
      std::copy(logits_.begin(), logits_.end(), out.Data());
      return out;
    }
    void Finally() override {
      self_->set_busy(false);
      self_->Unref();
    }

   private:
    ContextWrap* self_;
    std::vector<int32_t> tokens_;
    LogitsMode mode_;
    Napi::Reference<Napi::Float32Array> out_;
    std::vector<float> logits_;
  };

  // eval(tokens: Int32Array, logits: 0 none | 1 last | 2 all, out?: Float32Array) → Promise<Float32Array | null>
  Napi::Value Eval(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ctx(env);
    const char* usage = "eval(tokens: Int32Array, logits: 0 | 1 | 2, out?: Float32Array)";
    if (info.Length() < 2 || !info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array) throw_type(env, usage);
    Napi::Int32Array t = info[0].As<Napi::Int32Array>();
    const int mode = int_arg(info, 1, usage, "logits mode", 0, 2);
    std::vector<int32_t> tokens(t.Data(), t.Data() + t.ElementLength());
    Napi::Float32Array out;
    if (info.Length() > 2 && !info[2].IsUndefined()) {
      if (!info[2].IsTypedArray() || info[2].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
        throw_type(env, "eval: out must be a Float32Array");
      out = info[2].As<Napi::Float32Array>();
      const size_t V = size_t(ctx_->model().config().vocab_size);
      const size_t want = mode == 0 ? 0 : mode == 1 ? V : V * tokens.size();
      if (out.ElementLength() != want)
        throw Napi::RangeError::New(env, "eval: out has " + std::to_string(out.ElementLength()) + " floats, the logits need " + std::to_string(want));
    }
    ctx_->clear_cancel();  // a cancel() from now on stops this eval, even before it starts
    auto* w = new EvalWorker(env, this, std::move(tokens), LogitsMode(mode), out);
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
  }

  Napi::Value Reset(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const bool given = info.Length() > 0 && !info[0].IsUndefined();
    c.reset(given ? int_arg(info, 0, "reset(posBase?: number)", "posBase", -kMaxPositionBase, kMaxPositionBase) : 0);
    return env.Undefined();
  }

  Napi::Value Truncate(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const int n = int_arg(info, 0, "truncate(n: number)", "n", 0, kIntMax);
    js_errors<Napi::RangeError>(env, [&] { c.truncate(n); });
    return env.Undefined();
  }

  // Works while an eval runs (that is its point), so it skips the busy check.
  Napi::Value Cancel(const Napi::CallbackInfo& info) {
    if (ctx_) ctx_->cancel();
    return info.Env().Undefined();
  }

  // reserveSegments(tokens): see Context::reserve_segments.
  Napi::Value ReserveSegments(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const int tokens = int_arg(info, 0, "reserveSegments(tokens: number)", "tokens", 0, kIntMax);
    js_errors(env, [&] { c.reserve_segments(tokens); });
    return env.Undefined();
  }

  // setSegments([{ block: NativeKVBlock, alpha: number, logit: boolean, shift?: number, temperature?: number }])
  // The segments are read first: reading them can run JavaScript (getters, proxies) that could
  // dispose this context or start an eval on it, so the context is looked up only afterwards.
  Napi::Value SetSegments(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ctx(env);
    if (info.Length() < 1 || !info[0].IsArray()) throw_type(env, "setSegments(segments: Array)");
    Napi::Array arr = info[0].As<Napi::Array>();
    std::vector<Segment> segs;
    for (uint32_t i = 0; i < arr.Length(); i++) {
      if (!arr.Get(i).IsObject()) throw_type(env, "segments must be objects");
      Napi::Object o = arr.Get(i).As<Napi::Object>();
      Segment s;
      s.block = BlockWrap::from(env, o.Get("block"), "segment.block must be a NativeKVBlock")->block(env);
      s.alpha = float(get_number(o, "alpha"));
      s.logit_scaling = get_bool(o, "logit");
      const Napi::Value temperature = o.Get("temperature");
      if (!temperature.IsUndefined()) {
        const double t = temperature.IsNumber() ? temperature.As<Napi::Number>().DoubleValue() : NAN;
        if (!(t > 0) || !std::isfinite(float(t))) throw Napi::RangeError::New(env, "segment.temperature must be a finite number > 0 (as a 32-bit float)");
        s.temperature = float(t);
      }
      const Napi::Value shift = o.Get("shift");
      if (!shift.IsUndefined()) {
        const double d = shift.IsNumber() ? shift.As<Napi::Number>().DoubleValue() : NAN;
        if (!(std::fabs(d) <= 2.0 * kMaxPosition) || d != std::floor(d))
          throw Napi::RangeError::New(env, "segment.shift must be an integer from -" + std::to_string(2 * kMaxPosition) + " to " + std::to_string(2 * kMaxPosition));
        s.shift = int(d);
      }
      segs.push_back(std::move(s));
    }
    Context& c = ctx(env);
    js_errors(env, [&] { c.set_segments(std::move(segs)); });
    return env.Undefined();
  }

  Napi::Value ExportBlock(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const char* usage = "exportBlock(from: number, to: number, onDevice?: boolean)";
    if (info.Length() > 2 && !info[2].IsBoolean() && !info[2].IsUndefined()) throw_type(env, usage);
    const int from = int_arg(info, 0, usage, "from", 0, kIntMax), to = int_arg(info, 1, usage, "to", 0, kIntMax);
    const bool on_device = info.Length() > 2 && info[2].IsBoolean() && info[2].As<Napi::Boolean>().Value();
    return BlockWrap::Wrap(env, js_errors<Napi::RangeError>(env, [&] { return c.export_block(from, to, on_device); }));
  }

  // setAttentionProbe(layer: number), -1 to stop
  Napi::Value SetAttentionProbe(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const int layer = int_arg(info, 0, "setAttentionProbe(layer: number)", "layer", -1, kIntMax);
    js_errors<Napi::RangeError>(env, [&] { c.set_attention_probe(layer); });
    return env.Undefined();
  }

  // attentionEntropy() → Float32Array, nats per query head at the last token of the last eval
  Napi::Value AttentionEntropy(const Napi::CallbackInfo& info) {
    const auto& e = ctx(info.Env()).attention_entropy();
    Napi::Float32Array a = Napi::Float32Array::New(info.Env(), e.size());
    std::copy(e.begin(), e.end(), a.Data());
    return a;
  }

  // { steps, stages: [{ stage, ms, bytes }] } of a GPU context made with DKI_CUDA_PROFILE=1, else null.
  Napi::Value CudaProfile(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const StageProfile p = ctx(env).stage_profile();
    if (!p.on) return env.Null();
    Napi::Array stages = Napi::Array::New(env, p.stages.size());
    for (size_t i = 0; i < p.stages.size(); i++) {
      Napi::Object o = Napi::Object::New(env);
      o.Set("stage", p.stages[i].stage);
      o.Set("ms", p.stages[i].ms);
      o.Set("bytes", double(p.stages[i].bytes));
      stages.Set(uint32_t(i), o);
    }
    Napi::Object out = Napi::Object::New(env);
    out.Set("steps", p.steps);
    out.Set("stages", stages);
    return out;
  }

  Napi::Value Dispose(const Napi::CallbackInfo& info) {
    ctx(info.Env());
    ctx_.reset();
    return info.Env().Undefined();
  }

  Napi::Value NPast(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), ctx_ ? ctx_->n_past() : 0); }
  Napi::Value MaxTokens(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), ctx_ ? ctx_->max_tokens() : 0); }
  Napi::Value PosBase(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), ctx_ ? ctx_->pos_base() : 0); }

  std::unique_ptr<Context> ctx_;
  bool busy_ = false;
};

// ---------------------------------------------------------------- Sampler

class SamplerWrap : public Napi::ObjectWrap<SamplerWrap> {
 public:
  static void Init(Napi::Env env, Napi::Object exports) {
    exports.Set("NativeSampler", DefineClass(env, "NativeSampler", {InstanceMethod("sample", &SamplerWrap::Sample)}));
  }
  // new NativeSampler({ temperature, topK, topP, repetitionPenalty, seed })
  explicit SamplerWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<SamplerWrap>(info) {
    Napi::Env env = info.Env();
    tag(env, info.This().As<Napi::Object>(), kSamplerTag);
    if (info.Length() < 1 || !info[0].IsObject()) throw_type(env, "NativeSampler(params)");
    Napi::Object o = info[0].As<Napi::Object>();
    SamplingParams p;
    p.temperature = float(get_number(o, "temperature"));
    p.top_k = get_int(o, "topK");
    p.top_p = float(get_number(o, "topP"));
    p.repetition_penalty = float(get_number(o, "repetitionPenalty"));
    double seed = get_number(o, "seed");
    if (seed < 0 || seed != double(uint64_t(seed))) throw_type(env, "seed must be a non-negative integer");
    p.seed = uint64_t(seed);
    sampler_ = js_errors<Napi::RangeError>(env, [&] { return std::make_unique<Sampler>(p); });
  }

 private:
  // sample(logits: Float32Array, recent: Int32Array) → token id (fast: runs on the calling thread)
  Napi::Value Sample(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 2 || !info[0].IsTypedArray() || !info[1].IsTypedArray() ||
        info[0].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
        info[1].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
      throw_type(env, "sample(logits: Float32Array, recent: Int32Array)");
    Napi::Float32Array l = info[0].As<Napi::Float32Array>();
    Napi::Int32Array r = info[1].As<Napi::Int32Array>();
    if (l.ElementLength() == 0) throw_type(env, "logits are empty");
    return Napi::Number::New(env, sampler_->sample(l.Data(), int(l.ElementLength()), r.Data(), int(r.ElementLength())));
  }
  std::unique_ptr<Sampler> sampler_;
};

// ---------------------------------------------------------------- engine settings

Napi::Value SetThreads(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const int n = int_arg(info, 0, "setThreads(n: number)", "thread count (0: the default)", 0, kMaxThreads);
  g_settings.request([n] { set_thread_count(n); });
  return env.Undefined();
}

// setKVPoolBytes(n): bytes of freed K/V block buffers kept for reuse (0: none).
Napi::Value SetKVPoolBytes(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsNumber()) throw_type(env, "setKVPoolBytes(bytes: number)");
  const double n = info[0].As<Napi::Number>().DoubleValue();
  if (!(n >= 0) || n > 9007199254740991.0 || n != std::floor(n)) throw Napi::RangeError::New(env, "K/V pool size must be a non-negative integer number of bytes");
  set_kv_pool_bytes(size_t(n));
  return env.Undefined();
}

// kvPoolBytes(deviceIndex?): bytes the host's pool of freed K/V block buffers holds, or GPU
// deviceIndex's.
Napi::Value KVPoolBytes(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || info[0].IsUndefined()) return Napi::Number::New(env, double(kv_pool_bytes()));
  [[maybe_unused]] const int device = int_arg(info, 0, "kvPoolBytes(deviceIndex?: number)", "deviceIndex", 0, kMaxDevice);
#ifdef DKI_CUDA
  return Napi::Number::New(env, double(cuda_pool_bytes(device)));
#else
  throw Napi::Error::New(env, "kvPoolBytes: this addon was built without the CUDA backend (npm run build:cuda builds it)");
#endif
}

Napi::Value GetThreads(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), thread_pool().size()); }

// threadBudget() → { threads, affinity, cgroupQuota, cgroupFile }: the default thread count and
// what it came from (cgroupQuota in CPUs and cgroupFile null when no quota applies).
Napi::Value ThreadBudgetJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const ThreadBudget& b = thread_budget();
  Napi::Object o = Napi::Object::New(env);
  o.Set("threads", b.threads);
  o.Set("affinity", b.affinity);
  o.Set("cgroupQuota", b.cgroup_quota > 0 ? Napi::Value(Napi::Number::New(env, b.cgroup_quota)) : env.Null());
  o.Set("cgroupFile", b.cgroup_quota > 0 ? Napi::Value(Napi::String::New(env, b.cgroup_file)) : env.Null());
  return o;
}

Napi::Value SetSimd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) throw_type(env, "setSimd(name: string)");
  const std::string name = info[0].As<Napi::String>().Utf8Value();
  js_errors(env, [&] { check_simd(name); });
  g_settings.request([name] { set_simd(name); });
  return env.Undefined();
}

Napi::Value Simd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
  o.Set("active", js_errors(env, [] { return kernels().name; }));
  auto names = available_simd();
  Napi::Array a = Napi::Array::New(env, names.size());
  for (size_t i = 0; i < names.size(); i++) a.Set(uint32_t(i), names[i]);
  o.Set("available", a);
  o.Set("prefetchBytes", prefetch_bytes());
  o.Set("decodeStreams", decode_streams());
  return o;
}

Napi::Value SetPrefetch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const int bytes = int_arg(info, 0, "setPrefetch(bytes: number)", "setPrefetch: bytes", 0, kMaxPrefetchBytes);
  g_settings.request([bytes] { set_prefetch_bytes(bytes); });
  return env.Undefined();
}

Napi::Value SetDecodeStreams(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsNumber()) throw_type(env, "setDecodeStreams(streams: number)");
  const double n = info[0].As<Napi::Number>().DoubleValue();
  if (n != 1 && n != 2) throw Napi::RangeError::New(env, "setDecodeStreams: streams must be 1 or 2");
  g_settings.request([n] { set_decode_streams(int(n)); });
  return env.Undefined();
}

// cuda() → { built, devices, names, reason }: whether this addon has the CUDA backend and which
// GPUs it sees (reason says why there are none).
Napi::Value Cuda(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
  Napi::Array names = Napi::Array::New(env);
#ifdef DKI_CUDA
  std::string why;
  const int n = cuda_device_count(&why);
  for (int i = 0; i < n; i++) names.Set(uint32_t(i), js_errors(env, [i] { return cuda_device_name(i); }));
  o.Set("built", true);
  o.Set("devices", n);
  o.Set("reason", why);
#else
  o.Set("built", false);
  o.Set("devices", 0);
  o.Set("reason", "this addon was built without the CUDA backend (npm run build:cuda builds it)");
#endif
  o.Set("names", names);
  return o;
}

// lockFile(path) → fd: an exclusive flock on the file (created if missing), held until
// unlockFile(fd) or this process's end; the file then holds this process's id.
Napi::Value LockFile(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) throw_type(env, "lockFile(path: string)");
  const std::string path = info[0].As<Napi::String>().Utf8Value();
  // A NUL would cut the path short and lock another file.
  if (path.empty() || path.find('\0') != std::string::npos) throw_type(env, "lockFile: path must be a non-empty string without NUL characters");
  const int fd = js_errors(env, [&] { return lock_file(path); });
  classes(env).locks.insert(fd);
  return Napi::Number::New(env, fd);
}

Napi::Value UnlockFile(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const int fd = int_arg(info, 0, "unlockFile(fd: number)", "unlockFile: fd", 0, kIntMax);
  // Only this environment's own locks: a number another thread's lock has since taken must not
  // be closed here, nor again by this environment's teardown.
  if (classes(env).locks.erase(fd) == 0)
    throw Napi::Error::New(env, "unlockFile: descriptor " + std::to_string(fd) + " is not a lock lockFile took on this thread (or was already let go of)");
  js_errors(env, [&] { unlock_file(fd); });
  return env.Undefined();
}

// The sizes the engine takes, for the TypeScript checks that mirror them (a test keeps the two equal).
Napi::Object Limits(Napi::Env env) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("vocabSize", limits::kVocab);
  o.Set("hiddenSize", limits::kHidden);
  o.Set("intermediateSize", limits::kIntermediate);
  o.Set("numLayers", limits::kLayers);
  o.Set("numHeads", limits::kHeads);
  o.Set("numKvHeads", limits::kHeads);
  o.Set("headDim", limits::kHeadDim);
  o.Set("headsTimesHeadDim", limits::kHeadsTimesHeadDim);
  o.Set("blockTokens", kMaxBlockTokens);
  o.Set("contextTokens", kMaxContextTokens);
  o.Set("segmentTokens", kMaxSegmentTokens);
  o.Set("position", kMaxPosition);
  o.Set("positionBase", kMaxPositionBase);
  o.Set("threads", kMaxThreads);
  o.Set("deviceIndex", kMaxDevice);
  return o;
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  // A DKI_SIMD the CPU cannot honour, or a DKI_PREFETCH out of range, fails the require with the
  // reason before any work runs.
  if (!simd_env_error().empty()) throw Napi::Error::New(env, simd_env_error());
  env.SetInstanceData(new Classes);
  ModelWrap::Init(env, exports);
  BlockWrap::Init(env, exports);
  ContextWrap::Init(env, exports);
  SamplerWrap::Init(env, exports);
  exports.Set("limits", Limits(env));
  exports.Set("loadModel", Napi::Function::New(env, LoadModel));
  exports.Set("remapBlock", Napi::Function::New(env, RemapBlock));
  exports.Set("concatBlocks", Napi::Function::New(env, ConcatBlocks));
  exports.Set("blendBlocks", Napi::Function::New(env, BlendBlocks));
  exports.Set("deserializeBlock", Napi::Function::New(env, DeserializeBlock));
  exports.Set("setThreads", Napi::Function::New(env, SetThreads));
  exports.Set("getThreads", Napi::Function::New(env, GetThreads));
  exports.Set("threadBudget", Napi::Function::New(env, ThreadBudgetJs));
  exports.Set("setKVPoolBytes", Napi::Function::New(env, SetKVPoolBytes));
  exports.Set("kvPoolBytes", Napi::Function::New(env, KVPoolBytes));
  exports.Set("setSimd", Napi::Function::New(env, SetSimd));
  exports.Set("simd", Napi::Function::New(env, Simd));
  exports.Set("setPrefetch", Napi::Function::New(env, SetPrefetch));
  exports.Set("setDecodeStreams", Napi::Function::New(env, SetDecodeStreams));
  exports.Set("cuda", Napi::Function::New(env, Cuda));
  exports.Set("lockFile", Napi::Function::New(env, LockFile));
  exports.Set("unlockFile", Napi::Function::New(env, UnlockFile));
  return exports;
}

}  // namespace

NODE_API_MODULE(dki_native, Init)
