// The tiered K/V cache: where blocks go (demotion L1 → L2 → L3 by frequency × recency), where they
// come back from (promotion on hit), L3 persistence across restarts, isolation between users and
// models, single flight, invalidation. Blocks of 8 tokens on the tiny model cost 4096 B in L1,
// 2144 B in L2 (f16) and 1568 B in L3 (int8 file).
import { spawn } from "node:child_process";
import { once } from "node:events";
import { existsSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { Model } from "../src/engine/model.js";
import { packageRoot } from "../src/engine/native.js";
import { DkiArgumentError } from "../src/errors.js";
import { ENTRY_HEADER_BYTES, FolderLockedError, TieredKVCache, userHash, type BlockRequest } from "../src/cache/index.js";
import { L3Files } from "../src/cache/tiers/l3-files.js";
import { Usage } from "../src/cache/usage.js";
import { CountingModel, diskUsage, tinyModel, tokensFrom } from "./support/cache.js";
import { maxAbsDiff, tempDir } from "./support/paths.js";

let model: Model;
let other: Model;
const L1_BLOCK = 4096;
const L2_BLOCK = 2144;
const L3_FILE = 1568;
const req = (i: number, userId = "alice", n = 8): BlockRequest => ({ userId, tokens: tokensFrom(i, n) });
const big = { l1Bytes: 1 << 20, l2Bytes: 1 << 20, l3Bytes: 1 << 22 };

beforeAll(async () => {
  model = await tinyModel(1);
  other = await tinyModel(2); // same shape, other weights: another fingerprint
});
afterAll(() => {
  model.dispose();
  other.dispose();
});

describe("sizes", () => {
  test("per-tier costs of an 8-token block are as the header comment says", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: big });
    const { block, key } = await cache.get(req(0));
    await cache.flush();
    expect(block.byteSize).toBe(L1_BLOCK);
    expect((await block.serialize("f16")).length).toBe(L2_BLOCK);
    expect(cache.stats().L3.bytes).toBe(L3_FILE);
    expect(cache.locate(key)).toEqual(["L1", "L3"]);
    await cache.close();
  });
});

