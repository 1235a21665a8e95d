// User isolation, as a property test: 200 users, random memories and preferences (the same texts
// under several users included) and a random mix of operations, checked after every step against a model of who
// owns what. No operation of one user ever returns or touches another's records; erasing a user
// removes everything of it (store, index files, K/V cache tiers) and changes nothing of the others.
import { readdirSync } from "node:fs";
import { basename, join } from "node:path";
import { afterAll, beforeAll, expect, test } from "vitest";
import { TieredKVCache } from "../src/cache/tiered-cache.js";
import type { Model } from "../src/engine/model.js";
import { MemoryNotFoundError } from "../src/memory/errors.js";
import { erasedUserId, MemoryStore } from "../src/memory/memory-store.js";
import { scopeFileBase } from "../src/memory/retrieval/scoped-index.js";
import type { Memory } from "../src/memory/types.js";
import { tinyModel, tokensFrom } from "./support/cache.js";
import { tempDir } from "./support/paths.js";
import { prng } from "./support/prng.js";

const SEED = 28_200;
const USERS = 200;
const STEPS = 2500;
const WORDS = "apple river mountain coffee piano garden rocket winter silver lantern tiger ocean violin desert maple harbor 北京 咖啡 音乐 花园".split(" ");

let model: Model;
beforeAll(async () => {
  model = await tinyModel(3);
});
afterAll(() => model?.dispose());

