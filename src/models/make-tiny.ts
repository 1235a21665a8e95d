// Random-weight Hugging Face model folders at chosen shapes: test fixtures for the engine and
// benchmark models at real sizes without downloading anything. The output is an ordinary HF
// folder (config.json, safetensors, tokenizer, chat template), so every loader path is exercised.
import { chmod, copyFile, mkdir, open, readdir, rm, writeFile } from "node:fs/promises";
import { endianness } from "node:os";
import { join } from "node:path";
import { packageRoot } from "../engine/native.js";
import { DkiArgumentError } from "../errors.js";
import { expectedTensors, parseHfConfig, type ModelConfig, type ModelShape } from "../formats/hf-config.js";
import type { WeightDType } from "../formats/safetensors.js";
import { f32ToBf16Bits, f32ToF16Bits } from "./half.js";

export type TinyArch = "llama" | "qwen2";
export type TinyPreset = "tiny" | "smollm2-135m" | "llama-1b" | "llama-8b";
export type TinyDType = "f32" | "f16" | "bf16";

export const TINY_ARCHES: readonly TinyArch[] = ["llama", "qwen2"];
export const TINY_PRESETS: readonly TinyPreset[] = ["tiny", "smollm2-135m", "llama-1b", "llama-8b"];
export const TINY_DTYPES: readonly TinyDType[] = ["f32", "f16", "bf16"];

/** The fields a test may change to get a variant of a preset (GQA ratios, tying, biases, sizes). */
export interface ShapeOverrides extends Partial<ModelShape> {
  tieWordEmbeddings?: boolean;
  /** q/k/v biases. Qwen2 always has them, so `false` is refused for arch qwen2. */
  attentionBias?: boolean;
  ropeTheta?: number;
  rmsNormEps?: number;
  maxPositionEmbeddings?: number;
}

export interface PresetShape extends ModelShape {
  tieWordEmbeddings: boolean;
  ropeTheta: number;
  rmsNormEps: number;
  maxPositionEmbeddings: number;
  /** Factor of Llama 3.x long-context RoPE scaling (llama arch only); 0 = none. */
  llama3RopeFactor: number;
}

/**
 * Model shapes. Every preset uses vocab 49152 so that the bundled SmolLM2 tokenizer (copied into
 * each folder) can encode prompts and decode every id the model can emit; llama-1b and llama-8b
 * therefore have Llama-3.2-1B's and Llama-3.1-8B's bodies but not their 128256-token vocabulary.
 */
export const PRESETS: Readonly<Record<TinyPreset, Readonly<PresetShape>>> = {
  tiny: {
    vocabSize: 49152, hiddenSize: 64, intermediateSize: 172, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 16,
    tieWordEmbeddings: false, ropeTheta: 10000, rmsNormEps: 1e-5, maxPositionEmbeddings: 4096, llama3RopeFactor: 0,
  },
  "smollm2-135m": {
    vocabSize: 49152, hiddenSize: 576, intermediateSize: 1536, numLayers: 30, numHeads: 9, numKvHeads: 3, headDim: 64,
    tieWordEmbeddings: true, ropeTheta: 100000, rmsNormEps: 1e-5, maxPositionEmbeddings: 8192, llama3RopeFactor: 0,
  },
  "llama-1b": {
    vocabSize: 49152, hiddenSize: 2048, intermediateSize: 8192, numLayers: 16, numHeads: 32, numKvHeads: 8, headDim: 64,
    tieWordEmbeddings: true, ropeTheta: 500000, rmsNormEps: 1e-5, maxPositionEmbeddings: 131072, llama3RopeFactor: 32,
  },
  // For GPU benchmarks: 7.5B parameters, 15 GB in BF16.
  "llama-8b": {
    vocabSize: 49152, hiddenSize: 4096, intermediateSize: 14336, numLayers: 32, numHeads: 32, numKvHeads: 8, headDim: 128,
    tieWordEmbeddings: false, ropeTheta: 500000, rmsNormEps: 1e-5, maxPositionEmbeddings: 131072, llama3RopeFactor: 8,
  },
};

