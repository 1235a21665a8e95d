// DKISystem end to end on a generated model and the real memory store (LMDB, hashing embedder):
// routing and injection for the right user only (a property test over users, memories and
// queries), the exact identities of injection at α = 1, gating's effects on the output, the
// hybrid injection (preferences as K/V only, history as text only), the cache across turns and
// processes, concurrent users, and what each turn writes.
import { spawn } from "node:child_process";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { DKISystem, formatHistory, type DKIConfigInput, type HistoryProvider } from "../src/dki/index.js";
import type { MemoryStoreApi } from "../src/memory/types.js";
import { maxAbsDiff, repoRoot, tempDir } from "./support/paths.js";
import { prng } from "./support/prng.js";

let model: Model;
let modelDir: string;
const maxRowDiff = (a: ArrayLike<number>[], b: ArrayLike<number>[]) => Math.max(...a.map((row, i) => maxAbsDiff(row, b[i]!)));
const sameRows = (a: Float32Array[], b: Float32Array[]) => a.length === b.length && a.every((r, i) => maxAbsDiff(r, b[i]!) === 0);

/** Exact-identity settings: no encoding prefix, no template, no history, nothing but the memory. */
const bare: DKIConfigInput = { encodingPrefix: "none", chatTemplate: "never", historyEnabled: false, preferenceEnabled: false, generationReserve: 64 };

beforeAll(async () => {
  modelDir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: modelDir, seed: 7 });
  model = await Model.load(modelDir, { contextSize: 1024 });
});
afterAll(() => model.dispose());

async function open(config: DKIConfigInput = {}, dataDir = tempDir()): Promise<DKISystem> {
  return DKISystem.open({ model, dataDir, config: { generationReserve: 128, ...config } });
}

const HIKING = "Alice loves hiking in the Alps and is allergic to peanuts.";
const HIKING_Q = "Any tips for hiking in the Alps with a peanut allergy?";

describe("end to end", () => {
  test("A's related memory is routed and injected for A (logits change), never for B; the second turn gets it from L1 with the same logits", async () => {
    const sys = await open(); // default gating
    try {
      const [mem] = await sys.memories.add(HIKING, { userId: "alice" });
      await sys.memories.add("Bob plays the cello in a jazz band.", { userId: "bob" });
      const r = await sys.chat(HIKING_Q, { userId: "alice", sessionId: "s1", maxNewTokens: 4 });
      expect(r.memoriesUsed.map((m) => m.id)).toEqual([mem!.id]);
      expect(r.memoriesUsed[0]!.tokens).toBe(model.tokenizer.encode(HIKING, { addSpecialTokens: false }).length);
      expect(r.gating.inject).toBe(true);
      expect(r.cache.tiers.map((b) => [b.kind, b.id, b.tier])).toEqual([["memory", mem!.id, "L4"]]);
      expect(r.cache.hit).toBe(false);
      expect(r.budget.memoryTokens).toBe(r.memoriesUsed[0]!.tokens);
      expect(r.budget.userTokens).toBe(r.inputTokens);

      // In a session of its own: "s1" now has history, which changes the prompt.
      const withMem = await sys.logits(HIKING_Q, { userId: "alice", sessionId: "probe" });
      const without = await sys.logits(HIKING_Q, { userId: "alice", sessionId: "probe", allowInjection: false });
      expect(withMem.tiers.map((t) => t.tier)).toEqual(["L1"]);
      expect(maxRowDiff(withMem.logits, without.logits)).toBeGreaterThan(1e-3);

      const again = await sys.chat(HIKING_Q, { userId: "alice", sessionId: "s1", maxNewTokens: 4 });
      expect(again.cache).toMatchObject({ hit: true, tiers: [{ kind: "memory", id: mem!.id, tier: "L1" }] });
      expect(sameRows((await sys.logits(HIKING_Q, { userId: "alice", sessionId: "probe" })).logits, withMem.logits)).toBe(true);

      // A second memory that routing finds but that is not relevant enough itself: left out, and said why.
      const [weak] = await sys.memories.add("Alice's cousin has a red bicycle.", { userId: "alice" });
      const third = await sys.chat(HIKING_Q, { userId: "alice", sessionId: "s3", maxNewTokens: 1 });
      expect(third.memoriesUsed.map((m) => m.id)).toEqual([mem!.id]);
      expect(third.metadata.memoriesLeftOut).toEqual([{ id: weak!.id, reason: expect.stringMatching(/^relevance 0\.\d{3} is below the threshold 0\.162$/) }]);

      const b = await sys.chat(HIKING_Q, { userId: "bob", sessionId: "s2", maxNewTokens: 4 });
      expect(b.memoriesUsed.every((m) => m.id !== mem!.id)).toBe(true);
    } finally {
      await sys.close();
    }
  });

  test("property: over random users, memories and queries, a turn injects only its own user's memories, and its record names only them", async () => {
    const sys = await open({ gating: { relevanceThreshold: 0 }, maxMemories: 3 });
    try {
      const rnd = prng(2029);
      const topics = ["hiking", "peanuts", "cello", "jazz", "Lyon", "vegetarian", "marathon", "sushi", "Kyoto", "chess", "sailing", "opera"];
      const pick = () => topics[Math.floor(rnd() * topics.length)]!;
      const users = ["u0", "u1", "u2", "u3"];
      const owner = new Map<string, string>();
      for (let i = 0; i < 16; i++) {
        const u = users[Math.floor(rnd() * users.length)]!;
        for (const m of await sys.memories.add(`${u} likes ${pick()} and ${pick()} (${i}).`, { userId: u })) owner.set(m.id, u);
      }
      for (let i = 0; i < 12; i++) {
        const u = users[Math.floor(rnd() * users.length)]!;
        const r = await sys.chat(`Tell me about ${pick()} and ${pick()}.`, { userId: u, sessionId: `p${i}`, maxNewTokens: 1 });
        for (const m of r.memoriesUsed) expect(owner.get(m.id)).toBe(u);
        const [audit] = (await sys.audit.list({ userId: u, sessionId: `p${i}` })).slice(-1);
        expect(audit!.memoryIds).toEqual(r.memoriesUsed.map((m) => m.id));
        for (const id of audit!.memoryIds) expect(owner.get(id)).toBe(u);
      }
    } finally {
      await sys.close();
    }
  });
});