test(`no operation of one user touches another's records (${USERS} users, ${STEPS} random steps, seed ${SEED})`, async () => {
  const rand = prng(SEED);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)];
  const sentence = () => Array.from({ length: 3 + Math.floor(rand() * 5) }, () => pick(WORDS)).join(" ");
  // Texts several users hold word for word: isolation must not rest on texts being different.
  const shared = Array.from({ length: 30 }, sentence);
  const users = Array.from({ length: USERS }, (_, i) => `user-${i}`);
  const owned = new Map<string, Map<string, string>>(users.map((u) => [u, new Map()]));
  const allIds = () => [...owned.values()].flatMap((m) => [...m.keys()]);
  const ownerOf = (id: string) => users.find((u) => owned.get(u)!.has(id));
  const prefs = new Map<string, string>(); // preference id → owner

  const dir = tempDir();
  // hnswFrom 3: users with 3+ memories get HNSW indexes (with files), smaller ones are scanned, so
  // both kinds of dense index are exercised. "commit" durability: no fsync per write (speed only;
  // memory-durability.test.ts kills processes under the default).
  const options = { dir, hnswFrom: 3, durability: "commit" } as const;
  const store = await MemoryStore.open(options);
  const expectOwn = (userId: string, memories: Memory[]) => {
    for (const m of memories) {
      expect(m.userId).toBe(userId);
      expect(owned.get(userId)!.get(m.id)).toBe(m.text);
    }
  };

  for (let step = 0; step < STEPS; step++) {
    const u = pick(users);
    const mine = owned.get(u)!;
    const r = rand();
    if (r < 0.35 || mine.size === 0) {
      const texts = Array.from({ length: 1 + Math.floor(rand() * 3) }, () => (rand() < 0.5 ? pick(shared) : sentence()));
      const added = await store.memories.add(texts.length === 1 ? texts[0] : texts.map((content) => ({ role: "user" as const, content })), {
        userId: u,
        metadata: { step, userId: pick(users) }, // a metadata userId must change nothing
      });
      added.forEach((m) => mine.set(m.id, m.text));
      expectOwn(u, added);
    } else if (r < 0.6) {
      const results = await store.memories.search(rand() < 0.5 ? pick(shared) : sentence(), { userId: u, limit: 1 + Math.floor(rand() * 10) });
      expectOwn(
        u,
        results.map((x) => x.memory),
      );
    } else if (r < 0.65) {
      const all = await store.memories.getAll({ userId: u });
      expectOwn(u, all);
      expect(all.map((m) => m.id).sort()).toEqual([...mine.keys()].sort());
    } else if (r < 0.75) {
      // Preferences: add one, or touch one of this user's or anyone's.
      const prefIds = [...prefs].filter(([, owner]) => owner === u).map(([id]) => id);
      if (rand() < 0.4 || prefs.size === 0) {
        const p = await store.preferences.add(pick(shared), { userId: u, type: "style", priority: Math.floor(rand() * 5) });
        expect(p.userId).toBe(u);
        prefs.set(p.id, u);
      } else {
        const id = rand() < 0.5 && prefIds.length > 0 ? pick(prefIds) : pick([...prefs.keys()]);
        const owner = prefs.get(id)!;
        const op = pick(["update", "delete"] as const);
        const attempt = op === "update" ? store.preferences.update(id, { priority: 9 }, { userId: u }) : store.preferences.delete(id, { userId: u });
        if (owner !== u) await expect(attempt).rejects.toBeInstanceOf(MemoryNotFoundError);
        else {
          await attempt;
          if (op === "delete") prefs.delete(id);
        }
      }
      const listed = await store.preferences.list({ userId: u, includeInactive: true });
      expect(listed.map((p) => p.id).sort()).toEqual([...prefs].filter(([, owner]) => owner === u).map(([id]) => id).sort());
    } else {
      // get, update, delete or history with an id of this user or of anyone else.
      const id = rand() < 0.5 ? pick([...mine.keys()]) : pick(allIds());
      const ownerBefore = ownerOf(id)!;
      const textBefore = owned.get(ownerBefore)!.get(id);
      const op = pick(["get", "update", "delete", "history"] as const);
      if (op === "get") {
        const m = await store.memories.get(id, { userId: u });
        if (ownerBefore === u) expectOwn(u, [m!]);
        else expect(m).toBeUndefined();
      } else if (op === "history") {
        const h = await store.memories.history(id, { userId: u });
        if (ownerBefore !== u) expect(h).toEqual([]);
        for (const e of h) expect(e.userId).toBe(u);
      } else if (ownerBefore !== u) {
        const attempt = op === "update" ? store.memories.update(id, "overwritten", { userId: u }) : store.memories.delete(id, { userId: u });
        await expect(attempt).rejects.toBeInstanceOf(MemoryNotFoundError);
        expect((await store.memories.get(id, { userId: ownerBefore }))?.text).toBe(textBefore);
      } else if (op === "update") {
        const text = sentence();
        const updated = await store.memories.update(id, text, { userId: u });
        mine.set(id, text);
        expectOwn(u, [updated]);
      } else {
        await store.memories.delete(id, { userId: u });
        mine.delete(id);
      }
    }
  }

  // Erasure, with a K/V cache holding blocks of the erased user and of others in every tier.
  const victim = users.find((u) => owned.get(u)!.size >= 3)!;
  await store.preferences.add("likes tea", { userId: victim, type: "style" });
  await store.conversations.recordTurn({ userId: victim, sessionId: "s", query: "q", response: "r", injectionMode: "dki", memoryIds: [], latencyMs: 1, auditAction: "dki_generate" });
  const others = users.filter((u) => u !== victim);
  const queries = [shared[0], shared[1], "apple garden", "咖啡 音乐"];
  const now = Date.now(); // fixed, so the recency signal is the same in every snapshot
  const snapshot = async () => {
    const out: string[] = [];
    for (const u of others) {
      out.push(JSON.stringify(await store.memories.getAll({ userId: u })), JSON.stringify(await store.preferences.list({ userId: u, includeInactive: true })));
      for (const q of queries) out.push(JSON.stringify(await store.memories.search(q, { userId: u, limit: 10, now })));
    }
    return out;
  };
  const before = await snapshot();

  const cacheDir = tempDir();
  const cache = await TieredKVCache.open({ model, dir: cacheDir, budgets: { l1Bytes: 40_000, l2Bytes: 40_000, l3Bytes: 50_000_000 }, writeBehind: false });
  const keys = new Map<string, string[]>();
  for (const u of [victim, others[0], others[1]]) {
    const k: string[] = [];
    for (let i = 0; i < 4; i++) {
      const hit = await cache.get({ userId: u, tokens: tokensFrom(i + u.length * 10, 8) });
      k.push(hit.key);
      hit.release();
    }
    keys.set(u, k);
  }
  await cache.flush();
  const tiersOf = (u: string) => keys.get(u)!.flatMap((k) => cache.locate(k));
  expect(new Set(tiersOf(victim)).size).toBeGreaterThan(1); // spread over more than one tier
  store.flushIndexes();
  const victimIndex = scopeFileBase(join(dir, "index"), victim);
  const victimFiles = () => readdirSync(join(dir, "index")).filter((f) => f.startsWith(basename(victimIndex)));
  expect(victimFiles().some((f) => f.endsWith(".hnsw"))).toBe(true);

  const erased = await store.eraseUser(victim, { cache });
  const victimPrefs = [...prefs.values()].filter((owner) => owner === victim).length;
  expect(erased).toMatchObject({ memories: owned.get(victim)!.size, preferences: victimPrefs + 1, turns: 2, cacheCleared: true });
  expect(tiersOf(victim)).toEqual([]);
  expect(tiersOf(others[0]).length).toBeGreaterThanOrEqual(4);
  expect(tiersOf(others[1]).length).toBeGreaterThanOrEqual(4);
  expect(victimFiles()).toEqual([]);
  await cache.close();

  const nothingLeft = async (s: MemoryStore) => {
    expect(s.listUsers()).not.toContain(victim);
    expect(await s.memories.getAll({ userId: victim })).toEqual([]);
    expect(await s.memories.search(shared[0], { userId: victim })).toEqual([]);
    expect(await s.preferences.list({ userId: victim, includeInactive: true })).toEqual([]);
    expect(await s.conversations.list({ userId: victim, sessionId: "s" })).toEqual([]);
    expect(await s.audit.list({ userId: victim })).toEqual([]);
    for (const id of owned.get(victim)!.keys()) expect(await s.memories.history(id, { userId: victim })).toEqual([]);
  };
  await nothingLeft(store);
  // The erasure's own audit row holds counts and a hash, nothing of the user.
  const row = store.systemAudit().find((a) => a.action === "user_erase")!;
  expect(row.userId).toBe(erasedUserId(victim));
  expect(JSON.stringify(row)).not.toContain(victim);
  expect(await snapshot()).toEqual(before);

  // And after a reopen, from the files alone.
  await store.close();
  const reopened = await MemoryStore.open(options);
  try {
    expect(reopened.checkIndexes()).toEqual([]);
    await nothingLeft(reopened);
    const after: string[] = [];
    for (const u of others) {
      after.push(JSON.stringify(await reopened.memories.getAll({ userId: u })), JSON.stringify(await reopened.preferences.list({ userId: u, includeInactive: true })));
      for (const q of queries) after.push(JSON.stringify(await reopened.memories.search(q, { userId: u, limit: 10, now })));
    }
    expect(after).toEqual(before);
  } finally {
    await reopened.close();
  }
});
