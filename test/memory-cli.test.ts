// `dki memory`, `dki pref` and `dki user erase` as a user runs them (node bin/dki.js, built by npm
// test's tsc step).
import { readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, expect, test } from "vitest";
import { TieredKVCache } from "../src/cache/tiered-cache.js";
import type { Model } from "../src/engine/model.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { tinyModel, tokensFrom } from "./support/cache.js";
import { locomoSample } from "./support/conversation-samples.js";
import { dki, dkiFails } from "./support/dki-bin.js";
import { tempDir } from "./support/paths.js";

let model: Model;
beforeAll(async () => {
  model = await tinyModel(4);
});
afterAll(() => model?.dispose());

test("memory add, search --format json, list, get, rm; bad input as one line and exit 1", async () => {
  const data = join(tempDir(), "store");
  const as = (user: string) => ["--data", data, "--user", user];
  const added = JSON.parse((await dki(["memory", "add", "I like green tea in the morning", ...as("alice"), "--session", "s1", "--metadata", '{"turnId":"D1:1","mood":"calm"}', "--format", "json"])).stdout) as {
    id: string;
    user_id: string;
    session_id: string;
    metadata: object;
  };
  expect(added).toMatchObject({ user_id: "alice", session_id: "s1", metadata: { turnId: "D1:1", mood: "calm" } });
  await dki(["memory", "add", "我住在北京市", ...as("alice")]);
  const bob = JSON.parse((await dki(["memory", "add", "I like green tea too", ...as("bob"), "--format", "json"])).stdout) as { id: string };

  const search = JSON.parse((await dki(["memory", "search", "green tea", ...as("alice"), "--format", "json"])).stdout) as {
    results: { id: string; text: string; score: number; signals: { dense: number; bm25: number; recency: number }; metadata: object }[];
  };
  expect(search.results.map((r) => r.id)).not.toContain(bob.id); // bob's same words are not alice's
  expect(Object.keys(search.results[0]).sort()).toEqual(["id", "metadata", "score", "signals", "text"]);
  expect(Object.keys(search.results[0].signals).sort()).toEqual(["bm25", "dense", "recency"]);
  expect(search.results[0]).toMatchObject({ id: added.id, text: "I like green tea in the morning", metadata: { turnId: "D1:1", mood: "calm" } });
  expect((await dki(["memory", "search", "北京", ...as("alice")])).stdout).toMatch(/^\[1\] \d\.\d{3} mem_\S+ {2}我住在北京市$/m);
  expect((await dki(["memory", "list", ...as("alice"), "--session", "s1"])).stdout).toBe(`${added.id}\tI like green tea in the morning\n`);
  expect((await dki(["memory", "get", added.id, ...as("alice")])).stdout).toContain("I like green tea in the morning");

  expect(await dkiFails(["memory", "get", added.id, ...as("bob")])).toBe(`dki: memory "${added.id}" not found for user "bob"\n`);
  expect(await dkiFails(["memory", "rm", added.id, ...as("bob")])).toBe(`dki: memory "${added.id}" not found for user "bob"\n`);
  expect(await dkiFails(["memory", "add", "x", ...as("alice"), "--metadata", "{nope"])).toMatch(/^dki: --metadata is not valid JSON: .*\n$/);
  expect(await dkiFails(["memory", "add", "x", ...as("alice"), "--metadata", "[1]"])).toBe("dki: metadata must be a JSON object, got an array\n");
  expect(await dkiFails(["memory", "add", "   ", ...as("alice")])).toBe("dki: text is empty\n");
  expect(await dkiFails(["memory", "search", "tea", ...as("alice"), "--limit", "0"])).toMatch(/^dki: .*--limit must be an integer in \[1, 1000\], got "0"/);
  expect(await dkiFails(["memory", "list", "--data", data])).toMatch(/^dki: .*--user/);
  const other = tempDir();
  writeFileSync(join(other, "notes.txt"), "mine");
  expect(await dkiFails(["memory", "list", "--data", other, "--user", "u"])).toMatch(/^dki: .* is not a memory store folder: it holds notes\.txt/);

  await dki(["memory", "rm", added.id, ...as("alice")]);
  expect((await dki(["memory", "history", added.id, ...as("alice")])).stdout).toMatch(/memory_add\n.*memory_delete\n$/);
});

