// `dki memory`, `dki pref` and `dki user erase` as a user runs them (node bin/dki.js, built by npm
// test's tsc step).
import { execFile, spawn } from "node:child_process";
import { existsSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, expect, test } from "vitest";
import { TieredKVCache } from "../src/cache/tiered-cache.js";
import type { Model } from "../src/engine/model.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { tinyModel, tokensFrom } from "./support/cache.js";
import { locomoSample } from "./support/conversation-samples.js";
import { dki, dkiBin, dkiFails, dkiSpawn } from "./support/dki-bin.js";
import { tempDir } from "./support/paths.js";

const run = promisify(execFile);

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
  expect((await dki(["memory", "search", "北京", ...as("alice")])).stdout).toMatch(/^\[1\] relevance \d\.\d{3} {2}mem_\S+ {2}我住在北京市$/m);
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
  expect(await dkiFails(["memory", "add", "x", "--data", other, "--user", "u"])).toMatch(/^dki: .* is not a memory store folder: it holds notes\.txt/);

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
  // Knowledge-base collections beside the store: conv-26's own goes with it; a group's and a shared one stay.
  await dki(["kb", "create", "notes-26", "--data", data, "--owner-user", "conv-26"]);
  await dki(["kb", "create", "team", "--data", data, "--owner-prefix", "conv-"]);
  await dki(["kb", "create", "handbook", "--data", data]);
  const erased = JSON.parse((await dki(["user", "erase", "conv-26", "--data", data, "--format", "json", "--yes"])).stdout) as Record<string, unknown>;
  expect(erased).toMatchObject({ user_id: "conv-26", memories: 0, preferences: 2, cache_cleared: true, cache: cacheDir, collections: ["notes-26"] });
  expect((await dki(["kb", "list", "--data", data])).stdout).toBe("handbook\t0 documents\t0 chunks\nteam\t0 documents\t0 chunks\towner conv-*\n");
  expect((await dki(["user", "erase", "conv-26", "--data", data, "--yes"])).stdout).toMatch(/; K\/V cleared from .*; 0 knowledge-base collections removed\n$/);
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
  expect(summary).toEqual({ format: "locomo", as: "memories", users: [{ user_id: "conv-26", memories: 7 }], memories: 7, invalid_utf8: 0 });
  expect(await dkiFails(["user", "erase", "conv-26", "--data", data, "--cache", join(tempDir(), "nope"), "--yes"])).toMatch(/--cache .*nope: no such folder/);
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
  expect(stdout).toMatch(/^\[1\] relevance \S+ {2}mem_\S+ {2}note 3 about sailing$/m);
});

test("read commands refuse a store that does not exist, naming it, and create nothing; memory add creates one", async () => {
  const missing = join(tempDir(), "typo");
  const reads = [["memory", "list", "--user", "u"], ["memory", "search", "x", "--user", "u"], ["memory", "get", "m", "--user", "u"], ["memory", "history", "m", "--user", "u"], ["memory", "rm", "m", "--user", "u"], ["pref", "list", "--user", "u"], ["pref", "rm", "p", "--user", "u"], ["user", "list"], ["stats"], ["user", "erase", "u", "--yes"]];
  for (const args of reads) {
    expect(await dkiFails([...args, "--data", missing])).toBe(`dki: --data ${missing}: no memory store there (${missing}); check the path (dki memory add or dki memory import creates a store)\n`);
  }
  expect(existsSync(missing)).toBe(false);
  await dki(["memory", "add", "first memory", "--data", missing, "--user", "u"]);
  expect(existsSync(join(missing, "store.lmdb"))).toBe(true);
  expect((await dki(["memory", "list", "--data", missing, "--user", "u"])).stdout).toMatch(/^mem_\S+\tfirst memory\n$/);
});