describe("demotion and promotion", () => {
  test("L1 → L2 → L3 on pressure, oldest first; hits promote to L1 and leave L2", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: { l1Bytes: 2 * L1_BLOCK, l2Bytes: 2 * L2_BLOCK, l3Bytes: 1 << 20 } });
    const [A, B, C, D, E] = [0, 1, 2, 3, 4].map((i) => cache.keyOf(req(i)));
    for (const i of [0, 1, 2]) expect((await cache.get(req(i))).tier).toBe("L4");
    await cache.flush();
    expect(cache.locate(A)).toEqual(["L2", "L3"]); // the oldest left L1 first
    expect(cache.locate(B)).toEqual(["L1", "L3"]);
    expect(cache.locate(C)).toEqual(["L1", "L3"]);
    await cache.get(req(3));
    await cache.get(req(4));
    await cache.flush();
    // L1 {D, E}; L2 took B then C and pushed A out; A survives in L3 only.
    expect(cache.locate(A)).toEqual(["L3"]);
    expect(cache.locate(B)).toEqual(["L2", "L3"]);
    expect(cache.locate(C)).toEqual(["L2", "L3"]);
    expect(cache.locate(D)).toEqual(["L1", "L3"]);
    expect(cache.locate(E)).toEqual(["L1", "L3"]);

    expect((await cache.get(req(0))).tier).toBe("L3"); // promoted to L1, pushing D down, B out of L2
    await cache.flush();
    expect(cache.locate(A)).toEqual(["L1", "L3"]);
    expect(cache.locate(D)).toEqual(["L2", "L3"]);
    expect(cache.locate(B)).toEqual(["L3"]);
    expect((await cache.get(req(2))).tier).toBe("L2");
    await cache.flush();
    expect(cache.locate(C)).toEqual(["L1", "L3"]); // promoted out of L2: L1 and L2 never both hold a key
    expect((await cache.get(req(2))).tier).toBe("L1");

    const s = cache.stats();
    expect([s.L1.hits, s.L2.hits, s.L3.hits, s.L4.hits]).toEqual([1, 1, 1, 5]);
    expect(s.L1.bytes).toBeLessThanOrEqual(2 * L1_BLOCK);
    expect(s.L2.bytes).toBeLessThanOrEqual(2 * L2_BLOCK);
    expect(s.L3.entries).toBe(5);
    for (const t of ["L2", "L3", "L4"] as const) expect(s[t].meanLoadMs).toBeGreaterThan(0);
    await cache.close();
  });

  test("frequency × recency: a long half-life keeps the often-used entry, a short one the recent entry", async () => {
    for (const [halfLife, survivor, victim] of [[1e6, 0, 1], [0.25, 1, 0]] as const) {
      const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: { l1Bytes: 2 * L1_BLOCK, l2Bytes: 1 << 20, l3Bytes: 1 << 20 }, recencyHalfLife: halfLife });
      await cache.get(req(0)); // X: used three times
      await cache.get(req(0));
      await cache.get(req(0));
      await cache.get(req(1)); // Y: used once, more recently
      await cache.get(req(2)); // needs room for one
      await cache.flush();
      expect(cache.locate(cache.keyOf(req(survivor)))[0], `half-life ${halfLife}`).toBe("L1");
      expect(cache.locate(cache.keyOf(req(victim)))[0], `half-life ${halfLife}`).toBe("L2");
      await cache.close();
    }
  });

  test("a block larger than a tier skips it", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: { l1Bytes: L1_BLOCK - 1, l2Bytes: L2_BLOCK, l3Bytes: 1 << 20 } });
    const { key, tier } = await cache.get(req(0));
    expect(tier).toBe("L4");
    await cache.flush();
    expect(cache.locate(key)).toEqual(["L2", "L3"]);
    expect((await cache.get(req(0))).tier).toBe("L2");
    await cache.flush();
    expect(cache.stats().L1.bytes).toBe(0);
    await cache.close();
  });
});

