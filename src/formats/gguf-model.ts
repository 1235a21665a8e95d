// A llama / qwen2 GGUF file → the engine's ModelConfig and tensors under their Hugging Face
// names and shapes. Tensor data stays where it is in the file (the native side maps it): llama
// q/k rows keep llama.cpp's permutation for interleaved rotary pairs, and the config says so
// (ropeInterleaved), while qwen2 files use rotate-half and unpermuted rows like HF.
import { closeSync, openSync, readSync } from "node:fs";
import { FormatError } from "../errors.js";
import { checkConfigLimits, expectedTensors, type Arch, type Llama3RopeScaling, type ModelConfig } from "./hf-config.js";
import { GgmlType, GgufMeta, readGguf, type GgufFile, type GgufTensorInfo } from "./gguf.js";
import type { TensorInfo } from "./safetensors.js";

export interface GgufModel {
  file: string;
  config: ModelConfig;
  /** Tensors under HF names, HF shapes ([rows, cols] = [ne1, ne0]), dtype "F32" | "F16" | "BF16" | "Q8_0" (or any ggml type name with allowAnyType). */
  tensors: TensorInfo[];
  /** Typed access to the file's metadata (tokenizer.ggml.*, general.*, …). */
  metadata: GgufMeta;
  gguf: GgufFile;
}

export interface ReadGgufModelOptions {
  /** Accept tensor types the engine cannot run (for `models info`); default false. */
  allowAnyType?: boolean;
}

const SUPPORTED: Record<number, string> = { [GgmlType.F32]: "F32", [GgmlType.F16]: "F16", [GgmlType.BF16]: "BF16", [GgmlType.Q8_0]: "Q8_0" };

/** GGUF tensor name → HF name (llama.cpp's tensor_mapping for LLaMA-family decoders). */
export function ggufToHfName(name: string): string | null {
  const fixed: Record<string, string> = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
  };
  if (name in fixed) return fixed[name];
  const m = /^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$/.exec(name);
  if (!m) return null;
  const part: Record<string, string> = {
    attn_norm: "input_layernorm",
    attn_q: "self_attn.q_proj",
    attn_k: "self_attn.k_proj",
    attn_v: "self_attn.v_proj",
    attn_output: "self_attn.o_proj",
    ffn_norm: "post_attention_layernorm",
    ffn_gate: "mlp.gate_proj",
    ffn_up: "mlp.up_proj",
    ffn_down: "mlp.down_proj",
  };
  const p = part[m[2]];
  return p ? `model.layers.${Number(m[1])}.${p}.${m[3]}` : null;
}

/** HF name → GGUF name; the inverse of ggufToHfName. */
export function hfToGgufName(name: string): string {
  const fixed: Record<string, string> = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
  };
  if (name in fixed) return fixed[name];
  const m = /^model\.layers\.(\d+)\.(.+)\.(weight|bias)$/.exec(name);
  const part: Record<string, string> = {
    input_layernorm: "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    post_attention_layernorm: "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
  };
  if (!m || !part[m[2]]) throw new Error(`no GGUF name for tensor "${name}"`);
  return `blk.${m[1]}.${part[m[2]]}.${m[3]}`;
}

