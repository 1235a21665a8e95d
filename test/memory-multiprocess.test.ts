// Several processes on one memory store. Children run the built package
// (support/memory-store-child.mjs): eight of them add 100 memories each, all at once, to a store
// none of them finds made (so they also race to create it); a ninth then finds every one of the
// 800, and finds each by its own text. An open DKISystem (a generated model) sees a memory another
// process added at its next turn, and an erasure by another process at the one after; a third
// process with the user's index loaded sees the erasure at its next search too.
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { createInterface } from "node:readline";
import { join } from "node:path";
import { afterAll, beforeAll, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { DKISystem } from "../src/dki/index.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import type { Embedder } from "../src/memory/types.js";
import { repoRoot, tempDir } from "./support/paths.js";

interface Line {
  ok: boolean;
  ready?: boolean;
  result?: unknown;
  error?: { name: string; message: string };
}

const CHILD = join(repoRoot, "test/support/memory-store-child.mjs");
const DIST = join(repoRoot, "dist");

/** Runs a child over a list of commands; resolves with its lines once it exits 0. */
function runCommands(dir: string, options: object, commands: object[]): Promise<Line[]> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CHILD, DIST, dir, JSON.stringify(options), JSON.stringify(commands)], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr.on("data", (d: Buffer) => (err += d.toString()));
    child.on("error", reject);
    child.on("close", (code, signal) => {
      if (code !== 0) reject(new Error(`child exited ${code} (signal ${signal}): ${out.slice(-2000)} ${err.slice(-2000)}`));
      else resolve(out.split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as Line));
    });
  });
}

/** A child that keeps the store open and answers one command at a time. */
class StoreProcess {
  private readonly child: ChildProcessWithoutNullStreams;
  private readonly lines: AsyncIterator<string>;

  constructor(dir: string, options: object = {}) {
    this.child = spawn(process.execPath, [CHILD, DIST, dir, JSON.stringify(options)], { stdio: ["pipe", "pipe", "pipe"] });
    this.lines = createInterface({ input: this.child.stdout })[Symbol.asyncIterator]();
  }

  private async next(): Promise<Line> {
    const { value, done } = await this.lines.next();
    if (done) throw new Error("the store process ended");
    return JSON.parse(value as string) as Line;
  }

  async ready(): Promise<void> {
    expect(await this.next()).toMatchObject({ ok: true, ready: true });
  }

  async send<T>(command: object): Promise<T> {
    this.child.stdin.write(JSON.stringify(command) + "\n");
    const line = await this.next();
    if (!line.ok) throw new Error(`${JSON.stringify(command)}: ${line.error?.name}: ${line.error?.message}`);
    return line.result as T;
  }

  async close(): Promise<void> {
    await this.send({ op: "close" });
    this.child.stdin.end();
  }
}

type Dump = Record<string, { id: string; userId: string; text: string; hits: string[] }[]>;

test("8 processes × 100 concurrent adds to one new store: all 800 there and each found by its own text from a ninth process", async () => {
  const dir = join(tempDir(), "store");
  // HNSW from 40 memories a user, so the writers also save index files of the same users at once.
  const options = { hnswFrom: 40, indexFlushDelayMs: 20 };
  const writers = Array.from({ length: 8 }, (_, p) => {
    const userId = `u${p % 4}`;
    // A word of its own in each text (p3x17q), so each is its own text's best match.
    const texts = Array.from({ length: 100 }, (_, i) => `process ${p} memory ${i}: note p${p}x${i}q about the ${["kite", "heron", "maple", "violin"][i % 4]}`);
    return runCommands(dir, options, [{ op: "addMany", userId, texts, searchEvery: 10 }]).then((lines) => ({ userId, texts, result: lines[1].result as { ids: string[]; misses: string[] } }));
  });
  const added = await Promise.all(writers);
  const expected = new Map<string, { userId: string; text: string }>();
  for (const w of added) {
    expect(w.result.ids).toHaveLength(100);
    // Each writer found its own latest add at its next search, whatever the others wrote between.
    expect(w.result.misses).toEqual([]);
    w.result.ids.forEach((id, i) => expected.set(id, { userId: w.userId, text: w.texts[i] }));
  }
  expect(expected.size).toBe(800);

  const [, dump] = await runCommands(dir, options, [{ op: "dump" }]);
  const found = new Map<string, { userId: string; text: string }>();
  const notFound: string[] = [];
  for (const [userId, memories] of Object.entries(dump.result as Dump)) {
    for (const m of memories) {
      found.set(m.id, { userId, text: m.text });
      if (!m.hits.includes(m.id)) notFound.push(m.id);
    }
  }
  expect(found).toEqual(expected);
  expect(notFound).toEqual([]);
}, 300_000);

