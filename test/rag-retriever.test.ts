// The retriever interface RAGSystem uses: InMemoryRetriever (a real BM25 retriever in memory, for
// tests of code built on the library) on its own and under RAGSystem; the KnowledgeBase under
// RAGSystem scoped to the turn's user (another tenant's collection is never searched); and
// rag.enabled false, which turns retrieval off.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { RAGSystem, resolveRagConfig } from "../src/rag/rag-system.js";
import { KnowledgeBase } from "../src/rag/kb/knowledge-base.js";
import { InMemoryRetriever } from "../src/rag/kb/in-memory-retriever.js";
import { tempDir } from "./support/paths.js";

let model: Model;
beforeAll(async () => {
  const dir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 21 });
  model = await Model.load(dir, { contextSize: 2048 });
});
afterAll(() => {
  model.dispose();
});

const DOCS = [
  { id: "leave", text: "Every employee gets 25 days of paid vacation a year.", metadata: { category: "hr" } },
  { id: "parking", text: "The garage has 120 parking spaces assigned by lottery.", metadata: { category: "facilities" } },
  { id: "canteen", text: "The canteen serves a vegan dish every day.", metadata: { category: "facilities" } },
  { id: "停车", text: "公司车库有一百二十个停车位，每年抽签分配。", metadata: { category: "facilities" } },
];

describe("InMemoryRetriever", () => {
  test("ranks by BM25 over CJK-aware terms, filters, thresholds and limits; records its calls", async () => {
    const r = new InMemoryRetriever({ handbook: DOCS });
    const top = await r.retrieve("how many vacation days a year", { collection: "handbook", userId: "u1" });
    expect(top.results[0].chunk.docId).toBe("leave");
    expect(top.results[0].score).toBe(1);
    expect(top.queries).toEqual(["how many vacation days a year"]);
    expect((await r.retrieve("停车位 抽签", { collection: "handbook", userId: "u1", limit: 1 })).results.map((x) => x.chunk.docId)).toEqual(["停车"]);
    const facilities = await r.retrieve("garage parking canteen vegan", { collection: "handbook", userId: "u1", filter: { eq: { category: "facilities" } } });
    expect(facilities.results.map((x) => x.chunk.docId).sort()).toEqual(["canteen", "parking"]);
    expect((await r.retrieve("garage parking canteen", { collection: "handbook", userId: "u1", filter: { eq: { category: "hr" } } })).results).toEqual([]);
    const strict = await r.retrieve("garage parking spaces canteen", { collection: "handbook", userId: "u1", minScore: 0.99 });
    expect(strict.results.map((x) => x.chunk.docId)).toEqual(["parking"]);
    expect(top.results[0].source).toEqual({ chunkId: "leave", docId: "leave", collection: "handbook", start: 0, end: DOCS[0].text.length, headingPath: [] });
    // Replace and remove.
    r.add("handbook", { id: "leave", text: "Employees get 30 days of leave." });
    expect((await r.retrieve("leave days", { collection: "handbook", userId: "u1" })).results[0].chunk.text).toBe("Employees get 30 days of leave.");
    expect(r.remove("handbook", "leave")).toBe(true);
    expect((await r.retrieve("leave days employees", { collection: "handbook", userId: "u1" })).results.some((x) => x.chunk.docId === "leave")).toBe(false);
    expect(r.calls.length).toBe(7);
    expect(r.calls[0]).toEqual({ query: "how many vacation days a year", options: { collection: "handbook", userId: "u1" } });
  });

  test("bad input and unsupported options are refused by name; tenants' collections are not found by others", async () => {
    const r = new InMemoryRetriever();
    r.createCollection("alice-notes", { owner: { userId: "alice" } });
    r.add("alice-notes", { id: "n1", text: "Alice's locker code is 4411." });
    r.add("shared", { id: "s1", text: "The locker room opens at seven." });
    expect((await r.retrieve("locker code", { collection: "alice-notes", userId: "alice" })).results[0].chunk.docId).toBe("n1");
    await expect(r.retrieve("locker code", { collection: "alice-notes", userId: "bob" })).rejects.toThrow(/^no collection "alice-notes"; collections: shared$/);
    await expect(r.retrieve("x", { collection: "shared", userId: "u", filter: { eq: { colour: "red" } } })).rejects.toThrow(/filter: unknown field "colour"/);
    await expect(r.retrieve("x", { collection: "shared", userId: "u", mode: "dense" })).rejects.toThrow(/BM25 only/);
    await expect(r.retrieve("x", { collection: "shared", userId: "u", expand: { multiQuery: 2, generate: async () => "" } })).rejects.toThrow(/does not expand queries/);
    await expect(r.retrieve(" ", { collection: "shared", userId: "u" })).rejects.toThrow(/non-empty string/);
    await expect(r.retrieve("x", { collection: "shared", userId: "u", limit: 0 })).rejects.toThrow(/limit must be/);
    expect(() => r.add("shared", { id: "", text: "x" })).toThrow(/non-empty string id/);
    expect(() => r.add("shared", { id: "e", text: "  " })).toThrow(/text must be a non-empty string/);
    expect(() => r.add("bad name", { id: "e", text: "x" })).toThrow(/collection name "bad name"/);
    expect(() => r.createCollection("shared")).toThrow(/already exists/);
  });
});