describe("persistence", () => {
  test("L3 survives close and reopen with a new cache object; the restored block matches", async () => {
    const dir = tempDir();
    const r: BlockRequest = { userId: "alice", tokens: tokensFrom(7, 12), startPos: -12, prefix: [1, 2, 3] };
    const first = await TieredKVCache.open({ model, dir, budgets: big });
    const fresh = (await first.get(r)).block;
    await first.close();

    const second = await TieredKVCache.open({ model, dir, budgets: big });
    expect(second.stats().L3.entries).toBe(1);
    const hit = await second.get(r);
    expect(hit.tier).toBe("L3");
    expect(hit.block.tokens).toEqual(r.tokens);
    expect(hit.block.startPos).toBe(-12);
    const maxK = Math.max(...Array.from(fresh.keys(), Math.abs));
    expect(maxAbsDiff(hit.block.keys(), fresh.keys()) / maxK).toBeLessThanOrEqual(1 / 127);
    expect((await second.get(r)).tier).toBe("L1");
    // The prefix is part of the identity: without it the entry is not found.
    expect((await second.get({ ...r, prefix: [] })).tier).toBe("L4");
    await second.close();
  });

  test("one cache per folder: a second open in this process is refused while the first is open, under any spelling of the folder; the lock file stays at close", async () => {
    const dir = tempDir();
    const lockFile = join(dir, ".lock");
    const first = await TieredKVCache.open({ model, dir, budgets: big });
    await expect(TieredKVCache.open({ model, dir, budgets: big })).rejects.toThrow(/already open in this process: close\(\) that cache first/);
    // Through a symlink the path differs, and the kernel's lock refuses it (each open holds its own).
    const alias = join(tempDir(), "alias");
    symlinkSync(dir, alias);
    const err = await TieredKVCache.open({ model, dir: alias, budgets: big }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FolderLockedError);
    expect((err as Error).message).toMatch(/already open: its lock file .* names this process \(\d+\); close\(\) that cache first/);
    await first.close();
    expect(readFileSync(lockFile, "utf8")).toBe(`${process.pid}\n`);
    const again = await TieredKVCache.open({ model, dir: alias, budgets: big });
    await again.close();
    expect(existsSync(lockFile)).toBe(true);
  });

  test("one cache per folder: a lock held by another process refuses open() naming it; once that process is killed (no cleanup), open() succeeds at once", async () => {
    const dir = tempDir();
    const lockFile = join(dir, ".lock");
    const addon = join(packageRoot(), "build", "Release", "dki_native.node");
    const code = `require(${JSON.stringify(addon)}).lockFile(${JSON.stringify(lockFile)}); console.log("locked"); setInterval(() => {}, 60000);`;
    const child = spawn(process.execPath, ["-e", code], { stdio: ["ignore", "pipe", "pipe"] });
    const exited = once(child, "exit");
    try {
      let stderr = "";
      child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
      await new Promise<void>((resolve, reject) => {
        child.stdout.on("data", (d: Buffer) => d.toString().includes("locked") && resolve());
        child.on("exit", (status) => reject(new Error(`the lock holder exited (${status}) before locking: ${stderr}`)));
      });
      const err = await TieredKVCache.open({ model, dir, budgets: big }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(FolderLockedError);
      expect((err as Error).message).toMatch(new RegExp(`is in use by another open cache: its lock file .* names process ${child.pid}$`));
    } finally {
      child.kill("SIGKILL");
    }
    expect((await exited)[1]).toBe("SIGKILL");
    // The file still names the dead holder; the kernel let go of its lock with the process.
    expect(readFileSync(lockFile, "utf8")).toBe(`${child.pid}\n`);
    const cache = await TieredKVCache.open({ model, dir, budgets: big });
    expect(readFileSync(lockFile, "utf8")).toBe(`${process.pid}\n`);
    await cache.close();
  });

  test("one cache per folder: a lock file left by a crash whose pid now belongs to an unrelated live process does not hold the folder", async () => {
    const dir = tempDir();
    writeFileSync(join(dir, ".lock"), `${process.ppid}\n`); // alive, and not a cache
    const cache = await TieredKVCache.open({ model, dir, budgets: big });
    await cache.close();
  });

  test("writeBehind: false puts the file in place before put() resolves; leftovers of crashed writes are removed on open", async () => {
    const dir = tempDir();
    const cache = await TieredKVCache.open({ model, dir, budgets: big, writeBehind: false });
    const r = req(3);
    await cache.put(r, await model.computeBlock(r.tokens));
    expect(diskUsage(dir).entries).toHaveLength(1);
    await cache.close();
    const stray = join(dir, userHash("alice"), ".deadbeef.1.0.tmp");
    const { writeFile } = await import("node:fs/promises");
    await writeFile(stray, "partial");
    const again = await TieredKVCache.open({ model, dir, budgets: big });
    expect(existsSync(stray)).toBe(false);
    expect(again.stats().L3.bytes).toBe(L3_FILE);
    await again.close();
  });

  test("the next session ranks L3 entries as this one did: an entry used often from L1 outlives one used once", async () => {
    const dir = tempDir();
    const cache = await TieredKVCache.open({ model, dir, budgets: big });
    const hot = await cache.get(req(0));
    for (let i = 0; i < 20; i++) (await cache.get(req(0))).release(); // L1 hits: its file is never read
    const cold = await cache.get(req(1)); // used once, but last
    hot.release();
    cold.release();
    await cache.close();
    const small = await TieredKVCache.open({ model, dir, budgets: { ...big, l3Bytes: L3_FILE } });
    expect(small.locate(hot.key)).toEqual(["L3"]);
    expect(small.locate(cold.key)).toEqual([]);
    await small.close();
  });

  test("reopening with a smaller L3 budget trims to it", async () => {
    const dir = tempDir();
    const cache = await TieredKVCache.open({ model, dir, budgets: big });
    for (let i = 0; i < 5; i++) await cache.get(req(i));
    await cache.close();
    const small = await TieredKVCache.open({ model, dir, budgets: { ...big, l3Bytes: 2 * L3_FILE } });
    expect(small.stats().L3.entries).toBe(2);
    expect(diskUsage(dir).bytes).toBeLessThanOrEqual(2 * L3_FILE);
    await small.close();
  });
});

describe("isolation", () => {
  test("another user never hits an entry of this user; clear(user) removes only theirs, from every tier", async () => {
    const dir = tempDir();
    const counting = new CountingModel(model);
    const cache = await TieredKVCache.open({ model: counting, dir, budgets: big });
    const a = await cache.get(req(0, "alice"));
    const b = await cache.get(req(0, "bob"));
    expect(b.tier).toBe("L4");
    expect(b.key).not.toBe(a.key);
    expect(counting.computes).toBe(2);
    expect((await cache.get(req(0, "alice"))).tier).toBe("L1");
    await cache.flush();
    await cache.clear("alice");
    expect(cache.locate(a.key)).toEqual([]);
    expect(cache.locate(b.key)).toEqual(["L1", "L3"]);
    expect(existsSync(join(dir, userHash("alice"), `${a.key}.kvb`))).toBe(false);
    expect(existsSync(join(dir, userHash("bob"), `${b.key}.kvb`))).toBe(true);
    await cache.close();
    // After a restart too: clear finds a user's files by their folder.
    const again = await TieredKVCache.open({ model, dir, budgets: big });
    await again.clear("bob");
    expect(diskUsage(dir).entries).toHaveLength(0);
    await again.close();
  });

  test("another model never hits an entry of this model, also through a shared folder", async () => {
    const dir = tempDir();
    const mine = await TieredKVCache.open({ model, dir, budgets: big });
    const a = await mine.get(req(0));
    await mine.close();
    const theirs = await TieredKVCache.open({ model: other, dir, budgets: big });
    const b = await theirs.get(req(0));
    expect(b.tier).toBe("L4");
    expect(b.key).not.toBe(a.key);
    expect(b.block.fingerprint).toBe(other.info.fingerprint);
    await theirs.close();
    const back = await TieredKVCache.open({ model, dir, budgets: big });
    const hit = await back.get(req(0));
    expect(hit.tier).toBe("L3");
    expect(hit.block.fingerprint).toBe(model.info.fingerprint);
    await back.close();
  });

  test("put() refuses a block that is not the one the request describes", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: big });
    const r = req(0);
    await expect(cache.put(r, await model.computeBlock(tokensFrom(1, 8)))).rejects.toThrow(/tokens differ/);
    await expect(cache.put(r, await model.computeBlock(r.tokens, { startPos: 4 }))).rejects.toThrow(/position/);
    await expect(cache.put(r, await other.computeBlock(r.tokens))).rejects.toThrow(/another model/);
    expect(cache.stats().L1.entries).toBe(0);
    await cache.close();
  });
});

