// Q8_0 weights (quantised at load time) and the interleaved rotary layout of llama GGUF files,
// each checked against the float64 reference fed the same weights.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { LogitsMode, native } from "../src/engine/native.js";
import { readHfFolder } from "../src/formats/hf-folder.js";
import { writeSafetensors } from "../src/formats/safetensors.js";
import { f16BitsToF32, f32ToF16Bits } from "../src/models/half.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { convertHfToGguf } from "../src/models/convert.js";
import { KVBlock } from "../src/kv/kv-block.js";
import { loadRefWeights, refForward, type RefWeights } from "./reference/forward.js";
import { maxAbsDiff, tempDir } from "./support/paths.js";

/** llama.cpp's quantize_row_q8_0_ref then dequantisation, in float32 arithmetic like the C code. */
function q8RoundTrip(x: Float64Array): Float64Array {
  const out = new Float64Array(x.length);
  for (let b = 0; b < x.length; b += 32) {
    let amax = 0;
    for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(Math.fround(x[b + i])));
    const d = Math.fround(amax / 127);
    const id = d !== 0 ? Math.fround(1 / d) : 0;
    const dStored = f16BitsToF32(f32ToF16Bits(d));
    for (let i = 0; i < 32; i++) {
      const v = Math.fround(Math.fround(x[b + i]) * id);
      const q = Math.sign(v) * Math.round(Math.abs(v)); // lround: halves away from zero
      out[b + i] = dStored * q;
    }
  }
  return out;
}

/**
 * The engine's Q8_0 activations (llama.cpp's x86 quantize_row_q8_0): id = 127/amax, q rounded half
 * to even, dequantised with the fp16 scale, in float32 arithmetic like the C code.
 */
function q8Activations(x: Float64Array): Float64Array {
  const out = new Float64Array(x.length);
  for (let b = 0; b < x.length; b += 32) {
    let amax = 0;
    for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(Math.fround(x[b + i])));
    const id = amax !== 0 ? Math.fround(127 / amax) : 0;
    const dStored = f16BitsToF32(f32ToF16Bits(Math.fround(amax / 127)));
    for (let i = 0; i < 32; i++) {
      const v = Math.fround(Math.fround(x[b + i]) * id);
      let q = Math.round(v);
      if (q - v === 0.5 && q % 2 !== 0) q -= 1; // Math.round sends halves up; ties go to even
      out[b + i] = dStored * q;
    }
  }
  return out;
}

const isMatrix = (name: string) => name.endsWith("_proj.weight") || name === "model.embed_tokens.weight" || name === "lm_head.weight";

let dir: string;
let ref: RefWeights;
const models: Model[] = [];
const prompt = [1, 450, 3000, 17, 9021, 44, 12000, 5, 49000, 77, 2, 31000];

beforeAll(async () => {
  dir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 21, overrides: { numLayers: 3, numHeads: 4, numKvHeads: 2, headDim: 32, hiddenSize: 128, intermediateSize: 256 } });
  ref = await loadRefWeights(dir);
});
afterAll(() => models.forEach((m) => m.dispose()));

/** Prefill and decode of `tokens` on one SIMD path against the reference on the same rounding. */
async function checkAgainstReference(modelDir: string, weights: RefWeights, tokens: number[], simd: string): Promise<void> {
  const model = await Model.load(modelDir, { quantize: "q8_0", contextSize: tokens.length + 8 });
  models.push(model);
  const q8ref: RefWeights = { config: weights.config, get: (n: string) => (isMatrix(n) ? q8RoundTrip(weights.get(n)) : weights.get(n)) };
  native().setSimd(simd);
  try {
    const want = refForward(q8ref, tokens, { projectionInput: q8Activations }).logits;
    const prefill = await model.logits(tokens);
    const ctx = model.createContext(tokens.length);
    const decode: Float32Array[] = [];
    for (const t of tokens) decode.push((await ctx.eval(Int32Array.of(t), LogitsMode.Last))!);
    ctx.dispose();
    // An activation within float rounding of a Q8_0 rounding boundary can round either way
    // depending on summation order (the AVX-512 path sums 16 lanes, the scalar path one at a
    // time), and then that position and those attending to it move by about one quantisation
    // step (seen: AVX-512, 5 of 12 positions, ≤ 0.15). So: most positions exact, none far off;
    // a wrong kernel moves every position by far more.
    for (const [mode, rows] of [["prefill", prefill], ["decode", decode]] as const) {
      const diffs = want.map((row, i) => maxAbsDiff(row, rows[i]));
      const rel = want.map((row, i) => {
        let num = 0, den = 0;
        for (let j = 0; j < row.length; j++) {
          num += (row[j] - rows[i][j]) ** 2;
          den += row[j] ** 2;
        }
        return Math.sqrt(num / den);
      });
      console.log(`Q8_0 (${simd}, ${mode}, ${tokens.length} tokens): max abs logit difference to the reference per position ${diffs.map((d) => d.toExponential(1)).join(" ")}`);
      expect(diffs.filter((d) => d < 1e-4).length).toBeGreaterThanOrEqual(tokens.length / 2);
      expect(Math.max(...rel)).toBeLessThan(0.01);
    }
    // Without the activation rounding the reference is far off: the test sees it.
    const unrounded = refForward(q8ref, tokens).logits;
    expect(Math.min(...unrounded.map((row, i) => maxAbsDiff(row, prefill[i])))).toBeGreaterThan(1e-3);
  } finally {
    native().setSimd("auto");
  }
}

