// A loaded model: native weights + tokenizer + chat template, with the calls users make.
import { readHfFolder } from "../formats/hf-folder.js";
import { readGgufModel } from "../formats/gguf-model.js";
import type { TensorInfo } from "../formats/safetensors.js";
import { ggufTokenizer } from "../tokenizer/gguf-tokenizer.js";
import type { ModelConfig } from "../formats/hf-config.js";
import { DkiArgumentError, NonFiniteError } from "../errors.js";
import { Tokenizer } from "../tokenizer/tokenizer.js";
import type { ChatMessage } from "../tokenizer/chat-template.js";
import { eitherSignal } from "../util/either-signal.js";
import { Semaphore } from "../util/semaphore.js";
import { isNativeNonFinite, LogitsMode, native, type NativeConfig, type NativeContextHandle, type NativeModelHandle, type NativeSegment, type NativeTensorSpec } from "./native.js";
import { entropy, runGeneration, type GenerateOptions, type GenerateResult } from "./generate.js";
import { KVBlock } from "../kv/kv-block.js";
import { threadsInfo, type ThreadsInfo } from "./threads.js";

/** A K/V block injected into attention with its own strength. */
export interface Segment {
  kv: KVBlock;
  /** Memory influence α (default 1). */
  alpha?: number;
  /** "value" (default): V ← α·V, keys untouched. "logit": ln α added to the block's attention scores. */
  scaling?: "value" | "logit";
  /**
   * Divides the block's attention scores before ln α is added (APE's score/T + ln s, with s the
   * logit-scaled α); default 1. Finite and > 0; the CPU runs it, a model on CUDA refuses T ≠ 1.
   */
  temperature?: number;
}

/**
 * Where injected segments sit relative to the prompt: "negative" puts them at [-M, -1] and the
 * prompt at 0 (the prompt keeps the positions it would have alone); "prefix" puts them at
 * [0, M-1] and the prompt at M (exactly as if the memory text preceded the prompt).
 */
export type PositionStrategy = "negative" | "prefix";

export interface InjectionOptions {
  segments?: Segment[];
  positions?: PositionStrategy;
  /** Segments with α below this are not injected at all (default 0.1): the output is then the plain model's. */
  alphaThreshold?: number;
}

export interface ComputeBlockOptions {
  /** Position of the block's first token (default 0). */
  startPos?: number;
  /**
   * Tokens encoded before the block but not kept (e.g. BOS + system prompt), so the block's
   * keys/values are computed in the context they will be used in.
   */
  prefix?: readonly number[];
  /** Keep the block in GPU memory (a model loaded with device "cuda" only): it never crosses PCIe. */
  onDevice?: boolean;
}

export interface BlendOptions {
  /** Share of the memory tokens recomputed, in [0, 1]. */
  ratio: number;
  /** What the blocks were encoded behind: token ids (default none) or their K/V block, ending where the first block starts. */
  prefix?: number[] | KVBlock;
}

export interface EntropyProbe {
  /** Entropy in nats. */
  nats: number;
  /** nats divided by the largest possible entropy (ln of the number of outcomes), in [0, 1]. */
  normalized: number;
}

export interface LoadOptions {
  /**
   * Worker threads for the engine (default and 0: the CPUs this process may use: its affinity
   * mask, capped by its cgroup CPU quota; see ModelInfo.threads). Applies process-wide.
   */
  threads?: number;
  /**
   * Own-token window of the default context (default: min(config max positions, 4096)). It may
   * exceed the config's max positions: rotary positions go on, how well the model does beyond
   * its trained length is the model's.
   */
  contextSize?: number;
  /** "q8_0": quantise every matrix to Q8_0 at load time (llama.cpp's block format); default "none". */
  quantize?: "none" | "q8_0";
  /**
   * Where the model runs (default "cpu"). "cuda" uploads the weights to a GPU once and runs every
   * context there (needs the addon from `npm run build:cuda`); "auto" picks CUDA when a GPU is
   * usable, else the CPU.
   */
  device?: Device;
  /** Which GPU when device is "cuda" or "auto" (default 0). */
  deviceIndex?: number;
  /**
   * Read every weight once at load and refuse the model at the first NaN/±inf, naming the tensor
   * and element (llama.cpp's --check-tensors); default false, as it costs a pass over the files.
   * Norms and biases, copied at load, are always checked.
   */
  checkTensors?: boolean;
}