describe("exactness (α = 1, one memory)", () => {
  test.each(["negative", "prefix"] as const)("%s positions: the system's logits equal [memory ; prompt] run as one sequence (≤ 1e-4)", async (positions) => {
    const sys = await open({ ...bare, positions });
    try {
      await sys.memories.add(HIKING, { userId: "alice" });
      const r = await sys.logits(HIKING_Q, { userId: "alice", sessionId: "x", forceAlpha: 1 });
      expect(r.memoriesUsed).toHaveLength(1);
      const mem = model.tokenizer.encode(HIKING, { addSpecialTokens: false });
      // Rotary attention sees relative positions only: memory at [−M, −1] and prompt at 0 is the
      // one sequence shifted by M, so both strategies must match it.
      const full = (await model.logits([...mem, ...r.promptTokens])).slice(mem.length);
      expect(maxRowDiff(full, r.logits)).toBeLessThan(1e-4);
    } finally {
      await sys.close();
    }
  });
});

describe("gating in the system", () => {
  test("below the threshold the output is byte-identical to a turn without memory; forceAlpha and allowInjection are honoured", async () => {
    const sys = await open({ ...bare, gating: { relevanceThreshold: 0, alphaMax: 0.05 } });
    try {
      await sys.memories.add(HIKING, { userId: "alice" });
      const opts = { userId: "alice", sessionId: "g", maxNewTokens: 12 };
      const none = await sys.chat(HIKING_Q, { ...opts, allowInjection: false });
      expect(none.gating.reason).toBe("injection is off for this turn (allowInjection: false)");
      expect(none.cache.tiers).toEqual([]);
      const gated = await sys.chat(HIKING_Q, opts);
      expect(gated.gating.inject).toBe(false);
      expect(gated.gating.entropy).not.toBeNull(); // measured: relevance said yes, α came out below 0.1
      expect(gated.gating.reason).toMatch(/below the injection threshold 0\.10: nothing injected$/);
      expect(gated.memoriesUsed).toEqual([]);
      expect(gated.text).toBe(none.text);
      expect(sameRows((await sys.logits(HIKING_Q, opts)).logits, (await sys.logits(HIKING_Q, { ...opts, allowInjection: false })).logits)).toBe(true);
      const low = await sys.chat(HIKING_Q, { ...opts, forceAlpha: 0.05 });
      expect(low.text).toBe(none.text);
      expect(low.gating).toMatchObject({ forced: true, inject: false });
      const forced = await sys.chat(HIKING_Q, { ...opts, forceAlpha: 0.9 });
      expect(forced.gating).toMatchObject({ forced: true, inject: true, alpha: 0.9 });
      expect(forced.memoriesUsed).toHaveLength(1);
      expect(forced.cache.tiers[0]!.alpha).toBe(0.9);
      await expect(sys.chat(HIKING_Q, { ...opts, forceAlpha: 2 })).rejects.toThrow(/forceAlpha must be a number in \[0, 1\], got 2/);
    } finally {
      await sys.close();
    }
  });

  test("α = 0 at alphaThreshold 0 is injected (the engine's rule): the memory's columns keep their softmax share, so the logits differ from no memory", async () => {
    const sys = await open({ ...bare, gating: { alphaThreshold: 0 } });
    try {
      const [mem] = await sys.memories.add(HIKING, { userId: "alice" });
      const opts = { userId: "alice", sessionId: "z" };
      const zero = await sys.logits(HIKING_Q, { ...opts, forceAlpha: 0 });
      expect(zero.gating).toMatchObject({ forced: true, inject: true, alpha: 0 });
      expect(zero.memoriesUsed.map((m) => m.id)).toEqual([mem!.id]);
      expect(zero.tiers.map((b) => [b.kind, b.alpha])).toEqual([["memory", 0]]);
      const without = await sys.logits(HIKING_Q, { ...opts, allowInjection: false });
      expect(maxRowDiff(zero.logits, without.logits)).toBeGreaterThan(1e-4);
      const turn = await sys.chat(HIKING_Q, { ...opts, forceAlpha: 0, maxNewTokens: 1 });
      expect(turn.memoriesUsed.map((m) => m.id)).toEqual([mem!.id]);
    } finally {
      await sys.close();
    }
    // A preference block at preferenceAlpha 0 follows the same rule.
    const withPrefs = await open({ ...bare, preferenceEnabled: true, preferenceAlpha: 0, gating: { alphaThreshold: 0 } });
    try {
      await withPrefs.preferences.add("short answers", { userId: "alice", type: "style" });
      const r = await withPrefs.chat(HIKING_Q, { userId: "alice", sessionId: "p", maxNewTokens: 1 });
      expect(r.metadata.hybridInjection).toMatchObject({ enabled: true, preferenceAlpha: 0 });
      expect(r.cache.tiers.map((b) => [b.kind, b.alpha])).toEqual([["preferences", 0]]);
    } finally {
      await withPrefs.close();
    }
  });

  test("α grows with relevance: a closer query injects the same memory more strongly (entropy weight 0 to isolate it)", async () => {
    const sys = await open({ gating: { relevanceThreshold: 0, entropyWeight: 0 } });
    try {
      await sys.memories.add(HIKING, { userId: "alice" });
      const close = await sys.chat(HIKING_Q, { userId: "alice", sessionId: "m", maxNewTokens: 1 });
      const loose = await sys.chat("What about the weather in general?", { userId: "alice", sessionId: "m2", maxNewTokens: 1 });
      expect(close.gating.relevance).toBeGreaterThan(loose.gating.relevance + 0.1);
      expect(close.gating.inject && loose.gating.inject).toBe(true);
      expect(close.gating.alpha).toBeGreaterThan(loose.gating.alpha);
      // What gating read is the dense (cosine) signal, not the rank-based fused score.
      expect(close.memoriesUsed[0]!.relevance).toBe(close.gating.relevance);
    } finally {
      await sys.close();
    }
  });
});

