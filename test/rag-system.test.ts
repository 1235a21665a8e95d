// RAGSystem end to end on a generated model, the real memory store (LMDB, hashing embedder) and
// the knowledge base: the same routing as DKISystem (same memories for the same user and query),
// the prompt it builds, what a turn records, history, streaming, knowledge-base chunks as text
// (numbered, with sources) and as K/V, and bad input.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { DKISystem, routeMemories } from "../src/dki/index.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import type { Reranker } from "../src/memory/types.js";
import { RAGSystem } from "../src/rag/rag-system.js";
import { buildRagPrompt } from "../src/rag/prompt-builder.js";
import { KnowledgeBase } from "../src/rag/kb/knowledge-base.js";
import { tempDir } from "./support/paths.js";

let model: Model;
let kb: KnowledgeBase;
const openStore = (o: { dir: string }) => MemoryStore.open(o);

beforeAll(async () => {
  const dir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 21 });
  model = await Model.load(dir, { contextSize: 2048 });
  kb = await KnowledgeBase.open({ dir: tempDir(), embedder: new HashingEmbedder(), tokenizer: model.tokenizer });
  await kb.ingestText("# Leave\nEvery employee gets 25 days of paid vacation a year.\n# Parking\nThe garage has 120 spaces assigned by lottery.", { collection: "handbook", docId: "handbook.md", docType: "markdown" });
  await kb.ingestText("The canteen serves a vegan dish every day.", { collection: "handbook", docId: "canteen.txt" });
});
afterAll(async () => {
  await kb.close();
  model.dispose();
});

const MEMORIES = ["Alice loves hiking in the Alps.", "Alice is allergic to peanuts.", "Alice plays the cello in a jazz band.", "Alice lives in Lyon and cycles to work.", "Alice's favourite food is ramen."];
const QUERY = "What should I pack for hiking given my peanut allergy?";

async function seed(data: string): Promise<void> {
  const store = await MemoryStore.open({ dir: data });
  for (const m of MEMORIES) await store.memories.add(m, { userId: "alice" });
  await store.memories.add("Bob collects stamps and hikes in Norway.", { userId: "bob" });
  await store.close();
}