export type Device = "cpu" | "cuda" | "auto";

/** Refuses bad load options before any file is read or weight loaded, naming the option. */
function checkLoadOptions(opts: LoadOptions): void {
  if (opts === null || typeof opts !== "object") throw new DkiArgumentError(`load options must be an object, got ${shown(opts)}`);
  const integerIn = (name: string, v: unknown, lo: number, hi: number, meaning: string) => {
    if (v !== undefined && !(Number.isInteger(v) && (v as number) >= lo && (v as number) <= hi))
      throw new DkiArgumentError(`${name} must be ${meaning}, got ${shown(v)}`);
  };
  const maxThreads = native().limits.threads;
  integerIn("threads", opts.threads, 0, maxThreads, `an integer from 0 (the default) to ${maxThreads}`);
  integerIn("contextSize", opts.contextSize, 1, native().limits.contextTokens, `an integer from 1 to ${native().limits.contextTokens}`);
  const maxDevice = native().limits.deviceIndex;
  integerIn("deviceIndex", opts.deviceIndex, 0, maxDevice, `an integer from 0 to ${maxDevice}`);
  if (opts.quantize !== undefined && opts.quantize !== "none" && opts.quantize !== "q8_0")
    throw new DkiArgumentError(`quantize must be "none" or "q8_0", got ${shown(opts.quantize)}`);
  if (opts.checkTensors !== undefined && typeof opts.checkTensors !== "boolean") throw new DkiArgumentError(`checkTensors must be true or false, got ${shown(opts.checkTensors)}`);
}

/** A value as an error message shows it: strings quoted, so "2" and 2 differ. */
function shown(v: unknown): string {
  return typeof v === "string" ? JSON.stringify(v) : String(v);
}

/** The config as the native engine takes it. */
export function nativeConfig(c: ModelConfig): NativeConfig {
  return {
    vocabSize: c.vocabSize,
    hiddenSize: c.hiddenSize,
    intermediateSize: c.intermediateSize,
    numLayers: c.numLayers,
    numHeads: c.numHeads,
    numKvHeads: c.numKvHeads,
    headDim: c.headDim,
    rmsNormEps: c.rmsNormEps,
    ropeTheta: c.ropeTheta,
    tieWordEmbeddings: c.tieWordEmbeddings,
    attentionBias: c.attentionBias,
    ropeInterleaved: c.ropeInterleaved ?? false,
    ropeScaling: c.ropeScaling,
  };
}

/** The device a load with `device` runs on: "auto" becomes "cuda" only where a GPU is usable. */
export function resolveDevice(device: Device = "cpu"): "cpu" | "cuda" {
  if (device !== "cpu" && device !== "cuda" && device !== "auto") throw new DkiArgumentError(`device must be "cpu", "cuda" or "auto", got ${JSON.stringify(device)}`);
  const cuda = native().cuda();
  if (device === "auto") return cuda.devices > 0 ? "cuda" : "cpu";
  if (device === "cuda" && cuda.devices === 0) throw new DkiArgumentError(`device "cuda" was asked for but no GPU is usable: ${cuda.reason}`);
  return device;
}

export interface ModelInfo {
  dir: string;
  config: ModelConfig;
  fingerprint: string;
  paramCount: number;
  weightBytes: number;
  dtypes: string[];
  /** Where the model runs; deviceBytes are the weight bytes held in GPU memory (0 on the CPU). */
  device: "cpu" | "cuda";
  deviceBytes: number;
  /** The engine's threads when the model was loaded, and where the default count came from. */
  threads: ThreadsInfo;
  /**
   * What the caller should know about this load, said once: a context window beyond the
   * positions the model was trained on (it works; quality past them is the model's).
   */
  warnings: string[];
}

/** A segment that passed the α threshold, with its index in the caller's `segments`. */
interface KeptSegment extends Required<Segment> {
  index: number;
}

/**
 * A NaN/inf error from a call with injected segments, worded for the caller: the segment the
 * engine names (by its place among those injected) becomes its index in the caller's list, and
 * non-finite logits say which segments were injected. Other errors pass through unchanged.
 */