describe("hybrid injection", () => {
  test("preferences go in as one K/V block first at preferenceAlpha, never as text; history as text only; the record keeps the original query", async () => {
    const sys = await open({ gating: { relevanceThreshold: 0.05 } });
    try {
      await sys.preferences.add("vegetarian, no meat", { userId: "alice", type: "dietary", priority: 5 });
      await sys.preferences.add("short answers", { userId: "alice", type: "style", priority: 9 });
      const [mem] = await sys.memories.add(HIKING, { userId: "alice" });
      const first = await sys.chat(HIKING_Q, { userId: "alice", sessionId: "h", maxNewTokens: 6 });
      const hi = first.metadata.hybridInjection;
      expect(hi.preferenceText).toBe("- [style] short answers\n- [dietary] vegetarian, no meat");
      expect(hi.enabled).toBe(true);
      expect(hi.preferenceAlpha).toBe(0.4);
      expect(hi.preferenceTokens).toBe(model.tokenizer.encode(hi.preferenceText, { addSpecialTokens: false }).length);
      expect(first.cache.tiers.map((b) => [b.kind, b.alpha])).toEqual([["preferences", 0.4], ["memory", first.gating.alpha]]);
      expect(hi.finalInput).not.toContain("vegetarian");
      expect(hi.finalInput).not.toContain(HIKING);
      expect(hi.historyMessages).toEqual([]);
      expect(first.memoriesUsed.map((m) => m.id)).toEqual([mem!.id]);

      const second = await sys.chat("And what should I pack?", { userId: "alice", sessionId: "h", maxNewTokens: 6 });
      const h2 = second.metadata.hybridInjection;
      expect(h2.historyMessages.map((m) => [m.role, m.content])).toEqual([["user", HIKING_Q], ["assistant", first.text]]);
      expect(h2.historySuffixText.startsWith("[Session History Reference]")).toBe(true);
      expect(h2.finalInput).toContain(`User: ${HIKING_Q}`);
      expect(second.cache.tiers[0]).toMatchObject({ kind: "preferences", tier: "L1" });

      const rows = await sys.conversations.list({ userId: "alice", sessionId: "h" });
      expect(rows.map((t) => [t.role, t.content])).toEqual([["user", HIKING_Q], ["assistant", first.text], ["user", "And what should I pack?"], ["assistant", second.text]]);
      expect(rows[1]).toMatchObject({ injectionMode: "dki", memoryIds: [mem!.id] });
      expect(rows[1]!.alpha).toBeCloseTo(first.gating.alpha, 12);
      const audit = await sys.audit.list({ userId: "alice", sessionId: "h" });
      expect(audit.filter((a) => a.action === "dki_generate")).toHaveLength(2);
      expect(audit[0]!.metadata).toMatchObject({ reason: first.gating.reason, relevance: first.gating.relevance });
    } finally {
      await sys.close();
    }
  });
});

