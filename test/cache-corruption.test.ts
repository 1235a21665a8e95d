// Corrupt L3 entries are dropped (file deleted, counted) and recomputed, never injected: the
// block handed out after each kind of damage generates exactly what a freshly computed block does.
import { readFile, truncate, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { Model } from "../src/engine/model.js";
import type { KVBlock } from "../src/kv/kv-block.js";
import { encodeEntry, TieredKVCache, userHash, type BlockRequest } from "../src/cache/index.js";
import { CountingModel, tinyModel, tokensFrom } from "./support/cache.js";
import { tempDir } from "./support/paths.js";

let model: Model;
let other: Model;
let fresh: KVBlock;
let freshTokens: number[];
const r: BlockRequest = { userId: "carol", tokens: tokensFrom(11, 24) };
const prompt = [1, 450, 3000, 17, 9021, 44];
const budgets = { l1Bytes: 1 << 20, l2Bytes: 1 << 20, l3Bytes: 1 << 20 };
const generate = async (kv: KVBlock) => (await model.generate({ tokens: prompt }, { maxNewTokens: 16, segments: [{ kv }] })).tokens;

beforeAll(async () => {
  model = await tinyModel(1);
  other = await tinyModel(2);
  fresh = await model.computeBlock(r.tokens);
  freshTokens = await generate(fresh);
});
afterAll(() => {
  model.dispose();
  other.dispose();
});

// L3 file layout: 64-byte entry header (magic, version, key at 16..47, length at 48), then the
// serialised block: its own 64-byte header (start_pos at +32, fingerprint at +40, checksum at
// +56), token ids, int8 payload.
const ENTRY = 64;
type Damage = (file: string, key: string) => Promise<void>;
const flip = (at: (n: number) => number): Damage => async (file) => {
  const b = await readFile(file);
  b[at(b.length)] ^= 0x01;
  await writeFile(file, b);
};
const damages: [string, RegExp, Damage][] = [
  ["truncated to half", /truncated/, async (f) => truncate(f, Math.floor((await readFile(f)).length / 2))],
  ["truncated by one byte", /truncated/, async (f) => truncate(f, (await readFile(f)).length - 1)],
  ["emptied", /shorter than its header/, async (f) => truncate(f, 0)],
  ["a payload bit flipped", /checksum mismatch/, flip((n) => n - 100)],
  ["a token id bit flipped", /checksum mismatch/, flip(() => ENTRY + 64 + 5)],
  ["the block's start position flipped (covered by its checksum)", /checksum mismatch/, flip(() => ENTRY + 32)],
  ["the entry header's key flipped", /another key/, flip(() => 20)],
  ["the block's checksum flipped", /checksum mismatch/, flip(() => ENTRY + 56)],
  ["replaced by another model's block under a valid entry header", /another model/, async (f, key) => writeFile(f, encodeEntry(key, await (await other.computeBlock(r.tokens)).serialize("int8")))],
  ["replaced by another model's block, raw", /bad magic/, async (f) => writeFile(f, await (await other.computeBlock(r.tokens)).serialize("int8"))],
  ["replaced by this model's block for other tokens, under a valid entry header", /tokens differ/, async (f, key) => writeFile(f, encodeEntry(key, await (await model.computeBlock(tokensFrom(12, 24))).serialize("int8")))],
  ["replaced by this model's block at another position, under a valid entry header", /starts at position/, async (f, key) => writeFile(f, encodeEntry(key, await (await model.computeBlock(r.tokens, { startPos: 5 })).serialize("int8")))],
];

describe("corrupt L3 entries", () => {
  test.each(damages)("%s: dropped, recomputed, generation identical to a fresh block", async (_, reason, damage) => {
    const dir = tempDir();
    const first = await TieredKVCache.open({ model, dir, budgets });
    const { key } = await first.get(r);
    await first.close();
    const file = join(dir, userHash(r.userId), `${key}.kvb`);
    expect(existsSync(file)).toBe(true);
    await damage(file, key);

    const counting = new CountingModel(model);
    const cache = await TieredKVCache.open({ model: counting, dir, budgets });
    const hit = await cache.get(r);
    expect(hit.tier).toBe("L4");
    expect(counting.computes).toBe(1);
    const s = cache.stats();
    expect(s.corruptDropped).toBe(1);
    expect(s.lastError).toMatch(reason); // caught by the check meant for this damage
    expect(s.L3.misses).toBe(1);
    expect(await generate(hit.block)).toEqual(freshTokens);
    // The recomputed block is written back: a later session reads it from L3 again.
    await cache.close();
    const again = await TieredKVCache.open({ model, dir, budgets });
    const back = await again.get(r);
    expect(back.tier).toBe("L3");
    expect(again.stats().corruptDropped).toBe(0);
    await again.close();
  });

  test("damage while the cache is running (nothing in L1/L2): dropped on the next read", async () => {
    const dir = tempDir();
    const cache = await TieredKVCache.open({ model, dir, budgets: { l1Bytes: 0, l2Bytes: 0, l3Bytes: 1 << 20 } });
    const { key } = await cache.get(r);
    await cache.flush();
    expect((await cache.get(r)).tier).toBe("L3");
    const file = join(dir, userHash(r.userId), `${key}.kvb`);
    await flip((n) => n - 7)(file, key);
    const hit = await cache.get(r);
    expect(hit.tier).toBe("L4");
    expect(cache.stats().corruptDropped).toBe(1);
    expect(cache.stats().lastError).toMatch(/checksum/);
    expect(await generate(hit.block)).toEqual(freshTokens);
    await cache.flush();
    expect((await cache.get(r)).tier).toBe("L3");
    await cache.close();
  });

  test("a file deleted behind the cache's back is a plain miss, not corruption", async () => {
    const dir = tempDir();
    const cache = await TieredKVCache.open({ model, dir, budgets: { l1Bytes: 0, l2Bytes: 0, l3Bytes: 1 << 20 } });
    const { key } = await cache.get(r);
    await cache.flush();
    const { unlink } = await import("node:fs/promises");
    await unlink(join(dir, userHash(r.userId), `${key}.kvb`));
    expect((await cache.get(r)).tier).toBe("L4");
    expect(cache.stats().corruptDropped).toBe(0);
    await cache.close();
  });
});