function withSegments(e: unknown, what: string, kept: KeptSegment[]): unknown {
  let err: NonFiniteError;
  if (e instanceof NonFiniteError) err = e;
  else if (isNativeNonFinite(e)) err = new NonFiniteError(`${what}: ${e.message}`, e.row >= 0 ? e.row : undefined, e.segment >= 0 ? e.segment : undefined);
  else return e;
  const at = err.segment === undefined ? undefined : kept[err.segment];
  if (at) return new NonFiniteError(err.message.replace(/injected segment \d+/, `segments[${at.index}]`), err.step, at.index);
  if (kept.length === 0) return err;
  const list = kept.map((k) => `segments[${k.index}] (${k.kv.nTokens} tokens, α = ${k.alpha}, ${k.scaling} scaling)`).join(", ");
  return new NonFiniteError(`${err.message}; injected: ${list}`, err.step, undefined);
}

/** log softmax(logits)[id], with the maximum subtracted first (no overflow). */
export function logSoftmaxAt(logits: Float32Array, id: number): number {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i]! > max) max = logits[i]!;
  let z = 0;
  for (let i = 0; i < logits.length; i++) z += Math.exp(logits[i]! - max);
  return logits[id]! - max - Math.log(z);
}

/** What to generate from: plain text, chat messages (rendered with the chat template) or token ids. */
export type PromptInput = string | { messages: ChatMessage[] } | { tokens: number[] };

export class Model {
  private readonly ctxMutex = new Semaphore(1);
  private defaultCtx: NativeContextHandle | null = null;
  /** Aborted by dispose(): calls waiting for the context give up, a running generation stops. */
  private readonly disposal = new AbortController();

  private constructor(
    private handle: NativeModelHandle | null,
    readonly tokenizer: Tokenizer,
    readonly info: ModelInfo,
    readonly contextSize: number,
  ) {}

  get config(): ModelConfig {
    return this.info.config;
  }

  /**
   * Loads a Hugging Face folder (config.json, safetensors, tokenizer.json) or a GGUF file (a path
   * ending in .gguf: weights, config and tokenizer from the file). Off the main thread.
   */
  static async load(dir: string, opts: LoadOptions = {}): Promise<Model> {
    checkLoadOptions(opts);
    let files: { config: ModelConfig; tensors: TensorInfo[] };
    let tokenizer: Tokenizer;
    if (dir.toLowerCase().endsWith(".gguf")) {
      const g = await readGgufModel(dir);
      files = g;
      tokenizer = ggufTokenizer(g.metadata, { bosTokenId: g.config.bosTokenId, eosTokenIds: g.config.eosTokenIds });
    } else {
      files = await readHfFolder(dir);
      tokenizer = await Tokenizer.fromFolder(dir);
    }
    const addon = native();
    const device = resolveDevice(opts.device);
    if (opts.threads !== undefined) addon.setThreads(opts.threads);
    const c = files.config;
    const tensors: NativeTensorSpec[] = files.tensors.map((t) => ({ name: t.name, file: t.file, dtype: t.dtype, shape: t.shape, offset: t.offset, nbytes: t.nbytes }));
    const handle = await addon.loadModel({
      config: nativeConfig(c),
      tensors,
      quantize: opts.quantize ?? "none",
      device,
      deviceIndex: opts.deviceIndex,
      checkTensors: opts.checkTensors ?? false,
    });
    const ni = handle.info();
    const contextSize = opts.contextSize ?? Math.min(c.maxPositionEmbeddings, 4096);
    const warnings: string[] = [];
    if (contextSize > c.maxPositionEmbeddings)
      warnings.push(
        `the context window of ${contextSize} tokens is beyond the ${c.maxPositionEmbeddings} positions the model was trained on (max_position_embeddings): ` +
          "positions past them work, but how well the model does there is its own",
      );
    const info: ModelInfo = {
      dir,
      config: c,
      fingerprint: ni.fingerprint,
      paramCount: ni.paramCount,
      weightBytes: ni.weightBytes,
      dtypes: opts.quantize === "q8_0" ? ["Q8_0", "F32"] : [...new Set(files.tensors.map((t) => t.dtype))],
      device: ni.device,
      deviceBytes: ni.deviceBytes,
      threads: threadsInfo(),
      warnings,
    };
    const model = new Model(handle, tokenizer, info, contextSize);
    // Made now, not on first use: a window the memory cannot hold is refused by the load that
    // asked for it (the native context sizes it before allocating; its pages then fill lazily).
    try {
      model.defaultCtx = model.createContext();
    } catch (e) {
      model.dispose();
      if ((e as { code?: unknown }).code === "ENOMEM") throw new DkiArgumentError(`contextSize ${contextSize}: ${(e as Error).message}`);
      throw e;
    }
    return model;
  }

