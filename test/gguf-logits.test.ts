// HF folder → GGUF (F32 / F16 / Q8_0) → load: the logits match the HF folder's. Llama GGUF
// files keep llama.cpp's q/k row permutation and run with interleaved rotary pairs; qwen2 files
// are unpermuted and rotate-half. Also checked against transformers itself on the committed
// fixture.
import { copyFileSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { LogitsMode, native } from "../src/engine/native.js";
import { readGgufModel } from "../src/formats/gguf-model.js";
import { writeSafetensors, type TensorToWrite } from "../src/formats/safetensors.js";
import { convertHfToGguf, permutedSourceRow } from "../src/models/convert.js";
import { f16BitsToF32 } from "../src/models/half.js";
import { makeTinyModel, type TinyArch } from "../src/models/make-tiny.js";
import { llamaTinyRefs } from "./support/llama-tiny-refs.js";
import { hfLlamaTiny, maxAbsDiff, tempDir } from "./support/paths.js";

const POSITIONS = 256;

function tokenIds(n: number, vocab: number, seed: number): number[] {
  let s = seed >>> 0;
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out.push(3 + (s % (vocab - 3)));
  }
  return out;
}

const argmax = (a: Float32Array) => {
  let b = 0;
  for (let i = 1; i < a.length; i++) if (a[i] > a[b]) b = i;
  return b;
};

/** Mean over positions of ‖got − ref‖₂ / ‖ref‖₂, and the share of positions with the same top-1 token. */
function compare(ref: Float32Array[], got: Float32Array[]): { meanRelErr: number; top1: number; maxAbs: number } {
  let rel = 0, same = 0, maxAbs = 0;
  for (let p = 0; p < ref.length; p++) {
    let num = 0, den = 0;
    for (let i = 0; i < ref[p].length; i++) {
      const d = got[p][i] - ref[p][i];
      num += d * d;
      den += ref[p][i] * ref[p][i];
      maxAbs = Math.max(maxAbs, Math.abs(d));
    }
    rel += Math.sqrt(num / den);
    if (argmax(ref[p]) === argmax(got[p])) same++;
  }
  return { meanRelErr: rel / ref.length, top1: same / ref.length, maxAbs };
}

/**
 * Writes an F32 HF folder holding exactly the weights of a GGUF file (Q8_0 and F16 dequantised,
 * llama q/k rows un-permuted), with the tokenizer and config of `like`.
 */
async function dequantiseToHf(file: string, like: string, out: string): Promise<void> {
  mkdirSync(out, { recursive: true });
  for (const f of ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]) copyFileSync(join(like, f), join(out, f));
  const g = await readGgufModel(file);
  const bytes = readFileSync(file);
  const tensors: TensorToWrite[] = g.tensors.map((t) => {
    const n = t.shape.reduce((a, b) => a * b, 1);
    const src = bytes.subarray(t.offset, t.offset + t.nbytes);
    const x = new Float32Array(n);
    if (t.dtype === "F32") new Uint8Array(x.buffer).set(src);
    else if (t.dtype === "F16") for (let i = 0; i < n; i++) x[i] = f16BitsToF32(src[2 * i] | (src[2 * i + 1] << 8));
    else if (t.dtype === "Q8_0") {
      for (let b = 0; b < n / 32; b++) {
        const d = f16BitsToF32(src[34 * b] | (src[34 * b + 1] << 8));
        for (let j = 0; j < 32; j++) x[32 * b + j] = d * ((src[34 * b + 2 + j] << 24) >> 24);
      }
    } else throw new Error(`dtype ${t.dtype}`);
    let y = x;
    if (g.config.ropeInterleaved && /[qk]_proj/.test(t.name)) {
      const cols = t.shape[1] ?? 1;
      y = new Float32Array(n);
      for (let r = 0; r < t.shape[0]; r++) y.set(x.subarray(r * cols, (r + 1) * cols), permutedSourceRow(r, g.config.headDim) * cols);
    }
    return { name: t.name, dtype: "F32", shape: t.shape, data: new Uint8Array(y.buffer) };
  });
  await writeSafetensors(join(out, "model.safetensors"), tensors);
}

async function logitsOf(path: string, tokens: number[], quantize?: "q8_0"): Promise<Float32Array[]> {
  const m = await Model.load(path, { contextSize: tokens.length, quantize });
  try {
    return (await m.logits(tokens)).map((r) => Float32Array.from(r));
  } finally {
    m.dispose();
  }
}