test("memory search's text shows the cosine relevance (not the fused rank score) and a snippet of the text", async () => {
  const data = join(tempDir(), "store");
  const long = `I like green tea in the morning, ${"and a long walk along the river afterwards ".repeat(5)}`.trim();
  await dki(["memory", "add", long, "--data", data, "--user", "u"]);
  await dki(["memory", "add", "Bicycles need oil", "--data", data, "--user", "u"]);
  const { stdout } = await dki(["memory", "search", "green tea", "--data", data, "--user", "u"]);
  // The reference: the cosine of the two hashing-embedder vectors (unit length), computed here.
  const [q, m] = await new HashingEmbedder().embed(["green tea", long]);
  const cosine = q.reduce((sum, x, i) => sum + x * m[i], 0);
  const line = stdout.split("\n")[0];
  const shown = /^\[1\] relevance (\d\.\d{3}) {2}mem_\S+ {2}(.*)$/.exec(line);
  expect(shown, line).not.toBeNull();
  expect(Math.abs(Number(shown![1]) - cosine)).toBeLessThan(0.0006);
  expect(cosine).toBeLessThan(0.9); // so the fused score of the top hit (≈ 1) could not pass for it
  expect(shown![2]).toBe(`${long.slice(0, 119)}…`);
});

test("memory add - reads stdin; characters that were not UTF-8 are warned about with their count (stdin, the argument, import)", async () => {
  const data = join(tempDir(), "store");
  const as = ["--data", data, "--user", "u", "--format", "json"];
  const piped = await dkiSpawn(["memory", "add", "-", ...as], { input: "I sail on Sundays.\n" }).done;
  expect(piped.code, piped.stderr).toBe(0);
  expect(piped.stderr).toBe("");
  expect(JSON.parse(piped.stdout).text).toBe("I sail on Sundays.");

  // E9 before a space, then FF and FE: three bad sequences; the U+FFFD after them is valid UTF-8 and not counted.
  const bad = Buffer.concat([Buffer.from("caf"), Buffer.from([0xe9]), Buffer.from(" au lait "), Buffer.from([0xff, 0xfe]), Buffer.from(" \uFFFD ok")]);
  const r = await dkiSpawn(["memory", "add", "-", ...as], { input: bad }).done;
  expect(r.code, r.stderr).toBe(0);
  expect(r.stderr).toBe("dki: warning: stdin: 3 characters were not UTF-8 and are stored as U+FFFD\n");
  expect(JSON.parse(r.stdout).text).toBe("caf\uFFFD au lait \uFFFD\uFFFD \uFFFD ok");

  // An argument with a byte that is not UTF-8, as a shell passes it.
  const arg = await run("bash", ["-c", `"$0" "$1" memory add $'caf\\xe9 noir' --data "$2" --user u`, process.execPath, dkiBin, data]);
  expect(arg.stderr).toBe("dki: warning: the text argument holds 1 U+FFFD replacement character (bytes that were not UTF-8?); stored as given\n");

  const file = join(tempDir(), "locomo.json");
  const json = Buffer.from(JSON.stringify(locomoSample().slice(0, 1)));
  const at = json.indexOf(Buffer.from('"text":"')) + 8;
  writeFileSync(file, Buffer.concat([json.subarray(0, at), Buffer.from([0xff]), json.subarray(at)]));
  const imported = await dki(["memory", "import", file, "--data", data]);
  expect(imported.stderr).toBe(`dki: warning: ${file}: 1 character was not UTF-8 and is stored as U+FFFD\n`);
  expect(JSON.parse(imported.stdout)).toMatchObject({ memories: 7, invalid_utf8: 1 });
});

