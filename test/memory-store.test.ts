// The memory store's API and its answers to bad input: every refusal names what is wrong, and
// nothing is overwritten or lost on the way.
import { existsSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { DkiArgumentError } from "../src/errors.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { MemoryNotFoundError, MemoryStoreError } from "../src/memory/errors.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import type { RebuildReport } from "../src/memory/retrieval/scoped-index.js";
import { repoRoot, tempDir } from "./support/paths.js";

const open: MemoryStore[] = [];
async function openStore(dir: string, options: Partial<Parameters<typeof MemoryStore.open>[0]> = {}): Promise<MemoryStore> {
  const s = await MemoryStore.open({ dir, ...options });
  open.push(s);
  return s;
}
afterEach(async () => {
  for (const s of open.splice(0)) await s.close();
});

describe("MemoryStore API", () => {
  it("adds, searches, gets, updates, deletes and keeps a history", async () => {
    const store = await openStore(tempDir());
    const [tea] = await store.memories.add("I drink green tea every morning", { userId: "alice", sessionId: "s1", metadata: { topic: "food" } });
    await store.memories.add("My dog is called Biscuit", { userId: "alice", metadata: { topic: "pets" } });
    await store.memories.add("我住在北京市海淀区", { userId: "alice", sessionId: "s2" });
    expect(tea.userId).toBe("alice");
    expect(tea.sessionId).toBe("s1");

    const results = await store.memories.search("what tea do I drink?", { userId: "alice", limit: 2 });
    expect(results[0].memory.id).toBe(tea.id);
    expect(results[0].signals.dense).toBeGreaterThan(0);
    expect(results[0].signals.bm25).toBe(1);
    expect(results[0].score).toBeGreaterThan(0);
    expect(results[0].score).toBeLessThanOrEqual(1);
    const zh = await store.memories.search("北京", { userId: "alice", limit: 1 });
    expect(zh[0].memory.text).toContain("北京市");

    expect((await store.memories.search("dog every morning", { userId: "alice", filter: { eq: { topic: "food" } } })).map((r) => r.memory.id)).toEqual([tea.id]);
    expect((await store.memories.search("tea", { userId: "alice", sessionId: "s2" })).every((r) => r.memory.sessionId === "s2")).toBe(true);
    expect(await store.memories.getAll({ userId: "alice", filter: { in: { topic: ["pets", "x"] } } })).toHaveLength(1);
    expect(await store.memories.getAll({ userId: "alice", sessionId: "s1" })).toHaveLength(1);

    expect(await store.memories.get(tea.id, { userId: "alice" })).toEqual(tea);
    const updated = await store.memories.update(tea.id, "I drink oolong tea every morning", { userId: "alice" });
    expect(updated.text).toContain("oolong");
    expect((await store.memories.search("oolong", { userId: "alice", limit: 1 }))[0].memory.id).toBe(tea.id);
    await store.memories.delete(tea.id, { userId: "alice" });
    expect(await store.memories.get(tea.id, { userId: "alice" })).toBeUndefined();
    expect((await store.memories.search("oolong tea", { userId: "alice" })).map((r) => r.memory.id)).not.toContain(tea.id);

    const history = await store.memories.history(tea.id, { userId: "alice" });
    expect(history.map((h) => h.action)).toEqual(["memory_add", "memory_update", "memory_delete"]);
    expect(history[1].metadata).toEqual({ previousText: "I drink green tea every morning", text: "I drink oolong tea every morning" });
    expect(JSON.stringify(history[2])).not.toContain("oolong");
  });

  it("finds, lists and erases the records of long and non-ASCII user ids, and only theirs", async () => {
    const store = await openStore(tempDir());
    // Up to the 256-byte limit, across the lengths where LMDB's key encoding changes (63 bytes).
    const ids = ["x".repeat(62), "x".repeat(63), "x".repeat(256), "é".repeat(40), "中".repeat(85), "😀".repeat(64), "用户"];
    const users = ids.flatMap((id) => (Buffer.byteLength(`${id}y`) <= 256 ? [id, `${id}y`] : [id]));
    for (const u of users) {
      await store.memories.add(`memory of ${u.length}`, { userId: u, sessionId: u });
      await store.preferences.add("pref", { userId: u, type: "t" });
      await store.conversations.recordTurn({ userId: u, sessionId: u, query: "q", response: "r", injectionMode: "none", memoryIds: [], latencyMs: 1, auditAction: "none_generate" });
    }
    for (const u of users) {
      expect((await store.memories.getAll({ userId: u })).map((m) => m.userId)).toEqual([u]);
      expect(await store.memories.getAll({ userId: u, sessionId: u })).toHaveLength(1);
      expect(await store.preferences.list({ userId: u })).toHaveLength(1);
      expect(await store.conversations.list({ userId: u, sessionId: u })).toHaveLength(2);
      expect((await store.audit.list({ userId: u })).length).toBeGreaterThan(0);
    }
    for (const u of ids) {
      expect(await store.eraseUser(u)).toMatchObject({ memories: 1, preferences: 1, turns: 2 });
      expect(await store.memories.getAll({ userId: u })).toEqual([]);
      expect(await store.audit.list({ userId: u })).toEqual([]);
    }
    for (const u of users.filter((x) => !ids.includes(x))) expect(await store.memories.getAll({ userId: u })).toHaveLength(1);
  });

  it("adds a message list as one memory per message, role in metadata, scope never taken from metadata", async () => {
    const store = await openStore(tempDir());
    const added = await store.memories.add(
      [
        { role: "user", content: "I am allergic to peanuts" },
        { role: "assistant", content: "Noted, no peanuts." },
      ],
      { userId: "bob", metadata: { userId: "mallory", sessionId: "evil" } },
    );
    expect(added.map((m) => [m.userId, m.sessionId, m.metadata.role])).toEqual([
      ["bob", undefined, "user"],
      ["bob", undefined, "assistant"],
    ]);
    expect(await store.memories.getAll({ userId: "mallory" })).toEqual([]);
    expect(await store.memories.search("peanuts", { userId: "mallory" })).toEqual([]);
  });

  it("keeps preferences, conversation turns and the audit log", async () => {
    const store = await openStore(tempDir());
    const low = await store.preferences.add("Likes short answers", { userId: "u", type: "style", priority: 1 });
    const high = await store.preferences.add("Vegetarian", { userId: "u", type: "dietary", priority: 5, category: "food" });
    await store.preferences.update(low.id, { active: false }, { userId: "u" });
    expect((await store.preferences.list({ userId: "u" })).map((p) => p.id)).toEqual([high.id]);
    expect((await store.preferences.list({ userId: "u", includeInactive: true })).map((p) => p.id)).toEqual([high.id, low.id]);
    await expect(store.preferences.update(high.id, { priority: 1.5 }, { userId: "u" })).rejects.toThrow(/priority must be an integer/);
    await expect(store.preferences.update(high.id, { userId: "v" } as never, { userId: "u" })).rejects.toThrow(/unknown field\(s\) userId/);
    await expect(store.preferences.delete(high.id, { userId: "other" })).rejects.toBeInstanceOf(MemoryNotFoundError);
    await store.preferences.delete(high.id, { userId: "u" });

    const turn = await store.conversations.recordTurn({
      userId: "u",
      sessionId: "s",
      query: "what should I eat?",
      response: "Try a salad.",
      injectionMode: "dki",
      alpha: 0.7,
      memoryIds: ["mem_x"],
      latencyMs: 12.5,
      auditAction: "dki_generate",
      auditMetadata: { entropy: 1.2 },
    });
    await store.conversations.recordTurn({ userId: "u", sessionId: "s", query: "and then?", response: "Fruit.", injectionMode: "none", memoryIds: [], latencyMs: 3, auditAction: "dki_generate" });
    const turns = await store.conversations.list({ userId: "u", sessionId: "s" });
    expect(turns.map((t) => [t.role, t.content])).toEqual([
      ["user", "what should I eat?"],
      ["assistant", "Try a salad."],
      ["user", "and then?"],
      ["assistant", "Fruit."],
    ]);
    expect((await store.conversations.list({ userId: "u", sessionId: "s", limit: 2 })).map((t) => t.content)).toEqual(["and then?", "Fruit."]);
    expect(turn.assistantTurn).toMatchObject({ injectionMode: "dki", alpha: 0.7, memoryIds: ["mem_x"], latencyMs: 12.5 });
    const audit = await store.audit.list({ userId: "u", action: "dki_generate" });
    expect(audit).toHaveLength(2);
    expect(audit[0]).toMatchObject({ sessionId: "s", alpha: 0.7, mode: "dki", metadata: { entropy: 1.2 }, memoryIds: ["mem_x"] });
  });

  it("persists across reopen and reports no rebuild after a clean close", async () => {
    const dir = tempDir();
    let store = await openStore(dir);
    for (let i = 0; i < 20; i++) await store.memories.add(`note number ${i} about topic ${i % 3}`, { userId: `user${i % 4}` });
    await store.close();
    const reports: RebuildReport[] = [];
    store = await openStore(dir, { onRebuild: (r) => reports.push(r) });
    expect(store.checkIndexes()).toEqual([]);
    expect(reports).toEqual([]);
    expect(store.stats()).toMatchObject({ users: 4, memories: 20, indexedMemories: 20 });
    expect((await store.memories.search("note number 7", { userId: "user3", limit: 1 }))[0].memory.text).toBe("note number 7 about topic 1");
  });
});

describe("MemoryStore bad input", () => {
  it("refuses empty, over-long and non-string texts and bad scopes, naming the problem", async () => {
    const store = await openStore(tempDir(), { maxTextChars: 50 });
    await expect(store.memories.add("   ", { userId: "u" })).rejects.toThrow(/text is empty/);
    await expect(store.memories.add("x".repeat(51), { userId: "u" })).rejects.toThrow(/51 characters long; the maximum is 50/);
    await expect(store.memories.add(42 as never, { userId: "u" })).rejects.toThrow(DkiArgumentError);
    await expect(store.memories.add("hi", { userId: "" })).rejects.toThrow(/userId must be a non-empty string/);
    await expect(store.memories.add("hi", { userId: "a\u0000b" })).rejects.toThrow(/control character/);
    await expect(store.memories.add("hi", {} as never)).rejects.toThrow(/userId/);
    await expect(store.memories.search("", { userId: "u" })).rejects.toThrow(/query is empty/);
    await expect(store.memories.search("hi", { userId: "u", limit: 0 })).rejects.toThrow(/limit must be an integer/);
    await expect(store.memories.search("hi", { userId: "u", minScore: 2 })).rejects.toThrow(/minScore/);
    await expect(store.memories.search("hi", { userId: "u", filter: { like: { a: 1 } } as never })).rejects.toThrow(/unknown operator "like"/);
    await expect(store.memories.search("hi", { userId: "u", filter: { and: [{ in: { a: 1 } }] } as never })).rejects.toThrow(/filter.and\[0\].in.a must be an array/);
    await expect(store.memories.search("hi", { userId: "u", fusion: { method: "rrf", weights: { dense: 0, bm25: 0 } } })).rejects.toThrow(/all 0/);
    expect(store.stats().memories).toBe(0);
  });

  it("refuses metadata that is not JSON, naming the path", async () => {
    const store = await openStore(tempDir());
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    await expect(store.memories.add("t", { userId: "u", metadata: { a: { b: [1, undefined] } } as never })).rejects.toThrow(/metadata.a.b\[1\] is undefined/);
    await expect(store.memories.add("t", { userId: "u", metadata: { n: Number.NaN } })).rejects.toThrow(/metadata.n is NaN/);
    await expect(store.memories.add("t", { userId: "u", metadata: { d: new Date() } as never })).rejects.toThrow(/metadata.d is a Date/);
    await expect(store.memories.add("t", { userId: "u", metadata: cyclic as never })).rejects.toThrow(/cycle/);
    await expect(store.memories.add("t", { userId: "u", metadata: "{}" as never })).rejects.toThrow(/metadata must be a JSON object/);
    await expect(store.memories.add("t", { userId: "u", metadata: { big: "x".repeat(70_000) } })).rejects.toThrow(/at most 65536/);
    expect(store.stats().memories).toBe(0);
  });

  it("answers an unknown id as not found, and another user's id the same way", async () => {
    const store = await openStore(tempDir());
    const [m] = await store.memories.add("secret of alice", { userId: "alice" });
    expect(await store.memories.get("nope", { userId: "alice" })).toBeUndefined();
    expect(await store.memories.get(m.id, { userId: "bob" })).toBeUndefined();
    await expect(store.memories.update(m.id, "hacked", { userId: "bob" })).rejects.toThrow(`memory "${m.id}" not found for user "bob"`);
    await expect(store.memories.delete(m.id, { userId: "bob" })).rejects.toBeInstanceOf(MemoryNotFoundError);
    expect(await store.memories.history(m.id, { userId: "bob" })).toEqual([]);
    expect((await store.memories.get(m.id, { userId: "alice" }))?.text).toBe("secret of alice");
    // An id no record can have is bad input, not a lookup (LMDB keys are bounded).
    await expect(store.memories.get("x".repeat(5000), { userId: "alice" })).rejects.toThrow(/id is 5000 bytes long in UTF-8; at most 256/);
    await expect(store.memories.add("hi", { userId: "😀".repeat(65) })).rejects.toThrow(/userId is 260 bytes long/);
    // The longest ids make the longest keys: a turn's [user, session, turn].
    const longest = "😀".repeat(64);
    await store.conversations.recordTurn({ userId: longest, sessionId: longest, query: "q", response: "r", injectionMode: "none", memoryIds: [], latencyMs: 1, auditAction: "none_generate" });
    expect(await store.conversations.list({ userId: longest, sessionId: longest })).toHaveLength(2);
    await expect(store.preferences.delete(42 as never, { userId: "alice" })).rejects.toThrow(/id must be a non-empty string, got 42/);
  });

  it("lets a second opener in, in this process and in another, each seeing the other's writes at its next search", async () => {
    const dir = tempDir();
    const first = await openStore(dir);
    await first.memories.add("the red kite flies", { userId: "u" });
    const second = await openStore(dir);
    expect((await second.memories.search("red kite", { userId: "u" }))[0].memory.text).toBe("the red kite flies");
    await second.memories.add("the blue heron waits", { userId: "u" });
    // first's loaded index was at the generation before second's add: reloaded at this search.
    expect((await first.memories.search("blue heron", { userId: "u" }))[0].memory.text).toBe("the blue heron waits");
    const { execFileSync } = await import("node:child_process");
    // The child runs the built package (npm test compiles dist/ first).
    const script = `import(${JSON.stringify(join(repoRoot, "dist/src/memory/memory-store.js"))}).then(async (m) => { const s = await m.MemoryStore.open({ dir: ${JSON.stringify(dir)} }); await s.memories.add("the green frog sings", { userId: "u" }); console.log((await s.memories.getAll({ userId: "u" })).length); await s.close(); }, e => console.log(e.name + ": " + e.message))`;
    expect(execFileSync(process.execPath, ["-e", script], { encoding: "utf8" }).trim()).toBe("3");
    for (const s of [first, second]) expect((await s.memories.search("green frog", { userId: "u", limit: 1 }))[0].memory.text).toBe("the green frog sings");
    await second.eraseUser("u");
    expect(await first.memories.search("red kite", { userId: "u" })).toEqual([]);
  });

  it("refuses a foreign folder, a damaged store file and another schema version, overwriting nothing", async () => {
    const foreign = tempDir();
    writeFileSync(join(foreign, "notes.txt"), "mine");
    await expect(MemoryStore.open({ dir: foreign })).rejects.toThrow(/is not a memory store folder: it holds notes.txt/);
    expect(readdirSync(foreign)).toEqual(["notes.txt"]);

    const damaged = tempDir();
    const garbage = Buffer.alloc(64 * 1024, 0x5a);
    writeFileSync(join(damaged, "store.lmdb"), garbage);
    await expect(MemoryStore.open({ dir: damaged })).rejects.toThrow(MemoryStoreError);
    expect(readFileSync(join(damaged, "store.lmdb")).equals(garbage)).toBe(true);
    writeFileSync(join(damaged, "store.lmdb"), "short");
    await expect(MemoryStore.open({ dir: damaged })).rejects.toThrow(/store.lmdb is 5 bytes long, too short for an LMDB file/);
    // An empty file is not a new store: it is what a failed copy leaves.
    writeFileSync(join(damaged, "store.lmdb"), "");
    await expect(MemoryStore.open({ dir: damaged })).rejects.toThrow(/store.lmdb is empty \(0 bytes\).*Restore it from a backup, or move it/);
    rmSync(join(damaged, "store.lmdb"));
    await openStore(damaged);

    const file = tempDir();
    const notAFolder = join(file, "f");
    writeFileSync(notAFolder, "x");
    await expect(MemoryStore.open({ dir: notAFolder })).rejects.toThrow(/is not a folder/);
  });

  it("re-embeds alone: waits a bounded time for another process's re-embedding and then names it", async () => {
    const dir = tempDir();
    const store = await openStore(dir, { embedder: new HashingEmbedder({ dim: 64 }) });
    await store.memories.add("the quick brown fox", { userId: "u" });
    await store.close();
    // The lock a re-embedding process holds, taken here by a plain child.
    const { spawn } = await import("node:child_process");
    const script = `import(${JSON.stringify(join(repoRoot, "dist/src/cache/tiers/folder-lock.js"))}).then(async (m) => { await m.FolderLock.acquire(${JSON.stringify(dir)}); console.log("locked"); setTimeout(() => {}, 60_000); })`;
    const holder = spawn(process.execPath, ["-e", script], { stdio: ["ignore", "pipe", "inherit"] });
    try {
      await new Promise<void>((resolve) => holder.stdout.once("data", () => resolve()));
      const t0 = Date.now();
      await expect(MemoryStore.open({ dir, embedder: new HashingEmbedder({ dim: 128 }), reembed: true, exclusiveWaitMs: 500 })).rejects.toThrow(
        new RegExp(`the memory store ${dir} is being re-embedded by process ${holder.pid}; waited 0.5 s`),
      );
      expect(Date.now() - t0).toBeGreaterThanOrEqual(500);
    } finally {
      holder.kill("SIGKILL");
    }
    // Once it is gone, the re-embedding runs.
    const again = await openStore(dir, { embedder: new HashingEmbedder({ dim: 128 }), reembed: true });
    expect((await again.memories.search("brown fox", { userId: "u" }))[0].memory.text).toBe("the quick brown fox");
  });

  it("opens a version-1 store (records without checksums) and reads, searches and extends it", async () => {
    const dir = tempDir();
    // Written the way version 1 wrote: plain JSON records, bare float32 vectors (a plain Node
    // child: two copies of lmdb's addon in one process must not open the same file).
    const { execFileSync } = await import("node:child_process");
    const dist = (f: string) => JSON.stringify(join(repoRoot, "dist/src/memory", f));
    const script = `Promise.all([import("lmdb"), import(${dist("embedders/hashing.js")})]).then(async ([{ open }, { HashingEmbedder }]) => {
      const env = open({ path: ${JSON.stringify(join(dir, "store.lmdb"))}, maxDbs: 16 });
      const db = (name) => env.openDB({ name, encoding: "json" });
      const e = new HashingEmbedder();
      const [v] = await e.embed(["the old red kite"]);
      await db("meta").put("schema", { format: "dki-memory-store", version: 1, createdAt: 0 });
      await db("meta").put("embedder", { id: e.id, dim: e.dim });
      await db("users").put("u", { createdAt: 0, generation: 3 });
      await db("memories").put(["u", "mem_old"], { id: "mem_old", userId: "u", text: "the old red kite", metadata: {}, createdAt: 0, updatedAt: 0, active: true });
      await env.openDB({ name: "vectors", encoding: "binary" }).put(["u", "mem_old"], Buffer.from(v.buffer));
      await env.close();
    })`;
    execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: repoRoot });
    const store = await openStore(dir);
    expect((await store.memories.get("mem_old", { userId: "u" }))?.text).toBe("the old red kite");
    expect((await store.memories.search("red kite", { userId: "u" }))[0].memory.id).toBe("mem_old");
    await store.memories.add("a new blue heron", { userId: "u" });
    expect((await store.memories.search("blue heron", { userId: "u" }))[0].memory.text).toBe("a new blue heron");
    expect(store.stats()).toMatchObject({ schemaVersion: 2, memories: 2 });
  });

  it("replaces index files an older version saved under names without their checksum", async () => {
    const dir = tempDir();
    const first = await openStore(dir, { hnswFrom: 0 });
    await first.memories.add("the grey heron", { userId: "u" });
    await first.close();
    const index = join(dir, "index");
    for (const f of readdirSync(index)) renameSync(join(index, f), join(index, f.replace(/-[0-9a-f]{16}\./, ".")));
    expect(readdirSync(index).sort()).toEqual([expect.stringMatching(/^[0-9a-f]{32}\.hnsw$/), expect.stringMatching(/^[0-9a-f]{32}\.ids\.json$/)]);
    const store = await openStore(dir, { hnswFrom: 0 });
    expect(store.checkIndexes().map((r) => r.reason)).toEqual(["missing"]);
    store.flushIndexes();
    expect(readdirSync(index).sort()).toEqual([expect.stringMatching(/^[0-9a-f]{32}-[0-9a-f]{16}\.hnsw$/), expect.stringMatching(/^[0-9a-f]{32}-[0-9a-f]{16}\.ids\.json$/)]);
    expect((await store.memories.search("grey heron", { userId: "u" }))[0].memory.text).toBe("the grey heron");
  });

  it("refuses a store of another schema version, naming both versions", async () => {
    const dir = tempDir();
    const store = await openStore(dir);
    await store.memories.add("kept", { userId: "u" });
    await store.close();
    // Rewritten by a plain Node child: two copies of lmdb's addon in one process (vitest's and
    // Node's module graphs) must not open the same file.
    const { execFileSync } = await import("node:child_process");
    const script = `import("lmdb").then(async ({ open }) => { const env = open({ path: ${JSON.stringify(join(dir, "store.lmdb"))}, maxDbs: 16 }); await env.openDB({ name: "meta", encoding: "json" }).put("schema", { format: "dki-memory-store", version: 99, createdAt: 0 }); await env.close(); })`;
    execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: repoRoot });
    await expect(MemoryStore.open({ dir })).rejects.toThrow(/schema version 99; this dki-engine reads version 2 .*newer dki-engine/);
  });

  it("refuses another embedder unless asked to re-embed, and never mixes their vectors", async () => {
    const dir = tempDir();
    let store = await openStore(dir, { embedder: new HashingEmbedder({ dim: 64 }) });
    await store.memories.add("the quick brown fox", { userId: "u" });
    await store.memories.add("lazy dogs sleep", { userId: "u" });
    await store.close();
    await expect(MemoryStore.open({ dir, embedder: new HashingEmbedder({ dim: 128 }) })).rejects.toThrow(/made by embedder hashing-v1-d64 \(64 dimensions\), not hashing-v1-d128 \(128\).*reembed/);
    const progress: [number, number][] = [];
    const reports: RebuildReport[] = [];
    store = await openStore(dir, { embedder: new HashingEmbedder({ dim: 128 }), reembed: true, hnswFrom: 0, onProgress: (d, t) => progress.push([d, t]), onRebuild: (r) => reports.push(r) });
    expect(progress.at(-1)).toEqual([2, 2]);
    expect((await store.memories.search("quick fox", { userId: "u", limit: 1 }))[0].memory.text).toBe("the quick brown fox");
    expect(reports.map((r) => r.reason)).toEqual(["missing"]);
    expect(store.systemAudit().map((a) => a.action)).toEqual(["store_reembed"]);
    await store.close();
    // Now the 128-dimension embedder is the store's, and the 64 one is refused.
    await expect(MemoryStore.open({ dir, embedder: new HashingEmbedder({ dim: 64 }) })).rejects.toThrow(/not hashing-v1-d64/);
  });

  it("rebuilds a damaged or missing index file from the store and reports it", async () => {
    const dir = tempDir();
    // HNSW from the first memory: smaller users are scanned exactly and have no index files.
    const hnswFrom = 0;
    let store = await openStore(dir, { hnswFrom });
    for (let i = 0; i < 30; i++) await store.memories.add(`fact ${i}: the colour of item ${i} is ${["red", "green", "blue"][i % 3]}`, { userId: "u" });
    await store.close();
    const indexDir = join(dir, "index");
    const hnsw = readdirSync(indexDir).find((f) => f.endsWith(".hnsw"))!;
    const bytes = readFileSync(join(indexDir, hnsw));
    bytes[Math.floor(bytes.length / 2)] ^= 0xff;
    writeFileSync(join(indexDir, hnsw), bytes);
    const reports: RebuildReport[] = [];
    store = await openStore(dir, { hnswFrom, onRebuild: (r) => reports.push(r) });
    const found = await store.memories.search("colour of item 7", { userId: "u", limit: 1 });
    expect(found[0].memory.text).toContain("item 7 ");
    expect(reports).toHaveLength(1);
    expect(reports[0]).toMatchObject({ scope: "u", reason: "corrupt", documents: 30 });
    expect(store.stats().lastRebuild?.reason).toBe("corrupt");
    await store.close();

    for (const f of readdirSync(indexDir)) writeFileSync(join(indexDir, f), "");
    store = await openStore(dir, { hnswFrom });
    expect(store.checkIndexes().map((r) => r.reason)).toEqual(["corrupt"]);
    await store.close();
    const { rmSync } = await import("node:fs");
    rmSync(indexDir, { recursive: true });
    store = await openStore(dir, { hnswFrom });
    expect(store.checkIndexes().map((r) => r.reason)).toEqual(["missing"]);
    expect(existsSync(indexDir)).toBe(true);
  });
});