describe.each<TinyArch>(["llama", "qwen2"])("%s: HF folder vs its GGUF conversions", (arch) => {
  const dir = tempDir();
  const hf32 = join(dir, "hf-f32");
  const hf16 = join(dir, "hf-f16");
  let tokens: number[];
  let ref32: Float32Array[];
  let ref16: Float32Array[];

  beforeAll(async () => {
    const seed = arch === "llama" ? 11 : 12;
    await makeTinyModel({ arch, preset: "tiny", dtype: "f32", out: hf32, seed });
    await makeTinyModel({ arch, preset: "tiny", dtype: "f16", out: hf16, seed });
    tokens = tokenIds(POSITIONS, 49152, seed);
    ref32 = await logitsOf(hf32, tokens);
    ref16 = await logitsOf(hf16, tokens);
  });

  test("the GGUF config says how rotary pairs are laid out", async () => {
    const file = join(dir, "cfg.gguf");
    await convertHfToGguf({ dir: hf32, out: file, type: "f32" });
    expect((await readGgufModel(file)).config.ropeInterleaved).toBe(arch === "llama");
  });

  test("F32: logits within 1e-3", async () => {
    const file = join(dir, "f32.gguf");
    await convertHfToGguf({ dir: hf32, out: file, type: "f32" });
    const got = await logitsOf(file, tokens);
    const r = compare(ref32, got);
    expect(r.maxAbs).toBeLessThan(1e-3);
    expect(r.top1).toBe(1);
  });

  test("F16: the F16 folder's GGUF matches the F16 folder within 1e-3; the F32 folder's is within fp16 weight rounding", async () => {
    const file = join(dir, "f16.gguf");
    await convertHfToGguf({ dir: hf16, out: file, type: "f16" });
    const same = compare(ref16, await logitsOf(file, tokens));
    expect(same.maxAbs).toBeLessThan(1e-3);

    const file2 = join(dir, "f16-from-f32.gguf");
    await convertHfToGguf({ dir: hf32, out: file2, type: "f16" });
    const rounded = compare(ref32, await logitsOf(file2, tokens));
    // the F16 folder is the F32 folder rounded to fp16 (norms included): same size of error as that rounding
    const rounding = compare(ref32, ref16);
    expect(rounded.meanRelErr).toBeLessThan(Math.max(2 * rounding.meanRelErr, 1e-3));
    expect(rounded.top1).toBeGreaterThanOrEqual(0.99);
  });

  test("Q8_0: the file's logits equal the HF folder quantised at load time; error against F32 reported", async () => {
    const file = join(dir, "q8.gguf");
    await convertHfToGguf({ dir: hf32, out: file, type: "q8_0" });
    const m = await readGgufModel(file);
    expect(m.tensors.find((t) => t.name === "model.layers.0.self_attn.q_proj.weight")!.dtype).toBe("Q8_0");
    expect(m.tensors.find((t) => t.name === "model.layers.0.input_layernorm.weight")!.dtype).toBe("F32");
    const got = await logitsOf(file, tokens);
    // The converter and the load-time quantiser both follow quantize_row_q8_0_ref, and the rows
    // llama's permutation moves keep their blocks: the same weights, so the same logits (qwen2:
    // bit for bit). Llama's interleaved rotary rounds a hair differently from rotate-half, and
    // now and then that moves an activation across a Q8_0 rounding boundary: measured mean
    // relative difference 3e-5, one logit off by 0.12 in 256 × 49152.
    const loadTime = compare(await logitsOf(hf32, tokens, "q8_0"), got);
    expect(loadTime.meanRelErr).toBeLessThan(1e-3);
    expect(loadTime.top1).toBe(1);
    // Against the very weights the file holds, dequantised into an F32 HF folder: the error of
    // rounding activations to Q8_0 (llama.cpp's scheme). Against the original F32 folder: that
    // plus the rounding of the weights.
    const dq = join(dir, "hf-dequantised");
    await dequantiseToHf(file, hf32, dq);
    const activations = compare(await logitsOf(dq, tokens), got);
    const total = compare(ref32, got);
    console.log(
      `${arch} Q8_0: vs its own weights in F32 ${(100 * activations.meanRelErr).toFixed(2)}% mean relative logit error, top-1 ${(100 * activations.top1).toFixed(1)}%; ` +
        `vs the original F32 folder ${(100 * total.meanRelErr).toFixed(2)}%, top-1 ${(100 * total.top1).toFixed(1)}%`,
    );
    // These default random models are chaotic (sharp attention, large residual gains) and amplify
    // any rounding: measured 3.6–3.8% / 91–93% and 5.8–6.6% / 85–90%. The 2% / 95% bar is
    // checked on models conditioned like trained ones in q8-and-rope-layout.test.ts.
    expect(activations.meanRelErr).toBeLessThanOrEqual(0.05);
    expect(activations.top1).toBeGreaterThanOrEqual(0.88);
    expect(total.meanRelErr).toBeLessThanOrEqual(0.08);
    expect(total.top1).toBeGreaterThanOrEqual(0.8);
  });

  test("K/V remapping follows the GGUF rotary layout: an injected block equals running memory + prompt as one sequence", async () => {
    const file = join(dir, "f32-inj.gguf");
    await convertHfToGguf({ dir: hf32, out: file, type: "f32" });
    const m = await Model.load(file, { contextSize: 64 });
    try {
      const mem = tokens.slice(0, 12);
      const prompt = tokens.slice(12, 20);
      const full = await m.logits([...mem, ...prompt]);
      const fullRows = full.slice(mem.length).map((r) => Float32Array.from(r));
      const block = await m.computeBlock(mem, { startPos: 5 }); // computed elsewhere, then moved to 0..11
      const injected = await m.logits(prompt, { segments: [{ kv: block }], positions: "prefix" });
      for (let i = 0; i < prompt.length; i++) expect(maxAbsDiff(fullRows[i], injected[i])).toBeLessThan(1e-3);
      block.dispose();
    } finally {
      m.dispose();
    }
  });
});