describe("blocks, order and prefix", () => {
  test("memoryOrder score vs time vs score-last; encodingPrefix bos+system keys blocks by the system prompt; clearSessionCache drops a session's blocks; stats", async () => {
    const dataDir = tempDir();
    let sys = await open({ gating: { relevanceThreshold: 0 }, preferenceEnabled: false, encodingPrefix: "bos+system" }, dataDir);
    const [older] = await sys.memories.add("Alice went to Kyoto in spring.", { userId: "alice" });
    await new Promise((r) => setTimeout(r, 5));
    const [newer] = await sys.memories.add("Alice loves hiking in the Alps with friends in Kyoto.", { userId: "alice" });
    const q = "Hiking in the Alps and Kyoto?";
    const byScore = await sys.chat(q, { userId: "alice", sessionId: "o1", maxNewTokens: 1, systemPrompt: "Be brief." });
    expect(byScore.memoriesUsed.map((m) => m.id)).toEqual([newer!.id, older!.id]);
    expect(byScore.memoriesUsed[0]!.score).toBeGreaterThanOrEqual(byScore.memoriesUsed[1]!.score);
    expect(byScore.cache.tiers.map((b) => b.tier)).toEqual(["L4", "L4"]);
    // Same system prompt: the same blocks (L1); another: other blocks, encoded behind it (L4).
    expect((await sys.chat(q, { userId: "alice", sessionId: "o2", maxNewTokens: 1, systemPrompt: "Be brief." })).cache.tiers.map((b) => b.tier)).toEqual(["L1", "L1"]);
    expect((await sys.chat(q, { userId: "alice", sessionId: "o3", maxNewTokens: 1, systemPrompt: "Be verbose." })).cache.tiers.map((b) => b.tier)).toEqual(["L4", "L4"]);
    // The blocks o1 and o2 used, dropped from every tier: computed again.
    expect(await sys.clearSessionCache("o1")).toBe(2);
    expect(await sys.clearSessionCache("o1")).toBe(0);
    expect((await sys.chat(q, { userId: "alice", sessionId: "o4", maxNewTokens: 1, systemPrompt: "Be brief." })).cache.tiers.map((b) => b.tier)).toEqual(["L4", "L4"]);
    const st = sys.stats();
    expect(st.turns).toBe(4);
    expect(st.failedTurns).toBe(0);
    expect(st.meanLatency.totalMs).toBeGreaterThan(0);
    expect(st.cache.L4.hits).toBe(6);
    await sys.close();

    sys = await open({ gating: { relevanceThreshold: 0 }, preferenceEnabled: false, memoryOrder: "time" }, dataDir);
    try {
      const byTime = await sys.chat(q, { userId: "alice", sessionId: "o5", maxNewTokens: 1 });
      expect(byTime.memoriesUsed.map((m) => m.id)).toEqual([older!.id, newer!.id]);
      expect(byTime.metadata.memoryOrder).toBe("time");
    } finally {
      await sys.close();
    }
    sys = await open({ gating: { relevanceThreshold: 0 }, preferenceEnabled: false, memoryOrder: "score-last" }, dataDir);
    try {
      const bestLast = await sys.chat(q, { userId: "alice", sessionId: "o6", maxNewTokens: 1 });
      expect(bestLast.memoriesUsed.map((m) => m.id)).toEqual([older!.id, newer!.id]);
      expect(bestLast.memoriesUsed[1]!.score).toBeGreaterThanOrEqual(bestLast.memoriesUsed[0]!.score);
      expect(bestLast.metadata.memoryOrder).toBe("score-last");
    } finally {
      await sys.close();
    }
  });

  test("memoryEncoding joint: the routed memories are one block, equal to computing their tokens together with the engine; separate blocks differ", async () => {
    const joint = await open({ ...bare, memoryEncoding: "joint" });
    try {
      await joint.memories.add("Alice went to Kyoto in spring.", { userId: "alice" });
      await joint.memories.add("Alice loves hiking in the Alps.", { userId: "alice" });
      await joint.memories.add("Alice keeps two cats.", { userId: "alice" });
      const q = "Does Alice like hiking in the Alps, Kyoto or cats?";
      const r = await joint.chat(q, { userId: "alice", sessionId: "j1", maxNewTokens: 1, forceAlpha: 1 });
      expect(r.memoriesUsed).toHaveLength(3);
      expect(r.metadata.memoryEncoding).toBe("joint");
      const tokens = r.memoriesUsed.flatMap((m) => model.tokenizer.encode(m.text, { addSpecialTokens: false }));
      expect(r.cache.tiers).toEqual([expect.objectContaining({ kind: "memory", id: r.memoriesUsed.map((m) => m.id).join("+"), tokens: tokens.length })]);

      // The reference: the engine's own block of all the tokens, injected at [−M, −1].
      const got = await joint.logits(q, { userId: "alice", sessionId: "j2", forceAlpha: 1 });
      const block = await model.computeBlock(tokens);
      try {
        const want = await model.logits(got.promptTokens, { segments: [{ kv: block, alpha: 1 }], positions: "negative" });
        expect(maxRowDiff(got.logits, want)).toBeLessThan(1e-4);
      } finally {
        block.dispose();
      }
      // Apart, each memory loses the others: not the same logits.
      const separate = await open({ ...bare });
      try {
        for (const m of r.memoriesUsed) await separate.memories.add(m.text, { userId: "alice" });
        const apart = await separate.logits(q, { userId: "alice", sessionId: "s1", forceAlpha: 1 });
        expect(apart.tiers).toHaveLength(3);
        expect(apart.promptTokens).toEqual(got.promptTokens);
        expect(maxRowDiff(apart.logits, got.logits)).toBeGreaterThan(1e-4);
      } finally {
        await separate.close();
      }
    } finally {
      await joint.close();
    }
  });

  test("memoryMaxTokens caps the memory tokens a turn injects; the memories past it are reported left out", async () => {
    const short = "Alice hikes in the Alps.";
    const n = model.tokenizer.encode(short, { addSpecialTokens: false }).length;
    const sys = await open({ gating: { relevanceThreshold: 0 }, preferenceEnabled: false, memoryMaxTokens: n + 2 });
    try {
      const [a] = await sys.memories.add(short, { userId: "alice" });
      const [b] = await sys.memories.add("Alice hikes in the Alps every summer with her two brothers and their dogs.", { userId: "alice" });
      const r = await sys.chat("Alice hikes in the Alps?", { userId: "alice", sessionId: "cap", maxNewTokens: 1 });
      expect(r.memoriesUsed.map((m) => m.id)).toEqual([a!.id]);
      expect(r.budget.memoryTokens).toBe(n);
      expect(r.metadata.memoriesLeftOut).toEqual([{ id: b!.id, reason: expect.stringMatching(new RegExp(`^its \\d+ tokens exceed the 2 left of memoryMaxTokens \\(${n + 2}\\)$`)) }]);
      // What routing returned, before the budget: both, in the search's order and with its scores.
      expect(r.metadata.routed).toEqual((await sys.store.memories.search("Alice hikes in the Alps?", { userId: "alice", limit: 3 })).map((x) => ({ id: x.memory.id, score: x.score })));
      expect(r.metadata.routed.map((x) => x.id).sort()).toEqual([a!.id, b!.id].sort());
      // The same text stored twice is one block, injected once.
      const [twin] = await sys.memories.add(short, { userId: "alice" });
      const again = await sys.chat("Alice hikes in the Alps?", { userId: "alice", sessionId: "cap2", maxNewTokens: 1 });
      expect(again.memoriesUsed).toHaveLength(1);
      expect(again.cache.tiers).toHaveLength(1);
      const first = again.memoriesUsed[0]!.id;
      expect([a!.id, twin!.id]).toContain(first);
      expect(again.metadata.memoriesLeftOut).toContainEqual({ id: first === a!.id ? twin!.id : a!.id, reason: `same text as ${first}, injected once` });
    } finally {
      await sys.close();
    }
  });

  test("a Chinese query gets the Chinese history template; the history is dropped when it would crowd out the answer", async () => {
    const sys = await open({ gating: { relevanceThreshold: 0 }, generationReserve: 920 }, tempDir());
    try {
      await sys.chat("我对花生过敏", { userId: "li", sessionId: "zh", maxNewTokens: 2 });
      const r = await sys.chat("推荐一个北京的餐厅", { userId: "li", sessionId: "zh", maxNewTokens: 2 });
      const h = r.metadata.hybridInjection;
      expect(h.historyLanguage).toBe("cn");
      // The window (1024) less the reserve (920) leaves 104 prompt tokens: the history does not fit, and goes.
      expect(h.historyDropped).toBe(true);
      expect(h.historySuffixText).toBe("");
      expect(h.finalInput).not.toContain("[会话历史参考]");
    } finally {
      await sys.close();
    }
    const roomy = await open({ gating: { relevanceThreshold: 0 } }, tempDir());
    try {
      await roomy.chat("我对花生过敏", { userId: "li", sessionId: "zh", maxNewTokens: 2 });
      const h = (await roomy.chat("推荐一个北京的餐厅", { userId: "li", sessionId: "zh", maxNewTokens: 2 })).metadata.hybridInjection;
      expect(h.historySuffixText.startsWith("[会话历史参考]\n在回复用户之前")).toBe(true);
      expect(h.historySuffixText).toContain("用户: 我对花生过敏");
      expect(h.finalInput).toContain(h.historySuffixText);
    } finally {
      await roomy.close();
    }
  });
});

