// The tiny BERT of tiny-bert.ts recomputed plainly in float64, one unpadded input at a time,
// token by token: what the ONNX tests check onnxruntime's results against. Nothing here shares
// code with the graph writer, so agreement means both are the same network.
import type { TinyBertWeights, TinyCrossEncoderWeights } from "./tiny-bert.js";

/** erf to ~1e-9: its Maclaurin series below 3, the asymptotic series of erfc above. */
export function erf(x: number): number {
  const ax = Math.abs(x);
  if (ax < 3) {
    let term = ax;
    let sum = ax;
    for (let n = 1; n < 80; n++) {
      term *= (-ax * ax) / n;
      sum += term / (2 * n + 1);
    }
    return Math.sign(x) * (2 / Math.sqrt(Math.PI)) * sum;
  }
  const x2 = ax * ax;
  const erfc = (Math.exp(-x2) / (ax * Math.sqrt(Math.PI))) * (1 - 1 / (2 * x2) + 3 / (4 * x2 * x2) - 15 / (8 * x2 ** 3) + 105 / (16 * x2 ** 4));
  return Math.sign(x) * (1 - erfc);
}

export type Matrix = number[][]; // [tokens][features]

const linear = (x: Matrix, w: Float32Array, b: Float32Array, nOut: number): Matrix =>
  x.map((row) => Array.from({ length: nOut }, (_, o) => row.reduce((s, v, i) => s + v * w[i * nOut + o], b[o])));

function layerNorm(x: Matrix, g: Float32Array, b: Float32Array, eps: number): Matrix {
  return x.map((row) => {
    const mean = row.reduce((s, v) => s + v, 0) / row.length;
    const variance = row.reduce((s, v) => s + (v - mean) ** 2, 0) / row.length;
    return row.map((v, i) => ((v - mean) / Math.sqrt(variance + eps)) * g[i] + b[i]);
  });
}

const addRows = (a: Matrix, b: Matrix): Matrix => a.map((row, t) => row.map((v, i) => v + b[t][i]));

/** The encoder's last hidden state of one input: its token ids and token types (default 0 throughout). */
export function referenceHidden(w: TinyBertWeights, ids: number[], types: number[] = ids.map(() => 0)): Matrix {
  const c = w.config;
  const H = c.hidden;
  const hd = H / c.heads;
  let x: Matrix = ids.map((id, t) => Array.from({ length: H }, (_, d) => w.wordEmb[id * H + d] + w.posEmb[t * H + d] + w.typeEmb[types[t] * H + d]));
  x = layerNorm(x, w.embLnG, w.embLnB, c.eps);
  for (const L of w.layers) {
    const q = linear(x, L.wq, L.bq, H);
    const k = linear(x, L.wk, L.bk, H);
    const v = linear(x, L.wv, L.bv, H);
    const ctx: Matrix = x.map(() => new Array<number>(H).fill(0));
    for (let h = 0; h < c.heads; h++) {
      for (let i = 0; i < ids.length; i++) {
        const scores = ids.map((_, j) => {
          let s = 0;
          for (let d = 0; d < hd; d++) s += q[i][h * hd + d] * k[j][h * hd + d];
          return s / Math.sqrt(hd);
        });
        const top = Math.max(...scores);
        const e = scores.map((s) => Math.exp(s - top));
        const z = e.reduce((a, b) => a + b, 0);
        for (let j = 0; j < ids.length; j++) for (let d = 0; d < hd; d++) ctx[i][h * hd + d] += (e[j] / z) * v[j][h * hd + d];
      }
    }
    const x1 = layerNorm(addRows(linear(ctx, L.wo, L.bo, H), x), L.ln1g, L.ln1b, c.eps);
    const gelu = linear(x1, L.w1, L.b1, c.intermediate).map((row) => row.map((h) => 0.5 * h * (1 + erf(h / Math.SQRT2))));
    x = layerNorm(addRows(linear(gelu, L.w2, L.b2, H), x1), L.ln2g, L.ln2b, c.eps);
  }
  return x;
}

/** A sentence embedding as sentence-transformers makes it: the mean over the tokens, L2-normalised. */
export function referenceEmbedding(w: TinyBertWeights, ids: number[]): number[] {
  const x = referenceHidden(w, ids);
  const mean = Array.from({ length: w.config.hidden }, (_, d) => x.reduce((s, row) => s + row[d], 0) / x.length);
  const norm = Math.hypot(...mean);
  return mean.map((v) => v / norm);
}

/**
 * A cross-encoder's relevance of one pair (its ids and types): the pooler on the first token, the
 * classifier's logits, then the sigmoid of one logit or the softmax probability of class 1 of two.
 */
export function referenceCrossScore(w: TinyCrossEncoderWeights, ids: number[], types: number[]): number {
  const first = [referenceHidden(w, ids, types)[0]];
  const pooled = linear(first, w.poolW, w.poolB, w.config.hidden).map((row) => row.map(Math.tanh));
  const logits = linear(pooled, w.clsW, w.clsB, w.labels)[0];
  if (w.labels === 1) return 1 / (1 + Math.exp(-logits[0]));
  const top = Math.max(...logits);
  const e = logits.map((l) => Math.exp(l - top));
  return e[1] / e.reduce((a, b) => a + b, 0);
}
