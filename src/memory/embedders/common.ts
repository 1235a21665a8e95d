// What every embedder does the same way: refuse what cannot be embedded, and hand out unit vectors.
import { DkiArgumentError } from "../../errors.js";

/** Refuses a non-array, a non-string and an empty or whitespace-only text, naming its index. */
export function checkTexts(who: string, texts: unknown): asserts texts is string[] {
  if (!Array.isArray(texts)) throw new DkiArgumentError(`${who}.embed: expected an array of strings`);
  texts.forEach((t, i) => {
    if (typeof t !== "string") throw new DkiArgumentError(`${who}.embed: texts[${i}] is a ${typeof t}, not a string`);
    if (t.trim() === "") throw new DkiArgumentError(`${who}.embed: texts[${i}] is empty; there is nothing to embed`);
  });
}

/**
 * `v` scaled to length 1, as float32 (the norm summed in float64). A zero vector stays zero:
 * cosine against it is then 0, not NaN.
 */
export function unitVector(v: Float64Array): Float32Array {
  let norm = 0;
  for (const x of v) norm += x * x;
  norm = Math.sqrt(norm);
  const out = new Float32Array(v.length);
  if (norm > 0) for (let i = 0; i < v.length; i++) out[i] = v[i] / norm;
  return out;
}

/** Cosine similarity of two vectors; 0 when their lengths differ or either is zero. */
export function cosine(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) return 0;
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i]! * b[i]!;
    na += a[i]! * a[i]!;
    nb += b[i]! * b[i]!;
  }
  return na === 0 || nb === 0 ? 0 : dot / Math.sqrt(na * nb);
}
