// A plain float64 reference forward pass of a Llama / Mistral / Qwen2 decoder, written from the
// math (llama2.c style): slow, top to bottom, no tricks. The native engine is tested against it,
// and it is itself tested against Hugging Face transformers (test/reference-forward.test.ts).
//
// Attention of every token runs over [segment tokens ; own tokens]: segments are precomputed
// K/V (keys already rotated at their own positions), visible to every own token; own tokens
// see themselves and the own tokens before them (causal). A segment with scaling "value"
// contributes alpha·V (keys untouched); with "logit" it adds ln(alpha) to its columns' scores.
// A segment's temperature T divides its columns' scores before that (APE: score/T + ln s).
import { closeSync, openSync, readSync } from "node:fs";
import { readHfFolder } from "../../src/formats/hf-folder.js";
import type { ModelConfig } from "../../src/formats/hf-config.js";
import type { TensorInfo } from "../../src/formats/safetensors.js";
import type { KVBlock } from "../../src/kv/kv-block.js";

// ---------------------------------------------------------------------------------------------
// Weights

/** Weights as float64, row-major in the Hugging Face layout ([out, in] for projections). */
export interface RefWeights {
  config: ModelConfig;
  get(name: string): Float64Array;
}

/** IEEE 754 half precision: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits. */
export function decodeF16(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const mantissa = bits & 0x3ff;
  if (exponent === 0) return sign * mantissa * 2 ** -24; // zero and subnormals: m/1024 · 2^-14
  if (exponent === 0x1f) return mantissa === 0 ? sign * Infinity : NaN;
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}

/** bfloat16: the upper 16 bits of an IEEE 754 float32 (1 sign, 8 exponent bits with bias 127, 7 mantissa). */
export function decodeBF16(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 7) & 0xff;
  const mantissa = bits & 0x7f;
  if (exponent === 0) return sign * mantissa * 2 ** -133; // m/128 · 2^-126
  if (exponent === 0xff) return mantissa === 0 ? sign * Infinity : NaN;
  return sign * (1 + mantissa / 128) * 2 ** (exponent - 127);
}

