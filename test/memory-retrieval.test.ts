// Retrieval: quality on a labelled corpus (printed), and the retrieval pieces' behaviour (fusion,
// filters inside the search, a scope moving from an exact scan to HNSW).
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it, test } from "vitest";
import { MemoryStore } from "../src/memory/memory-store.js";
import { Bm25Index } from "../src/memory/retrieval/bm25.js";
import { FlatIndex } from "../src/memory/retrieval/flat-index.js";
import { fuse, type Fusion } from "../src/memory/retrieval/fusion.js";
import { VectorIndex } from "../src/memory/retrieval/vector-index.js";
import { terms } from "../src/memory/text-terms.js";
import { MEMORIES, QUESTIONS } from "./support/memory-corpus.js";
import { tempDir } from "./support/paths.js";
import { prng } from "./support/prng.js";

describe("retrieval quality on a labelled corpus", () => {
  let store: MemoryStore;
  let ids: string[];
  beforeAll(async () => {
    store = await MemoryStore.open({ dir: tempDir(), durability: "commit" });
    ids = (await store.memories.add(MEMORIES.map((content) => ({ role: "user" as const, content })), { userId: "u" })).map((m) => m.id);
  });
  afterAll(() => store.close());

  const modes: Record<string, Fusion> = {
    "dense only": { method: "rrf", weights: { dense: 1, bm25: 0 } },
    "BM25 only": { method: "rrf", weights: { dense: 0, bm25: 1 } },
    "hybrid RRF": { method: "rrf" },
    "hybrid weighted": { method: "weighted" },
  };

  test(`hybrid recall@5 is at least dense-only's and BM25-only's (${QUESTIONS.length} questions, English and Chinese)`, async () => {
    expect(QUESTIONS.length).toBeGreaterThanOrEqual(50);
    const recall: Record<string, number> = {};
    const lines: string[] = [];
    for (const [name, fusion] of Object.entries(modes)) {
      let hits = 0;
      let rr = 0;
      for (const [q, answer] of QUESTIONS) {
        const found = (await store.memories.search(q, { userId: "u", limit: 5, fusion })).map((r) => r.memory.id);
        const rank = found.indexOf(ids[answer]);
        if (rank >= 0) {
          hits++;
          rr += 1 / (rank + 1);
        }
      }
      recall[name] = hits / QUESTIONS.length;
      lines.push(`${name.padEnd(16)} recall@5 ${(recall[name] * 100).toFixed(1)}% (${hits}/${QUESTIONS.length})  MRR@5 ${(rr / QUESTIONS.length).toFixed(3)}`);
    }
    console.log(`memory retrieval, ${MEMORIES.length} memories, hashing embedder:\n  ${lines.join("\n  ")}`);
    expect(recall["hybrid RRF"]).toBeGreaterThanOrEqual(recall["dense only"]);
    expect(recall["hybrid RRF"]).toBeGreaterThanOrEqual(recall["BM25 only"]);
    expect(recall["hybrid weighted"]).toBeGreaterThanOrEqual(Math.min(recall["dense only"], recall["BM25 only"]));
  });

  it("filters inside the search: a selective filter still fills the results", async () => {
    const s = await MemoryStore.open({ dir: tempDir(), durability: "commit", hnswFrom: 0 });
    try {
      // 300 memories about the same thing; only 5 carry the tag. A post-filter over the top 40
      // would return few or none of them.
      await s.memories.add(Array.from({ length: 300 }, (_, i) => ({ role: "user" as const, content: `note ${i} about the garden and the roses` })), { userId: "u" });
      const tagged = await s.memories.add(Array.from({ length: 5 }, (_, i) => ({ role: "user" as const, content: `tagged note ${i} on tax forms` })), { userId: "u", metadata: { tag: "x" } });
      const found = await s.memories.search("garden roses", { userId: "u", limit: 5, filter: { eq: { tag: "x" } } });
      expect(found.map((r) => r.memory.id).sort()).toEqual(tagged.map((m) => m.id).sort());
    } finally {
      await s.close();
    }
  });
});