  /** The native handle, for K/V and context code in this package. */
  nativeHandle(): NativeModelHandle {
    if (!this.handle) throw new Error("model has been disposed");
    return this.handle;
  }

  /** A fresh native context with its own K/V cache. */
  createContext(maxTokens = this.contextSize): NativeContextHandle {
    return new (native().NativeContext)(this.nativeHandle(), maxTokens);
  }

  /**
   * Runs `fn` with the model's reusable context, one caller at a time. The signal `fn` gets fires
   * when the caller's does or the model is disposed; a call still waiting its turn then rejects.
   */
  async withContext<T>(fn: (ctx: NativeContextHandle, signal: AbortSignal) => Promise<T>, signal?: AbortSignal): Promise<T> {
    const either = signal ? eitherSignal([signal, this.disposal.signal]) : { signal: this.disposal.signal, release: () => {} };
    try {
      return await this.ctxMutex.run(async () => {
        this.defaultCtx ??= this.createContext();
        return fn(this.defaultCtx, either.signal);
      }, either.signal);
    } finally {
      either.release();
    }
  }

  /** Token ids for a prompt. Text gets the tokenizer's special tokens (BOS where the model uses one). */
  encodePrompt(input: PromptInput): number[] {
    if (typeof input === "string") return this.tokenizer.encode(input, { addSpecialTokens: true });
    if (input === null || typeof input !== "object") throw new DkiArgumentError(`a prompt is a string, { messages } or { tokens }, got ${input === null ? "null" : typeof input}`);
    if ("tokens" in input) {
      if (!Array.isArray(input.tokens)) throw new DkiArgumentError("{ tokens } must hold an array of token ids");
      return input.tokens;
    }
    if (!Array.isArray(input.messages)) throw new DkiArgumentError("a prompt is a string, { messages: [...] } or { tokens: [...] }");
    const text = this.tokenizer.applyChatTemplate(input.messages, { addGenerationPrompt: true });
    return this.tokenizer.encode(text, { addSpecialTokens: false });
  }

  /** Computes a K/V block for text or token ids with this model. */
  async computeBlock(input: string | readonly number[], opts: ComputeBlockOptions = {}): Promise<KVBlock> {
    const tokens = typeof input === "string" ? this.tokenizer.encode(input, { addSpecialTokens: false }) : input;
    const prefix = opts.prefix ?? [];
    const startPos = opts.startPos ?? 0;
    const base = native().limits.positionBase;
    // The context starts at startPos - prefix.length; both ends stay within the positions it takes.
    if (!Number.isInteger(startPos) || Math.abs(startPos) > base || Math.abs(startPos - prefix.length) > base)
      throw new DkiArgumentError(`startPos must be an integer within ±${base} (less the prefix's length below), got ${shown(startPos)}`);
    // The block's own context is made to fit it: the model's context window does not bound it.
    const maxBlock = { tokens: native().limits.blockTokens, name: "a K/V block holds" };
    this.checkTokens(tokens, "the memory", maxBlock);
    if (prefix.length > 0) this.checkTokens(prefix, "the prefix", maxBlock);
    const onDevice = opts.onDevice ?? false;
    if (onDevice && this.info.device !== "cuda") throw new DkiArgumentError('onDevice: the model runs on the CPU; K/V blocks live on a GPU only for a model loaded with device "cuda"');
    const ctx = this.createContext(prefix.length + tokens.length);
    try {
      ctx.reset(startPos - prefix.length);
      await ctx.eval(Int32Array.from([...prefix, ...tokens]), LogitsMode.None);
      return new KVBlock(ctx.exportBlock(prefix.length, prefix.length + tokens.length, onDevice), this.nativeHandle());
    } finally {
      ctx.dispose();
    }
  }

