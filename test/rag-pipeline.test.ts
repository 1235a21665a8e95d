// The query pipeline's LLM steps and query transformations (seed 001): the parsers of each step's
// output, the StepRunner's fallbacks (output that does not parse, a failing backend, a step timeout)
// and the turn's abort; rewrite, decomposition with iterative retrieval and step-back driven by a
// scripted backend over a real knowledge base; and the same steps on a generated model inside a
// RAGSystem turn (mechanics: every step recorded with prompt, raw output and parsed result, the
// turn answered whatever the model wrote), constrained choices, a step model given by path, bad input.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { RAGSystem } from "../src/rag/rag-system.js";
import { KnowledgeBase } from "../src/rag/kb/knowledge-base.js";
import type { KbSearchResult } from "../src/rag/kb/search.js";
import { ModelStepBackend, parseChoice, StepRunner, type StepBackend } from "../src/rag/pipeline/steps.js";
import { parseSingleQuery, parseSubQueries, rewriteQuery } from "../src/rag/pipeline/query-transform.js";
import { interleave, retrieveTransformed, type Searcher } from "../src/rag/pipeline/transformed-retrieval.js";
import { ScriptedBackend } from "./support/scripted-backend.js";
import { tempDir } from "./support/paths.js";

let modelDir: string;
let model: Model;
let kb: KnowledgeBase;

beforeAll(async () => {
  modelDir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: modelDir, seed: 33 });
  model = await Model.load(modelDir, { contextSize: 2048 });
  kb = await KnowledgeBase.open({ dir: tempDir(), embedder: new HashingEmbedder(), tokenizer: model.tokenizer });
  // A two-hop corpus: who founded what, then a fact about each company.
  await kb.ingestText("Marie Dubois founded Lumen Labs in 2011.", { collection: "firms", docId: "founders-lumen.txt" });
  await kb.ingestText("Karl Weber founded Orbital Works in 1998.", { collection: "firms", docId: "founders-orbital.txt" });
  await kb.ingestText("Lumen Labs employs 40 engineers.", { collection: "firms", docId: "staff-lumen.txt" });
  await kb.ingestText("Orbital Works employs 900 engineers.", { collection: "firms", docId: "staff-orbital.txt" });
  await kb.ingestText("Engineering headcount is the number of people employed in engineering roles.", { collection: "firms", docId: "glossary.txt" });
});
afterAll(async () => {
  await kb.close();
  model.dispose();
});

const searcher = (collection: string, limit = 3): Searcher<KbSearchResult> => ({
  search: (q) => kb.search(q, { collection, limit }),
  id: (r) => r.chunk.id,
  text: (r) => r.chunk.text,
});

describe("step output parsers", () => {
  test("a single query: first non-empty line, labels, markers and quotes dropped; too short or too long does not parse", () => {
    expect(parseSingleQuery('\n  Standalone query: "How many engineers does Lumen Labs employ?"\nextra')).toBe("How many engineers does Lumen Labs employ?");
    expect(parseSingleQuery("1. vacation days policy")).toBe("vacation days policy");
    expect(parseSingleQuery("  \n\n")).toBeUndefined();
    expect(parseSingleQuery("ok")).toBeUndefined();
    expect(parseSingleQuery("x".repeat(301))).toBeUndefined();
  });

  test("sub-queries: the first well-formed JSON array of strings, prose around it allowed; anything else does not parse", () => {
    expect(parseSubQueries('Sure: ["Who founded Lumen Labs?", "Where is it?"] hope [this] helps', 3)).toEqual(["Who founded Lumen Labs?", "Where is it?"]);
    expect(parseSubQueries('["same question", "Same Question"]', 3)).toEqual(["same question"]);
    expect(parseSubQueries("1. Who founded it?\n2. Where?", 3)).toBeUndefined();
    expect(parseSubQueries('["a", "b", "c", "d"]', 3)).toBeUndefined(); // more than asked for
    expect(parseSubQueries('["Who founded it?", 3]', 3)).toBeUndefined();
    expect(parseSubQueries("[]", 3)).toBeUndefined();
    expect(parseSubQueries('["unterminated', 3)).toBeUndefined();
  });

  test("a choice: the first option word in the output", () => {
    expect(parseChoice("Yes, it does.", ["yes", "no"])).toBe("yes");
    expect(parseChoice("I think: NO", ["yes", "no"])).toBe("no");
    expect(parseChoice("maybe", ["yes", "no"])).toBeUndefined();
    expect(parseChoice("nothing", ["yes", "no"])).toBeUndefined(); // "no" only as a whole word
  });
});