describe("Q8_0 quantised at load time", () => {
  test.each(native().simd().available)("prefill and decode match the reference run on the same dequantised weights and Q8_0 activations (%s kernels)", async (simd) => {
    await checkAgainstReference(dir, ref, prompt, simd);
  });

  // The AMX path multiplies 32 rows by 32 tokens at a time: 45 tokens leave a half-empty second
  // pair of token groups, and projections of 160, 32 and 352 rows leave each thread a range that
  // is not a multiple of 32 (those rows go through the AVX-512 tiles). Every path must agree.
  test.each(native().simd().available)("a 45-token prompt and odd row counts (tile tails) match the reference (%s kernels)", async (simd) => {
    const tailDir = tempDir();
    await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: tailDir, seed: 22, overrides: { numLayers: 2, numHeads: 5, numKvHeads: 1, headDim: 32, hiddenSize: 160, intermediateSize: 352 } });
    const tokens = Array.from({ length: 45 }, (_, i) => (i * 7919 + 3) % 49000);
    await checkAgainstReference(tailDir, await loadRefWeights(tailDir), tokens, simd);
  });

  test.each(["llama", "qwen2"] as const)("%s: close to the unquantised model: mean relative logit error ≤ 2%, greedy top-1 agreement ≥ 94% over 256 positions", async (arch) => {
    // Conditioned like a trained model (gains 1): the default sharp random models are chaotic and
    // amplify any weight error (measured there: ~8% relative error, ~82% agreement).
    const smooth = tempDir();
    await makeTinyModel({ arch, preset: "tiny", dtype: "f32", out: smooth, seed: 22, gains: { qk: 1, residual: 1 }, overrides: { numLayers: 4, hiddenSize: 128, intermediateSize: 384, numHeads: 4, numKvHeads: 2, headDim: 32 } });
    const f32 = await Model.load(smooth, { contextSize: 300 });
    const q8 = await Model.load(smooth, { contextSize: 300, quantize: "q8_0" });
    models.push(f32, q8);
    expect(q8.info.weightBytes).toBeLessThan(f32.info.weightBytes / 3.5);
    expect(q8.info.fingerprint).not.toBe(f32.info.fingerprint);
    const tokens = Array.from({ length: 256 }, (_, i) => (i * 7919 + 13) % 49152);
    const a = await f32.logits(tokens);
    const b = await q8.logits(tokens);
    let relSum = 0;
    let agree = 0;
    for (let i = 0; i < tokens.length; i++) {
      let num = 0, den = 0, am = 0, bm = 0;
      for (let j = 0; j < a[i].length; j++) {
        num += (a[i][j] - b[i][j]) ** 2;
        den += a[i][j] ** 2;
        if (a[i][j] > a[i][am]) am = j;
        if (b[i][j] > b[i][bm]) bm = j;
      }
      relSum += Math.sqrt(num / den);
      if (am === bm) agree++;
    }
    console.log(`${arch} Q8_0 vs F32: mean relative logit error ${((relSum / tokens.length) * 100).toFixed(2)}%, top-1 agreement ${((agree / tokens.length) * 100).toFixed(1)}%`);
    // Weights and activations both rounded to Q8_0, as llama.cpp runs a Q8_0 file. Measured:
    // llama 1.92% / 96.9%, qwen2 1.87% / 94.9% (scalar, AVX2; AVX-512 sums in another order and
    // gets 97.7% and 95.3%): qwen2 can miss the 95% by one position of 256. With fp32
    // activations it was 1.4% / 97%, but then llama.cpp and this engine disagreed on 7% of
    // greedy steps. The bar stays visible at what every path meets.
    expect(relSum / tokens.length).toBeLessThan(0.02);
    expect(agree / tokens.length).toBeGreaterThanOrEqual(0.94);
  });

  test("weights left as they are mapped (F16 rows that do not split into 32-blocks, a Q8_0 GGUF) stay readable after the quantisation pass", async () => {
    // These used to point into the weight files after the pass had unmapped them: a segfault at the first forward.
    const f16 = tempDir();
    await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f16", out: f16, seed: 23 });
    const gguf = join(tempDir(), "tiny-q8_0.gguf");
    await convertHfToGguf({ dir: f16, out: gguf, type: "q8_0" });
    const folderQ8 = await Model.load(f16, { contextSize: 64, quantize: "q8_0" });
    const fileQ8 = await Model.load(gguf, { contextSize: 64 });
    const fileQ8Again = await Model.load(gguf, { contextSize: 64, quantize: "q8_0" });
    models.push(folderQ8, fileQ8, fileQ8Again);
    const tokens = prompt.slice(0, 8);
    const a = await folderQ8.logits(tokens);
    const b = await fileQ8.logits(tokens);
    const c = await fileQ8Again.logits(tokens);
    // The same weights (the converter keeps the 172-wide rows of w_down as F16, as the load-time pass does).
    for (let i = 0; i < tokens.length; i++) {
      expect(maxAbsDiff(a[i], b[i])).toBeLessThan(1e-3);
      expect(Array.from(c[i])).toEqual(Array.from(b[i]));
    }
    expect(fileQ8Again.info.weightBytes).toBe(fileQ8.info.weightBytes);
  });
});