/** What Qwen2 checkpoints change relative to a Llama body of the same shape. */
const QWEN2 = { ropeTheta: 1000000, rmsNormEps: 1e-6, maxPositionEmbeddings: 32768 };

const TORCH_DTYPE: Record<TinyDType, string> = { f32: "float32", f16: "float16", bf16: "bfloat16" };
const ST_DTYPE: Record<TinyDType, WeightDType> = { f32: "F32", f16: "F16", bf16: "BF16" };
const DTYPE_BYTES: Record<TinyDType, number> = { f32: 4, f16: 2, bf16: 2 };

/** SmolLM2's special tokens, which the bundled tokenizer defines. */
const BOS_ID = 1; // <|im_start|>
const EOS_ID = 2; // <|im_end|>

/** ChatML as SmolLM2 writes it, without SmolLM2's default system message so prompts stay short. */
export const CHATML_TEMPLATE =
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/** config.json as transformers writes it for LlamaForCausalLM / Qwen2ForCausalLM. */
export interface HfConfigJson {
  architectures: string[];
  model_type: TinyArch;
  vocab_size: number;
  hidden_size: number;
  intermediate_size: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads: number;
  head_dim: number;
  hidden_act: "silu";
  rms_norm_eps: number;
  rope_theta: number;
  rope_scaling: {
    rope_type: "llama3";
    factor: number;
    low_freq_factor: number;
    high_freq_factor: number;
    original_max_position_embeddings: number;
  } | null;
  max_position_embeddings: number;
  tie_word_embeddings: boolean;
  attention_bias: boolean;
  attention_dropout: number;
  mlp_bias: boolean;
  bos_token_id: number;
  eos_token_id: number;
  initializer_range: number;
  torch_dtype: string;
  use_cache: boolean;
  transformers_version: string;
}

function checkShape(arch: TinyArch, s: PresetShape, attentionBias: boolean): void {
  const bad = (msg: string): never => { throw new DkiArgumentError(`make-tiny: ${msg}`); };
  const positive: (keyof PresetShape)[] = ["vocabSize", "hiddenSize", "intermediateSize", "numLayers", "numHeads", "numKvHeads", "headDim", "maxPositionEmbeddings"];
  for (const k of positive) {
    const v = s[k];
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v <= 0) bad(`${k} must be a positive integer, got ${JSON.stringify(v)}`);
  }
  if (!(s.ropeTheta > 0) || !(s.rmsNormEps > 0)) bad("ropeTheta and rmsNormEps must be positive");
  if (s.numHeads % s.numKvHeads !== 0) bad(`numHeads ${s.numHeads} is not a multiple of numKvHeads ${s.numKvHeads}`);
  if (s.headDim % 2 !== 0) bad(`headDim ${s.headDim} must be even (RoPE rotates pairs)`);
  if (s.vocabSize <= EOS_ID) bad(`vocabSize ${s.vocabSize} must be above the eos id ${EOS_ID}`);
  if (arch === "qwen2" && !attentionBias) bad("qwen2 always has q/k/v biases; attentionBias: false needs arch llama");
}