describe("pluggable history", () => {
  test("another HistoryProvider (here: the user's earlier session) supplies the suffix the turn uses", async () => {
    const dataDir = tempDir();
    // A provider that recalls the user's previous session instead of this one: the kind of swap
    // Recall v4 makes, through the same interface.
    const crossSession = (store: MemoryStoreApi): HistoryProvider => ({
      strategy: "previous_session",
      async suffix(req) {
        const turns = await store.conversations.list({ userId: req.userId, sessionId: "earlier", limit: req.maxMessages });
        const messages = turns.map((t) => ({ role: t.role as "user" | "assistant", content: t.content, id: t.id }));
        return { ...formatHistory(messages, req.language, req.counter, req.maxTokens), strategy: "previous_session", metadata: { from: "earlier" } };
      },
    });
    const sys = await DKISystem.open({ model, dataDir, config: { generationReserve: 128 }, history: crossSession });
    try {
      await sys.chat("I am allergic to peanuts.", { userId: "alice", sessionId: "earlier", maxNewTokens: 2 });
      const r = await sys.chat("What should I avoid?", { userId: "alice", sessionId: "now", maxNewTokens: 2 });
      const h = r.metadata.hybridInjection;
      expect(h.historyStrategy).toBe("previous_session");
      expect(h.historyMessages.map((m) => m.content)[0]).toBe("I am allergic to peanuts.");
      expect(h.finalInput).toContain("User: I am allergic to peanuts.");
    } finally {
      await sys.close();
    }
  });

  test("a model path is loaded and owned by the system (disposed on close)", async () => {
    const sys = await DKISystem.open({ model: modelDir, loadOptions: { contextSize: 256 }, dataDir: tempDir(), config: { generationReserve: 64 } });
    const owned = sys.model;
    expect(owned).not.toBe(model);
    expect(owned.contextSize).toBe(256);
    await sys.chat("Hello there", { userId: "u", sessionId: "s", maxNewTokens: 1 });
    await sys.close();
    expect(() => owned.nativeHandle()).toThrow("model has been disposed");
  });
});

