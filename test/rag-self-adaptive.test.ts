// Self-RAG and Adaptive RAG. The decision logic with a scripted backend (Self-RAG's need check,
// retrieval grading and reformulation, answer grading over at most maxRounds rounds, its
// thresholds; Adaptive RAG's strategy per query class and its per-strategy statistics), and the
// mechanics on a generated model inside RAGSystem turns (constrained yes/no grades as P(yes), the
// chosen draft as the response, limits), and bad input.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { KnowledgeBase } from "../src/rag/kb/knowledge-base.js";
import { RAGSystem } from "../src/rag/rag-system.js";
import { StepRunner } from "../src/rag/pipeline/steps.js";
import { resolveSelfRag, runSelfRag, type SelfRagConfig } from "../src/rag/pipeline/self-rag.js";
import { classifyQuery, resolveStrategies, StrategyLedger } from "../src/rag/pipeline/adaptive.js";
import { ScriptedBackend } from "./support/scripted-backend.js";
import { tempDir } from "./support/paths.js";
import type { Reranker } from "../src/memory/types.js";

let model: Model;
let kb: KnowledgeBase;
const openStore = (o: { dir: string }) => MemoryStore.open(o);

beforeAll(async () => {
  const dir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 55 });
  model = await Model.load(dir, { contextSize: 2048 });
  kb = await KnowledgeBase.open({ dir: tempDir(), embedder: new HashingEmbedder(), tokenizer: model.tokenizer });
  await kb.ingestText("Marie Dubois founded Lumen Labs in 2011.", { collection: "firms", docId: "founders.txt" });
  await kb.ingestText("Lumen Labs employs 40 engineers.", { collection: "firms", docId: "staff.txt" });
  await kb.ingestText("The canteen serves soup on Mondays.", { collection: "firms", docId: "canteen.txt" });
});
afterAll(async () => {
  await kb.close();
  model.dispose();
});

type Doc = { id: string; text: string };
const DOCS: Record<string, Doc[]> = {
  "who founded lumen labs": [{ id: "d-canteen", text: "The canteen serves soup." }],
  "lumen labs founder": [{ id: "d-founder", text: "Marie Dubois founded Lumen Labs." }],
};

/** A Self-RAG run on a script: passages relevant when they mention Lumen Labs; answers numbered drafts. */
async function selfRag(script: ScriptedBackend, config: Partial<SelfRagConfig> = {}, query = "who founded lumen labs") {
  const steps = new StepRunner(script);
  let n = 0;
  const answered: Doc[][] = [];
  const r = await runSelfRag(query, resolveSelfRag(config), {
    steps,
    retrieve: async (q) => DOCS[q.toLowerCase()] ?? [],
    candidate: (d) => ({ ...d, score: 0.5 }),
    answer: async (_q, docs) => {
      answered.push(docs);
      return `draft ${++n}`;
    },
  });
  return { r, steps, answered };
}

const JUDGE: [RegExp, string | ((p: string) => string)][] = [
  [/need facts from documents/, "yes"],
  [/help answer the question\?[\s\S]*Passage: (.*)/, (p) => (p.includes("Passage: Marie Dubois") ? "yes" : "no")],
  [/found nothing useful/, "Lumen Labs founder"],
];