  /**
   * CacheBlend (Yao et al., 2024): `blocks`, each encoded on its own, as one block placed from the
   * first one's position and brought toward their joint encoding behind `prefix`: the ⌈ratio·n⌉
   * tokens whose layer-1 K/V deviate most from the joint ones are recomputed at every later layer,
   * reading the others' cached K/V (native/blend.h). ratio 0 gives their concatenation, 1 the
   * joint encoding (computeBlock of all their tokens behind the prefix). `prefix`: the tokens
   * the blocks were encoded behind (computed now, ending where the first block starts), or their
   * block. CPU only. Off the main thread.
   */
  async blendBlocks(blocks: KVBlock[], opts: BlendOptions): Promise<KVBlock> {
    if (!Array.isArray(blocks) || blocks.length === 0 || !blocks.every((b) => b instanceof KVBlock)) throw new DkiArgumentError("blendBlocks needs a non-empty array of KVBlocks");
    if (opts === null || typeof opts !== "object") throw new DkiArgumentError("blendBlocks needs options { ratio, prefix? }");
    const { ratio } = opts;
    if (typeof ratio !== "number" || !(ratio >= 0 && ratio <= 1)) throw new DkiArgumentError(`blendBlocks: ratio must be a number in [0, 1], got ${shown(ratio)}`);
    if (this.info.device === "cuda") throw new DkiArgumentError('blendBlocks (CacheBlend, blockFix "cacheblend") runs on the CPU only; this model is loaded on CUDA');
    for (const b of blocks) if (b.fingerprint !== this.info.fingerprint) throw new DkiArgumentError("blendBlocks: a block was computed by another model (fingerprint mismatch)");
    const given = opts.prefix ?? [];
    let prefix: KVBlock | null = null;
    if (given instanceof KVBlock) prefix = given;
    else if (!Array.isArray(given)) throw new DkiArgumentError("blendBlocks: prefix must be token ids or a KVBlock");
    else if (given.length > 0) prefix = await this.computeBlock(given, { startPos: blocks[0]!.startPos - given.length });
    try {
      return new KVBlock(await native().blendBlocks(this.nativeHandle(), prefix?.nativeHandle() ?? null, blocks.map((b) => b.nativeHandle()), ratio), this.nativeHandle());
    } finally {
      if (prefix !== null && prefix !== given) prefix.dispose();
    }
  }

  /** Installs the segments that pass the α threshold into ctx at the positions the strategy asks for. */
  private injectSegments(ctx: NativeContextHandle, inj: InjectionOptions): { segmentTokens: number; kept: KeptSegment[] } {
    const threshold = inj.alphaThreshold ?? 0.1;
    if (!(threshold >= 0) || !Number.isFinite(threshold)) throw new DkiArgumentError(`alphaThreshold must be a finite number >= 0, got ${threshold}`);
    const positions = inj.positions ?? "negative";
    if (positions !== "negative" && positions !== "prefix") throw new DkiArgumentError(`positions must be "negative" or "prefix", got ${JSON.stringify(positions)}`);
    const kept: KeptSegment[] = [];
    if (inj.segments !== undefined && !Array.isArray(inj.segments)) throw new DkiArgumentError("segments must be an array of { kv, alpha?, scaling? }");
    for (const [index, s] of (inj.segments ?? []).entries()) {
      if (s === null || typeof s !== "object" || !(s.kv instanceof KVBlock)) throw new DkiArgumentError("each segment must be { kv: KVBlock, alpha?, scaling? }");
      const alpha = s.alpha ?? 1;
      const scaling = s.scaling ?? "value";
      // The engine scales in 32-bit floats: 1e39 is finite here and +inf there.
      if (typeof alpha !== "number" || !Number.isFinite(Math.fround(alpha)) || alpha < 0)
        throw new DkiArgumentError(`segments[${index}]: alpha must be a finite number >= 0 (as a 32-bit float, at most ~3.4e38), got ${shown(alpha)}`);
      if (scaling !== "value" && scaling !== "logit") throw new DkiArgumentError(`segment scaling must be "value" or "logit", got ${JSON.stringify(scaling)}`);
      const temperature = s.temperature ?? 1;
      if (typeof temperature !== "number" || !Number.isFinite(Math.fround(temperature)) || !(Math.fround(temperature) > 0))
        throw new DkiArgumentError(`segments[${index}]: temperature must be a finite number > 0 (as a 32-bit float), got ${shown(temperature)}`);
      if (temperature !== 1 && this.info.device === "cuda")
        throw new DkiArgumentError(`segments[${index}]: temperature ${temperature} (APE) runs on the CPU only; this model is loaded on CUDA`);
      if (s.kv.fingerprint !== this.info.fingerprint) throw new DkiArgumentError("a segment's K/V block was computed by another model (fingerprint mismatch)");
      // The rule is exactly "injected when α >= alphaThreshold": α = 0 with threshold 0 is
      // injected (value scaling: its columns keep their softmax share with zero values).
      if (alpha < threshold) continue;
      if (scaling === "logit" && alpha === 0)
        throw new DkiArgumentError(`segments[${index}]: alpha 0 with logit scaling would add ln 0 = -inf to its scores; leave the segment out (or raise alphaThreshold above 0) instead`);
      kept.push({ index, kv: s.kv, alpha, scaling, temperature });
    }
    const total = kept.reduce((n, s) => n + s.kv.nTokens, 0);
    // An injection the GPU cannot hold fails here, before anything is copied.
    ctx.reserveSegments(total);
    let at = positions === "negative" ? -total : 0;
    const placed: NativeSegment[] = [];
    for (const s of kept) {
      // Each block moves to where it sits by its shift, with no copy of it made here: the CPU
      // turns its queries back by the shift, the GPU rotates the keys as it copies them into the
      // context's segment buffer (see Segment in kv_block.h).
      placed.push({ block: s.kv.nativeHandle(), alpha: s.alpha, logit: s.scaling === "logit", shift: at - s.kv.startPos, temperature: s.temperature });
      at += s.kv.nTokens;
    }
    ctx.reset(positions === "negative" ? 0 : total);
    ctx.setSegments(placed);
    return { segmentTokens: total, kept };
  }