describe("retrieval pieces", () => {
  it("fuses by reciprocal rank or by weights, each score in [0, 1]", () => {
    const c = [
      { dense: 0.9, bm25: 0, recency: 1 },
      { dense: 0.5, bm25: 1, recency: 0.5 },
      { dense: 0.1, bm25: 0.5, recency: 0 },
    ];
    const rrf = fuse(c, { method: "rrf", k: 0 });
    // k 0: rank 1 in both signals would score 1; the second is rank 2 dense and rank 1 BM25.
    expect(rrf[1]).toBeCloseTo((1 / 2 + 1 / 1) / 2);
    expect(rrf[0]).toBeCloseTo(1 / 1 / 2); // found by dense only
    expect(fuse(c, { method: "weighted", weights: { dense: 1, bm25: 1, recency: 2 } })[0]).toBeCloseTo((0.9 + 0 + 2) / 4);
    for (const s of [...rrf, ...fuse(c, { method: "weighted" })]) expect(s >= 0 && s <= 1).toBe(true);
    expect(() => fuse(c, { method: "weighted", weights: { dense: -1 } })).toThrow(/dense must be a finite number >= 0/);
  });

  it("BM25 scores rare terms above common ones and forgets removed documents", () => {
    const bm = new Bm25Index();
    bm.add("a", terms("the cat sat on the mat"));
    bm.add("b", terms("the dog sat on the log"));
    bm.add("c", terms("the cat chased the dog"));
    expect(bm.search(terms("cat mat"), 3).map((h) => h.id)).toEqual(["a", "c"]);
    bm.remove("a");
    expect(bm.search(terms("mat"), 3)).toEqual([]);
    expect(bm.size).toBe(2);
  });

  it("HNSW and the exact scan agree on a random set, and HNSW survives save and load by checksum", () => {
    const rand = prng(9);
    const dim = 32;
    const vec = () => Float32Array.from({ length: dim }, () => rand() * 2 - 1);
    const hnsw = VectorIndex.create(dim);
    const flat = new FlatIndex(dim);
    for (let i = 0; i < 500; i++) {
      const v = vec();
      hnsw.add(`v${i}`, v);
      flat.add(`v${i}`, v);
    }
    for (let i = 0; i < 100; i++) {
      hnsw.remove(`v${i * 5}`);
      flat.remove(`v${i * 5}`);
    }
    let agree = 0;
    for (let q = 0; q < 50; q++) {
      const query = vec();
      const a = hnsw.search(query, 10).map((h) => h.id);
      const b = flat.search(query, 10).map((h) => h.id);
      agree += a.filter((id) => b.includes(id)).length;
    }
    expect(agree / 500).toBeGreaterThan(0.95);
    const base = `${tempDir()}/idx`;
    const checksum = hnsw.save(base);
    const loaded = VectorIndex.load(base, dim, checksum);
    const query = vec();
    expect(loaded.search(query, 10)).toEqual(hnsw.search(query, 10));
    // Files are named by their checksum: another checksum names files that are not there.
    expect(() => VectorIndex.load(base, dim, "0".repeat(64))).toThrow(/is missing/);
    const hnswFile = readdirSync(dirname(base)).find((f) => f.endsWith(".hnsw"))!;
    const bytes = readFileSync(join(dirname(base), hnswFile));
    bytes[bytes.length >> 1] ^= 1;
    writeFileSync(join(dirname(base), hnswFile), bytes);
    expect(() => VectorIndex.load(base, dim, checksum)).toThrow(/do not match the checksum/);
  });

  it("keeps at most maxLoadedIndexes users loaded, saving a changed one before unloading it", async () => {
    const dir = tempDir();
    for (const hnswFrom of [0, 1000]) {
      const reports: unknown[] = [];
      const store = await MemoryStore.open({ dir: `${dir}/${hnswFrom}`, durability: "commit", hnswFrom, maxLoadedIndexes: 2, indexFlushDelayMs: 60_000, onRebuild: (r) => reports.push(r) });
      try {
        for (let round = 0; round < 3; round++) {
          for (let u = 0; u < 5; u++) await store.memories.add(`user ${u} note ${round}: the ${["red", "green", "blue"][round]} kite`, { userId: `u${u}` });
        }
        expect(store.stats().indexesLoaded).toBe(2);
        for (let u = 0; u < 5; u++) {
          const hits = await store.memories.search("green kite", { userId: `u${u}`, limit: 1 });
          expect(hits[0].memory.text).toBe(`user ${u} note 1: the green kite`);
        }
        expect(store.stats().indexesLoaded).toBe(2);
        expect(reports).toEqual([]); // unloaded HNSW indexes were saved, so they load without a rebuild
      } finally {
        await store.close();
      }
    }
  });

  it("moves a user from the exact scan to HNSW when it grows, without a rebuild on reopen", async () => {
    const dir = tempDir();
    let store = await MemoryStore.open({ dir, durability: "commit", hnswFrom: 20 });
    for (let i = 0; i < 25; i++) await store.memories.add(`entry ${i} in the diary of a sailor`, { userId: "u" });
    await store.close();
    store = await MemoryStore.open({ dir, hnswFrom: 20 });
    try {
      expect(store.checkIndexes()).toEqual([]);
      expect((await store.memories.search("entry 17 diary", { userId: "u", limit: 1 }))[0].memory.text).toBe("entry 17 in the diary of a sailor");
    } finally {
      await store.close();
    }
  });
});