describe("StepRunner", () => {
  test("output that parses is the step's result; output that does not keeps the fallback and says why; records keep prompt and raw", async () => {
    const steps = new StepRunner(new ScriptedBackend([[/Conversation/, "Query: vacation days for employees"]]));
    const q = await rewriteQuery(steps, "and how many do I get?", [{ role: "user", content: "tell me about vacation" }]);
    expect(q).toBe("vacation days for employees");
    const bad = new StepRunner(new ScriptedBackend([[/Conversation/, "  \n"]]));
    expect(await rewriteQuery(bad, "and how many do I get?", [{ role: "user", content: "vacation?" }])).toBe("and how many do I get?");
    expect(steps.records[0]).toMatchObject({ step: "rewrite", raw: "Query: vacation days for employees", parsed: "vacation days for employees", fellBack: false, constrained: false });
    expect(steps.records[0]!.prompt).toContain("User: tell me about vacation\nUser: and how many do I get?");
    expect(bad.records[0]).toMatchObject({ step: "rewrite", raw: "  \n", parsed: "and how many do I get?", fellBack: true, error: "the output did not parse" });
  });

  test("no history: no rewrite step at all", async () => {
    const steps = new StepRunner(new ScriptedBackend([]));
    expect(await rewriteQuery(steps, "vacation days?", [])).toBe("vacation days?");
    expect(steps.records).toHaveLength(0);
  });

  test("a backend error and a step timeout fall back; the turn's own abort rejects", async () => {
    const failing: StepBackend = { complete: async () => Promise.reject(new Error("backend down")) };
    const s1 = new StepRunner(failing);
    expect(await s1.text("x", "p", 8, (r) => r, "fallback")).toBe("fallback");
    expect(s1.records[0]).toMatchObject({ fellBack: true, error: "backend down", raw: "" });

    // A backend that answers only when aborted: the step's timeout aborts it.
    const hanging: StepBackend = {
      complete: (_p, o) => new Promise((_, reject) => o.signal?.addEventListener("abort", () => reject(o.signal!.reason), { once: true })),
    };
    const s2 = new StepRunner(hanging, { timeoutMs: 20 });
    expect(await s2.text("x", "p", 8, (r) => r, "fallback")).toBe("fallback");
    expect(s2.records[0]!.error).toBe("the step took longer than 20 ms");

    const turn = new AbortController();
    const s3 = new StepRunner(hanging, { timeoutMs: 60_000, signal: turn.signal });
    const pending = s3.text("x", "p", 8, (r) => r, "fallback");
    turn.abort(new Error("user pressed stop"));
    await expect(pending).rejects.toThrow("user pressed stop");
  });

  test("a choice without a constrained backend is generated and parsed, with its fallback", async () => {
    const steps = new StepRunner(new ScriptedBackend([[/retrieval\?/, "Answer: No."], [/other/, "perhaps"]]));
    expect(await steps.choice("need", "needs retrieval?", ["yes", "no"], "yes")).toBe("no");
    expect(await steps.choice("need", "other", ["yes", "no"], "yes")).toBe("yes");
    expect(steps.records.map((r) => [r.fellBack, r.constrained])).toEqual([
      [false, false],
      [true, false],
    ]);
  });

  test("bad timeout is refused", () => {
    expect(() => new StepRunner(new ScriptedBackend([]), { timeoutMs: 0 })).toThrow(/timeoutMs must be a positive integer/);
  });
});

