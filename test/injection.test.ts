// Generation with injected K/V segments: the exact identities of DKI, checked against full-text
// runs and the float64 reference (test/reference/forward.ts).
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { KVBlock } from "../src/kv/kv-block.js";
import { loadRefWeights, refForward, refSegment, type RefWeights } from "./reference/forward.js";
import { maxAbsDiff, tempDir } from "./support/paths.js";

let model: Model;
let ref: RefWeights;
const memory = [3, 1200, 77, 4501, 9, 18000, 256, 31, 40000, 12, 600, 7];
const pref = [88, 2000, 5, 301, 46000];
const prompt = [1, 450, 3000, 17, 9021, 44, 12000];

beforeAll(async () => {
  const dir = tempDir();
  await makeTinyModel({ arch: "qwen2", preset: "tiny", dtype: "f32", out: dir, seed: 3, overrides: { numHeads: 6, numKvHeads: 2, headDim: 16 } });
  model = await Model.load(dir, { contextSize: 64 });
  ref = await loadRefWeights(dir);
});
afterAll(() => model.dispose());

const maxRowDiff = (a: ArrayLike<number>[], b: ArrayLike<number>[]) => Math.max(...a.map((row, i) => maxAbsDiff(row, b[i])));


describe("identities", () => {
  test("α = 1, prefix positions: same logits as [memory ; prompt] in one sequence (≤ 1e-4)", async () => {
    const full = (await model.logits([...memory, ...prompt])).slice(memory.length);
    const kv = await model.computeBlock(memory);
    const injected = await model.logits(prompt, { segments: [{ kv, alpha: 1 }], positions: "prefix" });
    expect(maxRowDiff(full, injected)).toBeLessThan(1e-4);
  });

  test("negative positions give the same logits as prefix positions (≤ 1e-4)", async () => {
    const kv = await model.computeBlock(memory);
    const prefix = await model.logits(prompt, { segments: [{ kv, alpha: 1 }], positions: "prefix" });
    const negative = await model.logits(prompt, { segments: [{ kv, alpha: 1 }], positions: "negative" });
    expect(maxRowDiff(prefix, negative)).toBeLessThan(1e-4);
    // The block computed directly at [-M, -1] needs no remap and gives the same again.
    const atNeg = await model.computeBlock(memory, { startPos: -memory.length });
    expect(atNeg.startPos).toBe(-memory.length);
    expect(maxRowDiff(negative, await model.logits(prompt, { segments: [{ kv: atNeg }] }))).toBeLessThan(1e-4);
  });

  test("blocks computed elsewhere are injected by turning the queries back, not by copying the keys: the same logits as remapped copies (≤ 1e-4)", async () => {
    // Three blocks, none computed where it is injected ([-M, -1] in order), with both scalings.
    const blocks = [await model.computeBlock(pref, { startPos: 40 }), await model.computeBlock(memory), await model.computeBlock(memory.slice(3, 9), { startPos: -500 })];
    const alphas = [0.8, 1, 0.5];
    const scalings = ["value", "logit", "value"] as const;
    const segments = (kvs: KVBlock[]) => kvs.map((kv, i) => ({ kv, alpha: alphas[i], scaling: scalings[i] }));
    const shifted = await model.logits(prompt, { segments: segments(blocks) });
    const total = blocks.reduce((n, b) => n + b.nTokens, 0);
    let at = -total;
    const remapped: KVBlock[] = [];
    for (const b of blocks) {
      remapped.push(await b.remap(at));
      at += b.nTokens;
    }
    expect(remapped.map((b) => b.startPos)).toEqual([-total, -total + pref.length, -total + pref.length + memory.length]);
    expect(maxRowDiff(shifted, await model.logits(prompt, { segments: segments(remapped) }))).toBeLessThan(1e-4);
    // The same through the reference, whose segments carry the remapped keys.
    const want = refForward(ref, prompt, { startPos: 0, segments: remapped.map((b, i) => refSegment(b, alphas[i]!, scalings[i]!)) }).logits;
    expect(maxRowDiff(shifted, want)).toBeLessThan(1e-4);
  });

  test("segments do not use the prompt's context window", async () => {
    const long = Array.from({ length: 60 }, (_, i) => 100 + i);
    const kv = await model.computeBlock(long);
    const prompt60 = Array.from({ length: 60 }, (_, i) => 200 + i);
    // 60 memory + 60 prompt tokens > 64-token window: fine, the window is the prompt's alone.
    expect((await model.logits(prompt60, { segments: [{ kv }] })).length).toBe(60);
    // Nor does a memory longer than the window (its block gets a context of its own).
    const longer = await model.computeBlock(Array.from({ length: 100 }, (_, i) => 300 + i));
    expect(longer.nTokens).toBe(100);
    expect((await model.logits(prompt60, { segments: [{ kv: longer }] })).length).toBe(60);
    await expect(model.computeBlock([])).rejects.toThrow(/^the memory is empty$/);
    await expect(model.computeBlock([1, 2], { prefix: [1e9] })).rejects.toThrow(/token id 1000000000 is outside the vocabulary/);
  });
});

