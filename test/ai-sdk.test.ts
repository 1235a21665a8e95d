// The AI SDK provider end to end: the `ai` package's own generateText, streamText, embed and
// embedMany against createDki on a generated model, the real memory store and K/V cache. Each
// answer is checked against the DKISystem it runs on (the same turn called directly), so the
// provider can only pass by handing the SDK what the system did.
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { embed, embedMany, generateText, streamText, type ModelMessage, type TextStreamPart, type ToolSet } from "ai";
import { InvalidArgumentError, NoSuchModelError, UnsupportedFunctionalityError, type LanguageModelV3StreamPart } from "@ai-sdk/provider";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import type { DKISystem } from "../src/dki/system.js";
import { createDki, type DkiProvider } from "../src/integrations/ai-sdk/index.js";
import { routeMemories } from "../src/dki/routing.js";
import { OnnxCrossEncoder } from "../src/memory/embedders/onnx-cross-encoder.js";
import { repoRoot, tempDir } from "./support/paths.js";
import { as, HIKING, HIKING_Q, meta, streamAbortedAtFirstText } from "./support/ai-sdk.js";

let model: Model;
let dki: DkiProvider;
let sys: DKISystem;
let memoryId: string;

beforeAll(async () => {
  const modelDir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: modelDir, seed: 7 });
  model = await Model.load(modelDir, { contextSize: 1024 });
  dki = createDki({ model, dataDir: tempDir(), config: { generationReserve: 128 } });
  sys = await dki.system();
  memoryId = (await sys.memories.add(HIKING, { userId: "alice" }))[0]!.id;
  await sys.memories.add("Bob plays the cello in a jazz band.", { userId: "bob" });
});
afterAll(async () => {
  await dki?.close();
  model?.dispose();
});

const memoryTokens = () => model.tokenizer.encode(HIKING, { addSpecialTokens: false }).length;