describe("many users at once", () => {
  test("concurrent turns give each user the answer it gets alone; an abort cancels only its own turn and records nothing", async () => {
    const sys = await open({ gating: { relevanceThreshold: 0 } });
    try {
      const users = ["a", "b", "c"];
      for (const u of users) await sys.memories.add(`${u} is into topic ${u}${u}${u} and hiking.`, { userId: u });
      const q = (u: string) => `What about hiking and ${u}${u}${u}?`;
      const alone = new Map<string, string>();
      for (const u of users) alone.set(u, (await sys.chat(q(u), { userId: u, sessionId: "solo", maxNewTokens: 8 })).text);
      const ctl = new AbortController();
      const turns = users.flatMap((u) => [0, 1].map((i) => sys.chat(q(u), { userId: u, sessionId: `c${i}`, maxNewTokens: 8, signal: u === "b" && i === 1 ? ctl.signal : undefined })));
      ctl.abort(new Error("b left"));
      const settled = await Promise.allSettled(turns);
      settled.forEach((s, k) => {
        const u = users[Math.floor(k / 2)]!;
        if (u === "b" && k % 2 === 1) {
          expect(s.status).toBe("rejected");
          expect((s as PromiseRejectedResult).reason.message).toBe("b left");
        } else {
          expect(s.status).toBe("fulfilled");
          const r = (s as PromiseFulfilledResult<Awaited<(typeof turns)[0]>>).value;
          expect(r.text).toBe(alone.get(u));
          expect(r.metadata.userId).toBe(u);
        }
      });
      expect(await sys.conversations.list({ userId: "b", sessionId: "c1" })).toEqual([]);
      expect(sys.stats().failedTurns).toBe(1);
    } finally {
      await sys.close();
    }
  });
});

