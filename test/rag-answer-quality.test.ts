// Citation confidence (0.4 similarity + 0.4 position + 0.2 coverage), unsupported-claim detection,
// citation formats; the fallbacks (empty retrieval answered without the model, an oversize first
// context cut instead of dropped), batch queries with per-query errors, and the semantic answer
// cache (threshold, scope, TTL on a clock the test moves, bounds), on a generated model.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { KnowledgeBase } from "../src/rag/kb/knowledge-base.js";
import { NO_RELEVANT_INFORMATION, RAGSystem } from "../src/rag/rag-system.js";
import { buildRagPrompt } from "../src/rag/prompt-builder.js";
import { extractCitations, sourceLabel } from "../src/rag/citations.js";
import { citationConfidence, formatCitations, sentences, unsupportedClaims } from "../src/rag/pipeline/citation-quality.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { resolveAnswerCache, SemanticAnswerCache } from "../src/rag/pipeline/answer-cache.js";
import { smollm2Tokenizer, tempDir } from "./support/paths.js";

let model: Model;
let kb: KnowledgeBase;
const openStore = (o: { dir: string }) => MemoryStore.open(o);
const LONG = Array.from({ length: 60 }, (_, i) => `Clause ${i + 1} of the lease says the tenant keeps the garden tidy.`).join(" ");

beforeAll(async () => {
  const dir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 66 });
  model = await Model.load(dir, { contextSize: 2048 });
  kb = await KnowledgeBase.open({ dir: tempDir(), embedder: new HashingEmbedder(), tokenizer: model.tokenizer });
  await kb.ingestText("Lumen Labs employs 40 engineers.", { collection: "firms", docId: "staff.txt" });
  await kb.ingestText(LONG, { collection: "lease", docId: "lease.txt" });
});
afterAll(async () => {
  await kb.close();
  model.dispose();
});

const BLOCKS = [
  { text: "Lumen Labs employs 40 engineers.", score: 0.8 },
  { text: "Marie Dubois founded Lumen Labs.", score: 0.5 },
];
const ANSWER = "Lumen Labs employs 40 engineers [1]. Marie founded it [2]. The garage has 120 spaces for electric cars. Yes.";

describe("citation quality", () => {
  test("sentences keep their markers and offsets", () => {
    const s = sentences(ANSWER);
    expect(s.map((x) => x.sentence)).toEqual(["Lumen Labs employs 40 engineers [1].", "Marie founded it [2].", "The garage has 120 spaces for electric cars.", "Yes."]);
    for (const x of s) expect(ANSWER.slice(x.start, x.end)).toBe(x.sentence);
  });

  test("confidence = 0.4 similarity + 0.4 position + 0.2 coverage", () => {
    const map = extractCitations(ANSWER, ["a", "b"]);
    const c = citationConfidence(ANSWER, map, BLOCKS);
    expect(c.map((x) => x.marker)).toEqual([1, 2]);
    // [1]: retrieval score 0.8, first of 2 blocks, every content term of its sentence in the block.
    expect(c[0]).toMatchObject({ similarity: 0.8, position: 1, coverage: 1 });
    expect(c[0]!.confidence).toBeCloseTo(0.4 * 0.8 + 0.4 * 1 + 0.2 * 1, 12);
    // [2]: 0.5, second of 2 (position 0.5), "marie" and "founded" both in the block ("it" is a stop word).
    expect(c[1]).toMatchObject({ similarity: 0.5, position: 0.5, coverage: 1 });
    expect(c[1]!.confidence).toBeCloseTo(0.6, 12);
    expect(() => citationConfidence("x [3]", extractCitations("x [3]", ["a", "b", "c"]), BLOCKS)).toThrow(/citation \[3\] names no block of the 2 given/);
  });

  test("unsupported claims: the sentence no block covers; short sentences claim nothing", () => {
    const u = unsupportedClaims(ANSWER, BLOCKS);
    expect(u.map((x) => x.sentence)).toEqual(["The garage has 120 spaces for electric cars."]);
    expect(u[0]!.bestCoverage).toBe(0);
    expect(unsupportedClaims(ANSWER, BLOCKS, 0)).toEqual([]);
    expect(() => unsupportedClaims(ANSWER, BLOCKS, 2)).toThrow(/threshold must be in \[0, 1\]/);
  });

  test("formats: markdown, html (escaped), plain, inline; unknown markers stay as written", () => {
    const text = "A <b> fact [1] and another [1, 2]. Unknown [7].";
    const map = extractCitations(text, ["doc-a", "doc-b"]);
    const label = (s: string) => s.toUpperCase();
    expect(formatCitations(text, map, label, "plain")).toBe("A <b> fact [1] and another [1, 2]. Unknown [7].\n\nSources:\n[1] DOC-A\n[2] DOC-B");
    expect(formatCitations(text, map, label, "markdown")).toBe('A <b> fact [[1]](#source-1) and another [[1]](#source-1)[[2]](#source-2). Unknown [7].\n\n<a id="source-1"></a>1. DOC-A\n<a id="source-2"></a>2. DOC-B');
    expect(formatCitations(text, map, label, "html")).toBe(
      '<p>A &lt;b&gt; fact <sup><a href="#source-1">[1]</a></sup> and another <sup><a href="#source-1">[1]</a></sup><sup><a href="#source-2">[2]</a></sup>. Unknown [7].</p>\n<ol><li id="source-1" value="1">DOC-A</li><li id="source-2" value="2">DOC-B</li></ol>',
    );
    expect(formatCitations(text, map, label, "inline")).toBe("A <b> fact (DOC-A) and another (DOC-A; DOC-B). Unknown [7].");
    expect(() => formatCitations(text, map, label, "latex" as "plain")).toThrow(/citation format must be one of markdown, html, plain, inline, got "latex"/);
  });
});

