// The random-weight model generator: valid HF folders for every arch × dtype, deterministic
// weights, sharding, preset configs, and weight scales that give usefully peaked logits.
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { Template } from "@huggingface/jinja";
import { describe, expect, test } from "vitest";
import { expectedTensors, parseHfConfig } from "../src/formats/hf-config.js";
import { readHfFolder } from "../src/formats/hf-folder.js";
import type { TensorInfo } from "../src/formats/safetensors.js";
import { bf16BitsToF32, f16BitsToF32 } from "../src/models/half.js";
import { makeTinyModel, presetConfig, PRESETS } from "../src/models/make-tiny.js";
import { tempDir } from "./support/paths.js";

async function tensorBytes(t: TensorInfo): Promise<Buffer> {
  const all = await readFile(t.file);
  return all.subarray(t.offset, t.offset + t.nbytes);
}

async function tensorValues(t: TensorInfo): Promise<Float64Array> {
  const b = await tensorBytes(t);
  const n = t.shape.reduce((a, c) => a * c, 1);
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    out[i] = t.dtype === "F32" ? b.readFloatLE(4 * i) : t.dtype === "F16" ? f16BitsToF32(b.readUInt16LE(2 * i)) : bf16BitsToF32(b.readUInt16LE(2 * i));
  }
  return out;
}

function meanStd(v: ArrayLike<number>): { mean: number; std: number } {
  let s = 0;
  let s2 = 0;
  for (let i = 0; i < v.length; i++) {
    s += v[i];
    s2 += v[i] * v[i];
  }
  const mean = s / v.length;
  return { mean, std: Math.sqrt(s2 / v.length - mean * mean) };
}

describe.each(["llama", "qwen2"] as const)("%s", (arch) => {
  test.each(["f32", "f16", "bf16"] as const)("tiny %s folder loads with readHfFolder", async (dtype) => {
    const out = tempDir();
    const r = await makeTinyModel({ arch, preset: "tiny", dtype, out });
    const hf = await readHfFolder(out);
    expect(hf.config).toEqual(r.config);
    expect(hf.config.arch).toBe(arch);
    expect(hf.config.attentionBias).toBe(arch === "qwen2");
    expect(hf.tensors.every((t) => t.dtype === dtype.toUpperCase())).toBe(true);
    expect(hf.tensors.map((t) => t.name)).toEqual([...expectedTensors(hf.config).keys()]);
    expect(r.paramCount).toBe(hf.tensors.reduce((a, t) => a + t.nbytes, 0) / (dtype === "f32" ? 4 : 2));
    expect(hf.rawConfig.torch_dtype).toBe({ f32: "float32", f16: "float16", bf16: "bfloat16" }[dtype]);
    for (const f of ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]) {
      expect(JSON.parse(await readFile(join(out, f), "utf8"))).toBeTypeOf("object");
    }
  });
});

test("weights are deterministic for a seed and differ across seeds; dtypes hold the same values", async () => {
  const [a, b, c, h] = [tempDir(), tempDir(), tempDir(), tempDir()];
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: a, seed: 5 });
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: b, seed: 5 });
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: c, seed: 6 });
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "bf16", out: h, seed: 5 });
  const [fa, fb, fc] = await Promise.all([a, b, c].map((d) => readFile(join(d, "model.safetensors"))));
  expect(fa.equals(fb)).toBe(true);
  expect(fa.equals(fc)).toBe(false);
  // BF16 is the F32 value rounded: within 2^-8 relative.
  const [ta, th] = await Promise.all([a, h].map(async (d) => (await readHfFolder(d)).tensors.find((t) => t.name === "model.layers.0.mlp.up_proj.weight")!));
  const [va, vh] = await Promise.all([tensorValues(ta), tensorValues(th)]);
  for (let i = 0; i < va.length; i += 97) expect(Math.abs(vh[i] - va[i])).toBeLessThanOrEqual(Math.abs(va[i]) * 2 ** -8);
});

test("a sharded folder round-trips through readHfFolder with the same tensor bytes", async () => {
  const single = tempDir();
  const sharded = tempDir();
  await makeTinyModel({ arch: "qwen2", preset: "tiny", dtype: "bf16", out: single, seed: 2 });
  const r = await makeTinyModel({ arch: "qwen2", preset: "tiny", dtype: "bf16", out: sharded, seed: 2, shards: 3 });
  const index = JSON.parse(await readFile(join(sharded, "model.safetensors.index.json"), "utf8")) as { metadata: { total_size: number }; weight_map: Record<string, string> };
  const shardNames = [1, 2, 3].map((i) => `model-0000${i}-of-00003.safetensors`);
  expect(new Set(Object.values(index.weight_map))).toEqual(new Set(shardNames));
  const [hs, hh] = await Promise.all([readHfFolder(single), readHfFolder(sharded)]);
  expect(index.metadata.total_size).toBe(hh.tensors.reduce((a, t) => a + t.nbytes, 0));
  expect(Object.keys(index.weight_map).sort()).toEqual(hh.tensors.map((t) => t.name).sort());
  expect(r.paramCount).toBe(index.metadata.total_size / 2);
  for (let i = 0; i < hs.tensors.length; i++) {
    expect(hh.tensors[i].name).toBe(hs.tensors[i].name);
    expect((await tensorBytes(hh.tensors[i])).equals(await tensorBytes(hs.tensors[i]))).toBe(true);
  }
  // Re-generating unsharded into the same folder must not leave the index behind.
  await makeTinyModel({ arch: "qwen2", preset: "tiny", dtype: "bf16", out: sharded, seed: 2 });
  expect((await readHfFolder(sharded)).tensors[0].file).toBe(join(sharded, "model.safetensors"));
});

