// Property test: under seeded random workloads of get / put / invalidate / clear / flush / reopen,
// some of them concurrent, no tier's bytes ever exceed its budget (checked after every operation,
// and on disk for L3), the disk holds exactly what L3 accounts for once idle, and every block the
// cache hands out is the one requested (tokens, position, model, and K/V within int8 error).
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { Model } from "../src/engine/model.js";
import type { KVBlock } from "../src/kv/kv-block.js";
import { TieredKVCache, type BlockRequest, type CacheBudgets } from "../src/cache/index.js";
import { diskUsage, prng, tinyModel, tokensFrom } from "./support/cache.js";
import { maxAbsDiff, tempDir } from "./support/paths.js";

let model: Model;
const reference = new Map<string, KVBlock>();

beforeAll(async () => {
  model = await tinyModel(1);
});
afterAll(() => model.dispose());

/** 18 distinct requests: 3 users × 6 memories of 3..30 tokens, some with a position or a prefix. */
function requests(rand: () => number): BlockRequest[] {
  const out: BlockRequest[] = [];
  for (const userId of ["u1", "u2", "u3"]) {
    for (let m = 0; m < 6; m++) {
      const n = 3 + Math.floor(rand() * 28);
      const r: BlockRequest = { userId, tokens: tokensFrom(m * 31 + n, n) };
      if (rand() < 0.3) r.startPos = -n;
      if (rand() < 0.3) r.prefix = [1, 2];
      out.push(r);
    }
  }
  return out;
}

async function freshBlock(r: BlockRequest): Promise<KVBlock> {
  const id = JSON.stringify([r.tokens, r.startPos ?? 0, r.prefix ?? []]);
  let b = reference.get(id);
  if (!b) {
    b = await model.computeBlock(r.tokens, { startPos: r.startPos, prefix: r.prefix });
    reference.set(id, b);
  }
  return b;
}

async function checkBlock(r: BlockRequest, b: KVBlock): Promise<void> {
  expect(b.tokens).toEqual(r.tokens);
  expect(b.startPos).toBe(r.startPos ?? 0);
  expect(b.fingerprint).toBe(model.info.fingerprint);
  const f = await freshBlock(r);
  const maxK = Math.max(...Array.from(f.keys(), Math.abs));
  const maxV = Math.max(...Array.from(f.values(), Math.abs));
  // The lossiest path is L2 bf16 (relative rounding ≤ 2^-8) and then L3 int8 (half a step of a
  // per-channel / per-token scale, ≤ 1/254 of the largest magnitude): together under 1%.
  expect(maxAbsDiff(b.keys(), f.keys()) / maxK).toBeLessThanOrEqual(0.01);
  expect(maxAbsDiff(b.values(), f.values()) / maxV).toBeLessThanOrEqual(0.01);
}

async function run(seed: number, ops: number, budgets: CacheBudgets): Promise<void> {
  const rand = prng(seed);
  const reqs = requests(rand);
  const dir = tempDir("dki-cache-prop-");
  const opts = { model, dir, budgets, recencyHalfLife: 1 + rand() * 32, l2Storage: rand() < 0.5 ? ("f16" as const) : ("bf16" as const) };
  let cache = await TieredKVCache.open(opts);
  const pick = () => reqs[Math.floor(rand() * reqs.length)];
  const checkBudgets = (where: string) => {
    const s = cache.stats();
    const disk = diskUsage(dir).bytes; // synchronous: the same moment as the stats
    expect(s.L1.bytes, where).toBeLessThanOrEqual(budgets.l1Bytes);
    expect(s.L2.bytes, where).toBeLessThanOrEqual(budgets.l2Bytes);
    expect(s.L3.bytes, where).toBeLessThanOrEqual(budgets.l3Bytes);
    // On disk, with writes and deletions possibly in flight: never more than L3 accounts for.
    expect(disk, where).toBeLessThanOrEqual(s.L3.bytes);
  };
  const one = async (): Promise<void> => {
    const x = rand();
    const r = pick();
    if (x < 0.6) {
      const hit = await cache.get(r);
      await checkBlock(r, hit.block);
    } else if (x < 0.75) {
      await cache.put(r, await model.computeBlock(r.tokens, { startPos: r.startPos, prefix: r.prefix }));
    } else if (x < 0.88) {
      await cache.invalidate(cache.keyOf(r));
    } else if (x < 0.92) {
      await cache.clear(r.userId);
    } else {
      await cache.flush();
    }
  };
  for (let i = 0; i < ops; i++) {
    const where = `seed ${seed}, op ${i}`;
    const y = rand();
    if (y < 0.2) {
      // A burst of concurrent operations, budgets checked as each one settles.
      const n = 2 + Math.floor(rand() * 4);
      await Promise.all(Array.from({ length: n }, () => one().then(() => checkBudgets(where))));
    } else if (y < 0.23) {
      await cache.close();
      await checkIdle(cache, dir, where);
      cache = await TieredKVCache.open(opts);
    } else {
      await one();
    }
    await checkBudgets(where);
  }
  await cache.flush();
  await checkIdle(cache, dir, `seed ${seed}, end`);
  const s = cache.stats();
  expect(s.backgroundErrors, s.lastError).toBe(0);
  expect(s.corruptDropped).toBe(0);
  await cache.close();
}

/** Once nothing is in flight, the files on disk are exactly the L3 entries and bytes accounted for. */
async function checkIdle(cache: TieredKVCache, dir: string, where: string): Promise<void> {
  const s = cache.stats();
  const d = diskUsage(dir);
  expect(d.bytes, where).toBe(s.L3.bytes);
  expect(d.entries.length, where).toBe(s.L3.entries);
  expect(d.files, where).toBe(d.entries.length); // no temporaries left behind
}

describe("budgets under random workloads", () => {
  // Blocks are 3..30 tokens: 1.5–15 KiB in L1, 0.8–7.9 KiB in L2, 0.8–4.9 KiB in L3.
  test.each([
    [1, { l1Bytes: 24_000, l2Bytes: 12_000, l3Bytes: 20_000 }],
    [2, { l1Bytes: 8_000, l2Bytes: 30_000, l3Bytes: 9_000 }],
    [3, { l1Bytes: 60_000, l2Bytes: 0, l3Bytes: 40_000 }],
    [4, { l1Bytes: 0, l2Bytes: 5_000, l3Bytes: 6_000 }],
  ])("seed %i, budgets %o", async (seed, budgets) => {
    await run(seed, 250, budgets);
  });

  test("tiers all see traffic in a mixed workload", async () => {
    const dir = tempDir("dki-cache-prop-");
    const cache = await TieredKVCache.open({ model, dir, budgets: { l1Bytes: 24_000, l2Bytes: 12_000, l3Bytes: 1 << 20 } });
    const rand = prng(99);
    const reqs = requests(rand);
    for (let i = 0; i < 120; i++) {
      await cache.get(reqs[Math.floor(rand() * reqs.length)]);
      if (i % 10 === 0) await cache.flush();
    }
    const s = cache.stats();
    for (const t of ["L1", "L2", "L3", "L4"] as const) expect(s[t].hits, t).toBeGreaterThan(0);
    await cache.close();
  });
});