test("pref add/list/rm, memory import, user erase clearing the K/V cache beside the store", async () => {
  const data = join(tempDir(), "store");
  const as = (user: string) => ["--data", data, "--user", user];
  const pref = JSON.parse((await dki(["pref", "add", "vegetarian", "--type", "dietary", "--priority", "5", "--category", "food", ...as("conv-26"), "--format", "json"])).stdout) as { id: string };
  await dki(["pref", "add", "short answers", "--type", "style", ...as("conv-26")]);
  expect((await dki(["pref", "list", ...as("conv-26")])).stdout).toMatch(new RegExp(`^${pref.id}\\t5\\tdietary\\tvegetarian\\n.*\\t0\\tstyle\\tshort answers\\n$`));
  expect(await dkiFails(["pref", "add", "x", ...as("conv-26")])).toMatch(/required option '--type <type>'/);

  const file = join(tempDir(), "locomo.json");
  writeFileSync(file, JSON.stringify(locomoSample().slice(0, 1)));
  // conv-26 has preferences, so it exists: the import is refused and nothing written.
  expect(await dkiFails(["memory", "import", file, "--data", data, "--format", "locomo"])).toMatch(/user "conv-26" already exists in the store; erase it first/);
  const bad = join(tempDir(), "bad.json");
  writeFileSync(bad, JSON.stringify([{ sample_id: "x", conversation: { session_1: [{ speaker: "A", text: "hi" }] } }]));
  expect(await dkiFails(["memory", "import", bad, "--data", data])).toBe(`dki: ${bad}: [0].conversation.session_1[0].dia_id: expected a string, got nothing (missing)\n`);

  // K/V blocks of two users in the cache folder `dki chat` uses; erase clears one user's only.
  const cacheDir = `${data}.kv-cache`;
  let cache = await TieredKVCache.open({ model, dir: cacheDir, budgets: { l1Bytes: 1e7, l2Bytes: 1e7, l3Bytes: 1e8 }, writeBehind: false });
  const keys: Record<string, string> = {};
  for (const u of ["conv-26", "keep"]) {
    const hit = await cache.get({ userId: u, tokens: tokensFrom(u.length, 8) });
    keys[u] = hit.key;
    hit.release();
  }
  await cache.close();
  const erased = JSON.parse((await dki(["user", "erase", "conv-26", "--data", data, "--format", "json"])).stdout) as Record<string, unknown>;
  expect(erased).toMatchObject({ user_id: "conv-26", memories: 0, preferences: 2, cache_cleared: true, cache: cacheDir });
  cache = await TieredKVCache.open({ model, dir: cacheDir, budgets: { l1Bytes: 1e7, l2Bytes: 1e7, l3Bytes: 1e8 } });
  try {
    expect(cache.locate(keys["conv-26"])).toEqual([]);
    expect(cache.locate(keys.keep)).toEqual(["L3"]);
  } finally {
    await cache.close();
  }
  expect((await dki(["pref", "list", ...as("conv-26"), "--format", "json"])).stdout).toBe('{"preferences":[]}\n');

  // Now conv-26 is gone, the import goes through.
  const summary = JSON.parse((await dki(["memory", "import", file, "--data", data, "--format", "locomo"])).stdout) as unknown;
  expect(summary).toEqual({ format: "locomo", users: [{ user_id: "conv-26", memories: 7 }], memories: 7 });
  expect(await dkiFails(["user", "erase", "conv-26", "--data", data, "--cache", join(tempDir(), "nope")])).toMatch(/--cache .*nope: no such folder/);
});

test("an index rebuilt from the store is reported on stderr", async () => {
  const data = join(tempDir(), "store");
  // Written through the API with HNSW from the first memory, so the user has index files.
  const store = await MemoryStore.open({ dir: data, hnswFrom: 0 });
  for (let i = 0; i < 5; i++) await store.memories.add(`note ${i} about sailing`, { userId: "u" });
  await store.close();
  const index = join(data, "index");
  for (const f of readdirSync(index)) if (f.endsWith(".hnsw")) writeFileSync(join(index, f), "damaged");
  const { stdout, stderr } = await dki(["memory", "search", "note 3 sailing", "--data", data, "--user", "u"]);
  expect(stderr).toMatch(/^dki: rebuilt the index of user "u" \(corrupt: .*\): 5 memories in \d+ ms\n$/);
  expect(stdout).toMatch(/^\[1\] \S+ mem_\S+ {2}note 3 about sailing$/m);
});