test("overrides give GQA, tying and bias variants, and bad shapes are refused", async () => {
  const out = tempDir();
  const r = await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out, overrides: { numHeads: 6, numKvHeads: 2, headDim: 16, attentionBias: true, numLayers: 1 }, tieEmbeddings: true });
  expect(r.config).toMatchObject({ numHeads: 6, numKvHeads: 2, headDim: 16, attentionBias: true, tieWordEmbeddings: true, numLayers: 1, hiddenSize: 64 });
  const hf = await readHfFolder(out);
  expect(hf.tensors.find((t) => t.name === "model.layers.0.self_attn.q_proj.weight")!.shape).toEqual([96, 64]);
  expect(hf.tensors.some((t) => t.name === "lm_head.weight")).toBe(false);
  expect(() => presetConfig("llama", "tiny", { numHeads: 4, numKvHeads: 3 })).toThrow(/multiple/);
  expect(() => presetConfig("llama", "tiny", { headDim: 15 })).toThrow(/even/);
  expect(() => presetConfig("qwen2", "tiny", { attentionBias: false })).toThrow(/qwen2/);
  expect(() => presetConfig("llama", "tiny", { numLayers: 0 })).toThrow(/numLayers/);
  await expect(makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out, shards: 1000 })).rejects.toThrow(/shards/);
});

test("preset configs carry real HF field names and shapes", () => {
  const smol = presetConfig("llama", "smollm2-135m", {}, "bf16");
  const real = { hidden_size: 576, intermediate_size: 1536, num_hidden_layers: 30, num_attention_heads: 9, num_key_value_heads: 3, rope_theta: 100000, tie_word_embeddings: true, vocab_size: 49152, model_type: "llama", torch_dtype: "bfloat16" };
  expect(smol).toMatchObject(real);
  // Same parameter count as the released SmolLM2-135M.
  const count = [...expectedTensors(parseHfConfig(smol)).values()].reduce((a, s) => a + s.reduce((x, y) => x * y, 1), 0);
  expect(count).toBe(134_515_008);

  const l1b = presetConfig("llama", "llama-1b");
  expect(l1b).toMatchObject({ hidden_size: 2048, num_hidden_layers: 16, num_attention_heads: 32, num_key_value_heads: 8, head_dim: 64, intermediate_size: 8192, tie_word_embeddings: true, rope_theta: 500000 });
  expect(l1b.rope_scaling).toEqual({ rope_type: "llama3", factor: 32, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 });
  expect(parseHfConfig(l1b).ropeScaling).toMatchObject({ type: "llama3", factor: 32 });

  // Llama-3.1-8B's body (8,030,261,248 parameters with its 128256-token vocabulary, untied).
  const l8b = presetConfig("llama", "llama-8b");
  expect(l8b.rope_scaling).toMatchObject({ rope_type: "llama3", factor: 8 });
  const count8b = [...expectedTensors(parseHfConfig(l8b)).values()].reduce((a, s) => a + s.reduce((x, y) => x * y, 1), 0);
  expect(count8b).toBe(8_030_261_248 - 2 * (128_256 - 49_152) * 4096);

  const qwen = presetConfig("qwen2", "tiny");
  expect(qwen).toMatchObject({ model_type: "qwen2", architectures: ["Qwen2ForCausalLM"], rope_theta: 1000000, attention_bias: true });
  expect(parseHfConfig(qwen).attentionBias).toBe(true);
  for (const p of Object.values(PRESETS)) expect(p.vocabSize).toBe(49152);
});

test("the chat template renders ChatML as SmolLM2 does", async () => {
  const out = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f16", out, overrides: { numLayers: 1 } });
  const cfg = JSON.parse(await readFile(join(out, "tokenizer_config.json"), "utf8")) as Record<string, string>;
  expect(cfg.bos_token).toBe("<|im_start|>");
  expect(cfg.eos_token).toBe("<|im_end|>");
  const text = new Template(cfg.chat_template).render({
    messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "hi" }],
    add_generation_prompt: true,
  });
  expect(text).toBe("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
});

describe.each([false, true])("tied %s", (tie) => {
  test("weight scales: unit-ish matrices, norms near 1, logits of a unit hidden state with std of a few units", async () => {
    const out = tempDir();
    await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out, seed: 1, tieEmbeddings: tie });
    const hf = await readHfFolder(out);
    const get = (name: string) => tensorValues(hf.tensors.find((t) => t.name === name)!);
    const norm = meanStd(await get("model.norm.weight"));
    expect(norm.mean).toBeGreaterThan(0.95);
    expect(norm.mean).toBeLessThan(1.05);
    expect(norm.std).toBeGreaterThan(0.01);
    expect(norm.std).toBeLessThan(0.1);
    const up = meanStd(await get("model.layers.0.mlp.up_proj.weight"));
    expect(up.std * Math.sqrt(64)).toBeCloseTo(1, 1);

    const head = await get(tie ? "model.embed_tokens.weight" : "lm_head.weight");
    const hidden = hf.config.hiddenSize;
    const vocab = hf.config.vocabSize;
    const h = new Float64Array(hidden).map((_, i) => Math.sin(i * 12.9898 + 1) * Math.SQRT2); // unit RMS, arbitrary direction
    const logits = new Float64Array(vocab);
    for (let v = 0; v < vocab; v++) {
      let s = 0;
      for (let i = 0; i < hidden; i++) s += head[v * hidden + i] * h[i];
      logits[v] = s;
    }
    const { std } = meanStd(logits);
    expect(std).toBeGreaterThan(2);
    expect(std).toBeLessThan(8);
  });
});