function readTensor(t: TensorInfo): Float64Array {
  const bytes = Buffer.alloc(t.nbytes);
  const fd = openSync(t.file, "r");
  try {
    let done = 0;
    while (done < t.nbytes) {
      const n = readSync(fd, bytes, done, t.nbytes - done, t.offset + done);
      if (n <= 0) throw new Error(`${t.file}: short read of tensor ${t.name}`);
      done += n;
    }
  } finally {
    closeSync(fd);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const count = t.shape.reduce((a, b) => a * b, 1);
  const out = new Float64Array(count);
  for (let i = 0; i < count; i++) {
    if (t.dtype === "F32") out[i] = view.getFloat32(4 * i, true);
    else if (t.dtype === "F16") out[i] = decodeF16(view.getUint16(2 * i, true));
    else if (t.dtype === "BF16") out[i] = decodeBF16(view.getUint16(2 * i, true));
    else throw new Error(`tensor ${t.name}: dtype ${t.dtype} is not supported by the reference`);
  }
  return out;
}

/** Reads a Hugging Face folder; tensors are converted to float64 on first use and kept. */
export async function loadRefWeights(dir: string): Promise<RefWeights> {
  const files = await readHfFolder(dir);
  const infos = new Map(files.tensors.map((t) => [t.name, t]));
  const cache = new Map<string, Float64Array>();
  return {
    config: files.config,
    get(name: string): Float64Array {
      let w = cache.get(name);
      if (!w) {
        const info = infos.get(name);
        if (!info) throw new Error(`reference: no tensor named ${name}`);
        w = readTensor(info);
        cache.set(name, w);
      }
      return w;
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Building blocks

/** y = W x (+ b), W row-major [rows, cols]. */
function matvec(W: Float64Array, x: Float64Array, rows: number, cols: number, bias?: Float64Array): Float64Array {
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let sum = 0;
    const base = r * cols;
    for (let c = 0; c < cols; c++) sum += W[base + c] * x[c];
    y[r] = bias ? sum + bias[r] : sum;
  }
  return y;
}

/** RMSNorm: x / sqrt(mean(x²) + eps) · weight. */
function rmsnorm(x: Float64Array, weight: Float64Array, eps: number): Float64Array {
  let ss = 0;
  for (let i = 0; i < x.length; i++) ss += x[i] * x[i];
  const scale = 1 / Math.sqrt(ss / x.length + eps);
  const y = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) y[i] = x[i] * scale * weight[i];
  return y;
}

const silu = (x: number) => x / (1 + Math.exp(-x));

/**
 * Rotary inverse frequencies inv_freq[i] = theta^(-2i/headDim), i < headDim/2, with the llama3
 * frequency adjustment (transformers' `_compute_llama3_parameters`) when the config has one.
 */
export function ropeInvFreq(config: ModelConfig): Float64Array {
  const half = config.headDim / 2;
  const inv = new Float64Array(half);
  for (let i = 0; i < half; i++) inv[i] = Math.pow(config.ropeTheta, -(2 * i) / config.headDim);
  const s = config.ropeScaling;
  if (s) {
    const lowFreqWavelen = s.originalMaxPositionEmbeddings / s.lowFreqFactor;
    const highFreqWavelen = s.originalMaxPositionEmbeddings / s.highFreqFactor;
    for (let i = 0; i < half; i++) {
      const wavelen = (2 * Math.PI) / inv[i];
      if (wavelen < highFreqWavelen) continue; // high frequencies: unchanged
      if (wavelen > lowFreqWavelen) {
        inv[i] = inv[i] / s.factor; // low frequencies: divided by the factor
      } else {
        // in between: interpolate between the scaled and the unscaled frequency
        const smooth = (s.originalMaxPositionEmbeddings / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor);
        inv[i] = (1 - smooth) * (inv[i] / s.factor) + smooth * inv[i];
      }
    }
  }
  return inv;
}

/**
 * Rotates one head vector in place, HF "rotate half" convention: dimension i pairs with
 * i + headDim/2, both rotated by the angle pos · inv_freq[i].
 */
function rope(v: Float64Array, offset: number, headDim: number, pos: number, invFreq: Float64Array): void {
  const half = headDim / 2;
  for (let i = 0; i < half; i++) {
    const angle = pos * invFreq[i];
    const cos = Math.cos(angle);
    const sin = Math.sin(angle);
    const a = v[offset + i];
    const b = v[offset + i + half];
    v[offset + i] = a * cos - b * sin;
    v[offset + i + half] = b * cos + a * sin;
  }
}

// ---------------------------------------------------------------------------------------------
// Forward pass

/** Precomputed K/V injected in front of the tokens. Per layer, `[nKvHeads, nTokens, headDim]`. */
export interface RefSegment {
  k: Float64Array[];
  v: Float64Array[];
  nTokens: number;
  alpha: number;
  scaling: "value" | "logit";
  /** Divides the segment's scores (default 1). */
  temperature?: number;
}

/** A reference segment from a native block's K/V, so that only the injection math is under test. */
export function refSegment(b: KVBlock, alpha: number, scaling: "value" | "logit", temperature?: number): RefSegment {
  const per = b.nKvHeads * b.nTokens * b.headDim;
  const k = b.keys(), v = b.values();
  return {
    k: Array.from({ length: b.nLayers }, (_, l) => Float64Array.from(k.subarray(l * per, (l + 1) * per))),
    v: Array.from({ length: b.nLayers }, (_, l) => Float64Array.from(v.subarray(l * per, (l + 1) * per))),
    nTokens: b.nTokens,
    alpha,
    scaling,
    temperature,
  };
}

export interface RefOutput {
  /** logits[t]: the vocabulary logits after token t. */
  logits: Float64Array[];
  /** Per layer, keys (after rotary) and values of the given tokens, `[nKvHeads, nTokens, headDim]`. */
  k: Float64Array[];
  v: Float64Array[];
}

export function refForward(
  w: RefWeights,
  tokens: number[],
  opts: {
    startPos?: number;
    segments?: RefSegment[];
    /** Rounds the input of every projection (an engine's activation quantisation); identity by default. */
    projectionInput?: (x: Float64Array) => Float64Array;
  } = {},
): RefOutput {
  const c = w.config;
  const startPos = opts.startPos ?? 0;
  const segments = opts.segments ?? [];
  const pin = opts.projectionInput ?? ((v: Float64Array) => v);
  const T = tokens.length;
  const D = c.hiddenSize;
  const hd = c.headDim;
  const nH = c.numHeads;
  const nKv = c.numKvHeads;
  const group = nH / nKv; // query heads per kv head
  const qDim = nH * hd;
  const kvDim = nKv * hd;
  const F = c.intermediateSize;
  const invFreq = ropeInvFreq(c);
  const attnScale = 1 / Math.sqrt(hd);

  for (const id of tokens) if (!Number.isInteger(id) || id < 0 || id >= c.vocabSize) throw new Error(`reference: token ${id} out of range`);
  for (const s of segments) {
    if (s.k.length !== c.numLayers || s.v.length !== c.numLayers) throw new Error("reference: segment needs K and V for every layer");
    for (let l = 0; l < c.numLayers; l++) {
      if (s.k[l].length !== nKv * s.nTokens * hd || s.v[l].length !== nKv * s.nTokens * hd) throw new Error(`reference: segment layer ${l} has the wrong size`);
    }
  }

  // Embedding lookup.
  const embed = w.get("model.embed_tokens.weight");
  const x: Float64Array[] = tokens.map((id) => embed.slice(id * D, (id + 1) * D));

  const outK: Float64Array[] = [];
  const outV: Float64Array[] = [];

  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`;
    const bias = (name: string) => (c.attentionBias ? w.get(p + `self_attn.${name}.bias`) : undefined);
    const Wq = w.get(p + "self_attn.q_proj.weight");
    const Wk = w.get(p + "self_attn.k_proj.weight");
    const Wv = w.get(p + "self_attn.v_proj.weight");
    const Wo = w.get(p + "self_attn.o_proj.weight");

    // --- attention block: q/k/v of every token, rotary at its position.
    const q: Float64Array[] = [];
    const K = new Float64Array(nKv * T * hd); // [nKv, T, hd]
    const V = new Float64Array(nKv * T * hd);
    for (let t = 0; t < T; t++) {
      const xn = pin(rmsnorm(x[t], w.get(p + "input_layernorm.weight"), c.rmsNormEps));
      const qt = matvec(Wq, xn, qDim, D, bias("q_proj"));
      const kt = matvec(Wk, xn, kvDim, D, bias("k_proj"));
      const vt = matvec(Wv, xn, kvDim, D, bias("v_proj"));
      const pos = startPos + t;
      for (let h = 0; h < nH; h++) rope(qt, h * hd, hd, pos, invFreq);
      for (let h = 0; h < nKv; h++) rope(kt, h * hd, hd, pos, invFreq);
      q.push(qt);
      for (let h = 0; h < nKv; h++) {
        for (let d = 0; d < hd; d++) {
          K[(h * T + t) * hd + d] = kt[h * hd + d];
          V[(h * T + t) * hd + d] = vt[h * hd + d];
        }
      }
    }
    outK.push(K);
    outV.push(V);

    // --- attention of each token over [segments ; own tokens 0..t].
    for (let t = 0; t < T; t++) {
      const attnOut = new Float64Array(qDim);
      for (let h = 0; h < nH; h++) {
        const kvh = Math.floor(h / group);
        // Columns: key, value, additive score bias and value multiplier of each visible token.
        const cols: { k: Float64Array; kOff: number; v: Float64Array; vOff: number; bias: number; vScale: number; temperature: number }[] = [];
        for (const s of segments) {
          const bias = s.scaling === "logit" ? Math.log(s.alpha) : 0;
          const vScale = s.scaling === "value" ? s.alpha : 1;
          for (let j = 0; j < s.nTokens; j++) {
            const off = (kvh * s.nTokens + j) * hd;
            cols.push({ k: s.k[l], kOff: off, v: s.v[l], vOff: off, bias, vScale, temperature: s.temperature ?? 1 });
          }
        }
        for (let j = 0; j <= t; j++) {
          const off = (kvh * T + j) * hd;
          cols.push({ k: K, kOff: off, v: V, vOff: off, bias: 0, vScale: 1, temperature: 1 });
        }
        // Scores, softmax.
        const scores = new Float64Array(cols.length);
        let max = -Infinity;
        for (let j = 0; j < cols.length; j++) {
          let dot = 0;
          for (let d = 0; d < hd; d++) dot += q[t][h * hd + d] * cols[j].k[cols[j].kOff + d];
          scores[j] = (dot * attnScale) / cols[j].temperature + cols[j].bias;
          if (scores[j] > max) max = scores[j];
        }
        let sum = 0;
        for (let j = 0; j < cols.length; j++) {
          scores[j] = Math.exp(scores[j] - max);
          sum += scores[j];
        }
        // Weighted sum of values.
        for (let j = 0; j < cols.length; j++) {
          const pj = scores[j] / sum;
          const col = cols[j];
          for (let d = 0; d < hd; d++) attnOut[h * hd + d] += pj * col.vScale * col.v[col.vOff + d];
        }
      }
      const o = matvec(Wo, pin(attnOut), D, qDim);
      for (let i = 0; i < D; i++) x[t][i] += o[i];
    }

    // --- MLP block: down(silu(gate(x)) * up(x)).
    const Wg = w.get(p + "mlp.gate_proj.weight");
    const Wu = w.get(p + "mlp.up_proj.weight");
    const Wd = w.get(p + "mlp.down_proj.weight");
    for (let t = 0; t < T; t++) {
      const xn = pin(rmsnorm(x[t], w.get(p + "post_attention_layernorm.weight"), c.rmsNormEps));
      const g = matvec(Wg, xn, F, D);
      const u = matvec(Wu, xn, F, D);
      const hmid = new Float64Array(F);
      for (let i = 0; i < F; i++) hmid[i] = silu(g[i]) * u[i];
      const down = matvec(Wd, pin(hmid), D, F);
      for (let i = 0; i < D; i++) x[t][i] += down[i];
    }
  }

  // Final norm and LM head (the embedding matrix when tied).
  const head = c.tieWordEmbeddings ? embed : w.get("lm_head.weight");
  const logits = x.map((xt) => matvec(head, pin(rmsnorm(xt, w.get("model.norm.weight"), c.rmsNormEps)), c.vocabSize, D));
  return { logits, k: outK, v: outV };
}