/** llama.cpp's convert_hf_to_gguf permute: rows of each head reordered for interleaved rotary pairs. */
function permuteRows(w: Float32Array, nHead: number, rows: number, cols: number): Float32Array {
  const out = new Float32Array(w.length);
  const half = rows / nHead / 2;
  // reshape(nHead, 2, half, cols).swapaxes(1, 2): new row (h, i, j) = old row (h, j, i)
  for (let h = 0; h < nHead; h++)
    for (let i = 0; i < half; i++)
      for (let j = 0; j < 2; j++) {
        const src = (h * 2 + j) * half + i;
        const dst = (h * half + i) * 2 + j;
        out.set(w.subarray(src * cols, (src + 1) * cols), dst * cols);
      }
  return out;
}

describe("interleaved rotary layout (llama GGUF)", () => {
  test("q/k rows permuted as llama.cpp does + interleaved RoPE give the same logits; remap stays exact", async () => {
    const files = await readHfFolder(dir);
    const c = files.config;
    const permDir = tempDir();
    const tensors = files.tensors.map((t) => {
      const raw = readFileSync(t.file).subarray(t.offset, t.offset + t.nbytes);
      let data: Float32Array = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
      if (t.name.endsWith("q_proj.weight")) data = permuteRows(data, c.numHeads, t.shape[0], t.shape[1]);
      if (t.name.endsWith("k_proj.weight")) data = permuteRows(data, c.numKvHeads, t.shape[0], t.shape[1]);
      return { name: t.name, dtype: "F32" as const, shape: t.shape, data: new Uint8Array(data.buffer) };
    });
    const file = join(permDir, "model.safetensors");
    await writeSafetensors(file, tensors);
    const permuted = (await readHfFolder(dir)).tensors.map((t) => ({ ...t, file }));
    const { tensors: placed } = await import("../src/formats/safetensors.js").then((m) => m.readSafetensorsHeader(file));
    const byName = new Map(placed.map((t) => [t.name, t]));
    const spec = permuted.map((t) => ({ ...t, offset: byName.get(t.name)!.offset }));
    const inter = await native().loadModel({ config: { ...c, ropeInterleaved: true }, tensors: spec });
    const ctx = new (native().NativeContext)(inter, 32);
    const got = (await ctx.eval(Int32Array.from(prompt), LogitsMode.All))!;
    const want = refForward(ref, prompt).logits;
    const V = c.vocabSize;
    expect(Math.max(...want.map((row, i) => maxAbsDiff(row, got.subarray(i * V, (i + 1) * V))))).toBeLessThan(1e-4);

    // Remap in the interleaved layout equals computing at the new position.
    const block = async (start: number) => {
      ctx.reset(start);
      await ctx.eval(Int32Array.from(prompt), LogitsMode.None);
      return new KVBlock(ctx.exportBlock(0, prompt.length), inter);
    };
    const moved = await (await block(0)).remap(-40);
    expect(maxAbsDiff(moved.keys(), (await block(-40)).keys())).toBeLessThan(1e-4);
  });
});