  /** Runs fn in the shared context with the injection installed, then clears it. */
  private withInjection<T>(
    what: string,
    inj: InjectionOptions,
    fn: (ctx: NativeContextHandle, segmentTokens: number, signal: AbortSignal) => Promise<T>,
    signal?: AbortSignal,
  ): Promise<T> {
    return this.withContext(async (ctx, either) => {
      const { segmentTokens, kept } = this.injectSegments(ctx, inj);
      try {
        return await fn(ctx, segmentTokens, either);
      } catch (e) {
        throw withSegments(e, what, kept);
      } finally {
        ctx.setSegments([]);
      }
    }, signal);
  }

  /** Logits of every position of `tokens`, [n][vocab], optionally with injected segments. */
  async logits(tokens: number[], inj: InjectionOptions = {}): Promise<Float32Array[]> {
    this.checkTokens(tokens);
    return this.withInjection("logits", inj, async (ctx) => {
      const all = (await ctx.eval(Int32Array.from(tokens), LogitsMode.All))!;
      const V = this.config.vocabSize;
      return tokens.map((_, i) => all.subarray(i * V, (i + 1) * V));
    });
  }

  /**
   * Constrained choice: the summed log-probability of each continuation's tokens right after the
   * input. The input is prefilled once; each continuation is then evaluated on top of it (the
   * context cut back to the input between them), one token at a time and only the last position's
   * logits read, so a long prompt costs one prefill, not one per option nor a [tokens × vocab]
   * logits matrix. What the RAG pipeline's yes/no and class steps decode with.
   */
  async scoreContinuations(input: PromptInput, continuations: number[][], opts: { signal?: AbortSignal } = {}): Promise<number[]> {
    const head = this.encodePrompt(input);
    this.checkTokens(head);
    if (!Array.isArray(continuations) || continuations.length === 0) throw new DkiArgumentError("scoreContinuations needs at least one continuation");
    continuations.forEach((c, i) => this.checkTokens(c, `continuation ${i}`, { tokens: this.contextSize - head.length, name: `left after the ${head.length}-token input` }));
    const V = this.config.vocabSize;
    return this.withInjection(
      "scoreContinuations",
      {},
      async (ctx, _segmentTokens, signal) => {
        const step = async (tokens: number[], out: Float32Array) => {
          if (signal.aborted) throw signal.reason;
          const onAbort = () => ctx.cancel();
          signal.addEventListener("abort", onAbort, { once: true });
          try {
            await ctx.eval(Int32Array.from(tokens), LogitsMode.Last, out);
          } catch (e) {
            throw signal.aborted ? signal.reason : e;
          } finally {
            signal.removeEventListener("abort", onAbort);
          }
        };
        const first = new Float32Array(V);
        const next = new Float32Array(V);
        await step(head, first);
        const scores: number[] = [];
        for (const c of continuations) {
          let lp = logSoftmaxAt(first, c[0]!);
          ctx.truncate(head.length);
          for (let k = 0; k + 1 < c.length; k++) {
            await step([c[k]!], next);
            lp += logSoftmaxAt(next, c[k + 1]!);
          }
          scores.push(lp);
        }
        return scores;
      },
      opts.signal,
    );
  }