describe("transformed retrieval (scripted backend, real knowledge base)", () => {
  const QUESTION = "How many engineers does the company founded by Marie Dubois employ?";
  const script = () =>
    new ScriptedBackend([
      [/JSON array/, '["Which company did Marie Dubois found?", "How many engineers does that company employ?"]'],
      // The refinement reads the earlier hop's passages and fills the company in.
      [/Facts found so far/, (p) => (p.includes("Marie Dubois founded Lumen Labs") ? "How many engineers does Lumen Labs employ?" : "How many engineers does that company employ?")],
      [/more general question/, "What is engineering headcount?"],
    ]);

  test("decomposition with iterative retrieval: the second hop is refined with what the first found and finds the right company", async () => {
    const steps = new StepRunner(script());
    const r = await retrieveTransformed(steps, QUESTION, [], { decompose: 3 }, searcher("firms"), 4);
    expect(r.subQueries).toEqual(["Which company did Marie Dubois found?", "How many engineers does that company employ?"]);
    expect(r.hops.map((h) => [h.kind, h.query])).toEqual([
      ["sub_query", "Which company did Marie Dubois found?"],
      ["sub_query", "How many engineers does Lumen Labs employ?"],
    ]);
    const docOf = (id: string) => kb.getChunk("firms", id)!.docId;
    expect(docOf(r.hops[0]!.found[0]!)).toBe("founders-lumen.txt");
    expect(docOf(r.hops[1]!.found[0]!)).toBe("staff-lumen.txt");
    // Both hops' best passages make the context, first of each hop first.
    expect(r.results.slice(0, 2).map((x) => x.chunk.docId)).toEqual(["founders-lumen.txt", "staff-lumen.txt"]);
    expect(steps.records.map((s) => s.step)).toEqual(["decompose", "refine"]);
  });

  test("without iterative retrieval the second hop searches the sub-query as written (no refine step)", async () => {
    const steps = new StepRunner(script());
    const r = await retrieveTransformed(steps, QUESTION, [], { decompose: 3, iterative: false }, searcher("firms"), 4);
    expect(r.hops[1]!.query).toBe("How many engineers does that company employ?");
    expect(steps.records.map((s) => s.step)).toEqual(["decompose"]);
  });

  test("a decomposition that does not parse retrieves with the query alone", async () => {
    const steps = new StepRunner(new ScriptedBackend([[/JSON array/, "1) first\n2) second"]]));
    const r = await retrieveTransformed(steps, QUESTION, [], { decompose: 3 }, searcher("firms"), 3);
    expect(r.subQueries).toEqual([QUESTION]);
    expect(r.hops).toEqual([{ kind: "query", query: QUESTION, found: (await kb.search(QUESTION, { collection: "firms", limit: 3 })).map((x) => x.chunk.id) }]);
    expect(r.results.map((x) => x.chunk.id)).toEqual(r.hops[0]!.found);
  });

  test("step-back: the general question is searched too and its passage joins the context", async () => {
    const steps = new StepRunner(script());
    const r = await retrieveTransformed(steps, "Lumen Labs engineers", [], { stepBack: true }, searcher("firms", 2), 4);
    expect(r.stepBack).toBe("What is engineering headcount?");
    expect(r.hops.map((h) => h.kind)).toEqual(["query", "step_back"]);
    expect(r.results.map((x) => x.chunk.docId)).toContain("glossary.txt");
  });

  test("rewrite then search: the rewritten query is what is searched", async () => {
    const steps = new StepRunner(new ScriptedBackend([[/Conversation/, "How many engineers does Orbital Works employ?"]]));
    const r = await retrieveTransformed(steps, "and how many engineers?", [{ role: "user", content: "Who founded Orbital Works?" }, { role: "assistant", content: "Karl Weber." }], { rewrite: true }, searcher("firms", 1), 1);
    expect(r.query).toBe("How many engineers does Orbital Works employ?");
    expect(r.results[0]!.chunk.docId).toBe("staff-orbital.txt");
  });

  test("interleave takes each list's rank 1, then rank 2, each id once", () => {
    expect(interleave([["a", "b", "c"], ["b", "d"], ["e"]], (x) => x, 10)).toEqual(["a", "b", "e", "d", "c"]);
    expect(interleave([["a", "b"], ["c", "d"]], (x) => x, 3)).toEqual(["a", "c", "b"]);
  });
});