describe("RAGSystem's retriever", () => {
  const config = { historyEnabled: false, preferenceEnabled: false };

  test("an InMemoryRetriever serves a turn as a KnowledgeBase does: chunks numbered in the prompt, asked as the turn's user", async () => {
    const retriever = new InMemoryRetriever({ handbook: DOCS });
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), config, knowledgeBase: retriever });
    const r = await rag.chat("How many vacation days do I get?", { userId: "alice", sessionId: "s1", maxNewTokens: 2, collection: "handbook", kbTopK: 2 });
    await rag.close();
    expect(r.sources[0]).toMatchObject({ kind: "chunk", docId: "leave", collection: "handbook" });
    expect(r.promptInfo.finalPrompt).toContain("25 days of paid vacation");
    expect(retriever.calls).toEqual([{ query: "How many vacation days do I get?", options: { collection: "handbook", limit: 2, filter: undefined, minScore: undefined, userId: "alice" } }]);
  });

  test("a KnowledgeBase collection owned by one user: that user's turns search it, another user's turns fail as for a missing one", async () => {
    const kb = await KnowledgeBase.open({ dir: tempDir(), embedder: new HashingEmbedder(), tokenizer: model.tokenizer });
    await kb.createCollection("alice-private", { owner: { userId: "alice" } });
    await kb.ingestText("Alice's safe combination is 7-19-42.", { collection: "alice-private", docId: "safe" });
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), config, knowledgeBase: kb });
    const mine = await rag.chat("What is the safe combination?", { userId: "alice", sessionId: "s1", maxNewTokens: 2, collection: "alice-private" });
    expect(mine.promptInfo.finalPrompt).toContain("7-19-42");
    await expect(rag.chat("What is the safe combination?", { userId: "bob", sessionId: "s1", maxNewTokens: 2, collection: "alice-private" })).rejects.toThrow(/^no collection "alice-private" \(the knowledge base is empty\)$/);
    const history = await rag.store.conversations.list({ userId: "bob", sessionId: "s1", limit: 10 });
    expect(history).toEqual([]);
    await rag.close();
    await kb.close();
  });

  test("rag.enabled false: no memory and no knowledge-base search, the collection named in a warning; the flag is checked", async () => {
    const data = tempDir();
    const store = await MemoryStore.open({ dir: data });
    await store.memories.add("Alice takes her vacation in August.", { userId: "alice" });
    await store.close();
    const retriever = new InMemoryRetriever({ handbook: DOCS });
    const on = await RAGSystem.open({ model, dataDir: data, config, knowledgeBase: retriever });
    const withRetrieval = await on.chat("When is my vacation?", { userId: "alice", sessionId: "a", maxNewTokens: 2, collection: "handbook" });
    await on.close();
    expect(withRetrieval.memoriesUsed).toHaveLength(1);
    expect(withRetrieval.sources.some((s) => s.kind === "chunk")).toBe(true);
    const off = await RAGSystem.open({ model, dataDir: data, config, knowledgeBase: retriever, rag: { enabled: false } });
    const r = await off.chat("When is my vacation?", { userId: "alice", sessionId: "b", maxNewTokens: 2, collection: "handbook" });
    await off.close();
    expect(r.memoriesUsed).toEqual([]);
    expect(r.sources).toEqual([]);
    expect(r.metadata.collection).toBeNull();
    expect(r.metadata.warnings).toContain('retrieval is disabled (rag.enabled false): collection "handbook" not searched');
    expect(r.promptInfo.finalPrompt).not.toContain("August");
    expect(r.promptInfo.finalPrompt).not.toContain("25 days");
    expect(retriever.calls).toHaveLength(1);
    expect(() => resolveRagConfig({ enabled: "no" as never })).toThrow(/rag\.enabled must be true or false, got "no"/);
  });
});