describe("Self-RAG decisions (scripted backend)", () => {
  test("a query that needs no retrieval is answered without context, no search made", async () => {
    const { r, answered, steps } = await selfRag(new ScriptedBackend([[/need facts from documents/, "No."], [/Answer to check/, "yes"]]));
    expect(r.trace).toMatchObject({ retrieved: false, rounds: [], chosenRound: -1 });
    expect(r.trace.needScore).toBe(0);
    expect(answered).toEqual([[]]);
    expect(r.answer).toBe("draft 1");
    expect(steps.records.map((s) => s.step)).toEqual(["need_retrieval"]);
  });

  test("a weak retrieval is reformulated and searched again; the answer comes from the better one and is accepted", async () => {
    const { r, answered, steps } = await selfRag(new ScriptedBackend([...JUDGE, [/Answer to check/, "yes"]]));
    expect(r.trace.rounds.map((x) => [x.query, x.retrievalScore, x.retrievalAccepted, x.answer])).toEqual([
      ["who founded lumen labs", 0, false, undefined],
      ["Lumen Labs founder", 1, true, "draft 1"],
    ]);
    expect(answered).toEqual([DOCS["lumen labs founder"]]);
    expect(r.trace.rounds[1]!.grades).toEqual({ supported: 1, relevant: 1, complete: 1 });
    expect(r.trace.chosenRound).toBe(1);
    expect(r.results).toEqual(DOCS["lumen labs founder"]);
    expect(steps.records.map((s) => s.step)).toEqual(["need_retrieval", "grade_passage", "reformulate", "grade_passage", "grade_supported", "grade_relevant", "grade_complete"]);
  });

  // Answers graded by draft: draft 2 passes two of three dimensions (0.667), the others one (0.333).
  const grading: [RegExp, (p: string) => string] = [/Answer to check: draft (\d)/, (p) => (/draft 2/.test(p) ? (/Complete:$/.test(p) ? "no" : "yes") : /Relevant:$/.test(p) ? "yes" : "no")];
  const alwaysRelevant: [RegExp, string][] = [[/help answer the question/, "yes"]];

  test("answerThreshold decides: 0.6 accepts draft 2 in round 2; 0.9 runs all 3 rounds and returns the best graded draft", async () => {
    const base = () => new ScriptedBackend([[/need facts/, "yes"], ...alwaysRelevant, [/found nothing useful/, "lumen labs founder"], grading]);
    const a = await selfRag(base(), { answerThreshold: 0.6 });
    expect(a.r.trace.rounds.map((x) => x.answerAccepted)).toEqual([false, true]);
    expect(a.r.answer).toBe("draft 2");
    const b = await selfRag(base(), { answerThreshold: 0.9 });
    expect(b.r.trace.rounds).toHaveLength(3);
    expect(b.r.trace.rounds.map((x) => x.answerScore!.toFixed(3))).toEqual(["0.333", "0.667", "0.333"]);
    expect(b.r.trace.chosenRound).toBe(1);
    expect(b.r.answer).toBe("draft 2");
  });

  test("maxRounds 1: a weak retrieval is still answered (the last round always answers); retrievalThreshold 0 accepts any", async () => {
    const script = () => new ScriptedBackend([...JUDGE, [/Answer to check/, "yes"]]);
    const one = await selfRag(script(), { maxRounds: 1 });
    expect(one.r.trace.rounds).toHaveLength(1);
    expect(one.r.trace.rounds[0]).toMatchObject({ retrievalAccepted: false, answer: "draft 1", answerAccepted: true });
    const lenient = await selfRag(script(), { retrievalThreshold: 0 });
    expect(lenient.r.trace.rounds.map((x) => x.retrievalAccepted)).toEqual([true]);
  });

  test("steps that fail fall back: need unknown → retrieve; a grade that does not parse counts 0.5; a failed reformulation keeps the query", async () => {
    const { r, steps } = await selfRag(new ScriptedBackend([[/help answer the question/, "no"], [/Answer to check/, "unsure"]]), { checkNeed: true, maxRounds: 2, answerThreshold: 0.5 });
    expect(r.trace.needScore).toBeNull();
    expect(r.trace.retrieved).toBe(true);
    expect(r.trace.rounds.map((x) => x.query)).toEqual(["who founded lumen labs", "who founded lumen labs"]);
    expect(r.trace.rounds[1]!.grades).toEqual({ supported: null, relevant: null, complete: null });
    expect(r.trace.rounds[1]!.answerScore).toBe(0.5);
    expect(steps.records.filter((s) => s.fellBack).map((s) => s.step)).toEqual(["need_retrieval", "reformulate", "grade_supported", "grade_relevant", "grade_complete"]);
  });

  test("bad config names the problem", () => {
    expect(() => resolveSelfRag({ maxRounds: 4 })).toThrow(/selfRag.maxRounds must be an integer from 1 to 3, got 4/);
    expect(() => resolveSelfRag({ answerThreshold: 1.5 })).toThrow(/selfRag.answerThreshold must be in \[0, 1\]/);
    expect(() => resolveSelfRag({ checkNeed: "no" as unknown as boolean })).toThrow(/selfRag.checkNeed must be a boolean/);
  });
});