describe("single flight", () => {
  test("concurrent gets of one key compute once; of different keys, once each", async () => {
    const counting = new CountingModel(model);
    const cache = await TieredKVCache.open({ model: counting, dir: tempDir(), budgets: big });
    const hits = await Promise.all(Array.from({ length: 8 }, () => cache.get(req(0))));
    expect(counting.computes).toBe(1);
    for (const h of hits) expect(h.block).toBe(hits[0].block);
    expect(cache.stats().singleFlightJoins).toBe(7);
    await Promise.all([1, 2, 3, 1, 2, 3].map((i) => cache.get(req(i))));
    expect(counting.computes).toBe(4);
    await cache.close();
  });

  test("concurrent gets of one L3 entry read it once", async () => {
    const dir = tempDir();
    const first = await TieredKVCache.open({ model, dir, budgets: big });
    await first.get(req(0));
    await first.close();
    const counting = new CountingModel(model);
    const cache = await TieredKVCache.open({ model: counting, dir, budgets: big });
    const hits = await Promise.all(Array.from({ length: 5 }, () => cache.get(req(0))));
    expect(hits.map((h) => h.tier)).toEqual(Array(5).fill("L3"));
    expect(cache.stats().L3.hits).toBe(1);
    expect(counting.computes).toBe(0);
    await cache.close();
  });
});

