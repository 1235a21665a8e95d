// Resource limits and non-finite values: a context is sized and checked before it is made and
// backed only as tokens fill it; a NaN weight, a NaN block or an overflowing α is a clear error
// naming where it struck, never a stream of token 0. Also the small refusals a newcomer met.
import { spawnSync } from "node:child_process";
import { cpSync, openSync, closeSync, writeFileSync, writeSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { DkiArgumentError, NonFiniteError } from "../src/errors.js";
import { Model } from "../src/engine/model.js";
import { LogitsMode, native, packageRoot } from "../src/engine/native.js";
import { readSafetensorsHeader } from "../src/formats/safetensors.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { TieredKVCache } from "../src/cache/index.js";
import { tempDir } from "./support/paths.js";

let cleanDir: string;
let clean: Model;
const PROMPT = "The weather today is";

beforeAll(async () => {
  cleanDir = join(tempDir(), "clean");
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: cleanDir, seed: 21 });
  clean = await Model.load(cleanDir, { contextSize: 64 });
});
afterAll(() => clean.dispose());

/** A copy of the clean model with one f32 element of one tensor set to NaN. */
async function poisoned(tensor: string, element: number): Promise<string> {
  const dir = join(tempDir(), "poisoned");
  cpSync(cleanDir, dir, { recursive: true });
  const { tensors } = await readSafetensorsHeader(join(dir, "model.safetensors"));
  const t = tensors.find((x) => x.name === tensor)!;
  expect(t.dtype).toBe("F32");
  const fd = openSync(t.file, "r+");
  try {
    writeSync(fd, Buffer.from(new Float32Array([NaN]).buffer), 0, 4, t.offset + 4 * element);
  } finally {
    closeSync(fd);
  }
  return dir;
}