/** Reads the header of a llama / qwen2 GGUF file and maps it onto the engine's config and HF tensor names. */
export async function readGgufModel(file: string, opts: ReadGgufModelOptions = {}): Promise<GgufModel> {
  const gguf = await readGguf(file);
  const meta = new GgufMeta(file, gguf.metadata);
  const fail = (msg: string): never => { throw new FormatError(file, msg); };

  const archName = meta.str("general.architecture", true);
  if (archName !== "llama" && archName !== "qwen2") fail(`general.architecture "${archName}" is not supported (llama, qwen2)`);
  const arch = archName as Arch;
  const k = (key: string) => `${arch}.${key}`;
  const pos = (key: string, dflt?: number): number => {
    const v = meta.int(k(key), dflt);
    if (v <= 0 || v > 2 ** 31 - 1) fail(`metadata "${k(key)}" must be a positive 32-bit integer, got ${v}`);
    return v;
  };

  const byName = new Map(gguf.tensors.map((t) => [t.name, t]));
  const hiddenSize = pos("embedding_length");
  const numHeads = pos("attention.head_count");
  const numKvHeads = pos("attention.head_count_kv", numHeads);
  if (numHeads % numKvHeads !== 0) fail(`attention.head_count ${numHeads} is not a multiple of attention.head_count_kv ${numKvHeads}`);
  const headDim = pos("attention.key_length", Math.floor(hiddenSize / numHeads));
  if (headDim % 2 !== 0) fail(`head dimension ${headDim} must be even`);
  const valueLength = pos("attention.value_length", headDim);
  if (valueLength !== headDim) fail(`attention.value_length ${valueLength} differs from attention.key_length ${headDim}: not supported`);
  const ropeDims = pos("rope.dimension_count", headDim);
  if (ropeDims !== headDim) fail(`rope.dimension_count ${ropeDims} is not the head dimension ${headDim}: partial rotary is not supported`);
  const scalingType = meta.str(k("rope.scaling.type"));
  if (scalingType !== undefined && scalingType !== "none") fail(`rope scaling type "${scalingType}" is not supported`);
  const ropeTheta = meta.num(k("rope.freq_base"), 10000);
  if (!(ropeTheta > 0)) fail(`rope.freq_base ${ropeTheta} must be positive`);
  const rmsNormEps = meta.num(k("attention.layer_norm_rms_epsilon"));
  if (!(rmsNormEps > 0)) fail(`attention.layer_norm_rms_epsilon ${rmsNormEps} must be positive`);

  const tokens = meta.arr("tokenizer.ggml.tokens", "string");
  const embd = byName.get("token_embd.weight");
  const vocabSize = meta.has(k("vocab_size")) ? pos("vocab_size") : tokens ? tokens.length : embd?.dims[1] ?? fail("no vocabulary size: no tokenizer.ggml.tokens and no token_embd.weight");
  if (vocabSize <= 0) fail("the vocabulary is empty");
  if (tokens && tokens.length !== vocabSize) fail(`tokenizer.ggml.tokens has ${tokens.length} tokens, the model's vocabulary is ${vocabSize}`);

  const optionalId = (key: string): number | null => {
    if (!meta.has(key)) return null;
    const id = meta.int(key);
    if (id >= vocabSize) fail(`metadata "${key}" ${id} is outside the vocabulary (0..${vocabSize - 1})`);
    return id;
  };
  const eosTokenIds: number[] = [];
  for (const key of ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]) {
    const id = optionalId(key);
    if (id !== null && !eosTokenIds.includes(id)) eosTokenIds.push(id);
  }

  const config: ModelConfig = {
    arch,
    vocabSize,
    hiddenSize,
    intermediateSize: pos("feed_forward_length"),
    numLayers: pos("block_count"),
    numHeads,
    numKvHeads,
    headDim,
    rmsNormEps,
    ropeTheta,
    ropeScaling: null,
    maxPositionEmbeddings: pos("context_length"),
    tieWordEmbeddings: !byName.has("output.weight"),
    attentionBias: arch === "qwen2" || byName.has("blk.0.attn_q.bias"),
    bosTokenId: optionalId("tokenizer.ggml.bos_token_id"),
    eosTokenIds,
    ropeInterleaved: arch === "llama",
  };

  checkConfigLimits(config, fail);
  const freqs = byName.get("rope_freqs.weight");
  if (freqs) config.ropeScaling = llama3ScalingFromFactors(file, readRopeFactors(file, freqs, headDim / 2), ropeTheta, headDim);

  const tensors: TensorInfo[] = [];
  const expected = expectedTensors(config);
  const seen = new Set<string>();
  for (const t of gguf.tensors) {
    const hf = ggufToHfName(t.name);
    if (hf === null || !expected.has(hf)) continue;
    seen.add(hf);
    const dtype = SUPPORTED[t.type];
    if (dtype === undefined && !opts.allowAnyType) fail(`tensor "${t.name}" is ${t.typeName}; the engine runs F32, F16, BF16 and Q8_0 (requantise with llama-quantize or reconvert)`);
    const shape = [...t.dims].reverse();
    const want = expected.get(hf)!;
    if (shape.length !== want.length || shape.some((d, i) => d !== want[i])) {
      fail(`tensor "${t.name}" has shape [${shape.join(", ")}] (HF order), the metadata implies [${want.join(", ")}]`);
    }
    tensors.push({ name: hf, dtype: dtype ?? t.typeName, shape, file, offset: t.offset, nbytes: t.nbytes });
  }
  for (const name of expected.keys()) {
    if (!seen.has(name)) fail(`tensor "${hfToGgufName(name)}" (${name}) is missing`);
  }
  return { file, config, tensors, metadata: meta, gguf };
}

