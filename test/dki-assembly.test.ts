// Injection assembly through the tiered cache (what DKISystem and a knowledge base's "chunks as
// K/V" mode call): blocks computed once at their canonical place and moved by the engine's shift
// give exactly the logits of running their tokens and the prompt as one sequence; repeats come
// from L1, another process's (a reopened cache's) from L3 within the int8 form's tolerance; one
// user's blocks never serve another.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { TieredKVCache } from "../src/cache/index.js";
import { assembleBlocks, canonicalStart, type BlockSpec } from "../src/dki/index.js";
import { maxAbsDiff, tempDir } from "./support/paths.js";

let model: Model;
const pref = [88, 2000, 5, 301, 46000];
const memory = [3, 1200, 77, 4501, 9, 18000, 256, 31, 40000, 12, 600, 7];
const prompt = [1, 450, 3000, 17, 9021, 44, 12000];
const budgets = { l1Bytes: 64 << 20, l2Bytes: 64 << 20, l3Bytes: 256 << 20 };
const maxRowDiff = (a: ArrayLike<number>[], b: ArrayLike<number>[]) => Math.max(...a.map((row, i) => maxAbsDiff(row, b[i]!)));
const specs = (alpha = 1): BlockSpec[] => [
  { name: "preferences", tokens: pref, alpha },
  { name: "m1", tokens: memory, alpha },
];

beforeAll(async () => {
  const dir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 11 });
  model = await Model.load(dir, { contextSize: 128 });
});
afterAll(() => model.dispose());

describe("assembleBlocks", () => {
  test("α = 1, one block at its canonical place, injected at negative or prefix positions, equals [block ; prompt] as one sequence (≤ 1e-4)", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets });
    try {
      const a = await assembleBlocks(cache, "alice", [], [{ name: "m1", tokens: memory, alpha: 1 }]);
      expect(a.blocks.map((b) => [b.name, b.tier, b.tokens])).toEqual([["m1", "L4", memory.length]]);
      // Computed at position 0 (no prefix): the engine's shift moves it.
      expect(a.segments[0]!.kv.startPos).toBe(0);
      const full = (await model.logits([...memory, ...prompt])).slice(memory.length);
      const negative = await model.logits(prompt, { segments: a.segments, positions: "negative" });
      const prefix = await model.logits(prompt, { segments: a.segments, positions: "prefix" });
      // Rotary attention sees relative positions only: [−M, −1] + [0, n) is [0, M) + [M, M + n) shifted.
      expect(maxRowDiff(full, negative)).toBeLessThan(1e-4);
      expect(maxRowDiff(full, prefix)).toBeLessThan(1e-4);
      a.release();
    } finally {
      await cache.close();
    }
  });

  test("several blocks land in the order given at [−M, −1], each moved by its shift: the same logits as blocks computed where they land (≤ 1e-4)", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets });
    try {
      const a = await assembleBlocks(cache, "alice", [], specs(0.7));
      expect(a.blocks.map((b) => [b.name, b.tier, b.tokens, b.alpha])).toEqual([["preferences", "L4", pref.length, 0.7], ["m1", "L4", memory.length, 0.7]]);
      expect(a.tokens).toBe(pref.length + memory.length);
      const M = a.tokens;
      const inPlace = [await model.computeBlock(pref, { startPos: -M }), await model.computeBlock(memory, { startPos: -memory.length })];
      const want = await model.logits(prompt, { segments: inPlace.map((kv) => ({ kv, alpha: 0.7 })) });
      expect(maxRowDiff(want, await model.logits(prompt, { segments: a.segments }))).toBeLessThan(1e-4);
      a.release();
    } finally {
      await cache.close();
    }
  });

  test("the encoding prefix is part of the block: computed behind it, at the position after it, under another key", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets });
    try {
      const bos = [1];
      expect(canonicalStart(bos)).toBe(1);
      const plain = await assembleBlocks(cache, "alice", [], [{ name: "m1", tokens: memory, alpha: 1 }]);
      const behind = await assembleBlocks(cache, "alice", bos, [{ name: "m1", tokens: memory, alpha: 1 }]);
      expect(behind.blocks[0]!.tier).toBe("L4");
      expect(behind.blocks[0]!.key).not.toBe(plain.blocks[0]!.key);
      expect(behind.segments[0]!.kv.startPos).toBe(1);
      const direct = await model.computeBlock(memory, { startPos: 1, prefix: bos });
      expect(maxAbsDiff(behind.segments[0]!.kv.values(), direct.values())).toBe(0);
      expect(maxAbsDiff(behind.segments[0]!.kv.values(), plain.segments[0]!.kv.values())).toBeGreaterThan(1e-3);
      plain.release();
      behind.release();
    } finally {
      await cache.close();
    }
  });

  test("repeats come from L1, a reopened cache (a new process's view) from L3 within the int8 tolerance; another user's request never hits", async () => {
    const dir = tempDir();
    let cache = await TieredKVCache.open({ model, dir, budgets });
    const first = await assembleBlocks(cache, "alice", [], specs(0.8));
    const fresh = await model.logits(prompt, { segments: first.segments });
    first.release();
    const again = await assembleBlocks(cache, "alice", [], specs(0.8));
    expect(again.blocks.map((b) => b.tier)).toEqual(["L1", "L1"]);
    expect(maxRowDiff(fresh, await model.logits(prompt, { segments: again.segments }))).toBe(0);
    again.release();
    const bob = await assembleBlocks(cache, "bob", [], specs(0.8));
    expect(bob.blocks.map((b) => b.tier)).toEqual(["L4", "L4"]);
    bob.release();
    await cache.close();

    cache = await TieredKVCache.open({ model, dir, budgets });
    try {
      const reopened = await assembleBlocks(cache, "alice", [], specs(0.8));
      expect(reopened.blocks.map((b) => b.tier)).toEqual(["L3", "L3"]);
      const restored = await model.logits(prompt, { segments: reopened.segments });
      const none = await model.logits(prompt);
      const err = maxRowDiff(fresh, restored);
      const effect = maxRowDiff(fresh, none);
      // The int8 form's tolerance (cache-quality.test.ts): within 6% of the memory's own effect.
      console.log(`L3 (int8) vs fresh: max |Δlogit| ${err.toFixed(4)}, memory effect ${effect.toFixed(3)}`);
      expect(err).toBeLessThan(0.06 * effect);
      expect(err).toBeGreaterThan(0); // really the int8 copy, not the fp32 block
      reopened.release();
    } finally {
      await cache.close();
    }
  });

  test("a block that cannot be made fails the assembly with the cache's error, and the blocks already got are released", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets });
    try {
      await expect(assembleBlocks(cache, "alice", [], [{ name: "ok", tokens: memory, alpha: 1 }, { name: "empty", tokens: [], alpha: 1 }])).rejects.toThrow(/tokens is empty/);
      const again = await assembleBlocks(cache, "alice", [], [{ name: "ok", tokens: memory, alpha: 1 }]);
      expect(again.blocks[0]!.tier).toBe("L1");
      again.release();
    } finally {
      await cache.close();
    }
  });
});