test("Model.load(file.gguf): tokenizer, chat template and generation as from the HF folder", async () => {
  const dir = tempDir();
  const hf = join(dir, "hf");
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: hf, seed: 8 });
  const file = join(dir, "m.gguf");
  await convertHfToGguf({ dir: hf, out: file, type: "f32" });
  const a = await Model.load(hf, { contextSize: 128 });
  const b = await Model.load(file, { contextSize: 128 });
  try {
    expect(b.info.dir).toBe(file);
    expect(b.config.ropeInterleaved).toBe(true);
    expect(b.info.fingerprint).not.toBe(a.info.fingerprint);
    const input = { messages: [{ role: "user" as const, content: "Name three colours." }] };
    expect(b.encodePrompt(input)).toEqual(a.encodePrompt(input));
    const ra = await a.generate(input, { maxNewTokens: 16, stopOnEos: false });
    const rb = await b.generate(input, { maxNewTokens: 16, stopOnEos: false });
    expect(rb.tokens).toEqual(ra.tokens);
    expect(rb.text).toBe(ra.text);
  } finally {
    a.dispose();
    b.dispose();
  }
});

test("llama with Llama 3 rope scaling: GGUF F32 logits within 1e-3 of the HF folder", async () => {
  const dir = tempDir();
  const hf = join(dir, "hf");
  await makeTinyModel({ arch: "llama", preset: "llama-1b", dtype: "f32", out: hf, seed: 4, overrides: { hiddenSize: 64, intermediateSize: 128, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 16, ropeTheta: 10000 } });
  const file = join(dir, "m.gguf");
  await convertHfToGguf({ dir: hf, out: file, type: "f32" });
  expect((await readGgufModel(file)).config.ropeScaling).toMatchObject({ type: "llama3", factor: 32 });
  const tokens = tokenIds(128, 49152, 4);
  const r = compare(await logitsOf(hf, tokens), await logitsOf(file, tokens));
  expect(r.maxAbs).toBeLessThan(1e-3);
});

describe("llama GGUF vs transformers (committed fixture)", () => {
  const refs = llamaTinyRefs;

  afterAll(() => native().setSimd("auto"));

  test.each(native().simd().available)("permuted q/k + interleaved rotary give transformers' logits (%s kernels)", async (simd) => {
    native().setSimd(simd);
    const file = join(tempDir(), "fixture.gguf");
    await convertHfToGguf({ dir: hfLlamaTiny, out: file, type: "f32", tokenizer: false }); // word-level tokenizer: no GGUF form
    const g = await readGgufModel(file);
    expect(g.config.ropeInterleaved).toBe(true);
    const model = await native().loadModel({ config: g.config, tensors: g.tensors });
    const ctx = new (native().NativeContext)(model, 64);
    try {
      const out = (await ctx.eval(Int32Array.from(refs.prompt_ids), LogitsMode.All))!;
      const V = g.config.vocabSize;
      for (let i = 0; i < refs.prompt_ids.length; i++) expect(maxAbsDiff(refs.none[i], out.subarray(i * V, (i + 1) * V))).toBeLessThan(1e-4);
    } finally {
      ctx.dispose();
      model.dispose();
    }
  });
});