describe("the steps on a generated model, in a RAGSystem turn", () => {
  const openStore = (o: { dir: string }) => MemoryStore.open(o);

  test("rag.turnTimeoutMs bounds the whole turn: past it the turn rejects naming the limit and records nothing; the caller's own abort keeps its reason", async () => {
    // A step backend that answers only when aborted, under a step timeout far above the turn's.
    const hanging: StepBackend = {
      complete: (_p, o) => new Promise((_, reject) => o.signal?.addEventListener("abort", () => reject(o.signal!.reason), { once: true })),
    };
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb, steps: { model: hanging, timeoutMs: 60_000 }, rag: { turnTimeoutMs: 50 } });
    const turn = { userId: "u", sessionId: "s", maxNewTokens: 2, collection: "firms", adaptive: true };
    await expect(rag.chat("Who founded Lumen Labs?", turn)).rejects.toThrow("the turn took longer than 50 ms (rag.turnTimeoutMs)");
    const stop = new AbortController();
    const pending = rag.chat("Who founded Lumen Labs?", { ...turn, signal: stop.signal });
    stop.abort(new Error("user pressed stop"));
    await expect(pending).rejects.toThrow("user pressed stop");
    const rows = await rag.store.conversations.list({ userId: "u", sessionId: "s", limit: 10 });
    await rag.close();
    expect(rows).toHaveLength(0);
    for (const bad of [-1, 1.5, "60"]) {
      await expect(RAGSystem.open({ model, dataDir: tempDir(), openStore, rag: { turnTimeoutMs: bad as number } })).rejects.toThrow(/rag.turnTimeoutMs must be a whole number of milliseconds \(0: no limit\)/);
    }
  });

  test("rewrite, decompose and step-back on the engine model: every step recorded, parsed or fallen back consistently, the turn answered", async () => {
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb, config: { historyEnabled: true } });
    await rag.chat("Who founded Lumen Labs?", { userId: "u", sessionId: "s", maxNewTokens: 3, collection: "firms" });
    const r = await rag.chat("How many engineers does it employ?", { userId: "u", sessionId: "s", maxNewTokens: 3, collection: "firms", queryTransform: { rewrite: true, decompose: 2, stepBack: true } });
    await rag.close();
    const p = r.metadata.pipeline!;
    expect(p.steps.map((s) => s.step).slice(0, 2)).toEqual(["rewrite", "decompose"]);
    expect(p.steps.map((s) => s.step)).toContain("step_back");
    for (const s of p.steps) {
      expect(typeof s.raw).toBe("string");
      // The model answered every step (no backend error, no timeout); only parsing may fall back.
      expect([undefined, "the output did not parse"]).toContain(s.error);
      expect(s.fellBack).toBe(s.error !== undefined);
    }
    const [rw, dc] = p.steps;
    expect(rw!.prompt).toContain("User: Who founded Lumen Labs?");
    expect(rw!.parsed).toBe(parseSingleQuery(rw!.raw) ?? "How many engineers does it employ?");
    expect(rw!.fellBack).toBe(parseSingleQuery(rw!.raw) === undefined);
    expect(p.query).toBe(rw!.parsed);
    expect(dc!.parsed).toEqual(parseSubQueries(dc!.raw, 2) ?? [p.query]);
    expect(p.subQueries).toEqual(dc!.parsed);
    // The context is what the hops found; the turn generated and was recorded as usual.
    const chunkIds = r.sources.flatMap((s) => (s.kind === "chunk" ? [s.chunkId] : []));
    for (const id of chunkIds) expect(p.hops.some((h) => h.found.includes(id))).toBe(true);
    expect(r.metadata.kbQueries).toEqual([...new Set(p.hops.map((h) => h.query))]);
    expect(r.outputTokens).toBeGreaterThan(0);
  });

  test("a turn without a transform has no pipeline trace and searches the query as before", async () => {
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb });
    const r = await rag.chat("Lumen Labs engineers", { userId: "u", sessionId: "s", maxNewTokens: 2, collection: "firms" });
    await rag.close();
    expect(r.metadata.pipeline).toBeNull();
    expect(r.metadata.kbQueries).toEqual(["Lumen Labs engineers"]);
  });

  test("constrained choice on the model: always one of the options, chosen by the highest log-probability", async () => {
    const backend = new ModelStepBackend(model);
    const steps = new StepRunner(backend);
    const c = await steps.choice("need_retrieval", "Does this question need documents? Answer yes or no.", ["yes", "no", "maybe"], "yes");
    const rec = steps.records[0]!;
    expect(rec).toMatchObject({ constrained: true, fellBack: false, raw: c, parsed: c });
    expect(rec.scores).toHaveLength(3);
    for (const s of rec.scores!) expect(s).toBeLessThan(0);
    expect(c).toBe(["yes", "no", "maybe"][rec.scores!.indexOf(Math.max(...rec.scores!))]);
  });

  test("Model.scoreContinuations: one prefill, then each continuation on top; equal to the log-probabilities read from the full logits", async () => {
    const prompt = "Does this question need documents? Answer yes or no.";
    const tok = model.tokenizer;
    const conts = [" yes", " no", " maybe not at all"].map((t) => tok.encode(t, { addSpecialTokens: false }));
    expect(conts[2]!.length).toBeGreaterThan(2); // a multi-token continuation is covered
    const got = await model.scoreContinuations(prompt, conts);
    const head = model.encodePrompt(prompt);
    for (const [i, c] of conts.entries()) {
      const rows = await model.logits([...head, ...c]);
      let want = 0;
      for (let k = 0; k < c.length; k++) {
        const row = rows[head.length - 1 + k]!;
        const max = Math.max(...row);
        want += row[c[k]!]! - max - Math.log(row.reduce((z, x) => z + Math.exp(x - max), 0));
      }
      expect(got[i]).toBeCloseTo(want, 3);
    }
    await expect(model.scoreContinuations(prompt, [])).rejects.toThrow(/at least one continuation/);
    await expect(model.scoreContinuations(prompt, [[]])).rejects.toThrow(/continuation 0 is empty/);
    const aborted = new AbortController();
    aborted.abort(new Error("stop"));
    await expect(model.scoreContinuations(prompt, conts, { signal: aborted.signal })).rejects.toThrow("stop");
  });

  test("a step model given by path and a custom backend; the system's own model answers the turn", async () => {
    const byPath = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb, steps: { model: modelDir, loadOptions: { contextSize: 1024 } } });
    const r1 = await byPath.chat("Lumen Labs engineers", { userId: "u", sessionId: "s", maxNewTokens: 2, collection: "firms", queryTransform: { stepBack: true } });
    await byPath.close();
    expect(r1.metadata.pipeline!.steps[0]!.step).toBe("step_back");
    expect([undefined, "the output did not parse"]).toContain(r1.metadata.pipeline!.steps[0]!.error);
    expect(r1.metadata.pipeline!.stepBack).toBe(parseSingleQuery(r1.metadata.pipeline!.steps[0]!.raw) ?? null);

    const script = new ScriptedBackend([[/more general question/, "What is engineering headcount?"]]);
    const custom = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb, steps: { model: script } });
    const r2 = await custom.chat("Lumen Labs engineers", { userId: "u", sessionId: "s", maxNewTokens: 2, collection: "firms", queryTransform: { stepBack: true } });
    await custom.close();
    expect(script.prompts).toHaveLength(1);
    expect(r2.metadata.pipeline!.stepBack).toBe("What is engineering headcount?");
    expect(r2.metadata.kbQueries).toEqual(["Lumen Labs engineers", "What is engineering headcount?"]);
  });

  test("retrieval off (rag.enabled false): no pipeline step runs, nothing is searched", async () => {
    const script = new ScriptedBackend([[/JSON array/, '["a b c", "d e f"]'], [/Class:/, "complex"]]);
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb, steps: { model: script }, rag: { enabled: false } });
    const r = await rag.chat("Lumen Labs engineers", { userId: "u", sessionId: "s", maxNewTokens: 2, collection: "firms", queryTransform: { decompose: 2 }, rerank: "lexical", adaptive: true });
    await rag.close();
    expect(script.prompts).toEqual([]);
    expect(r.metadata.pipeline).toBeNull();
    expect(r.sources).toEqual([]);
    expect(r.metadata.warnings[0]).toMatch(/retrieval is disabled/);
  });

  test("bad input names the problem", async () => {
    await expect(RAGSystem.open({ model, dataDir: tempDir(), openStore, steps: { model: 42 as unknown as string } })).rejects.toThrow(/steps.model must be/);
    await expect(RAGSystem.open({ model, dataDir: tempDir(), openStore, steps: { timeoutMs: -1 } })).rejects.toThrow(/steps.timeoutMs must be a positive integer/);
    const rag = await RAGSystem.open({ model, dataDir: tempDir(), openStore, knowledgeBase: kb });
    await expect(rag.chat("q?", { userId: "u", sessionId: "s", queryTransform: { rewrite: true } })).rejects.toThrow(/queryTransform needs a collection/);
    await expect(rag.chat("q?", { userId: "u", sessionId: "s", collection: "firms", queryTransform: { decompose: 1 } })).rejects.toThrow(/decompose must be 0 or an integer from 2 to 5/);
    await expect(rag.chat("q?", { userId: "u", sessionId: "s", collection: "firms", queryTransform: { rewrite: "yes" as unknown as boolean } })).rejects.toThrow(/rewrite must be a boolean/);
    await rag.close();
  });
});