describe("one session's turns", () => {
  test("run one after another: a turn started before the last was recorded still sees it in its history; an abort while waiting rejects that turn only", async () => {
    const sys = await open({ gating: { relevanceThreshold: 0 } });
    try {
      await sys.memories.add(HIKING, { userId: "alice" });
      const first = sys.chat(HIKING_Q, { userId: "alice", sessionId: "s", maxNewTokens: 6 });
      const ctl = new AbortController();
      const dropped = sys.chat("And the weather?", { userId: "alice", sessionId: "s", maxNewTokens: 2, signal: ctl.signal });
      const second = sys.chat("What should I pack?", { userId: "alice", sessionId: "s", maxNewTokens: 2 });
      // Another session of the same user does not wait behind "s".
      const elsewhere = sys.chat("What should I pack?", { userId: "alice", sessionId: "t", maxNewTokens: 2 });
      ctl.abort(new Error("left"));
      await expect(dropped).rejects.toThrow("left");
      const [r1, r2, r3] = await Promise.all([first, second, elsewhere]);
      expect(r2.metadata.hybridInjection.historyMessages.map((m) => [m.role, m.content])).toEqual([
        ["user", HIKING_Q],
        ["assistant", r1.text],
      ]);
      expect(r3.metadata.hybridInjection.historyMessages).toEqual([]);
      expect((await sys.conversations.list({ userId: "alice", sessionId: "s" })).map((t) => t.content)).toEqual([HIKING_Q, r1.text, "What should I pack?", r2.text]);
      // The wait behind the session's first turn is queue time, not the layer's own cost.
      expect(r2.latency.queueMs).toBeGreaterThan(0);
    } finally {
      await sys.close();
    }
  });
});