describe("α scaling against the float64 reference", () => {
  test("value α = 0.35 equals the reference with V·α (≤ 1e-4)", async () => {
    const kv = await model.computeBlock(memory, { startPos: -memory.length });
    const got = await model.logits(prompt, { segments: [{ kv, alpha: 0.35 }] });
    const want = refForward(ref, prompt, { startPos: 0, segments: [refSegment(kv, 0.35, "value")] }).logits;
    expect(maxRowDiff(want, got)).toBeLessThan(1e-4);
  });

  test("logit α = 0.35 equals the reference with ln α on memory scores (≤ 1e-4)", async () => {
    const kv = await model.computeBlock(memory, { startPos: -memory.length });
    const got = await model.logits(prompt, { segments: [{ kv, alpha: 0.35, scaling: "logit" }] });
    const want = refForward(ref, prompt, { startPos: 0, segments: [refSegment(kv, 0.35, "logit")] }).logits;
    expect(maxRowDiff(want, got)).toBeLessThan(1e-4);
  });

  test("two segments (preference + memory), each with its own α and scaling, equal the reference", async () => {
    const M = pref.length + memory.length;
    const p = await model.computeBlock(pref, { startPos: -M });
    const m = await model.computeBlock(memory, { startPos: -memory.length });
    const got = await model.logits(prompt, { segments: [{ kv: p, alpha: 0.8 }, { kv: m, alpha: 0.4, scaling: "logit" }] });
    const want = refForward(ref, prompt, { startPos: 0, segments: [refSegment(p, 0.8, "value"), refSegment(m, 0.4, "logit")] }).logits;
    expect(maxRowDiff(want, got)).toBeLessThan(1e-4);
  });

  test("many short blocks side by side, as DKISystem injects one per memory, equal the reference: runs of one α attended as one block or not", async () => {
    // Five short blocks computed at position 0, injected at [-M, -1] in order: two runs of equal α
    // and scaling (merged by the CPU attention), then a long block (never merged) and a short one.
    const long = Array.from({ length: 70 }, (_, i) => (i * 37 + 11) % 1000);
    const pieces = [memory.slice(0, 4), memory.slice(4, 7), pref, memory.slice(7), long, [5, 6, 7]];
    const alphas = [1, 1, 0.5, 0.5, 0.5, 0.5];
    const blocks = await Promise.all(pieces.map((p) => model.computeBlock(p)));
    const got = await model.logits(prompt, { segments: blocks.map((kv, i) => ({ kv, alpha: alphas[i] })), positions: "negative" });
    let at = -pieces.reduce((n, p) => n + p.length, 0);
    const segs = [];
    for (const [i, b] of blocks.entries()) {
      segs.push(refSegment(await b.remap(at), alphas[i]!, "value"));
      at += b.nTokens;
    }
    const want = refForward(ref, prompt, { startPos: 0, segments: segs }).logits;
    expect(maxRowDiff(want, got)).toBeLessThan(1e-4);
    // Merged or not, the same: the blocks one at a time with α nudged apart (no run to merge) agree within float rounding.
    const apart = await model.logits(prompt, { segments: blocks.map((kv, i) => ({ kv, alpha: alphas[i]! * (1 + i * 1e-7) })), positions: "negative" });
    expect(maxRowDiff(apart, got)).toBeLessThan(1e-4);
  });

  test("the reference's own memory K/V equal the native block's (independent check of compute)", async () => {
    const kv = await model.computeBlock(memory, { startPos: -memory.length });
    const r = refForward(ref, memory, { startPos: -memory.length });
    const per = kv.nKvHeads * kv.nTokens * kv.headDim;
    for (let l = 0; l < kv.nLayers; l++) {
      expect(maxAbsDiff(r.k[l], kv.keys().subarray(l * per, (l + 1) * per))).toBeLessThan(1e-4);
      expect(maxAbsDiff(r.v[l], kv.values().subarray(l * per, (l + 1) * per))).toBeLessThan(1e-4);
    }
  });

  test("logit α → 1e-30 converges to the no-memory logits", async () => {
    const kv = await model.computeBlock(memory);
    const none = await model.logits(prompt);
    const tiny = await model.logits(prompt, { segments: [{ kv, alpha: 1e-30, scaling: "logit" }], alphaThreshold: 0 });
    expect(maxRowDiff(none, tiny)).toBeLessThan(1e-5);
  });

  test("α below the threshold injects nothing: output byte-identical to no memory", async () => {
    const kv = await model.computeBlock(memory);
    const none = await model.logits(prompt);
    for (const alpha of [0, 0.05, 0.0999]) {
      const cut = await model.logits(prompt, { segments: [{ kv, alpha }], positions: "prefix" });
      cut.forEach((row, i) => expect(Buffer.from(row.buffer, row.byteOffset, row.byteLength).equals(Buffer.from(none[i].buffer, none[i].byteOffset, none[i].byteLength))).toBe(true));
    }
    const g0 = await model.generate({ tokens: prompt }, { maxNewTokens: 16 });
    const g1 = await model.generate({ tokens: prompt }, { maxNewTokens: 16, segments: [{ kv, alpha: 0.05 }] });
    expect(g1.tokens).toEqual(g0.tokens);
    expect(g1.stats.segmentTokens).toBe(0);
  });

  test("value α → 0 does not converge to the no-memory output (documented behaviour)", async () => {
    const kv = await model.computeBlock(memory);
    const none = await model.logits(prompt);
    const tiny = await model.logits(prompt, { segments: [{ kv, alpha: 1e-6 }], alphaThreshold: 0 });
    expect(maxRowDiff(none, tiny)).toBeGreaterThan(1e-3);
  });
});

