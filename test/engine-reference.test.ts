// The native engine against the plain float64 TypeScript reference (test/reference/forward.ts),
// on random models of every supported shape family, on every SIMD path this CPU runs.
import { afterAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { native } from "../src/engine/native.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { loadRefWeights, refForward, type RefWeights } from "./reference/forward.js";
import { maxAbsDiff, tempDir } from "./support/paths.js";

interface Variant {
  name: string;
  arch: "llama" | "qwen2";
  heads: number;
  kvHeads: number;
  tie: boolean;
  bias: boolean;
  dtype: "f32" | "f16" | "bf16";
  /** An MLP width that is no multiple of 4 or 16 sends the matmuls through their row and input tails. */
  intermediate?: number;
  /** Prompt length, when not the default 11 tokens. */
  promptLength?: number;
  /** Head size, when not 16 (the AVX-512 attention kernels take 32, 64 and 128; others fall back). */
  headDim?: number;
}

const variants: Variant[] = [
  { name: "llama MHA (GQA 1), untied", arch: "llama", heads: 4, kvHeads: 4, tie: false, bias: false, dtype: "f32" },
  { name: "llama GQA 2, tied", arch: "llama", heads: 4, kvHeads: 2, tie: true, bias: false, dtype: "f32" },
  { name: "llama GQA 3, with bias", arch: "llama", heads: 6, kvHeads: 2, tie: false, bias: true, dtype: "f32" },
  { name: "qwen2 GQA 3, tied, biases", arch: "qwen2", heads: 6, kvHeads: 2, tie: true, bias: true, dtype: "f32" },
  { name: "qwen2 GQA 2, untied", arch: "qwen2", heads: 4, kvHeads: 2, tie: false, bias: true, dtype: "f32" },
  { name: "llama GQA 2, F16 weights", arch: "llama", heads: 4, kvHeads: 2, tie: true, bias: false, dtype: "f16" },
  { name: "qwen2 GQA 3, BF16 weights", arch: "qwen2", heads: 6, kvHeads: 2, tie: false, bias: true, dtype: "bf16" },
  { name: "llama GQA 2, F16 weights, MLP width 166", arch: "llama", heads: 4, kvHeads: 2, tie: false, bias: false, dtype: "f16", intermediate: 166 },
  // The AVX-512 prefill tile takes tokens 32 at a time (two vectors of 16): 45 tokens fill one
  // panel and leave 13 for a one-vector panel; the 8200-wide input of the down projection makes
  // each block of transposed activations a single panel, so the tokens pass in two blocks. Head
  // size 64 sends attention through the AVX-512 scores (16 keys at a time, then the rest) and the
  // weighted sums of 4-query blocks.
  { name: "llama GQA 2, BF16 weights, MLP width 8200, 45 tokens, head size 64", arch: "llama", heads: 4, kvHeads: 2, tie: false, bias: false, dtype: "bf16", intermediate: 8200, promptLength: 45, headDim: 64 },
];

const prompt = [1, 450, 3000, 17, 9021, 44, 12000, 5, 49000, 77, 2];
const loaded: Model[] = [];
afterAll(() => {
  loaded.forEach((m) => m.dispose());
  native().setSimd("auto");
});

async function build(v: Variant): Promise<{ model: Model; ref: RefWeights }> {
  const out = tempDir();
  await makeTinyModel({
    arch: v.arch,
    preset: "tiny",
    dtype: v.dtype,
    out,
    seed: 7,
    overrides: {
      numHeads: v.heads,
      numKvHeads: v.kvHeads,
      headDim: v.headDim ?? 16,
      tieWordEmbeddings: v.tie,
      attentionBias: v.bias,
      numLayers: 2,
      ...(v.intermediate ? { intermediateSize: v.intermediate } : {}),
    },
  });
  const model = await Model.load(out, { contextSize: 64 });
  loaded.push(model);
  return { model, ref: await loadRefWeights(out) };
}

describe.each(variants)("$name", (v) => {
  test.each(native().simd().available)("logits match the float64 reference within 1e-4 (%s kernels)", async (simd) => {
    const { model, ref } = await build(v);
    expect(model.config.numHeads / model.config.numKvHeads).toBe(v.heads / v.kvHeads);
    native().setSimd(simd);
    const tokens = v.promptLength ? Array.from({ length: v.promptLength }, (_, i) => (i * 7919 + 3) % 49000) : prompt;
    const got = await model.logits(tokens);
    const want = refForward(ref, tokens).logits;
    const diff = Math.max(...want.map((row, i) => maxAbsDiff(row, got[i])));
    expect(diff).toBeLessThan(1e-4);
  });
});

describe("sharded checkpoints", () => {
  test("a BF16 model split over 3 safetensors shards loads and gives the same logits as one file", async () => {
    const one = tempDir();
    const three = tempDir();
    const shape = { numLayers: 3, numHeads: 4, numKvHeads: 2, headDim: 16 };
    await makeTinyModel({ arch: "qwen2", preset: "tiny", dtype: "bf16", out: one, seed: 5, overrides: shape });
    await makeTinyModel({ arch: "qwen2", preset: "tiny", dtype: "bf16", out: three, seed: 5, overrides: shape, shards: 3 });
    const a = await Model.load(one, { contextSize: 32 });
    const b = await Model.load(three, { contextSize: 32 });
    loaded.push(a, b);
    expect(b.info.fingerprint).toBe(a.info.fingerprint);
    const la = await a.logits(prompt);
    const lb = await b.logits(prompt);
    expect(Math.max(...la.map((row, i) => maxAbsDiff(row, lb[i])))).toBe(0);
    const want = refForward(await loadRefWeights(three), prompt).logits;
    expect(Math.max(...want.map((row, i) => maxAbsDiff(row, lb[i])))).toBeLessThan(1e-4);
  });
});