describe("fallbacks", () => {
  test("an oversize first context: seed 000 drops it; truncateFirstContext cuts it to fit, with a warning", async () => {
    const tok = await Tokenizer.fromFolder(smollm2Tokenizer);
    const input = { query: "What does the lease say about the garden?", contexts: [LONG, "short second"] };
    const budget = { maxContext: 400, reserveForGeneration: 100, layout: "seed" as const };
    const dropped = buildRagPrompt(tok, input, budget);
    expect(dropped.contextsUsed).toBe(0);
    const cut = buildRagPrompt(tok, input, { ...budget, truncateFirstContext: true });
    expect(cut.contextsUsed).toBe(1);
    expect(cut.info.retrievedContext).toMatch(/^Relevant information:\n\[1\] Clause 1 of the lease .*…$/);
    expect(cut.tokenCounts.context).toBeLessThanOrEqual(Math.floor(cut.tokenCounts.remaining * 0.5));
    expect(cut.tokens.length).toBeLessThanOrEqual(300);
    expect(cut.warnings[0]).toMatch(/^the first retrieved context was cut to \d+ of \d+ characters to fit the \d+-token context share$/);
    // One that fits is never cut.
    const fits = buildRagPrompt(tok, { ...input, contexts: ["short first"] }, { ...budget, truncateFirstContext: true });
    expect(fits.info.retrievedContext).toBe("Relevant information:\n[1] short first");
  });

  test("in RAGSystem: rag.truncateFirstContext keeps the long chunk, cut", async () => {
    const config = { generationReserve: 1800, historyEnabled: false };
    const plain = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb, config, rag: { layout: "seed" } });
    const a = await plain.chat("garden clause", { userId: "u", sessionId: "s", maxNewTokens: 1, collection: "lease", useMemories: false });
    await plain.close();
    const cutting = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb, config, rag: { layout: "seed", truncateFirstContext: true } });
    const b = await cutting.chat("garden clause", { userId: "u", sessionId: "s", maxNewTokens: 1, collection: "lease", useMemories: false });
    await cutting.close();
    expect(a.metadata.contextsUsed).toBe(0);
    expect(b.metadata.contextsUsed).toBe(1);
    expect(b.promptInfo.retrievedContext).toContain("…");
    expect(b.metadata.warnings.some((w) => w.startsWith("the first retrieved context was cut"))).toBe(true);
  });

  test("empty retrieval with emptyRetrieval 'answer': the fixed reply, no model call, the turn recorded; default generates", async () => {
    const data = tempDir();
    const rag = await RAGSystem.open({ model, dataDir: data, openStore, knowledgeBase: kb });
    const streamed: string[] = [];
    const base = { userId: "u", sessionId: "s", maxNewTokens: 2, collection: "firms", kbMinScore: 0.99, useMemories: false };
    const r = await rag.chat("quantum chromodynamics", { ...base, emptyRetrieval: "answer", onToken: (t) => streamed.push(t) });
    const g = await rag.chat("quantum chromodynamics", base);
    const rows = await rag.store.conversations.list({ userId: "u", sessionId: "s", limit: 10 });
    await rag.close();
    expect(r.text).toBe(NO_RELEVANT_INFORMATION);
    expect(r.metadata.noRelevantInformation).toBe(true);
    expect(r.outputTokens).toBe(0);
    expect(r.sources).toEqual([]);
    expect(streamed).toEqual([NO_RELEVANT_INFORMATION]);
    expect(g.metadata.noRelevantInformation).toBe(false);
    expect(g.outputTokens).toBeGreaterThan(0);
    expect(rows.map((x) => x.content)).toContain(NO_RELEVANT_INFORMATION);
  });

  test("citations option: confidence, unsupported claims and the formatted answer of the turn", async () => {
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb });
    const r = await rag.chat("Lumen Labs engineers", { userId: "u", sessionId: "s", maxNewTokens: 8, collection: "firms", useMemories: false, citations: { format: "plain", unsupportedThreshold: 0.3 } });
    const off = await rag.chat("Lumen Labs engineers", { userId: "u", sessionId: "t", maxNewTokens: 1, collection: "firms" });
    await rag.close();
    const q = r.metadata.citationQuality!;
    const blocks = r.sources.map((s) => ({ text: s.kind === "chunk" ? `(source: ${sourceLabel(s)}) ${kb.getChunk("firms", s.chunkId)!.text}` : "", score: s.score }));
    expect(q.confidence).toEqual(citationConfidence(r.text, r.citations, blocks));
    expect(q.unsupported).toEqual(unsupportedClaims(r.text, blocks, 0.3));
    expect(q.formatted).toBe(formatCitations(r.text, r.citations, (s) => (s.kind === "chunk" ? sourceLabel(s) : ""), "plain"));
    expect(off.metadata.citationQuality).toBeNull();
  });
});