describe("storage forms", () => {
  test("int8 / bf16 / f16 restored blocks: bounded logit error, greedy agreement", async () => {
    const kv = await model.computeBlock(memory, { startPos: -memory.length });
    const base = await model.logits(prompt, { segments: [{ kv }] });
    const baseGen = await model.generate({ tokens: prompt }, { maxNewTokens: 32, segments: [{ kv }], stopOnEos: false });
    // Bounds relative to the largest |logit|; measured values are logged (README states them).
    const bounds = { f16: 2e-3, bf16: 1e-2, int8: 3e-2 } as const;
    const spread = Math.max(...base.map((r) => Math.max(...Array.from(r, Math.abs))));
    for (const storage of ["f16", "bf16", "int8"] as const) {
      const restored = await KVBlock.deserialize(model.nativeHandle(), await kv.serialize(storage));
      const got = await model.logits(prompt, { segments: [{ kv: restored }] });
      const err = maxRowDiff(base, got);
      console.log(`${storage} K/V: max abs logit error ${err.toExponential(2)} (logits up to ±${spread.toFixed(2)})`);
      expect(err / spread, storage).toBeLessThan(bounds[storage]);
      const gen = await model.generate({ tokens: prompt }, { maxNewTokens: 32, segments: [{ kv: restored }], stopOnEos: false });
      const agree = gen.tokens.filter((t, i) => t === baseGen.tokens[i]).length / baseGen.tokens.length;
      console.log(`${storage} K/V: greedy agreement ${(agree * 100).toFixed(0)}% over ${baseGen.tokens.length} tokens`);
      expect(agree, storage).toBeGreaterThanOrEqual(0.9);
    }
  });
});

describe("probes and errors", () => {
  test("next-token and attention entropy", async () => {
    const e = await model.nextTokenEntropy({ tokens: prompt });
    expect(e.nats).toBeGreaterThan(0);
    expect(e.normalized).toBeGreaterThan(0);
    expect(e.normalized).toBeLessThanOrEqual(1);
    const a = await model.attentionEntropy({ tokens: prompt }, 1);
    expect(a.nats).toBeGreaterThan(0);
    expect(a.normalized).toBeLessThanOrEqual(1 + 1e-6);
    const kv = await model.computeBlock(memory);
    const withMem = await model.attentionEntropy({ tokens: prompt }, 1, { segments: [{ kv }] });
    expect(withMem.nats).not.toBeCloseTo(a.nats, 6);
    await expect(model.attentionEntropy({ tokens: prompt }, 99)).rejects.toThrow(/layer must be/);
  });

  test("invalid α, scaling and positions are refused", async () => {
    const kv = await model.computeBlock(memory);
    await expect(model.logits(prompt, { segments: [{ kv, alpha: -1 }] })).rejects.toThrow(/alpha/);
    await expect(model.logits(prompt, { segments: [{ kv, alpha: NaN }] })).rejects.toThrow(/alpha/);
    await expect(model.logits(prompt, { segments: [{ kv, scaling: "keys" as "value" }] })).rejects.toThrow(/scaling/);
    await expect(model.logits(prompt, { segments: [{ kv }], positions: "middle" as "prefix" })).rejects.toThrow(/positions/);
  });
});