test("user list; stats (users, memories, sessions, disk use, the cache's L3 blocks) in text and JSON; a folder that is not a cache refused", async () => {
  const data = join(tempDir(), "store");
  await dki(["memory", "add", "alpha", "--data", data, "--user", "bob", "--session", "s1"]);
  await dki(["memory", "add", "beta", "--data", data, "--user", "alice", "--session", "s1"]);
  await dki(["memory", "add", "gamma", "--data", data, "--user", "alice", "--session", "s2"]);
  expect((await dki(["user", "list", "--data", data])).stdout).toBe("alice\nbob\n");
  expect(JSON.parse((await dki(["user", "list", "--data", data, "--format", "json"])).stdout)).toEqual({ users: ["alice", "bob"] });

  const bare = JSON.parse((await dki(["stats", "--data", data, "--format", "json"])).stdout);
  expect(bare).toMatchObject({ users: 2, memories: 3, preferences: 0, sessions: 3, turns: 0, cache: null, disk: { knowledge_base: null, cache: null } });
  expect(bare.disk.store).toBeGreaterThan(0);

  const cacheDir = `${data}.kv-cache`;
  const cache = await TieredKVCache.open({ model, dir: cacheDir, budgets: { l1Bytes: 1e7, l2Bytes: 1e7, l3Bytes: 1e8 }, writeBehind: false });
  for (const u of ["alice", "bob", "bob"]) (await cache.get({ userId: u, tokens: tokensFrom(u.length + u.charCodeAt(0), 8) })).release();
  await cache.get({ userId: "bob", tokens: tokensFrom(99, 8) }).then((h) => h.release());
  await cache.close();
  // The reference: the .kvb files in the folder, listed here.
  const kvb = readdirSync(cacheDir, { recursive: true, encoding: "utf8" }).filter((f) => f.endsWith(".kvb"));
  const kvbBytes = kvb.reduce((n, f) => n + statSync(join(cacheDir, f)).size, 0);
  const withCache = JSON.parse((await dki(["stats", "--data", data, "--format", "json"])).stdout);
  expect(kvb).toHaveLength(3);
  expect(withCache.cache).toEqual({ dir: cacheDir, l3_entries: 3, l3_bytes: kvbBytes, l3_users: 2 });
  expect(withCache.disk.cache).toBeGreaterThanOrEqual(kvbBytes);
  const text = (await dki(["stats", "--data", data])).stdout.split("\n");
  expect(text[0]).toBe("users 2, memories 3, preferences 0, sessions 3, conversation turns 0 (embedder hashing-v2-512)".replace("hashing-v2-512", bare.embedder.id));
  expect(text[1]).toMatch(/^disk: store \d+\.\d MiB, index \d+\.\d MiB, knowledge base none, K\/V cache \d+\.\d MiB$/);
  expect(text[2]).toBe(`K/V cache ${cacheDir}: L3 3 blocks, ${(kvbBytes / 2 ** 20).toFixed(1)} MiB, 2 users (L1 and L2 live in a running process's memory)`);

  // A model folder given as the cache is refused, by stats and by erase, and left as it was.
  const modelDir = tempDir();
  writeFileSync(join(modelDir, "config.json"), "{}");
  for (const args of [["stats"], ["user", "erase", "bob", "--yes"]]) {
    expect(await dkiFails([...args, "--data", data, "--cache", modelDir])).toBe(`dki: --cache ${modelDir} is not a K/V cache folder: it holds config.json; give an empty or new folder\n`);
  }
  expect(readdirSync(modelDir)).toEqual(["config.json"]);
});

test("user erase asks on a terminal (only y or yes erases) and, with stdin not a terminal, refuses without --yes", async () => {
  const data = join(tempDir(), "store");
  await dki(["memory", "add", "alpha", "--data", data, "--user", "bob"]);
  const users = async () => (await dki(["user", "list", "--data", data])).stdout;
  expect(await dkiFails(["user", "erase", "bob", "--data", data])).toBe("dki: erasing cannot be undone: give --yes to confirm (stdin is not a terminal to ask on)\n");
  expect(await users()).toBe("bob\n");
  // script(1) runs the command on a pseudo-terminal, its stdin fed from ours.
  const onTerminal = (answer: string) =>
    new Promise<{ code: number | null; out: string }>((resolve) => {
      const cmd = [process.execPath, dkiBin, "user", "erase", "bob", "--data", data].map((a) => `'${a}'`).join(" ");
      const child = spawn("script", ["-qec", cmd, "/dev/null"], { stdio: ["pipe", "pipe", "pipe"] });
      let out = "";
      child.stdout.on("data", (d: Buffer) => (out += d.toString()));
      child.stdin.end(answer);
      child.on("close", (code) => resolve({ code, out }));
    });
  const no = await onTerminal("n\n");
  expect(no.out).toContain(`erase every record of user "bob" in ${data}? This cannot be undone. [y/N]`);
  expect(no.out).toContain("dki: not confirmed: nothing erased");
  expect(no.code).toBe(1);
  expect(await users()).toBe("bob\n");
  const yes = await onTerminal("yes\n");
  expect(yes.out).toContain("erased bob: 1 memories");
  expect(yes.code).toBe(0);
  expect(await users()).toBe("(no users)\n");
});