describe("Adaptive RAG decisions (scripted backend)", () => {
  const classifier = () =>
    new ScriptedBackend([
      [/JSON array/, '["Which company did Marie Dubois found?", "How many engineers does it employ?"]'],
      [/Facts found so far/, "How many engineers does Lumen Labs employ?"],
      [/Question: hello/, "none"],
      [/Question: How many engineers does the company founded by/, "complex"],
      [/Question: weird/, "no idea"],
      [/Class:/, "simple"],
    ]);

  test("classification: the model's word maps to a class; unparsable is simple", async () => {
    const steps = new StepRunner(classifier());
    expect(await classifyQuery(steps, "hello there")).toBe("no_retrieval");
    expect(await classifyQuery(steps, "How many engineers does the company founded by Marie Dubois employ?")).toBe("multi_hop");
    expect(await classifyQuery(steps, "Lumen Labs staff")).toBe("simple");
    expect(await classifyQuery(steps, "weird")).toBe("simple");
    expect(steps.records.at(-1)!.fellBack).toBe(true);
  });

  test("in RAGSystem: each class gets its strategy (direct: no search; standard; decompose), statistics per strategy", async () => {
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb, steps: { model: classifier() } });
    const base = { userId: "u", sessionId: "s", maxNewTokens: 2, collection: "firms", adaptive: true };
    const hello = await rag.chat("hello there", base);
    const simple = await rag.chat("Lumen Labs staff", base);
    const multi = await rag.chat("How many engineers does the company founded by Marie Dubois employ?", base);
    const stats = rag.strategyStats();
    await rag.close();
    expect(hello.metadata.pipeline!.adaptive).toEqual({ queryClass: "no_retrieval", strategy: "direct" });
    expect(hello.sources.filter((s) => s.kind === "chunk")).toEqual([]);
    expect(hello.metadata.kbQueries).toEqual([]);
    expect(simple.metadata.pipeline!.adaptive).toEqual({ queryClass: "simple", strategy: "standard" });
    expect(simple.metadata.kbQueries).toEqual(["Lumen Labs staff"]);
    expect(multi.metadata.pipeline!.adaptive).toEqual({ queryClass: "multi_hop", strategy: "decompose" });
    expect(multi.metadata.pipeline!.steps.map((s) => s.step)).toEqual(["classify", "decompose", "refine"]);
    expect(multi.metadata.pipeline!.hops.map((h) => h.query)).toEqual(["Which company did Marie Dubois found?", "How many engineers does Lumen Labs employ?"]);
    expect(Object.keys(stats).sort()).toEqual(["decompose", "direct", "standard"]);
    expect(stats.direct).toMatchObject({ queries: 1, failures: 0, meanRetrieved: 0, meanModelCalls: 2 });
    expect(stats.decompose).toMatchObject({ queries: 1, failures: 0, meanModelCalls: 4 });
    expect(stats.standard!.meanRetrieved).toBeGreaterThan(0);
  });

  test("the rerank strategy uses the system's cross-encoder when it has one, the lexical rerank otherwise", async () => {
    const reranker: Reranker = { id: "by-length", score: async (_q, ps) => ps.map((p) => Math.min(1, p.length / 100)), close: async () => {} };
    const turn = { userId: "u", sessionId: "s", maxNewTokens: 1, collection: "firms", adaptive: true };
    const methods: (string | undefined)[] = [];
    for (const withReranker of [false, true]) {
      const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb, steps: { model: classifier() }, adaptive: { simple: "rerank" }, ...(withReranker ? { reranker } : {}) });
      const r = await rag.chat("Lumen Labs staff", turn);
      await rag.close();
      expect(r.metadata.pipeline!.adaptive).toEqual({ queryClass: "simple", strategy: "rerank" });
      methods.push(r.metadata.pipeline!.rerank?.method);
    }
    expect(methods).toEqual(["lexical", "cross-encoder"]);
  });

  test("strategies are configurable per class; the ledger counts failures apart from the means", async () => {
    expect(resolveStrategies({ multi_hop: "self_rag" })).toEqual({ no_retrieval: "direct", simple: "standard", multi_hop: "self_rag" });
    expect(() => resolveStrategies({ trivial: "direct" } as never)).toThrow(/unknown query class "trivial"/);
    expect(() => resolveStrategies({ simple: "fast" } as never)).toThrow(/strategy for simple must be one of direct, standard, rerank, decompose, self_rag, got "fast"/);
    const l = new StrategyLedger();
    l.record("standard", { ok: true, latencyMs: 10, retrieved: 4, modelCalls: 2 });
    l.record("standard", { ok: true, latencyMs: 30, retrieved: 2, modelCalls: 2 });
    l.record("standard", { ok: false, latencyMs: 0, retrieved: 0, modelCalls: 0 });
    expect(l.stats()).toEqual({ standard: { queries: 3, failures: 1, meanLatencyMs: 20, meanRetrieved: 3, meanModelCalls: 2 } });
    await expect(RAGSystem.open({ model, dataDir: tempDir(), openStore, adaptive: { simple: "fast" } as never })).rejects.toThrow(/strategy for simple/);
  });
});