describe("a turn in a new process", () => {
  test("gets the block from L3 and logits equal a fresh computation within the int8 form's tolerance", async () => {
    const dataDir = tempDir();
    const config = { gating: { relevanceThreshold: 0 } };
    let sys = await open(config, dataDir);
    await sys.memories.add(HIKING, { userId: "alice" });
    const fresh = await sys.logits(HIKING_Q, { userId: "alice", sessionId: "n", forceAlpha: 1 });
    const none = await sys.logits(HIKING_Q, { userId: "alice", sessionId: "n", allowInjection: false });
    expect(fresh.tiers.map((t) => t.tier)).toEqual(["L4"]);
    await sys.close();

    const child = spawn(process.execPath, [join(repoRoot, "test/support/dki-chat-child.mjs"), join(repoRoot, "dist"), "turn", JSON.stringify({ model: modelDir, dataDir, config: { generationReserve: 128, ...config }, userId: "alice", sessionId: "n", query: HIKING_Q, forceAlpha: 1 })], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr.on("data", (d: Buffer) => (err += d.toString()));
    const code = await new Promise<number | null>((r) => child.on("exit", r));
    expect(code, err).toBe(0);
    const got = JSON.parse(out.trim().split("\n").at(-1)!) as { tiers: string[]; memoryIds: string[]; last: number[] };
    expect(got.tiers).toEqual(["L3"]);
    expect(got.memoryIds).toEqual(fresh.memoriesUsed.map((m) => m.id));
    const last = fresh.logits.at(-1)!;
    const err8 = maxAbsDiff(last, got.last);
    const effect = maxAbsDiff(last, none.logits.at(-1)!);
    // The int8 form's tolerance (cache-quality.test.ts): within 6% of the memory's own effect.
    console.log(`new process, L3 block: max |Δlogit| ${err8.toFixed(4)} against a fresh block (memory effect ${effect.toFixed(3)})`);
    expect(err8).toBeLessThan(0.06 * effect);

    // And a turn in this process again, reopened: L3 too.
    sys = await open(config, dataDir);
    try {
      const again = await sys.logits(HIKING_Q, { userId: "alice", sessionId: "n", forceAlpha: 1 });
      expect(again.tiers.map((t) => t.tier)).toEqual(["L3"]);
    } finally {
      await sys.close();
    }
  });
});

describe("bad input", () => {
  test("each is refused naming the problem", async () => {
    const sys = await open();
    try {
      await expect(sys.chat("", { userId: "a", sessionId: "s" })).rejects.toThrow("the query must be a non-empty string");
      await expect(sys.chat("hi", { userId: "", sessionId: "s" })).rejects.toThrow("userId must be a non-empty string");
      await expect(sys.chat("hi", { userId: "a", sessionId: "" })).rejects.toThrow("sessionId must be a non-empty string");
      await expect(sys.chat("hi", { userId: "a", sessionId: "s", allowInjection: "no" as unknown as boolean })).rejects.toThrow("allowInjection must be true or false");
      await expect(sys.chat("word ".repeat(2000), { userId: "a", sessionId: "s" })).rejects.toThrow(/more than the model's context window of 1024/);
      expect(sys.stats().turns).toBe(0);
    } finally {
      await sys.close();
    }
    await expect(sys.chat("hi", { userId: "a", sessionId: "s" })).rejects.toThrow("this DKISystem has been closed");
    await expect(DKISystem.open({ model, dataDir: tempDir(), config: { preferenceAlpha: -1 } })).rejects.toThrow("config.preferenceAlpha must be >= 0, got -1");
  });
});