describe("RAGSystem", () => {
  test("same user, memories and query: DKI and RAG use the same memory set (shared routing)", async () => {
    const data = tempDir();
    await seed(data);
    const config = { maxMemories: 3, historyEnabled: false, preferenceEnabled: false, gating: { relevanceThreshold: 0 } };
    const rag = await RAGSystem.open({ model, dataDir: data, config, openStore });
    const r = await rag.chat(QUERY, { userId: "alice", sessionId: "s1", maxNewTokens: 4 });
    const routed = await routeMemories(rag.store, QUERY, { userId: "alice", limit: 3 });
    const searched = await rag.searchMemories(QUERY, { userId: "alice" });
    const stats = rag.stats();
    await rag.close();
    const dki = await DKISystem.open({ model, dataDir: data, cacheDir: tempDir(), config, openStore });
    const d = await dki.chat(QUERY, { userId: "alice", sessionId: "s2", maxNewTokens: 4, forceAlpha: 1 });
    await dki.close();
    expect(r.memoriesUsed).toHaveLength(3);
    expect(r.memoriesUsed.map((m) => m.id)).toEqual(routed.map((x) => x.memory.id));
    expect(searched.map((x) => x.memory.id)).toEqual(routed.map((x) => x.memory.id));
    expect(stats.turns).toBe(1);
    expect(stats.meanLatency.ttftMs).toBe(r.latency.ttftMs);
    expect(d.memoriesUsed.map((m) => m.id)).toEqual(r.memoriesUsed.map((m) => m.id));
    expect(r.memoriesUsed.map((m) => m.text)).not.toContain("Bob collects stamps and hikes in Norway.");
    // RAG spends prompt tokens on them; DKI spends none.
    expect(r.metadata.contextTokens).toBeGreaterThan(0);
    expect(r.inputTokens).toBeGreaterThan(d.inputTokens);
    for (const m of r.memoriesUsed) expect(r.promptInfo.finalPrompt).toContain(m.text);
    for (const m of d.memoriesUsed) expect(d.metadata.hybridInjection.finalInput).not.toContain(m.text);
  });

  test("memoryRerank: both systems route the reranker's choice among a deeper search's candidates, keeping the search's scores", async () => {
    const data = tempDir();
    await seed(data);
    const config = { maxMemories: 2, historyEnabled: false, preferenceEnabled: false, gating: { relevanceThreshold: 0 } };
    // Scores by topic, whatever the query says: the routed set can only come from it.
    const seen: number[] = [];
    const reranker: Reranker = {
      id: "topic",
      score: async (_q, ps) => (seen.push(ps.length), ps.map((p) => (p.includes("ramen") ? 0.9 : p.includes("peanuts") ? 0.8 : 0.1))),
      close: async () => {},
    };
    const searched = await (async () => {
      const store = await MemoryStore.open({ dir: data });
      try {
        return await routeMemories(store, QUERY, { userId: "alice", limit: 5 });
      } finally {
        await store.close();
      }
    })();
    const rag = await RAGSystem.open({ model, dataDir: data, config, openStore, memoryRerank: { reranker } });
    const r = await rag.chat(QUERY, { userId: "alice", sessionId: "s1", maxNewTokens: 2 });
    const routed = await rag.searchMemories(QUERY, { userId: "alice" });
    const shallow = await routeMemories(rag.store, QUERY, { userId: "alice", limit: 2, rerank: { reranker, depth: 2 } });
    await rag.close();
    const dki = await DKISystem.open({ model, dataDir: data, cacheDir: tempDir(), config, openStore, memoryRerank: { reranker } });
    const d = await dki.chat(QUERY, { userId: "alice", sessionId: "s2", maxNewTokens: 2, forceAlpha: 1 });
    await dki.close();
    const text = (id: string) => searched.find((x) => x.memory.id === id)!.memory.text;
    // The search ranks hiking, peanuts, ramen (the other two share nothing with the query and are not found).
    expect(searched.map((x) => x.memory.text)).toEqual([MEMORIES[0], MEMORIES[1], MEMORIES[4]]);
    expect(routed.map((x) => text(x.memory.id))).toEqual([MEMORIES[4], MEMORIES[1]]);
    expect(routed.map((x) => x.score)).toEqual(routed.map((x) => searched.find((y) => y.memory.id === x.memory.id)!.score));
    expect(r.memoriesUsed.map((m) => m.id)).toEqual(routed.map((x) => x.memory.id));
    expect(d.memoriesUsed.map((m) => m.id)).toEqual(routed.map((x) => x.memory.id));
    // Depth 20 by default (all 3 the search finds), 2 when asked: the search's best 2 only.
    expect(seen).toEqual([3, 3, 2, 3]);
    expect(shallow.map((x) => x.memory.text)).toEqual([MEMORIES[1], MEMORIES[0]]);
    const bad = (memoryRerank: unknown) => RAGSystem.open({ model, dataDir: tempDir(), openStore, memoryRerank: memoryRerank as never });
    await expect(bad({ reranker: {} })).rejects.toThrow(/memoryRerank.reranker must be a Reranker/);
    await expect(bad({ reranker, depth: 0 })).rejects.toThrow(/memoryRerank.depth must be an integer from 1 to 100, got 0/);
    const short: Reranker = { id: "short", score: async () => [1], close: async () => {} };
    const store = await MemoryStore.open({ dir: data });
    await expect(routeMemories(store, QUERY, { userId: "alice", limit: 2, rerank: { reranker: short } })).rejects.toThrow(/reranker short gave 1 scores for 3 memories/);
    await store.close();
  });

  test('gating.relevanceSignal "rerank": the gate reads the routing reranker\'s scores, which routing returns beside the search\'s', async () => {
    const data = tempDir();
    await seed(data);
    const reranker: Reranker = {
      id: "topic",
      score: async (_q, ps) => ps.map((p) => (p.includes("ramen") ? 0.9 : p.includes("peanuts") ? 0.8 : 0.1)),
      close: async () => {},
    };
    const store = await MemoryStore.open({ dir: data });
    const routed = await routeMemories(store, QUERY, { userId: "alice", limit: 2, rerank: { reranker } });
    const plain = await routeMemories(store, QUERY, { userId: "alice", limit: 2 });
    await store.close();
    expect(routed.map((r) => r.rerank)).toEqual([0.9, 0.8]);
    expect(plain.every((r) => r.rerank === undefined)).toBe(true);
    const open = (tau: number | undefined, rerank = true) =>
      DKISystem.open({
        model, dataDir: data, cacheDir: tempDir(), openStore, ...(rerank ? { memoryRerank: { reranker } } : {}),
        config: { maxMemories: 2, historyEnabled: false, preferenceEnabled: false, gating: { relevanceSignal: "rerank", alphaMin: 1, alphaMax: 1, ...(tau === undefined ? {} : { relevanceThreshold: tau }) } },
      });
    // τ 0.85: ramen (0.9) opens the gate and is injected; peanuts (0.8) is below τ and left out, saying so.
    const dki = await open(0.85);
    const d = await dki.chat(QUERY, { userId: "alice", sessionId: "s1", maxNewTokens: 2 });
    // τ 0.95: no memory is relevant enough: nothing is injected.
    const none = await dki.chat(QUERY, { userId: "alice", sessionId: "s2", maxNewTokens: 2, relevanceThreshold: 0.95 });
    await dki.close();
    expect(d.gating.inject).toBe(true);
    expect(d.gating.relevance).toBe(0.9);
    expect(d.memoriesUsed.map((m) => [m.text, m.relevance])).toEqual([[MEMORIES[4], 0.9]]);
    expect(d.metadata.memoriesLeftOut).toEqual([{ id: routed[1]!.memory.id, reason: "relevance 0.800 is below the threshold 0.850" }]);
    expect(none.gating.inject).toBe(false);
    expect(none.memoriesUsed).toEqual([]);
    // Without a reranker there is nothing to read; without its own τ, the embedder's (for cosines) would be taken.
    await expect(open(0.5, false)).rejects.toThrow(/relevanceSignal "rerank" gates on the routing reranker's scores: give memoryRerank/);
    await expect(open(undefined)).rejects.toThrow(/relevanceSignal "rerank" needs config.gating.relevanceThreshold/);
  });

  test("a turn: the seed's prompt, streamed tokens, TTFT, and user/assistant/audit rows with injection_mode rag", async () => {
    const data = tempDir();
    await seed(data);
    const rag = await RAGSystem.open({ model, dataDir: data, config: { maxMemories: 2, systemPrompt: "You are a travel assistant." }, rag: { layout: "seed" }, openStore });
    const streamed: string[] = [];
    const r1 = await rag.chat(QUERY, { userId: "alice", sessionId: "trip", maxNewTokens: 6, onToken: (t) => streamed.push(t) });
    expect(streamed.join("")).toBe(r1.text);
    expect(r1.outputTokens).toBeGreaterThan(0);
    expect(r1.latency.ttftMs).toBeGreaterThan(0);
    expect(r1.latency.ttftMs).toBeLessThanOrEqual(r1.latency.totalMs);
    // The prompt is exactly what the builder makes of the routed memories (seed 000 §4 layout).
    const expected = buildRagPrompt(model.tokenizer, { query: QUERY, systemPrompt: "You are a travel assistant.", contexts: r1.memoriesUsed.map((m) => m.text), history: [] }, { maxContext: 2048, layout: "seed" });
    expect(r1.promptInfo).toEqual(expected.info);
    expect(r1.promptInfo.finalPrompt.startsWith("System: You are a travel assistant.\n\nRelevant information:\n[1] ")).toBe(true);
    expect(r1.inputTokens).toBe(expected.tokens.length);
    // Second turn: the first is history, newest last.
    const r2 = await rag.chat("And for cycling?", { userId: "alice", sessionId: "trip", maxNewTokens: 3 });
    expect(r2.promptInfo.historyMessages).toEqual([
      { role: "user", content: QUERY },
      { role: "assistant", content: r1.text },
    ]);
    expect(r2.promptInfo.finalPrompt).toContain(`Previous conversation:\nUser: ${QUERY}\nAI: ${r1.text}`);
    // A turn started while the session's last one is still running waits for it, and sees it.
    const [r3, r4] = await Promise.all([rag.chat("And for sailing?", { userId: "alice", sessionId: "trip", maxNewTokens: 3 }), rag.chat("Thanks!", { userId: "alice", sessionId: "trip", maxNewTokens: 1 })]);
    expect(r4.promptInfo.historyMessages.slice(-2)).toEqual([
      { role: "user", content: "And for sailing?" },
      { role: "assistant", content: r3.text },
    ]);
    // DKI's history switch applies to RAG too.
    const noHistory = await RAGSystem.open({ model, dataDir: tempDir(), config: { historyEnabled: false }, openStore });
    await noHistory.chat(QUERY, { userId: "alice", sessionId: "h", maxNewTokens: 1 });
    expect((await noHistory.chat(QUERY, { userId: "alice", sessionId: "h", maxNewTokens: 1 })).promptInfo.historyMessages).toEqual([]);
    await noHistory.close();
    const turns = await rag.store.conversations.list({ userId: "alice", sessionId: "trip" });
    expect(turns.map((t) => [t.role, t.content])).toEqual([
      ["user", QUERY],
      ["assistant", r1.text],
      ["user", "And for cycling?"],
      ["assistant", r2.text],
      ["user", "And for sailing?"],
      ["assistant", r3.text],
      ["user", "Thanks!"],
      ["assistant", r4.text],
    ]);
    expect(turns[1].injectionMode).toBe("rag");
    expect(turns[1].memoryIds).toEqual(r1.memoriesUsed.map((m) => m.id));
    expect(turns[1].latencyMs).toBeGreaterThan(0);
    const audit = await rag.store.audit.list({ userId: "alice", action: "rag_generate" });
    expect(audit).toHaveLength(4);
    expect(audit[0].memoryIds).toEqual(r1.memoriesUsed.map((m) => m.id));
    expect(audit[0].mode).toBe("rag");
    // Bob's turn sees none of Alice's memories or history.
    const b = await rag.chat(QUERY, { userId: "bob", sessionId: "trip", maxNewTokens: 2 });
    expect(b.memoriesUsed.map((m) => m.text)).toEqual(["Bob collects stamps and hikes in Norway."]);
    expect(b.promptInfo.historyMessages).toEqual([]);
    await rag.close();
  });

  test("a window too small for the system prompt: forced fallback to the bare query, reported", async () => {
    const data = tempDir();
    await seed(data);
    const small = await Model.load(model.info.dir, { contextSize: 600 });
    const rag = await RAGSystem.open({ model: small, dataDir: data, config: { maxMemories: 2, systemPrompt: "Be helpful. ".repeat(60) }, rag: { layout: "seed" }, openStore });
    const r = await rag.chat(QUERY, { userId: "alice", sessionId: "s", maxNewTokens: 2 });
    expect(r.metadata.forcedFallback).toBe(true);
    expect(r.promptInfo.finalPrompt).toBe(`User: ${QUERY}\nAI:`);
    expect(r.memoriesUsed).toEqual([]);
    expect(r.metadata.warnings[0]).toMatch(/forced fallback to the bare query/);
    await rag.close();
    small.dispose();
  });

  test("knowledge-base chunks: numbered with sources in the prompt (text), or injected as K/V with no prompt tokens (kv)", async () => {
    const data = tempDir();
    await seed(data);
    const rag = await RAGSystem.open({ model, dataDir: data, config: { maxMemories: 1 }, rag: { layout: "seed", kbTopK: 2 }, openStore, knowledgeBase: kb });
    const text = await rag.chat("How many vacation days do I get?", { userId: "alice", sessionId: "kb1", maxNewTokens: 3, collection: "handbook", useMemories: false });
    expect(text.sources.map((s) => s.kind)).toEqual(["chunk", "chunk"]);
    const first = text.sources[0] as Extract<(typeof text.sources)[number], { kind: "chunk" }>;
    expect(first.docId).toBe("handbook.md");
    expect(first.headingPath).toEqual(["Leave"]);
    expect(text.promptInfo.retrievedContext).toMatch(/^Relevant information:\n\[1\] \(source: handbook\.md › Leave\) # Leave\nEvery employee gets 25 days/);
    const kv = await rag.chat("How many vacation days do I get?", { userId: "alice", sessionId: "kb2", maxNewTokens: 3, collection: "handbook", kbMode: "kv", useMemories: false });
    expect(kv.metadata.injectedTokens).toBeGreaterThan(0);
    expect(kv.metadata.contextTokens).toBe(0);
    expect(kv.promptInfo.finalPrompt).not.toContain("25 days");
    expect(kv.inputTokens).toBeLessThan(text.inputTokens);
    expect(kv.sources.map((s) => (s.kind === "chunk" ? s.chunkId : ""))).toEqual(text.sources.map((s) => (s.kind === "chunk" ? s.chunkId : "")));
    // The second kv turn finds the chunk blocks in the cache.
    const again = await rag.chat("How many vacation days do I get?", { userId: "alice", sessionId: "kb3", maxNewTokens: 3, collection: "handbook", kbMode: "kv", useMemories: false });
    expect(again.latency.kvComputeMs).toBe(0);
    expect(again.latency.kvLoadMs.L1).toBeGreaterThanOrEqual(0);
    const audit = await rag.store.audit.list({ userId: "alice", action: "rag_generate" });
    expect(audit.at(-1)!.metadata).toMatchObject({ kbMode: "kv", collection: "handbook" });
    // Multi-query and HyDE with this system's own model: the original query searches first, and
    // whatever the (random-weight) model wrote is searched too without breaking the turn.
    const expanded = await rag.chat("How many vacation days do I get?", { userId: "alice", sessionId: "kb4", maxNewTokens: 2, collection: "handbook", useMemories: false, kbMultiQuery: 2, kbHyde: true });
    expect(expanded.metadata.kbQueries[0]).toBe("How many vacation days do I get?");
    expect(expanded.metadata.kbQueries.length).toBeLessThanOrEqual(3);
    expect(expanded.sources.length).toBeGreaterThan(0);
    await rag.close();
  });

  test("bad input: clear errors, nothing recorded", async () => {
    const data = tempDir();
    await seed(data);
    const rag = await RAGSystem.open({ model, dataDir: data, openStore });
    await expect(rag.chat("  ", { userId: "alice", sessionId: "s" })).rejects.toThrow(/query must be a non-empty string/);
    await expect(rag.chat("q", { userId: "", sessionId: "s" })).rejects.toThrow(/userId/);
    await expect(rag.chat("q", { userId: "alice", sessionId: "s", collection: "handbook" })).rejects.toThrow(/no knowledge base/);
    await expect(rag.chat("q", { userId: "alice", sessionId: "s", kbMode: "kv" })).rejects.toThrow(/kbMode needs a collection/);
    const abort = new AbortController();
    abort.abort(new Error("stop"));
    await expect(rag.chat(QUERY, { userId: "alice", sessionId: "s", signal: abort.signal })).rejects.toThrow();
    expect(await rag.store.conversations.list({ userId: "alice", sessionId: "s" })).toEqual([]);
    await rag.close();
    await expect(RAGSystem.open({ model, dataDir: data, rag: { contextShare: 2 }, openStore })).rejects.toThrow(/contextShare/);
  });
});