describe("resource limits", () => {
  test("a window the memory cannot hold is refused before anything is allocated, naming the bytes needed and available", async () => {
    // 16 layers × 8 KV heads × 128 dims: 128 KiB of K/V a token, 2.2 TB for the largest window.
    const dir = tempDir();
    await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f16", out: dir, seed: 2, overrides: { numLayers: 16, numHeads: 8, numKvHeads: 8, headDim: 128 } });
    const tokens = native().limits.contextTokens;
    const needed = /a 16777216-token context's K\/V cache needs 2\.2 TB \(2199023255552 bytes\) of memory; [\d.]+ [KMGT]?B \(\d+ bytes\) is available/;
    const load = Model.load(dir, { contextSize: tokens });
    await expect(load).rejects.toThrow(DkiArgumentError);
    await expect(load).rejects.toThrow(new RegExp(`^contextSize ${tokens}: ` + needed.source));
    const m = await Model.load(dir, { contextSize: 16 });
    try {
      expect(() => m.createContext(tokens)).toThrow(needed);
      expect(() => m.createContext(tokens)).toThrow(expect.objectContaining({ code: "ENOMEM" }));
    } finally {
      m.dispose();
    }
  });

  test("the logits of every position are checked against memory before they are computed", async () => {
    const m = await Model.load(cleanDir, { contextSize: 1_000_000 });
    try {
      // 10^6 positions × 49152 logits × 4 bytes, and JavaScript's copy: 393 GB.
      await expect(m.logits(new Array<number>(1_000_000).fill(5))).rejects.toThrow(
        /holding the logits of 1000000 positions \(and JavaScript's copy of them\) needs 393\.2 GB \(393216000000 bytes\) of memory; .* is available/,
      );
    } finally {
      m.dispose();
    }
  });

  test("a large window costs only the tokens it holds (peak RSS of a child process), and says it is beyond the trained positions", () => {
    const modelJs = pathToFileURL(join(packageRoot(), "dist", "src", "engine", "model.js")).href;
    const peak = (contextSize: number) => {
      const code = `
        import { Model } from ${JSON.stringify(modelJs)};
        const m = await Model.load(${JSON.stringify(cleanDir)}, { contextSize: ${contextSize}, threads: 1 });
        const r = await m.generate("Hello there", { maxNewTokens: 8, stopOnEos: false });
        console.log(JSON.stringify({ peakKiB: process.resourceUsage().maxRSS, generated: r.tokens.length, warnings: m.info.warnings }));
        m.dispose();`;
      const r = spawnSync(process.execPath, ["--input-type=module", "-e", code], { encoding: "utf8", timeout: 120_000 });
      expect(r.status, r.stderr).toBe(0);
      return JSON.parse(r.stdout) as { peakKiB: number; generated: number; warnings: string[] };
    };
    // 4M tokens × 2 layers × 2 KV heads × 16 dims × K and V × 4 bytes = 2.05 GB if allocated.
    const big = peak(4_000_000);
    const small = peak(64);
    expect(big.generated).toBe(8);
    expect((big.peakKiB - small.peakKiB) * 1024).toBeLessThan(64e6);
    expect(big.warnings).toEqual([expect.stringMatching(/^the context window of 4000000 tokens is beyond the 4096 positions the model was trained on/)]);
    expect(small.warnings).toEqual([]);
  });
});

describe("non-finite values", () => {
  test("a NaN in a norm weight is refused at load, naming the tensor and the element", async () => {
    const dir = await poisoned("model.norm.weight", 3);
    await expect(Model.load(dir)).rejects.toThrow(/tensor "model\.norm\.weight" holds NaN at element 3; the weights are damaged/);
  });

  test("a NaN in a matrix: generate and logits fail naming the step or position; checkTensors finds it at load", async () => {
    const V = clean.config.vocabSize;
    expect(clean.config.tieWordEmbeddings).toBe(false);
    const dir = await poisoned("lm_head.weight", 7 * clean.config.hiddenSize); // row 7: the logit of token 7
    const m = await Model.load(dir, { contextSize: 64 });
    try {
      const gen = m.generate(PROMPT, { maxNewTokens: 8, stopOnEos: false });
      await expect(gen).rejects.toThrow(NonFiniteError);
      await expect(gen).rejects.toThrow(
        /^generate, step 0 \(the prompt's prefill\): the logits of token \d+ of \d+ in this eval are not finite \(NaN at vocabulary id 7\); stopped rather than sample from them$/,
      );
      expect(((await gen.catch((e: unknown) => e)) as NonFiniteError).step).toBe(0);
      await expect(m.logits([1, 2, 3])).rejects.toThrow(/^logits: the logits of token 0 of 3 in this eval are not finite \(NaN at vocabulary id 7\)$/);
      // The failed eval left the context as it was: a call that needs no logits still works.
      await expect(m.attentionEntropy(PROMPT, 0)).resolves.toMatchObject({ nats: expect.any(Number) });
    } finally {
      m.dispose();
    }
    expect(V).toBe(49152);
    await expect(Model.load(dir, { checkTensors: true })).rejects.toThrow(
      new RegExp(`tensor "lm_head\\.weight" holds NaN at element ${7 * clean.config.hiddenSize}; the weights are damaged`),
    );
    await expect(Model.load(dir, { checkTensors: "yes" as unknown as boolean })).rejects.toThrow(/checkTensors must be true or false, got "yes"/);
  });

  test("the tiered cache neither computes into its tiers nor accepts a block holding NaN", async () => {
    const first = (await clean.generate(PROMPT, { maxNewTokens: 1, stopOnEos: false })).tokens[0]!;
    const m = await Model.load(await poisoned("model.embed_tokens.weight", first * clean.config.hiddenSize), { contextSize: 64 });
    const cache = await TieredKVCache.open({ model: m, dir: tempDir(), budgets: { l1Bytes: 1 << 24, l2Bytes: 1 << 24, l3Bytes: 1 << 24 } });
    try {
      const req = { userId: "u", tokens: [first], startPos: -1 };
      await expect(cache.get(req)).rejects.toThrow(new NonFiniteError("the K/V computed for 1 tokens at position -1 holds NaN or ±inf (the model's weights or its activations on these tokens are not finite); nothing was cached"));
      await expect(cache.put(req, await m.computeBlock([first], { startPos: -1 }))).rejects.toThrow(/^put\(\): the block holds NaN or ±inf in its keys or values: it cannot be injected, and is not stored$/);
      await cache.flush();
      const s = cache.stats();
      expect([s.L1.entries, s.L2.entries, s.L3.entries]).toEqual([0, 0, 0]);
      // A clean block of the same model is cached as always.
      const ok = { userId: "u", tokens: m.tokenizer.encode("fine", { addSpecialTokens: false }), startPos: -1 };
      expect((await cache.get(ok)).tier).toBe("L4");
      expect((await cache.get(ok)).tier).toBe("L1");
    } finally {
      await cache.close();
      m.dispose();
    }
  });

  test("a NaN met while decoding names the decode step; a block holding NaN is refused by the segment's index", async () => {
    const first = (await clean.generate(PROMPT, { maxNewTokens: 1, stopOnEos: false })).tokens[0]!;
    expect(clean.encodePrompt(PROMPT)).not.toContain(first);
    // The embedding of the first generated token: the prefill is clean, the step that feeds it back is not.
    const dir = await poisoned("model.embed_tokens.weight", first * clean.config.hiddenSize);
    const m = await Model.load(dir, { contextSize: 64 });
    try {
      const gen = m.generate(PROMPT, { maxNewTokens: 4, stopOnEos: false });
      await expect(gen).rejects.toThrow(/^generate, step 1 \(decode\): the logits of token 0 of 1 in this eval are not finite \(NaN at vocabulary id \d+\)/);
      expect(((await gen.catch((e: unknown) => e)) as NonFiniteError).step).toBe(1);

      const bad = await m.computeBlock([first], { startPos: -1 });
      const fine = await m.computeBlock("fine", { startPos: -1 });
      expect(bad.valueAbsMax()).toBe(Infinity);
      expect(fine.valueAbsMax()).toBeGreaterThan(0);
      expect(fine.valueAbsMax()).toBeLessThan(Infinity);
      // segments[0] is below the threshold and left out: the engine's segment 0 is the caller's segments[1].
      const inject = m.generate(PROMPT, { maxNewTokens: 2, segments: [{ kv: fine, alpha: 0.01 }, { kv: bad }] });
      await expect(inject).rejects.toThrow(/^generate: segments\[1\] \(1 tokens\) holds NaN or ±inf \(a key in layer 0 of 2\); it cannot be injected$/);
      expect(((await inject.catch((e: unknown) => e)) as NonFiniteError).segment).toBe(1);
      // Short blocks side by side with one α are attended as one merged block; the check still names the caller's segment.
      const adjacent = m.generate(PROMPT, { maxNewTokens: 2, positions: "negative", segments: [{ kv: await m.computeBlock("fine") }, { kv: await m.computeBlock([first]) }] });
      await expect(adjacent).rejects.toThrow(/^generate: segments\[1\] \(1 tokens\) holds NaN or ±inf \(a key in layer 0 of 2\); it cannot be injected$/);
      // A remapped copy carries what the scan of its source found.
      await expect(m.generate(PROMPT, { maxNewTokens: 2, segments: [{ kv: await bad.remap(-7) }] })).rejects.toThrow(/^generate: segments\[0\] \(1 tokens\) holds NaN or ±inf/);
      // Non-finite logits with a memory injected say which segments were.
      const clean2 = await m.computeBlock("The user loves hiking.", { startPos: -6 });
      const withFirst = { tokens: [...m.encodePrompt(PROMPT), first] };
      // The attention probe, a gating signal, is checked the same way.
      await expect(m.attentionEntropy(withFirst, 1)).rejects.toThrow(
        new RegExp(`^attentionEntropy: the attention of layer 1 at token ${withFirst.tokens.length - 1} of ${withFirst.tokens.length} in this eval is not finite \\(query head 0\\)$`),
      );
      await expect(m.nextTokenEntropy(withFirst)).rejects.toThrow(/^nextTokenEntropy: the logits of token \d+ of \d+ in this eval are not finite/);
      await expect(m.generate(withFirst, { maxNewTokens: 4, segments: [{ kv: clean2, alpha: 0.5 }] })).rejects.toThrow(
        /^generate, step 0 \(the prompt's prefill\): .*; injected: segments\[0\] \(\d+ tokens, α = 0\.5, value scaling\)$/,
      );
    } finally {
      m.dispose();
    }
  });

  test("an α whose scaled values overflow float32 is refused, naming the segment; α must be finite as a 32-bit float", async () => {
    const text = "The user loves hiking.";
    const n = clean.tokenizer.encode(text).length;
    const mem = await clean.computeBlock(text, { startPos: -n });
    const vmax = mem.values().reduce((m, v) => Math.max(m, Math.abs(v)), 0);
    expect(vmax).toBeGreaterThan(1.5);
    // Just past the bound α·max|v| ≤ FLT_MAX under which no scaled value (or sum of them) overflows.
    const alpha = Math.fround((1.5 * 3.4028234663852886e38) / vmax);
    const overflow = new RegExp(`α = ${alpha.toPrecision(6).replace(/\.?0+(e|$)/, "$1").replace("+", "\\+")} times the largest value magnitude [\\d.]+ overflows float32 \\(max 3\\.40282e\\+38\\)`);
    const gen = clean.generate(PROMPT, { maxNewTokens: 4, segments: [{ kv: mem, alpha }] });
    await expect(gen).rejects.toThrow(NonFiniteError);
    await expect(gen).rejects.toThrow(new RegExp(`^generate: segments\\[0\\] \\(${n} tokens\\): ` + overflow.source + "$"));
    await expect(clean.logits([1, 2], { segments: [{ kv: mem, alpha }] })).rejects.toThrow(/^logits: segments\[0\]/);
    await expect(mem.scaleValues(alpha)).rejects.toThrow(new RegExp("^scaleValues: " + overflow.source));
    await expect(mem.scaleValues(1e39)).rejects.toThrow(/^alpha must be a finite number >= 0 \(as a 32-bit float, at most ~3\.4e38\), got 1e\+39$/);
    // Below the bound the values themselves fit, and what overflows later is caught in the logits,
    // still naming the segment: never a stream of token 0.
    await expect(clean.generate(PROMPT, { maxNewTokens: 4, segments: [{ kv: mem, alpha: 1e38 }] })).rejects.toThrow(/segments\[0\]/);
    // Finite in JavaScript, +inf as the engine's float.
    await expect(clean.generate(PROMPT, { segments: [{ kv: mem, alpha: 1e39 }] })).rejects.toThrow(/segments\[0\]: alpha must be a finite number >= 0 \(as a 32-bit float/);
    // Logit scaling adds ln α (87.5 here): nothing overflows, so it runs.
    await expect(clean.generate(PROMPT, { maxNewTokens: 2, segments: [{ kv: mem, alpha: 1e38, scaling: "logit" }] })).resolves.toMatchObject({ tokens: expect.any(Array) });
    // The model is unharmed.
    expect((await clean.generate(PROMPT, { maxNewTokens: 2, stopOnEos: false })).tokens).toHaveLength(2);
  });

  test("α = 0 is injected exactly when alphaThreshold allows it (value scaling keeps the softmax share); with logit scaling it is refused", async () => {
    const mem = await clean.computeBlock("The user loves hiking.", { startPos: -6 });
    const tokens = clean.encodePrompt(PROMPT);
    const plain = await clean.logits(tokens);
    const zero = await clean.logits(tokens, { segments: [{ kv: mem, alpha: 0 }], alphaThreshold: 0 });
    const dropped = await clean.logits(tokens, { segments: [{ kv: mem, alpha: 0 }] });
    expect(dropped).toEqual(plain);
    // Memory columns with zero values still take their share: every row differs from the plain model's.
    zero.forEach((row, i) => expect(row).not.toEqual(plain[i]));
    await expect(clean.logits(tokens, { segments: [{ kv: mem, alpha: 0, scaling: "logit" }], alphaThreshold: 0 })).rejects.toThrow(
      /segments\[0\]: alpha 0 with logit scaling would add ln 0 = -inf/,
    );
    // Below a threshold above 0 it is left out like any other α: nothing to refuse.
    expect(await clean.logits(tokens, { segments: [{ kv: mem, alpha: 0, scaling: "logit" }] })).toEqual(plain);
  });
});

describe("small refusals", () => {
  test("an empty token range says it is empty, one outside says outside", async () => {
    const mem = await clean.computeBlock([10, 11, 12, 13, 14]);
    await expect(mem.slice(2, 2)).rejects.toThrow(/^slice \[2, 2\) is empty: it must hold at least one token \(from < to\)$/);
    await expect(mem.slice(3, 2)).rejects.toThrow(/^slice \[3, 2\) is empty/);
    await expect(mem.slice(3, 9)).rejects.toThrow(/^slice \[3, 9\) is outside the block's 5 tokens$/);
    const ctx = clean.createContext(8);
    try {
      await ctx.eval(Int32Array.of(1, 2, 3), LogitsMode.None);
      expect(() => ctx.exportBlock(1, 1)).toThrow(/^block range \[1, 1\) is empty/);
      expect(() => ctx.exportBlock(1, 4)).toThrow(/^block range \[1, 4\) is outside the context's cached 3 tokens$/);
    } finally {
      ctx.dispose();
    }
  });

  test("an empty stop string is refused, not ignored", async () => {
    await expect(clean.generate(PROMPT, { stop: ["\n", ""] })).rejects.toThrow(/^stop must be an array of non-empty strings, got \["\\n",""\]$/);
  });

  test("TieredKVCache.open names a dir that is a file, or sits under one", async () => {
    const root = tempDir();
    const file = join(root, "notes.txt");
    writeFileSync(file, "x");
    const budgets = { l1Bytes: 1e6, l2Bytes: 1e6, l3Bytes: 1e6 };
    await expect(TieredKVCache.open({ model: clean, dir: file, budgets })).rejects.toThrow(new RegExp(`^dir: ${file} is a file; the L3 tier needs a folder there$`));
    await expect(TieredKVCache.open({ model: clean, dir: join(file, "cache"), budgets })).rejects.toThrow(/^dir: a part of .* is a file, not a folder/);
    mkdirSync(join(root, "ok"));
    const cache = await TieredKVCache.open({ model: clean, dir: join(root, "ok"), budgets });
    await cache.close();
  });
});