describe("batch", () => {
  test("each query answered or failed on its own, in order", async () => {
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb });
    const items = await rag.batch(["Lumen Labs engineers", "", "garden clause"], { userId: "u", sessionId: "s", maxNewTokens: 1, collection: "firms" });
    await rag.close();
    expect(items.map((i) => [i.index, i.query, i.ok])).toEqual([
      [0, "Lumen Labs engineers", true],
      [1, "", false],
      [2, "garden clause", true],
    ]);
    const bad = items[1]!;
    expect(bad.ok === false && bad.error).toMatch(/query/);
    const ok = items[0]!;
    expect(ok.ok && ok.response.metadata.collection).toBe("firms");
    await expect(rag.batch(["q"], { userId: "u", sessionId: "s" })).rejects.toThrow(/closed/);
  });
});

describe("semantic answer cache", () => {
  const v = (...x: number[]) => Float32Array.from(x);

  test("a hit needs the scope, the threshold and a live entry; the oldest go past maxEntries", () => {
    let now = 1000;
    const c = new SemanticAnswerCache<string>(resolveAnswerCache({ ttlMs: 100, threshold: 0.9, maxEntries: 2, now: () => now }));
    c.store("u1", "q1", v(1, 0), "a1");
    expect(c.lookup("u1", v(1, 0.1))).toMatchObject({ value: "a1", query: "q1", ageMs: 0 });
    expect(c.lookup("u1", v(1, 0.1))!.similarity).toBeCloseTo(1 / Math.sqrt(1.01), 6);
    expect(c.lookup("u1", v(1, 1))).toBeNull(); // cosine 0.707 < 0.9
    expect(c.lookup("u2", v(1, 0))).toBeNull(); // another scope
    now += 100; // exactly the ttl: expired
    expect(c.lookup("u1", v(1, 0))).toBeNull();
    expect(c.size).toBe(0);
    c.store("u1", "a", v(1, 0), "A");
    c.store("u1", "b", v(0, 1), "B");
    c.store("u1", "c", v(-1, 0), "C");
    expect(c.size).toBe(2);
    expect(c.lookup("u1", v(1, 0))).toBeNull(); // "a" was the oldest
    expect(c.lookup("u1", v(0, 1))!.value).toBe("B");
    expect([c.hits, c.misses]).toEqual([3, 4]);
  });

  test("bad options name the problem", () => {
    expect(() => resolveAnswerCache({ ttlMs: 0 })).toThrow(/answerCache.ttlMs must be a positive integer/);
    expect(() => resolveAnswerCache({ threshold: 0 })).toThrow(/answerCache.threshold must be in \(0, 1\]/);
    expect(() => resolveAnswerCache({ maxEntries: 1.5 })).toThrow(/answerCache.maxEntries must be a positive integer/);
  });

  test("in RAGSystem: the same question with the same history is answered from the cache (recorded, no tokens); another user, another history, useCache false or an expired entry is not", async () => {
    let now = 0;
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb, answerCache: { ttlMs: 60_000, now: () => now } });
    const base = { maxNewTokens: 3, collection: "firms" };
    const q = "How many engineers does Lumen Labs employ?";
    const first = await rag.chat(q, { ...base, sessionId: "s1", userId: "u" });
    const streamed: string[] = [];
    // A new session: no history, as the first turn had.
    const again = await rag.chat("how many engineers does Lumen Labs employ", { ...base, sessionId: "s2", userId: "u", onToken: (t) => streamed.push(t) });
    // The same words in s1, after its first exchange: the prompt carries that history, so no hit.
    const followUp = await rag.chat(q, { ...base, sessionId: "s1", userId: "u" });
    const other = await rag.chat(q, { ...base, sessionId: "s3", userId: "w" });
    const skipped = await rag.chat(q, { ...base, sessionId: "s4", userId: "u", useCache: false });
    now = 60_000;
    const expired = await rag.chat(q, { ...base, sessionId: "s5", userId: "u" });
    const answers = [];
    for (const sessionId of ["s1", "s2", "s4", "s5"]) answers.push(...(await rag.store.conversations.list({ userId: "u", sessionId, limit: 20 })).filter((r) => r.role === "assistant"));
    const stats = rag.cacheStats();
    await rag.close();
    expect(first.metadata.cache).toEqual({ hit: false, similarity: null, cachedQuery: null, ageMs: null });
    expect(again.metadata.cache).toMatchObject({ hit: true, cachedQuery: q, ageMs: 0 });
    expect(again.metadata.cache!.similarity).toBeGreaterThanOrEqual(0.95);
    expect(again.text).toBe(first.text);
    expect([again.inputTokens, again.outputTokens]).toEqual([0, 0]);
    expect(streamed).toEqual([first.text]);
    expect(followUp.metadata.cache!.hit).toBe(false);
    expect(followUp.inputTokens).toBeGreaterThan(first.inputTokens);
    expect(other.metadata.cache!.hit).toBe(false);
    expect(skipped.metadata.cache).toBeNull();
    expect(expired.metadata.cache!.hit).toBe(false);
    expect(answers).toHaveLength(5);
    expect(stats).toEqual({ hits: 1, misses: 4, entries: 1 }); // the expired ones dropped when the last was stored
    await expect(RAGSystem.open({ model, dataDir: tempDir(), openStore, answerCache: { threshold: 2 } })).rejects.toThrow(/answerCache.threshold/);
  });
});