/** The config.json object for an arch, preset and overrides (no I/O). */
export function presetConfig(arch: TinyArch, preset: TinyPreset, overrides: ShapeOverrides = {}, dtype: TinyDType = "f32"): HfConfigJson {
  const base = PRESETS[preset];
  if (!base) throw new DkiArgumentError(`make-tiny: unknown preset "${String(preset)}" (${TINY_PRESETS.join(", ")})`);
  if (!TINY_ARCHES.includes(arch)) throw new DkiArgumentError(`make-tiny: unknown arch "${String(arch)}" (${TINY_ARCHES.join(", ")})`);
  const { attentionBias: biasOverride, ...shapeOverrides } = overrides;
  const s: PresetShape = { ...base, ...(arch === "qwen2" ? { ...QWEN2, llama3RopeFactor: 0 } : {}), ...stripUndefined(shapeOverrides) };
  const attentionBias = biasOverride ?? arch === "qwen2";
  checkShape(arch, s, attentionBias);
  return {
    architectures: [arch === "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"],
    model_type: arch,
    vocab_size: s.vocabSize,
    hidden_size: s.hiddenSize,
    intermediate_size: s.intermediateSize,
    num_hidden_layers: s.numLayers,
    num_attention_heads: s.numHeads,
    num_key_value_heads: s.numKvHeads,
    head_dim: s.headDim,
    hidden_act: "silu",
    rms_norm_eps: s.rmsNormEps,
    rope_theta: s.ropeTheta,
    rope_scaling: s.llama3RopeFactor
      ? { rope_type: "llama3", factor: s.llama3RopeFactor, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 }
      : null,
    max_position_embeddings: s.maxPositionEmbeddings,
    tie_word_embeddings: s.tieWordEmbeddings,
    attention_bias: attentionBias,
    attention_dropout: 0,
    mlp_bias: false,
    bos_token_id: BOS_ID,
    eos_token_id: EOS_ID,
    initializer_range: 0.02,
    torch_dtype: TORCH_DTYPE[dtype],
    use_cache: true,
    transformers_version: "4.46.0",
  };
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

// ---------------------------------------------------------------------------------------------
// Random numbers

/** FNV-1a, so that each tensor gets its own stream whatever the file layout or tensor order. */
function hashName(name: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/** xoshiro128** state (4 × u32), seeded by splitmix32 so that nearby seeds give unrelated streams. */
function seedState(seed: number, name: string): Uint32Array {
  let x = (hashName(name) ^ Math.imul(seed >>> 0, 0x9e3779b9) ^ Math.floor(seed / 2 ** 32)) >>> 0;
  const s = new Uint32Array(4);
  for (let i = 0; i < 4; i++) {
    x = (x + 0x9e3779b9) >>> 0;
    let z = x;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    s[i] = (z ^ (z >>> 16)) >>> 0;
  }
  if (s[0] === 0 && s[1] === 0 && s[2] === 0 && s[3] === 0) s[0] = 1;
  return s;
}

// Each value is the sum of the four bytes of one xoshiro output: Irwin–Hall(4), close enough to a
// normal for random weights, and only 1021 distinct values, so every tensor converts its whole
// value set to the output dtype once (a table) and the inner loop is one draw and one lookup.
const IH_LEVELS = 1021;
const IH_MEAN = 510;
const IH_STD = Math.sqrt((4 * (256 * 256 - 1)) / 12);

type Table = Float32Array | Uint16Array;

function valueTable(dtype: TinyDType, mean: number, std: number): Table {
  const table = dtype === "f32" ? new Float32Array(IH_LEVELS) : new Uint16Array(IH_LEVELS);
  const convert = dtype === "f16" ? f32ToF16Bits : dtype === "bf16" ? f32ToBf16Bits : (x: number) => x;
  for (let k = 0; k < IH_LEVELS; k++) table[k] = convert(mean + ((k - IH_MEAN) / IH_STD) * std);
  return table;
}

/** Fills `out` with table[irwinHall()] and advances `state`. */
function fillFromTable(out: Table, n: number, table: Table, state: Uint32Array): void {
  let s0 = state[0], s1 = state[1], s2 = state[2], s3 = state[3];
  for (let i = 0; i < n; i++) {
    const r = Math.imul(rotl(Math.imul(s1, 5), 7), 9) >>> 0;
    const t = s1 << 9;
    s2 ^= s0;
    s3 ^= s1;
    s1 ^= s2;
    s0 ^= s3;
    s2 ^= t;
    s3 = rotl(s3, 11);
    out[i] = table[(r & 255) + ((r >>> 8) & 255) + ((r >>> 16) & 255) + (r >>> 24)];
  }
  state[0] = s0; state[1] = s1; state[2] = s2; state[3] = s3;
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

// ---------------------------------------------------------------------------------------------
// Weight scales

/** Logit standard deviation the LM head aims for: peaked enough that greedy decoding follows the context. */
const LOGIT_STD = 4;
/** q/k gain: attention scores get std ≈ QK_GAIN², sharp enough to pick out tokens rather than average the context. */
const QK_GAIN = 2;
/**
 * o_proj/down_proj gain: the branches dominate the embedding in the residual stream. Without it a
 * tied model's final state stays close to the input token's embedding, whose own logit then wins
 * every step and greedy decoding repeats one token.
 */
const RESIDUAL_GAIN = 8;

/**
 * Mean and std of each tensor. Matrices use gain/sqrt(fan_in), so a projection of a unit-RMS
 * input has outputs of std ≈ gain; the residual stream grows with depth, which the RMSNorm before
 * every use undoes. Norms are 1 ± a little noise; the LM head (or the embedding, when tied) is scaled so logits of a unit-RMS hidden state
 * have std LOGIT_STD: with HF's 0.02 init they would be nearly flat. Tuned on the engine: with the
 * tiny preset (tied or not, llama or qwen2) and 30-layer variants greedy decoding of 32 tokens gives
 * mostly distinct tokens.
 */
/**
 * Weight gains. The defaults give sharp attention and context-following greedy output (good for
 * demos and sampling tests); such models are chaotic, so small weight errors (quantisation) grow
 * through the layers. { qk: 1, residual: 1 } gives the smoother conditioning of trained models,
 * for quantisation-quality measurements.
 */
export interface WeightGains {
  qk: number;
  residual: number;
  logit: number;
}

export const DEFAULT_GAINS: WeightGains = { qk: QK_GAIN, residual: RESIDUAL_GAIN, logit: LOGIT_STD };

function initFor(name: string, shape: number[], cfg: ModelConfig, gains: WeightGains = DEFAULT_GAINS): { mean: number; std: number } {
  const fanIn = shape[shape.length - 1];
  if (name.endsWith("norm.weight")) return { mean: 1, std: 0.05 };
  if (name.endsWith(".bias")) return { mean: 0, std: 0.1 };
  if (name === "lm_head.weight" || (name === "model.embed_tokens.weight" && cfg.tieWordEmbeddings)) {
    return { mean: 0, std: gains.logit / Math.sqrt(cfg.hiddenSize) };
  }
  if (name === "model.embed_tokens.weight") return { mean: 0, std: 1 };
  if (name.endsWith("q_proj.weight") || name.endsWith("k_proj.weight")) return { mean: 0, std: gains.qk / Math.sqrt(fanIn) };
  if (name.endsWith("o_proj.weight") || name.endsWith("down_proj.weight")) return { mean: 0, std: gains.residual / Math.sqrt(fanIn) };
  return { mean: 0, std: 1 / Math.sqrt(fanIn) };
}

// ---------------------------------------------------------------------------------------------
// Writing

export interface MakeTinyOptions {
  arch: TinyArch;
  preset: TinyPreset;
  dtype: TinyDType;
  /** Output folder; created if missing. Files this generator writes are replaced. */
  out: string;
  /** PRNG seed (a non-negative integer); the same seed gives byte-identical weights. Default 0. */
  seed?: number;
  /** Split the weights into this many safetensors shards with an index (HF layout). Default 1. */
  shards?: number;
  /** Shorthand for overrides.tieWordEmbeddings. */
  tieEmbeddings?: boolean;
  overrides?: ShapeOverrides;
  /** Weight gains (see WeightGains); default DEFAULT_GAINS. */
  gains?: Partial<WeightGains>;
}

export interface MakeTinyResult {
  dir: string;
  config: ModelConfig;
  paramCount: number;
  /** Size of the safetensors files on disk, headers included. */
  bytes: number;
}

interface PlannedTensor {
  name: string;
  shape: number[];
  elements: number;
  nbytes: number;
}

const CHUNK_ELEMENTS = 1 << 20;

/** Writes a random-weight HF model folder. Weights are streamed, a chunk at a time, so memory stays small at any size. */
export async function makeTinyModel(opts: MakeTinyOptions): Promise<MakeTinyResult> {
  if (endianness() !== "LE") throw new Error("make-tiny writes typed arrays directly and needs a little-endian machine");
  const seed = opts.seed ?? 0;
  if (!Number.isSafeInteger(seed) || seed < 0) throw new DkiArgumentError(`make-tiny: seed must be a non-negative integer, got ${seed}`);
  const shards = opts.shards ?? 1;
  if (!Number.isSafeInteger(shards) || shards < 1) throw new DkiArgumentError(`make-tiny: shards must be a positive integer, got ${shards}`);
  if (!TINY_DTYPES.includes(opts.dtype)) throw new DkiArgumentError(`make-tiny: unknown dtype "${String(opts.dtype)}" (${TINY_DTYPES.join(", ")})`);
  const overrides: ShapeOverrides = { ...opts.overrides };
  if (opts.tieEmbeddings !== undefined) overrides.tieWordEmbeddings = opts.tieEmbeddings;

  const rawConfig = presetConfig(opts.arch, opts.preset, overrides, opts.dtype);
  const config = parseHfConfig(rawConfig);
  const bytesPer = DTYPE_BYTES[opts.dtype];
  const plan: PlannedTensor[] = [...expectedTensors(config)].map(([name, shape]) => {
    const elements = shape.reduce((a, b) => a * b, 1);
    return { name, shape, elements, nbytes: elements * bytesPer };
  });
  if (shards > plan.length) throw new DkiArgumentError(`make-tiny: ${shards} shards requested but the model has only ${plan.length} tensors`);

  await mkdir(opts.out, { recursive: true });
  await removeOldWeights(opts.out);
  const groups = splitIntoShards(plan, shards);
  const fileNames = groups.length === 1
    ? ["model.safetensors"]
    : groups.map((_, i) => `model-${pad5(i + 1)}-of-${pad5(groups.length)}.safetensors`);
  let bytes = 0;
  for (let i = 0; i < groups.length; i++) {
    bytes += await writeShard(join(opts.out, fileNames[i]), groups[i], opts.dtype, config, seed, { ...DEFAULT_GAINS, ...opts.gains });
  }
  if (groups.length > 1) {
    const weightMap: Record<string, string> = {};
    groups.forEach((g, i) => g.forEach((t) => { weightMap[t.name] = fileNames[i]; }));
    const index = { metadata: { total_size: plan.reduce((a, t) => a + t.nbytes, 0) }, weight_map: weightMap };
    await writeFile(join(opts.out, "model.safetensors.index.json"), JSON.stringify(index, null, 2) + "\n");
  }
  await writeFile(join(opts.out, "config.json"), JSON.stringify(rawConfig, null, 2) + "\n");
  await writeFile(join(opts.out, "generation_config.json"), JSON.stringify(generationConfig(), null, 2) + "\n");
  await writeFile(join(opts.out, "tokenizer_config.json"), JSON.stringify(tokenizerConfig(), null, 2) + "\n");
  await copyFile(join(packageRoot(), "models", "tokenizers", "smollm2", "tokenizer.json"), join(opts.out, "tokenizer.json"));
  // The bundled tokenizer is read-only in the repo; the copy should be an ordinary file.
  await chmod(join(opts.out, "tokenizer.json"), 0o644);

  return { dir: opts.out, config, paramCount: plan.reduce((a, t) => a + t.elements, 0), bytes };
}

const pad5 = (n: number) => String(n).padStart(5, "0");

/** A previous run may have left a different layout (single file vs shards) that readHfFolder would prefer. */
async function removeOldWeights(dir: string): Promise<void> {
  for (const f of await readdir(dir)) {
    if (f === "model.safetensors" || f === "model.safetensors.index.json" || /^model-\d{5}-of-\d{5}\.safetensors$/.test(f)) {
      await rm(join(dir, f), { force: true });
    }
  }
}

/** Contiguous groups of roughly equal byte size, exactly `n` of them, none empty. */
function splitIntoShards(plan: PlannedTensor[], n: number): PlannedTensor[][] {
  const groups: PlannedTensor[][] = [];
  let current: PlannedTensor[] = [];
  let currentBytes = 0;
  let remaining = plan.reduce((a, t) => a + t.nbytes, 0);
  let target = remaining / n;
  plan.forEach((t, i) => {
    const shardsLeft = n - groups.length;
    const tensorsLeft = plan.length - i;
    const full = currentBytes + t.nbytes / 2 > target;
    if (current.length > 0 && shardsLeft > 1 && (full || tensorsLeft < shardsLeft)) {
      groups.push(current);
      remaining -= currentBytes;
      target = remaining / (shardsLeft - 1);
      current = [];
      currentBytes = 0;
    }
    current.push(t);
    currentBytes += t.nbytes;
  });
  groups.push(current);
  return groups;
}

/** Streams one safetensors file: header computed up front, then each tensor in chunks. Returns the file size. */
async function writeShard(file: string, tensors: PlannedTensor[], dtype: TinyDType, cfg: ModelConfig, seed: number, gains: WeightGains): Promise<number> {
  const header: Record<string, unknown> = { __metadata__: { format: "pt" } };
  let offset = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: ST_DTYPE[dtype], shape: t.shape, data_offsets: [offset, offset + t.nbytes] };
    offset += t.nbytes;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - ((8 + Buffer.byteLength(json)) % 8)) % 8); // data starts 8-aligned, as the safetensors writer does
  const headerBytes = Buffer.from(json, "utf8");
  const prefix = Buffer.alloc(8);
  prefix.writeBigUInt64LE(BigInt(headerBytes.length));

  const fh = await open(file, "w");
  try {
    await fh.write(Buffer.concat([prefix, headerBytes]), 0, 8 + headerBytes.length, 0);
    let pos = 8 + headerBytes.length;
    // Two buffers: one is being filled while the other is on its way to disk.
    const buffers = [new ArrayBuffer(CHUNK_ELEMENTS * 4), new ArrayBuffer(CHUNK_ELEMENTS * 4)];
    const inflight: Promise<unknown>[] = [Promise.resolve(), Promise.resolve()];
    let which = 0;
    for (const t of tensors) {
      const { mean, std } = initFor(t.name, t.shape, cfg, gains);
      const table = valueTable(dtype, mean, std);
      const state = seedState(seed, t.name);
      for (let done = 0; done < t.elements; done += CHUNK_ELEMENTS) {
        const n = Math.min(CHUNK_ELEMENTS, t.elements - done);
        const slot = which;
        which ^= 1;
        await inflight[slot]; // the write that last used this buffer
        const buf = buffers[slot];
        fillFromTable(dtype === "f32" ? new Float32Array(buf, 0, n) : new Uint16Array(buf, 0, n), n, table, state);
        const write = fh.write(new Uint8Array(buf, 0, n * DTYPE_BYTES[dtype]), 0, n * DTYPE_BYTES[dtype], pos);
        write.catch(() => {}); // observed by the await above or below; this only stops an early "unhandled rejection"
        inflight[slot] = write;
        pos += n * DTYPE_BYTES[dtype];
      }
    }
    await Promise.all(inflight);
    return pos;
  } finally {
    await fh.close();
  }
}

function generationConfig(): Record<string, unknown> {
  return { _from_model_config: true, bos_token_id: BOS_ID, eos_token_id: EOS_ID, pad_token_id: EOS_ID, transformers_version: "4.46.0" };
}

function tokenizerConfig(): Record<string, unknown> {
  return {
    add_prefix_space: false,
    additional_special_tokens: ["<|im_start|>", "<|im_end|>"],
    bos_token: "<|im_start|>",
    eos_token: "<|im_end|>",
    pad_token: "<|im_end|>",
    unk_token: "<|endoftext|>",
    chat_template: CHATML_TEMPLATE,
    clean_up_tokenization_spaces: false,
    model_max_length: 8192,
    tokenizer_class: "GPT2Tokenizer",
    vocab_size: 49152,
  };
}