describe("a burst of gets", () => {
  test("at most maxConcurrentLoads load at once, and each get resolves with the blocks leaving L1 within its budget", async () => {
    for (const maxConcurrentLoads of [undefined, 1, 3]) {
      const counting = new CountingModel(model);
      const l1Bytes = 2 * L1_BLOCK;
      const cache = await TieredKVCache.open({ model: counting, dir: tempDir(), budgets: { l1Bytes, l2Bytes: L2_BLOCK, l3Bytes: 1 << 20 }, maxConcurrentLoads });
      const leavingAtResolve: number[] = [];
      await Promise.all(Array.from({ length: 16 }, (_, i) => cache.get(req(100 + i)).then(() => leavingAtResolve.push(cache.stats().L1.leavingBytes))));
      expect(counting.computes).toBe(16);
      expect(counting.mostRunning).toBe(maxConcurrentLoads ?? 2);
      expect(Math.max(...leavingAtResolve)).toBeLessThanOrEqual(l1Bytes);
      await cache.close();
    }
    await expect(TieredKVCache.open({ model, dir: tempDir(), budgets: big, maxConcurrentLoads: 0 })).rejects.toThrow(/maxConcurrentLoads must be a positive integer, got 0/);
  });
});

describe("failed L3 writes", () => {
  test("are counted and say why in lastError; the entry is simply not in L3", async () => {
    const dir = tempDir();
    const cache = await TieredKVCache.open({ model, dir, budgets: big });
    writeFileSync(join(dir, userHash("alice")), "not a folder"); // where alice's L3 folder would go
    const hit = await cache.get(req(8));
    await cache.flush();
    const s = cache.stats();
    expect(s.backgroundErrors).toBe(1);
    expect(s.lastError).toMatch(/^L3 write of [0-9a-f]+: EEXIST/);
    expect(s.L3.entries).toBe(0);
    expect(cache.locate(hit.key)).toEqual(["L1"]);
    await cache.close();
  });
});

describe("blocks L3 cannot take", () => {
  test("a block larger than the L3 budget is counted as skipped once, not again as it moves down; nothing is counted with L3 off", async () => {
    const small = await TieredKVCache.open({ model, dir: tempDir(), budgets: { ...big, l3Bytes: L3_FILE - 1 } });
    const hit = await small.get(req(9));
    await small.flush();
    expect(small.stats().l3Skipped).toEqual({ tooLarge: 1, noRoom: 0 });
    expect(small.locate(hit.key)).toEqual(["L1"]);
    await small.close();
    // L1 holds one block and L2 none: six gets compute six blocks, each of which also tries L3
    // again as it leaves L1; each block counts once.
    const bouncing = await TieredKVCache.open({ model, dir: tempDir(), budgets: { l1Bytes: L1_BLOCK, l2Bytes: 0, l3Bytes: L3_FILE - 1 } });
    for (const i of [10, 11, 12, 10, 11, 12]) (await bouncing.get(req(i))).release();
    await bouncing.flush();
    expect(bouncing.stats().L4.hits).toBe(6);
    expect(bouncing.stats().l3Skipped).toEqual({ tooLarge: 6, noRoom: 0 });
    await bouncing.close();
    const off = await TieredKVCache.open({ model, dir: tempDir(), budgets: { ...big, l3Bytes: 0 } });
    await off.get(req(9));
    await off.flush();
    expect(off.stats().l3Skipped).toEqual({ tooLarge: 0, noRoom: 0 });
    await off.close();
  });

  test("L3 answers no-room while writes in progress hold its budget (nothing to evict), and the other write lands", async () => {
    const l3 = await L3Files.open(tempDir(), Math.floor(1.5 * L3_FILE), 64);
    const bytes = Buffer.alloc(L3_FILE - ENTRY_HEADER_BYTES, 1);
    const usage = () => new Usage(64, 0, 1);
    const [a, b] = await Promise.all([l3.write("a".repeat(64), userHash("alice"), usage(), bytes), l3.write("b".repeat(64), userHash("alice"), usage(), bytes)]);
    expect([a, b]).toEqual(["written", "no-room"]);
    expect(l3.size).toBe(1);
  });
});

