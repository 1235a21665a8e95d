// Bad arguments to the public API are refused with a DkiArgumentError that names the option and
// the value, before any work: not with a native wording, a TypeError or a late failure.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { DkiArgumentError } from "../src/errors.js";
import { Model } from "../src/engine/model.js";
import { KVBlock } from "../src/kv/kv-block.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { hfLlamaTiny } from "./support/paths.js";

describe("Model.load options", () => {
  // A folder that does not exist: each option is refused before any file is read.
  const nowhere = "/nonexistent/model-folder";
  test.each([
    [{ contextSize: 1e9 }, /contextSize must be an integer from 1 to 16777216, got 1000000000/],
    [{ contextSize: 0 }, /contextSize must be an integer from 1 to 16777216, got 0/],
    [{ threads: "2" }, /threads must be an integer from 0 \(the default\) to 1024, got "2"/],
    [{ threads: 5000 }, /threads must be an integer from 0 \(the default\) to 1024, got 5000/],
    [{ deviceIndex: -1 }, /deviceIndex must be an integer from 0 to 1023, got -1/],
    [{ deviceIndex: 1024 }, /deviceIndex must be an integer from 0 to 1023, got 1024/],
    [{ quantize: "q4" }, /quantize must be "none" or "q8_0", got "q4"/],
  ])("%o", async (opts, message) => {
    const err = await Model.load(nowhere, opts as never).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DkiArgumentError);
    expect((err as Error).message).toMatch(message);
  });
});

describe("blocks", () => {
  let m: Model;
  let block: KVBlock;
  beforeAll(async () => {
    m = await Model.load(hfLlamaTiny, { contextSize: 32 });
    block = await m.computeBlock([5, 6, 7]);
  });
  afterAll(() => m.dispose());

  test("computeBlock: a start position the context cannot take is named as startPos", async () => {
    await expect(m.computeBlock([5, 6], { startPos: 1e15 })).rejects.toThrow(/startPos must be an integer within ±16777216 .*got 1000000000000000/);
    await expect(m.computeBlock([5, 6], { startPos: -16777216, prefix: [1] })).rejects.toThrow(DkiArgumentError);
    expect((await m.computeBlock([5, 6], { startPos: -16777216 })).startPos).toBe(-16777216);
  });

  test("prompts, token ids and segments of the wrong shape are named, not a TypeError from inside", async () => {
    await expect(m.generate(42 as never)).rejects.toThrow(/a prompt is a string, \{ messages \} or \{ tokens \}, got number/);
    await expect(m.generate({ tokens: [1.5] })).rejects.toThrow(/the prompt: token ids must be integers, got 1\.5/);
    await expect(m.generate({ tokens: [600] })).rejects.toThrow(/the prompt: token id 600 is outside the vocabulary \(0\.\.511\)/);
    await expect(m.logits([5], { segments: [{ kv: null as never }] })).rejects.toThrow(/each segment must be \{ kv: KVBlock, alpha\?, scaling\? \}/);
    await expect(m.logits([5], { segments: block as never })).rejects.toThrow(/segments must be an array/);
  });

  test("sampling settings are checked as the native sampler takes them (32-bit floats, a 32-bit k)", async () => {
    await expect(m.generate("t1", { sampling: { temperature: 1e308 } })).rejects.toThrow(/temperature must be a finite number >= 0 \(as a 32-bit float\), got 1e\+308/);
    await expect(m.generate("t1", { sampling: { temperature: 0.7, topP: 1e-50 } })).rejects.toThrow(/topP must be in \(0, 1\] \(as a 32-bit float\), got 1e-50/);
    await expect(m.generate("t1", { sampling: { repetitionPenalty: 1e39 } })).rejects.toThrow(/repetitionPenalty must be a finite number > 0/);
    await expect(m.generate("t1", { sampling: { topK: 2 ** 31 } })).rejects.toThrow(/topK must be an integer from 0 to 2147483647, got 2147483648/);
  });

  test("scaleValues takes α ≥ 0, as injection does", async () => {
    await expect(block.scaleValues(-1)).rejects.toThrow(/alpha must be a finite number >= 0 \(as a 32-bit float, at most ~3\.4e38\), got -1/);
    expect((await block.scaleValues(0)).nTokens).toBe(3);
  });

  test("an unknown storage form is a DkiArgumentError listing the forms", async () => {
    const err = await block.serialize("f8" as "f16").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DkiArgumentError);
    expect((err as Error).message).toMatch(/unknown K\/V storage "f8" \(expected f32, f16, bf16, int8\)/);
    expect(() => block.storageBytes("q4" as "f16")).toThrow(DkiArgumentError);
  });

  test("deserialize needs a model: null would skip the native fingerprint check", async () => {
    const bytes = await block.serialize("f16");
    await expect(KVBlock.deserialize(null as never, bytes)).rejects.toThrow(/deserialize: model must be a Model or its nativeHandle\(\)/);
  });
});

describe("tokenizers with pieces outside the vocabulary", () => {
  const json = JSON.parse(readFileSync(join(hfLlamaTiny, "tokenizer.json"), "utf8")) as { model: Record<string, unknown> };

  test("a WordLevel model maps them to its unknown token, as the Rust tokenizers do", () => {
    const t = Tokenizer.fromJson(json, "tokenizer.json");
    expect(json.model.unk_token).toBe("t0");
    expect(t.encode("hi t5 t7 zz", { addSpecialTokens: false })).toEqual([0, 5, 7, 0]);
  });

  test("without an unknown token, encode refuses the text instead of returning undefined ids", () => {
    const t = Tokenizer.fromJson({ ...json, model: { ...json.model, unk_token: undefined } }, "tokenizer.json");
    expect(t.encode("t3 t4", { addSpecialTokens: false })).toEqual([3, 4]);
    expect(() => t.encode("t3 zz", { addSpecialTokens: false })).toThrow(/encode: "t3 zz" has a piece this tokenizer has no token for/);
  });
});