function readRopeFactors(file: string, t: GgufTensorInfo, half: number): Float32Array {
  if (t.type !== GgmlType.F32 || t.dims.length !== 1 || t.dims[0] !== half) {
    throw new FormatError(file, `tensor "rope_freqs.weight" must be F32 [${half}], got ${t.typeName} [${t.dims.join(", ")}]`);
  }
  const buf = Buffer.alloc(t.nbytes);
  const fd = openSync(file, "r");
  try {
    let done = 0;
    while (done < t.nbytes) {
      const n = readSync(fd, buf, done, t.nbytes - done, t.offset + done);
      if (n <= 0) throw new FormatError(file, "short read of rope_freqs.weight");
      done += n;
    }
  } finally {
    closeSync(fd);
  }
  const out = new Float32Array(half);
  for (let i = 0; i < half; i++) out[i] = buf.readFloatLE(4 * i);
  return out;
}

/** The per-frequency divisors llama.cpp's converter stores as rope_freqs.weight for Llama 3 scaling. */
export function llama3RopeFactors(s: Llama3RopeScaling, theta: number, headDim: number): Float32Array {
  const out = new Float32Array(headDim / 2);
  const lowWavelen = s.originalMaxPositionEmbeddings / s.lowFreqFactor;
  const highWavelen = s.originalMaxPositionEmbeddings / s.highFreqFactor;
  for (let i = 0; i < headDim / 2; i++) {
    // torch: 1 / base ** (arange(0, dim, 2, float32) / dim), all in float32
    const freq = Math.fround(1 / Math.fround(theta ** Math.fround((2 * i) / headDim)));
    const wavelen = (2 * Math.PI) / freq;
    if (wavelen < highWavelen) out[i] = 1;
    else if (wavelen > lowWavelen) out[i] = s.factor;
    else {
      const smooth = (s.originalMaxPositionEmbeddings / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor);
      out[i] = 1 / ((1 - smooth) / s.factor + smooth);
    }
  }
  return out;
}

/**
 * Recovers Llama 3 scaling parameters from a rope_freqs table. The table fixes the factor and
 * the ramp between the two wavelength thresholds; (original context, low, high) are only
 * determined up to a common scale, which does not change the frequencies, so low = 1 is chosen.
 */
function llama3ScalingFromFactors(file: string, r: Float32Array, theta: number, headDim: number): Llama3RopeScaling | null {
  let factor = 0;
  for (const v of r) {
    if (!(v >= 1) || !Number.isFinite(v)) throw new FormatError(file, `rope_freqs.weight holds ${v}; Llama 3 scaling factors are >= 1`);
    factor = Math.max(factor, v);
  }
  if (factor <= 1 + 1e-6) return null;
  // smooth_i = (1/r - 1/f) / (1 - 1/f) = A / wavelen_i + B on the ramp, with A = orig/(high-low), B = -low/(high-low)
  const pts: [number, number][] = [];
  for (let i = 0; i < r.length; i++) {
    if (r[i] > 1 + 1e-5 && r[i] < factor * (1 - 1e-5)) {
      const freq = 1 / theta ** ((2 * i) / headDim);
      pts.push([freq / (2 * Math.PI), (1 / r[i] - 1 / factor) / (1 - 1 / factor)]);
    }
  }
  const candidates: Llama3RopeScaling[] = [];
  if (pts.length >= 2) {
    const n = pts.length;
    const mx = pts.reduce((a, p) => a + p[0], 0) / n;
    const my = pts.reduce((a, p) => a + p[1], 0) / n;
    const sxx = pts.reduce((a, p) => a + (p[0] - mx) ** 2, 0);
    const sxy = pts.reduce((a, p) => a + (p[0] - mx) * (p[1] - my), 0);
    const A = sxy / sxx;
    const B = my - A * mx;
    if (B < 0 && A > 0) {
      candidates.push({ type: "llama3", factor, lowFreqFactor: 1, highFreqFactor: 1 - 1 / B, originalMaxPositionEmbeddings: -A / B });
    }
  }
  candidates.push({ type: "llama3", factor, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 });
  for (const c of candidates) {
    const back = llama3RopeFactors(c, theta, headDim);
    if (back.every((v, i) => Math.abs(v - r[i]) <= 1e-4 * r[i])) {
      // Round the fitted numbers where they are that close to integers (they always are for real files).
      const round = (x: number) => (Math.abs(x - Math.round(x)) < 1e-3 * Math.max(1, Math.abs(x)) ? Math.round(x) : x);
      const nice = { ...c, highFreqFactor: round(c.highFreqFactor), originalMaxPositionEmbeddings: round(c.originalMaxPositionEmbeddings) };
      const again = llama3RopeFactors(nice, theta, headDim);
      return again.every((v, i) => Math.abs(v - r[i]) <= 1e-4 * r[i]) ? nice : c;
    }
  }
  throw new FormatError(file, "rope_freqs.weight is not a Llama 3 frequency-scaling table the engine can reproduce");
}