describe("blocks f16 cannot hold", () => {
  test("a block with values beyond f16's range skips an f16 L2 (noted, not stored as inf) and is served from L3; a bf16 L2 keeps it", async () => {
    for (const l2Storage of ["f16", "bf16"] as const) {
      const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: { ...big, l1Bytes: L1_BLOCK }, l2Storage });
      const r = req(30);
      // A stand-in for a model with outlier values: the same tokens' block with values up to 1e5.
      const plain = await model.computeBlock(r.tokens);
      const maxV = Math.max(...Array.from(plain.values(), Math.abs));
      const key = await cache.put(r, await plain.scaleValues(1e5 / maxV));
      plain.dispose();
      (await cache.get(req(31))).release(); // pushes it out of L1
      await cache.flush();
      if (l2Storage === "f16") {
        expect(cache.stats().backgroundErrors).toBe(1);
        expect(cache.stats().lastError).toMatch(/beyond f16's range/);
        expect(cache.locate(key)).toEqual(["L3"]);
      } else {
        expect(cache.stats().backgroundErrors).toBe(0);
        expect(cache.locate(key)).toEqual(["L2", "L3"]);
      }
      const hit = await cache.get(r);
      expect(hit.tier).toBe(l2Storage === "f16" ? "L3" : "L2");
      const values = Array.from(hit.block.values());
      expect(values.every(Number.isFinite)).toBe(true);
      expect(Math.max(...values.map(Math.abs))).toBeGreaterThan(9e4);
      await cache.close();
    }
  });
});

describe("invalidate and arguments", () => {
  test("invalidate removes a key from every tier, its file included, even while its write is pending", async () => {
    const dir = tempDir();
    const cache = await TieredKVCache.open({ model, dir, budgets: big });
    const { key } = await cache.get(req(0));
    await cache.invalidate(key); // the write-behind may still be running
    await cache.flush();
    expect(cache.locate(key)).toEqual([]);
    expect(diskUsage(dir).files).toBe(0);
    expect(cache.stats().L3.bytes).toBe(0);
    expect((await cache.get(req(0))).tier).toBe("L4");
    await cache.close();
  });

  test("bad arguments get clear errors", async () => {
    await expect(TieredKVCache.open({ model, dir: tempDir(), budgets: { ...big, l2Bytes: -1 } })).rejects.toThrow(/budgets.l2Bytes/);
    await expect(TieredKVCache.open({ model, dir: tempDir(), budgets: big, l1OnDevice: true })).rejects.toThrow(/l1OnDevice needs a model loaded with device "cuda"/);
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: big });
    await expect(cache.get({ userId: "", tokens: [1] })).rejects.toThrow(DkiArgumentError);
    await expect(cache.get({ userId: "u", tokens: [] })).rejects.toThrow(/tokens is empty/);
    await expect(cache.get({ userId: "u", tokens: [1.5] })).rejects.toThrow(/not a token id/);
    await expect(cache.get({ userId: "u", tokens: [1], startPos: 0.5 })).rejects.toThrow(/startPos/);
    await expect(cache.invalidate("../../etc/passwd")).rejects.toThrow(/not a cache key/);
    // Out of the vocabulary: the model refuses, the cache stores nothing.
    await expect(cache.get({ userId: "u", tokens: [1e9] })).rejects.toThrow(/outside the vocabulary/);
    expect(cache.stats().L4.misses).toBe(1);
    await cache.close();
    await expect(cache.get(req(0))).rejects.toThrow(/closed/);
  });
});