let model: Model;
beforeAll(async () => {
  const modelDir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: modelDir, seed: 7 });
  model = await Model.load(modelDir, { contextSize: 1024 });
});
afterAll(() => model?.dispose());

test("an open chat session sees another process's add at its next turn and another's erasure at the one after; so does a third process", async () => {
  const dataDir = join(tempDir(), "store");
  const sys = await DKISystem.open({ model, dataDir, config: { generationReserve: 64, gating: { relevanceThreshold: 0 } } });
  const other = new StoreProcess(dataDir);
  try {
    await sys.memories.add("Bob plays the cello in a jazz band.", { userId: "bob" });
    const query = "Any tips for hiking in the Alps with a peanut allergy?";
    const first = await sys.chat(query, { userId: "alice", sessionId: "s", maxNewTokens: 1 });
    expect(first.memoriesUsed).toEqual([]);

    await other.ready();
    const [, added] = await runCommands(dataDir, {}, [{ op: "add", userId: "alice", text: "Alice loves hiking in the Alps and is allergic to peanuts." }]);
    const id = (added.result as { id: string }).id;
    const second = await sys.chat(query, { userId: "alice", sessionId: "s", maxNewTokens: 1 });
    expect(second.memoriesUsed.map((m) => m.id)).toEqual([id]);
    // The third process loads alice's index now, before the erasure.
    expect((await other.send<{ id: string }[]>({ op: "search", userId: "alice", query })).map((h) => h.id)).toEqual([id]);

    await runCommands(dataDir, {}, [{ op: "erase", userId: "alice" }]);
    const third = await sys.chat(query, { userId: "alice", sessionId: "t", maxNewTokens: 1 });
    expect(third.memoriesUsed).toEqual([]);
    expect(await sys.memories.search(query, { userId: "alice" })).toEqual([]);
    expect(await other.send({ op: "search", userId: "alice", query })).toEqual([]);
    // Bob's memory is untouched, everywhere.
    expect((await other.send<{ text: string }[]>({ op: "search", userId: "bob", query: "cello jazz" })).map((h) => h.text)).toEqual(["Bob plays the cello in a jazz band."]);
  } finally {
    await other.close();
    await sys.close();
  }
}, 120_000);

test("re-embedding takes in memories other processes add meanwhile, then refuses their writes and searches with the previous embedder", async () => {
  const dir = join(tempDir(), "store");
  const before = await MemoryStore.open({ dir });
  await before.memories.add("the old red kite", { userId: "u" });
  const other = new StoreProcess(dir);
  await other.ready();
  // The re-embedding's embedder holds its first batch until the other process has added one more.
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const inner = new HashingEmbedder({ dim: 128 });
  let calls = 0;
  const slow: Embedder = { id: inner.id, dim: inner.dim, embed: async (texts) => (calls++ === 0 ? held.then(() => inner.embed(texts)) : inner.embed(texts)) };
  const opening = MemoryStore.open({ dir, embedder: slow, reembed: true });
  while (calls === 0) await new Promise((r) => setTimeout(r, 10));
  const { id } = await other.send<{ id: string }>({ op: "add", userId: "u", text: "a blue heron added meanwhile" });
  release();
  const after = await opening;
  try {
    // The memory added during the re-embedding has a vector of the new embedder: found by search.
    expect((await after.memories.search("blue heron", { userId: "u", limit: 1 }))[0].memory.id).toBe(id);
    expect((await after.memories.search("red kite", { userId: "u", limit: 1 }))[0].memory.text).toBe("the old red kite");
    expect(after.systemAudit().filter((a) => a.action === "store_reembed").map((a) => a.metadata)).toEqual([{ from: new HashingEmbedder().id, to: inner.id, memories: 2 }]);
    // Processes still on the previous embedder are refused, in this process and another.
    await expect(before.memories.add("too late", { userId: "u" })).rejects.toThrow(/was re-embedded with embedder hashing-v1-d128 \(128 dimensions\) by another process/);
    await expect(before.memories.search("kite", { userId: "u" })).rejects.toThrow(/re-embedded/);
    await expect(other.send({ op: "add", userId: "u", text: "too late" })).rejects.toThrow(/MemoryStoreError: .*re-embedded/);
    expect((await after.memories.getAll({ userId: "u" })).map((m) => m.text).sort()).toEqual(["a blue heron added meanwhile", "the old red kite"]);
  } finally {
    await other.close();
    await before.close();
    await after.close();
  }
});