describe("Self-RAG and Adaptive RAG on a generated model (mechanics)", () => {
  test("selfRag: the grades are constrained P(yes) in [0, 1], at most maxRounds rounds, the response is the chosen draft, streamed once", async () => {
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb });
    const streamed: string[] = [];
    const r = await rag.chat("How many engineers does Lumen Labs employ?", {
      userId: "u",
      sessionId: "s",
      maxNewTokens: 3,
      collection: "firms",
      kbTopK: 2,
      selfRag: { maxRounds: 2, checkNeed: false },
      onToken: (t) => streamed.push(t),
    });
    await rag.close();
    const sr = r.metadata.pipeline!.selfRag!;
    expect(sr.retrieved).toBe(true);
    expect(sr.rounds.length).toBeGreaterThanOrEqual(1);
    expect(sr.rounds.length).toBeLessThanOrEqual(2);
    for (const round of sr.rounds) {
      expect(round.retrievalScore >= 0 && round.retrievalScore <= 1).toBe(true);
      if (round.answerScore !== undefined) expect(round.answerScore >= 0 && round.answerScore <= 1).toBe(true);
    }
    const chosen = sr.rounds[sr.chosenRound]!;
    expect(r.text).toBe(chosen.answer);
    expect(r.sources.flatMap((s) => (s.kind === "chunk" ? [s.chunkId] : []))).toEqual(chosen.chunkIds);
    expect(streamed.join("")).toBe(r.text);
    expect(streamed.length).toBeLessThanOrEqual(1);
    for (const s of r.metadata.pipeline!.steps.filter((x) => x.step.startsWith("grade_"))) expect(s.constrained).toBe(true);
  });

  test("adaptive on the engine model: a constrained classification, one of the classes, its strategy applied and counted", async () => {
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb });
    const r = await rag.chat("Lumen Labs staff", { userId: "u", sessionId: "s", maxNewTokens: 2, collection: "firms", adaptive: true });
    const stats = rag.strategyStats();
    await rag.close();
    const a = r.metadata.pipeline!.adaptive!;
    expect(["no_retrieval", "simple", "multi_hop"]).toContain(a.queryClass);
    expect(a.strategy).toBe({ no_retrieval: "direct", simple: "standard", multi_hop: "decompose" }[a.queryClass]);
    expect(r.metadata.pipeline!.steps[0]).toMatchObject({ step: "classify", constrained: true, fellBack: false });
    expect(stats[a.strategy]!.queries).toBe(1);
  });

  test("Self-RAG's decision stands over emptyRetrieval 'answer': a query judged to need no retrieval is answered by the model", async () => {
    const script = new ScriptedBackend([[/need facts from documents/, "no"], [/Answer to check/, "yes"]]);
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb, steps: { model: script } });
    const r = await rag.chat("hello, how are you?", { userId: "u", sessionId: "s", maxNewTokens: 3, collection: "firms", useMemories: false, selfRag: true, emptyRetrieval: "answer" });
    await rag.close();
    expect(r.metadata.pipeline!.selfRag!.retrieved).toBe(false);
    expect(r.metadata.noRelevantInformation).toBe(false);
    expect(r.outputTokens).toBeGreaterThan(0);
    expect(r.sources).toEqual([]);
  });

  test("thresholds in the system's config (rag.selfRag), a turn's own keys over them", async () => {
    const script = () => new ScriptedBackend([[/need facts from documents/, "yes"], [/help answer the question/, "yes"], [/Answer to check/, "no"]]);
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb, steps: { model: script() }, rag: { selfRag: { maxRounds: 1, answerThreshold: 0.2 } } });
    const a = await rag.chat("Lumen Labs engineers", { userId: "u", sessionId: "a", maxNewTokens: 2, collection: "firms", selfRag: true });
    const b = await rag.chat("Lumen Labs engineers", { userId: "u", sessionId: "b", maxNewTokens: 2, collection: "firms", selfRag: { maxRounds: 2 } });
    await rag.close();
    expect(a.metadata.pipeline!.selfRag!.config).toEqual({ maxRounds: 1, retrievalThreshold: 0.5, answerThreshold: 0.2, checkNeed: true });
    expect(a.metadata.pipeline!.selfRag!.rounds).toHaveLength(1);
    expect(b.metadata.pipeline!.selfRag!.config).toMatchObject({ maxRounds: 2, answerThreshold: 0.2 });
    // Every grade is "no" (score 0 < 0.2): the second round is used.
    expect(b.metadata.pipeline!.selfRag!.rounds).toHaveLength(2);
    await expect(RAGSystem.open({ model, dataDir: tempDir(), openStore, rag: { selfRag: { maxRounds: 5 } } })).rejects.toThrow(/selfRag.maxRounds must be an integer from 1 to 3/);
  });

  test("bad turn options name the problem", async () => {
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb });
    const base = { userId: "u", sessionId: "s" };
    await expect(rag.chat("q?", { ...base, selfRag: true })).rejects.toThrow(/selfRag needs a collection/);
    await expect(rag.chat("q?", { ...base, adaptive: true })).rejects.toThrow(/adaptive needs a collection/);
    await expect(rag.chat("q?", { ...base, collection: "firms", selfRag: { maxRounds: 0 } })).rejects.toThrow(/selfRag.maxRounds/);
    await rag.close();
  });
});