describe("generateText", () => {
  test("answers as the DKISystem's own turn: same text and prompt tokens, the memory injected, the turn recorded", async () => {
    const r = await generateText({ model: dki("dki"), prompt: HIKING_Q, maxOutputTokens: 6, providerOptions: as("alice", "g1") });
    const direct = await sys.chat(HIKING_Q, { userId: "alice", sessionId: "g1-direct", maxNewTokens: 6 });
    expect(r.text).toBe(direct.text);
    expect(r.text.length).toBeGreaterThan(0);

    const m = meta(r.providerMetadata);
    expect(m).toMatchObject({ mode: "dki", userId: "alice", sessionId: "g1", injected: true, forced: false, cacheHit: false, memoryTokens: memoryTokens(), promptTokens: direct.inputTokens, outputTokens: direct.outputTokens });
    expect(m.memories).toEqual([{ id: memoryId, text: HIKING, score: expect.any(Number), relevance: expect.any(Number), tokens: memoryTokens() }]);
    expect(m.alpha).toBe(direct.gating.alpha);
    expect(m.gateReason).toBe(direct.gating.reason);
    expect(m.tiers).toEqual([{ kind: "memory", id: memoryId, tier: "L4", loadMs: expect.any(Number), tokens: memoryTokens(), alpha: direct.gating.alpha }]);
    expect(m.ttftMs).toBeGreaterThan(0);
    // The direct turn found the block in L1, where the provider's turn put it.
    expect(direct.cache.tiers.map((t) => t.tier)).toEqual(["L1"]);

    const turns = await sys.conversations.list({ userId: "alice", sessionId: "g1" });
    expect(turns.map((t) => [t.role, t.content, t.injectionMode ?? null])).toEqual([
      ["user", HIKING_Q, null],
      ["assistant", r.text, "dki"],
    ]);
    expect(turns[1]!.memoryIds).toEqual([memoryId]);
  });

  test("usage: every count the engine knows is a number (cached counts 0 because none are, never missing), memory tokens beside the prompt's", async () => {
    const r = await generateText({ model: dki("dki"), prompt: HIKING_Q, maxOutputTokens: 5, providerOptions: as("alice", "u1") });
    const m = meta(r.providerMetadata);
    const prompt = m.promptTokens as number;
    const out = m.outputTokens as number;
    expect(prompt).toBeGreaterThan(model.tokenizer.encode(HIKING_Q, { addSpecialTokens: false }).length);
    expect(out).toBeGreaterThan(0);
    expect(r.usage).toMatchObject({
      inputTokens: prompt,
      inputTokenDetails: { noCacheTokens: prompt, cacheReadTokens: 0, cacheWriteTokens: 0 },
      outputTokens: out,
      outputTokenDetails: { textTokens: out, reasoningTokens: 0 },
      totalTokens: prompt + out,
      cachedInputTokens: 0,
      reasoningTokens: 0,
    });
    // The block was in L1 from the turn before: the memory's tokens came from the cache.
    expect(r.usage.raw).toEqual({ promptTokens: prompt, outputTokens: out, memoryTokens: memoryTokens(), memoryTokensFromCache: memoryTokens(), memoryTokensComputed: 0 });
    expect(r.totalUsage.inputTokens).toBe(prompt);
    expect(r.finishReason).toBe(m.finishReason === "length" || m.finishReason === "context" ? "length" : "stop");
    expect(r.rawFinishReason).toBe(m.finishReason);
  });

  test("finish reasons: the token limit is length, a stop sequence is stop (the engine's reason kept as the raw one)", async () => {
    const long = await generateText({ model: dki("none"), prompt: HIKING_Q, maxOutputTokens: 4, providerOptions: as("alice", "f1") });
    expect([long.finishReason, long.rawFinishReason]).toEqual(["length", "length"]);
    expect(long.usage.outputTokens).toBe(4);
    // A stop sequence taken from the answer itself: the engine stops there and drops it.
    const full = await generateText({ model: dki("none"), prompt: HIKING_Q, maxOutputTokens: 12, providerOptions: as("alice", "f2") });
    const stop = full.text.slice(Math.floor(full.text.length / 2)).trim().slice(0, 3);
    expect(stop.length).toBeGreaterThan(0);
    const stopped = await generateText({ model: dki("none"), prompt: HIKING_Q, maxOutputTokens: 12, stopSequences: [stop], providerOptions: as("alice", "f3") });
    expect([stopped.finishReason, stopped.rawFinishReason]).toEqual(["stop", "stop"]);
    expect(full.text.startsWith(stopped.text)).toBe(true);
    expect(stopped.text).not.toContain(stop);
  });

  test('"none" injects nothing and "rag" puts the memory into the prompt; each user sees only their own memories', async () => {
    const none = await generateText({ model: dki("none"), prompt: HIKING_Q, maxOutputTokens: 3, providerOptions: as("alice", "n1") });
    expect(meta(none.providerMetadata)).toMatchObject({ mode: "none", injected: false, memories: [], tiers: [], memoryTokens: 0 });
    expect(none.usage.raw).toMatchObject({ memoryTokens: 0 });

    const rag = await generateText({ model: dki("rag"), prompt: HIKING_Q, maxOutputTokens: 3, providerOptions: as("alice", "r1") });
    const rm = meta(rag.providerMetadata);
    expect(rm).toMatchObject({ mode: "rag", injected: false, alpha: null, tiers: [], memoryTokens: 0 });
    expect((rm.memories as { id: string }[]).map((x) => x.id)).toEqual([memoryId]);
    // The memory is prompt text in RAG: the prompt is longer than the same turn's without memory.
    expect(rag.usage.inputTokens!).toBeGreaterThan(none.usage.inputTokens!);
    expect((rm.contextTokens as number) > 0).toBe(true);
    expect((await sys.conversations.list({ userId: "alice", sessionId: "r1" })).map((t) => t.injectionMode ?? null)).toEqual([null, "rag"]);

    const bob = await generateText({ model: dki("dki"), prompt: HIKING_Q, maxOutputTokens: 3, providerOptions: as("bob", "b1") });
    expect((meta(bob.providerMetadata).memories as { id: string }[]).some((x) => x.id === memoryId)).toBe(false);
    const bobRag = await generateText({ model: dki("rag"), prompt: HIKING_Q, maxOutputTokens: 3, providerOptions: as("bob", "b2") });
    expect((meta(bobRag.providerMetadata).memories as { id: string }[]).some((x) => x.id === memoryId)).toBe(false);
  });

  test("providerOptions.dki.alpha forces α; system messages are the turn's system prompt", async () => {
    const r = await generateText({ model: dki("dki"), system: "You are terse.", prompt: HIKING_Q, maxOutputTokens: 3, providerOptions: as("alice", "a1", { alpha: 0.5 }) });
    const direct = await sys.chat(HIKING_Q, { userId: "alice", sessionId: "a1-direct", maxNewTokens: 3, forceAlpha: 0.5, systemPrompt: "You are terse." });
    expect(meta(r.providerMetadata)).toMatchObject({ forced: true, alpha: 0.5, promptTokens: direct.inputTokens });
    expect(r.text).toBe(direct.text);
  });

  test("earlier messages: none warned when they are the session's record, a warning when the model did not see them", async () => {
    const first = await generateText({ model: dki("dki"), prompt: HIKING_Q, maxOutputTokens: 3, providerOptions: as("alice", "h1") });
    const messages: ModelMessage[] = [{ role: "user", content: HIKING_Q }, ...first.response.messages, { role: "user", content: "And in winter?" }];
    const second = await generateText({ model: dki("dki"), messages, maxOutputTokens: 3, providerOptions: as("alice", "h1") });
    expect(second.warnings ?? []).toEqual([]);
    expect(meta(second.providerMetadata).historyTokens).toBeGreaterThan(0);

    const made: ModelMessage[] = [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello!" }, { role: "user", content: HIKING_Q }];
    const other = await generateText({ model: dki("dki"), messages: made, maxOutputTokens: 3, providerOptions: as("alice", "h2") });
    expect(other.warnings).toEqual([{ type: "other", message: expect.stringMatching(/^2 earlier message\(s\) of the prompt are not the recorded turns of session "h2" \(0 recorded messages\), and the model did not see them/) }]);
  });

  test("settings the engine has no equivalent for are warnings, not silently dropped", async () => {
    const r = await generateText({ model: dki("none"), prompt: HIKING_Q, maxOutputTokens: 2, presencePenalty: 0.5, frequencyPenalty: 0.2, providerOptions: as("alice", "w1") });
    expect(r.warnings?.map((w) => (w.type === "unsupported" ? w.feature : w.type))).toEqual(["presencePenalty", "frequencyPenalty"]);
  });

  test("bad input is refused naming the problem, before any turn runs", async () => {
    const before = (await sys.conversations.listUser({ userId: "alice" })).length;
    const fails = async (p: Promise<unknown>, type: { isInstance(e: unknown): boolean }, message: RegExp) => {
      const e = await p.then(
        () => null,
        (x: unknown) => x,
      );
      expect(e, "should have failed").not.toBeNull();
      expect(type.isInstance(e), String(e)).toBe(true);
      expect((e as Error).message).toMatch(message);
    };
    await fails(generateText({ model: dki("dki"), prompt: "Hi", maxRetries: 0 }), InvalidArgumentError, /providerOptions\.dki is missing: a DKI turn needs \{ userId, sessionId \}/);
    await fails(generateText({ model: dki("dki"), prompt: "Hi", maxRetries: 0, providerOptions: { dki: { userID: "alice", sessionId: "x" } } }), InvalidArgumentError, /providerOptions\.dki\.userId: .*; providerOptions\.dki: Unrecognized key: "userID"/);
    await fails(generateText({ model: dki("dki"), prompt: "Hi", maxRetries: 0, providerOptions: { dki: { userId: " ", sessionId: "x" } } }), InvalidArgumentError, /providerOptions\.dki\.userId: must be a non-empty string/);
    await fails(generateText({ model: dki("dki"), prompt: "Hi", maxRetries: 0, providerOptions: as("alice", "x", { alpha: 2 }) }), InvalidArgumentError, /providerOptions\.dki\.alpha: /);
    await fails(generateText({ model: dki("rag"), prompt: "Hi", maxRetries: 0, providerOptions: as("alice", "x", { alpha: 0.5 }) }), InvalidArgumentError, /applies to the "dki" model only, not "rag"/);
    await fails(
      generateText({ model: dki("dki"), maxRetries: 0, messages: [{ role: "user", content: [{ type: "file", data: new Uint8Array([1, 2]), mediaType: "image/png" }] }], providerOptions: as("alice", "x") }),
      UnsupportedFunctionalityError,
      /file parts \(image\/png\): the DKI engine reads text only/,
    );
    await fails(Promise.resolve().then(() => dki("gpt-4" as "dki")), NoSuchModelError, /no DKI language model "gpt-4": use "dki", "rag", "none"/);
    await fails(Promise.resolve().then(() => dki.embeddingModel("other")), NoSuchModelError, /no DKI embedding model "other"/);
    expect((await sys.conversations.listUser({ userId: "alice" })).length).toBe(before);
  });
});

describe("streamText", () => {
  test("the model's parts in order (stream-start, response-metadata, text-start, deltas, text-end, finish), deltas adding up to the answer", async () => {
    const parts: LanguageModelV3StreamPart[] = [];
    const { stream } = await dki("dki").doStream({ prompt: [{ role: "user", content: [{ type: "text", text: HIKING_Q }] }], maxOutputTokens: 8, providerOptions: as("alice", "s0") });
    for await (const p of stream) parts.push(p);
    const types = parts.map((p) => p.type);
    const deltas = types.filter((t) => t === "text-delta").length;
    expect(deltas).toBeGreaterThan(0);
    expect(types).toEqual(["stream-start", "response-metadata", "text-start", ...Array<string>(deltas).fill("text-delta"), "text-end", "finish"]);
    const text = parts.map((p) => (p.type === "text-delta" ? p.delta : "")).join("");
    const finish = parts.at(-1) as Extract<LanguageModelV3StreamPart, { type: "finish" }>;
    expect(finish.providerMetadata?.dki).toMatchObject({ mode: "dki", sessionId: "s0", memoryTokens: memoryTokens() });
    expect(finish.usage.outputTokens.total).toBe(8);
    const turns = await sys.conversations.list({ userId: "alice", sessionId: "s0" });
    expect(turns[1]!.content).toBe(text);
  });

  test("through the SDK: text, usage and metadata equal generateText's for the same turn", async () => {
    const s = streamText({ model: dki("dki"), prompt: HIKING_Q, maxOutputTokens: 6, providerOptions: as("alice", "s1") });
    const parts: TextStreamPart<ToolSet>[] = [];
    for await (const p of s.fullStream) parts.push(p);
    const types = parts.map((p) => p.type).filter((t) => t !== "text-delta");
    expect(types).toEqual(["start", "start-step", "text-start", "text-end", "finish-step", "finish"]);
    const g = await generateText({ model: dki("dki"), prompt: HIKING_Q, maxOutputTokens: 6, providerOptions: as("alice", "s1-g") });
    expect(await s.text).toBe(g.text);
    const usage = await s.usage;
    expect(usage.inputTokens).toBe(g.usage.inputTokens);
    expect(usage.outputTokens).toBe(g.usage.outputTokens);
    expect(usage.inputTokenDetails).toEqual({ noCacheTokens: g.usage.inputTokens, cacheReadTokens: 0, cacheWriteTokens: 0 });
    const m = meta(await s.providerMetadata);
    expect(m).toMatchObject({ mode: "dki", sessionId: "s1", memories: [{ id: memoryId }], memoryTokens: memoryTokens(), injected: true });
    expect(await s.finishReason).toBe(g.finishReason);
  });

  test("an abort mid-answer stops the turn: the SDK reports it as an abort, and nothing is recorded", async () => {
    const types = await streamAbortedAtFirstText(dki("dki"), "ab1");
    expect(types).toContain("abort");
    expect(types).not.toContain("finish");
    expect(types.filter((t) => t === "text-delta").length).toBeLessThan(800);
    expect(await sys.conversations.list({ userId: "alice", sessionId: "ab1" })).toEqual([]);
    const stats = sys.stats();
    expect(stats.failedTurns).toBeGreaterThan(0);
  });

  test("a reader that cancels the stream stops the turn too", async () => {
    const { stream } = await dki("dki").doStream({ prompt: [{ role: "user", content: [{ type: "text", text: HIKING_Q }] }], maxOutputTokens: 800, providerOptions: as("alice", "ab2") });
    const reader = stream.getReader();
    for (;;) {
      const { value } = await reader.read();
      if (value?.type === "text-delta") break;
    }
    const failed = sys.stats().failedTurns;
    await reader.cancel();
    // The turn ends (rejected by its signal) and records nothing.
    for (let i = 0; i < 3000 && sys.stats().failedTurns === failed; i++) await new Promise((r) => setTimeout(r, 10));
    expect(sys.stats().failedTurns).toBe(failed + 1);
    expect(await sys.conversations.list({ userId: "alice", sessionId: "ab2" })).toEqual([]);
  });

  test("generateText with an aborted signal rejects with the abort and records nothing", async () => {
    const ctl = new AbortController();
    const p = generateText({ model: dki("dki"), prompt: HIKING_Q, maxOutputTokens: 800, abortSignal: ctl.signal, providerOptions: as("alice", "ab3") });
    setTimeout(() => ctl.abort(), 0);
    await expect(p).rejects.toMatchObject({ name: "AbortError" });
    await expect(generateText({ model: dki("dki"), prompt: HIKING_Q, abortSignal: AbortSignal.abort(), providerOptions: as("alice", "ab3") })).rejects.toMatchObject({ name: "AbortError" });
    expect(await sys.conversations.list({ userId: "alice", sessionId: "ab3" })).toEqual([]);
  });
});

describe("embeddings", () => {
  test("embed and embedMany return the store's own vectors", async () => {
    const { embedding, providerMetadata } = await embed({ model: dki.embeddingModel(), value: HIKING });
    const [own] = await sys.store.embedder.embed([HIKING]);
    expect(embedding).toEqual(Array.from(own!));
    expect(embedding.length).toBe(sys.store.embedder.dim);
    expect(providerMetadata?.dki).toEqual({ embedder: sys.store.embedder.id, dimensions: sys.store.embedder.dim });

    const texts = [HIKING, HIKING_Q, "Bob plays the cello."];
    const many = await embedMany({ model: dki.textEmbeddingModel(), values: texts });
    const ownMany = await sys.store.embedder.embed(texts);
    expect(many.embeddings).toEqual(ownMany.map((v) => Array.from(v)));
    // No token count is known for the hashing embedder: none is claimed.
    expect(many.usage.tokens).toBeNaN();
  });
});

describe("memoryRerank", () => {
  test("a routing reranker picks the memory for both modes: dki injects it and rag prompts with it", async () => {
    const reranker = await OnnxCrossEncoder.load(`${repoRoot}/models/memory-qa-reranker`, { threads: 1 });
    const p = createDki({ model, dataDir: tempDir(), config: { maxMemories: 1, generationReserve: 128 }, memoryRerank: { reranker } });
    try {
      const s = await p.system();
      const q = "What is the name of the user's dog?";
      await s.memories.add("User: Is my dog named? My friend's dog is Pelvorin.", { userId: "carol" });
      const [own] = await s.memories.add("User: I have a dog named Corsadro.", { userId: "carol" });
      // The search alone puts the friend's dog first: only the reranker brings the user's own up.
      expect((await routeMemories(s.store, q, { userId: "carol", limit: 1 }))[0]!.memory.id).not.toBe(own!.id);
      for (const mode of ["dki", "rag"] as const) {
        const r = await generateText({ model: p(mode), prompt: q, maxOutputTokens: 2, providerOptions: as("carol", `rr-${mode}`, mode === "dki" ? { alpha: 1 } : {}) });
        expect((meta(r.providerMetadata).memories as { id: string }[]).map((x) => x.id)).toEqual([own!.id]);
      }
    } finally {
      await p.close();
      await reranker.close();
    }
  });
});

describe("the package", () => {
  test("dki-engine/ai-sdk resolves through package.json exports to the built provider", async () => {
    const { stdout } = await promisify(execFile)(process.execPath, ["--input-type=module", "-e", 'const m = await import("dki-engine/ai-sdk"); console.log(typeof m.createDki, m.DKI_MODEL_IDS.join(","))'], { cwd: repoRoot });
    expect(stdout.trim()).toBe("function dki,rag,none");
  });

  test("a provider given a model path loads it on first use, and refuses calls once closed", async () => {
    const p = createDki({ model: model.info.dir, dataDir: tempDir(), loadOptions: { contextSize: 512 } });
    try {
      const r = await generateText({ model: p("none"), prompt: "Hello", maxOutputTokens: 2, providerOptions: as("u", "s") });
      expect(r.usage.outputTokens).toBe(2);
    } finally {
      await p.close();
    }
    await expect(generateText({ model: p("none"), prompt: "Hello", maxRetries: 0, providerOptions: as("u", "s") })).rejects.toThrow("this DKI provider has been closed");
  });
});