  /** Entropy of the next-token distribution after the input, without generating (a gating signal). */
  async nextTokenEntropy(input: PromptInput, inj: InjectionOptions = {}): Promise<EntropyProbe> {
    const tokens = this.encodePrompt(input);
    this.checkTokens(tokens);
    return this.withInjection("nextTokenEntropy", inj, async (ctx) => {
      const nats = entropy((await ctx.eval(Int32Array.from(tokens), LogitsMode.Last))!);
      return { nats, normalized: nats / Math.log(this.config.vocabSize) };
    });
  }

  /**
   * Attention entropy (nats, mean over query heads) of the last input token at one layer: how
   * spread that layer's attention is, a model-uncertainty signal for gating. `normalized`
   * divides by ln(number of attended positions).
   */
  async attentionEntropy(input: PromptInput, layer: number, inj: InjectionOptions = {}): Promise<EntropyProbe> {
    const tokens = this.encodePrompt(input);
    this.checkTokens(tokens);
    if (!Number.isInteger(layer) || layer < 0 || layer >= this.config.numLayers) {
      throw new DkiArgumentError(`layer must be an integer in 0..${this.config.numLayers - 1}, got ${layer}`);
    }
    return this.withInjection("attentionEntropy", inj, async (ctx, segmentTokens) => {
      ctx.setAttentionProbe(layer);
      try {
        await ctx.eval(Int32Array.from(tokens), LogitsMode.None);
        const perHead = ctx.attentionEntropy();
        const nats = perHead.reduce((a, b) => a + b, 0) / perHead.length;
        const attended = segmentTokens + tokens.length;
        return { nats, normalized: attended > 1 ? nats / Math.log(attended) : 0 };
      } finally {
        ctx.setAttentionProbe(-1);
      }
    });
  }

  async generate(input: PromptInput, opts: GenerateOptions & InjectionOptions = {}): Promise<GenerateResult> {
    const prompt = this.encodePrompt(input);
    this.checkTokens(prompt);
    return this.withInjection("generate", opts, (ctx, segmentTokens, signal) => runGeneration(this, ctx, prompt, opts, segmentTokens, signal), opts.signal);
  }

  /**
   * Token ids for `what` ("the prompt", "the memory"): not empty, at most `max.tokens` (by default
   * the context window), in the vocabulary.
   */
  checkTokens(tokens: readonly number[], what = "the prompt", max: { tokens: number; name: string } = { tokens: this.contextSize, name: "of the context window" }): void {
    if (tokens.length === 0) throw new DkiArgumentError(`${what} is empty`);
    if (tokens.length > max.tokens) {
      throw new DkiArgumentError(`${what} has ${tokens.length} tokens, more than the ${max.tokens} tokens ${max.name}`);
    }
    this.checkTokenIds(tokens, what);
  }

  /** Throws a DkiArgumentError, prefixed with `what`, for an id that is not an integer in the vocabulary. */
  checkTokenIds(tokens: readonly number[], what: string): void {
    const V = this.config.vocabSize;
    for (const t of tokens) {
      if (!Number.isInteger(t)) throw new DkiArgumentError(`${what}: token ids must be integers, got ${shown(t)}`);
      if (t < 0 || t >= V) throw new DkiArgumentError(`${what}: token id ${t} is outside the vocabulary (0..${V - 1})`);
    }
  }

  /**
   * Frees the model. Work in flight is not cut short unsafely: a running generation stops at its
   * next step and rejects, calls waiting for the context reject at once, a running single eval
   * finishes; the context is freed when they are done. K/V blocks and contexts created from the
   * model keep what they need of it alive until they are disposed.
   */
  dispose(): void {
    if (!this.handle) return;
    this.handle.dispose();
    this.handle = null;
    this.disposal.abort(new Error("model has been disposed"));
    const ctx = this.defaultCtx;
    this.defaultCtx = null;
    // The context is free once the running call is out; nothing can make its dispose throw then,
    // and a rejection here would have no one to go to.
    if (ctx) void this.ctxMutex.run(async () => ctx.dispose()).catch(() => {});
  }
}