describe("release", () => {
  const disposed = (b: { keys(): Float32Array }) => {
    try {
      b.keys();
      return false;
    } catch (e) {
      return /disposed/.test((e as Error).message);
    }
  };

  test("a released block the cache made is freed once it has left L1; an unreleased one stays usable", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: { l1Bytes: 0, l2Bytes: 1 << 20, l3Bytes: 1 << 20 } });
    const kept = await cache.get(req(0)); // computed, then straight down to L2 (L1 holds nothing)
    const freed = await cache.get(req(1));
    await cache.flush();
    expect(disposed(kept.block)).toBe(false);
    freed.release();
    expect(disposed(freed.block)).toBe(true);
    expect(disposed(kept.block)).toBe(false); // never released: left to the garbage collector
    // The L2 copy is intact: the next get restores the same values.
    const again = await cache.get(req(1));
    expect(again.tier).toBe("L2");
    const fresh = await model.computeBlock(req(1).tokens);
    expect(maxAbsDiff(again.block.keys(), fresh.keys())).toBeLessThan(1e-2); // L2 holds f16
    fresh.dispose();
    again.release();
    await cache.close();
  });

  test("a block in L1 outlives its releases; two callers hold it until both release; release is once per hit", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: big });
    const a = await cache.get(req(2));
    const b = await cache.get(req(2));
    expect(b.tier).toBe("L1");
    expect(b.block).toBe(a.block);
    a.release();
    a.release(); // a second release of the same hit must not count as b's
    b.release();
    expect(disposed(a.block)).toBe(false); // still L1's
    const c = await cache.get(req(2));
    await cache.invalidate(a.key); // leaves L1 with c still holding it
    expect(disposed(c.block)).toBe(false);
    c.release();
    await cache.flush(); // the write-behind to L3 may still be reading it; freed when it is done
    expect(disposed(c.block)).toBe(true);
    await cache.close();
  });

  test("a block the cache made and a caller put() under a second key lives while that key holds it", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: big });
    const alice = await cache.get(req(4, "alice"));
    alice.release();
    await cache.put(req(4, "bob"), alice.block); // the same memory for another user
    await cache.flush(); // no write-behind holds it any more
    await cache.invalidate(alice.key);
    const bob = await cache.get(req(4, "bob"));
    expect(bob.tier).toBe("L1");
    expect(disposed(bob.block)).toBe(false);
    expect((await model.generate({ tokens: [5, 6] }, { maxNewTokens: 2, segments: [{ kv: bob.block }] })).tokens).toHaveLength(2);
    bob.release();
    await cache.close();
  });

  test("put() refuses a disposed block; one disposed after put() (against the contract) is dropped when evicted, and the get that evicted it still succeeds", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: { l1Bytes: L1_BLOCK, l2Bytes: 1 << 20, l3Bytes: 1 << 20 } });
    const gone = await model.computeBlock(req(5).tokens);
    gone.dispose();
    await expect(cache.put(req(5), gone)).rejects.toThrow(/put\(\): the block has been disposed/);
    const mine = await model.computeBlock(req(6).tokens);
    await cache.put(req(6), mine);
    await cache.flush();
    mine.dispose();
    const hit = await cache.get(req(7)); // evicts req(6)'s dead block from L1
    expect(hit.tier).toBe("L4");
    expect(disposed(hit.block)).toBe(false);
    await cache.flush();
    expect(cache.stats().lastError).toMatch(/disposed/);
    expect((await cache.get(req(6))).tier).toBe("L3"); // its write-behind had finished
    await cache.close();
  });

  test("put() waits while the blocks on their way down from L1 take more than L1's budget", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: { l1Bytes: 2 * L1_BLOCK, l2Bytes: 1 << 20, l3Bytes: 1 << 20 } });
    const blocks = [];
    for (let i = 10; i < 22; i++) {
      const b = await model.computeBlock(req(i).tokens);
      blocks.push(b);
      await cache.put(req(i), b);
      const s = cache.stats().L1;
      expect(s.bytes).toBeLessThanOrEqual(s.budgetBytes);
      expect(s.leavingBytes).toBeLessThanOrEqual(s.budgetBytes);
    }
    await cache.close();
    for (const b of blocks) b.dispose();
  });

  test("blocks given to put() are never freed by the cache", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: big });
    const mine = await model.computeBlock(req(3).tokens);
    await cache.put(req(3), mine);
    const hit = await cache.get(req(3));
    expect(hit.block).toBe(mine);
    hit.release();
    await cache.invalidate(hit.key);
    expect(disposed(mine)).toBe(false);
    mine.dispose();
    await cache.close();
  });
});
