// Recall v4 (src/recall/) on the real memory store (LMDB, hashing embedder) and a real tokenizer
// (a generated model's): config, reference resolution, the signals, synthetic long conversations
// (English and Chinese, 200 messages, the answer in one old message) against the newest-messages
// and BM25-alone baselines, the budget as a property, trace ids and fact calls.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import type { Embedder } from "../src/memory/types.js";
import { formatHistory, tokenCounter, type TokenCounter } from "../src/dki/prompt.js";
import {
  DEFAULT_RECALL,
  FactRetriever,
  MultiSignalRecall,
  RecallHistoryProvider,
  SuffixBuilder,
  detectFactCall,
  resolveRecallConfig,
  resolveReference,
  runFactCallLoop,
  type FactCallBackend,
  type RecalledMessage,
  type RecallConfig,
} from "../src/recall/index.js";
import { DkiArgumentError } from "../src/errors.js";
import { tempDir } from "./support/paths.js";
import { prng } from "./support/prng.js";
import { syntheticConversation, type SyntheticConversation } from "./support/recall-sessions.js";
import { locomoSample } from "./support/conversation-samples.js";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

let counter: TokenCounter;
let store: MemoryStore;

beforeAll(async () => {
  const modelDir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: modelDir, seed: 3 });
  counter = tokenCounter(await Tokenizer.fromFolder(modelDir));
  store = await MemoryStore.open({ dir: tempDir() });
}, 60_000);
afterAll(async () => store?.close());

/** Records the conversation as turns of (user, session); returns the turn id of each message. */
async function record(conv: Pick<SyntheticConversation, "messages">, userId: string, sessionId: string): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i + 1 < conv.messages.length; i += 2) {
    const r = await store.conversations.recordTurn({ userId, sessionId, query: conv.messages[i]!.content, response: conv.messages[i + 1]!.content, injectionMode: "none", memoryIds: [], latencyMs: 1, auditAction: "test" });
    ids.push(r.userTurn.id, r.assistantTurn.id);
  }
  return ids;
}

const config = (over: Parameters<typeof resolveRecallConfig>[0] = {}): RecallConfig => resolveRecallConfig({ enabled: true, ...over });

describe("config", () => {
  test("the defaults are seed 003 §5.6's", () => {
    const c = resolveRecallConfig();
    // Off by default here, so turns keep today's flat history unless a config turns Recall v4 on.
    expect(c.enabled).toBe(false);
    expect(c.strategy).toBe("summary_with_fact_call");
    expect(c.signals).toMatchObject({ keyword_enabled: true, keyword_topk: 5, keyword_method: "tfidf", vector_enabled: true, vector_top_k: 10, vector_threshold: 0.5, reference_enabled: true });
    expect(c.budget).toEqual({ generation_reserve: 512, instruction_reserve: 150, min_recent_turns: 2, max_recent_turns: 5 });
    expect(c.summary).toEqual({ per_message_threshold: 200, max_tokens_per_summary: 150, strategy: "extractive" });
    expect(c.fact_call).toEqual({ enabled: true, max_rounds: 3, max_fact_tokens: 800, batch_size: 5 });
    expect(c.prompt_formatter).toBe("auto");
    expect(c.signals.weights.keyword).toBeGreaterThanOrEqual(c.signals.weights.vector);
  });

  test("bad values are refused with the key named", () => {
    const bad: [unknown, RegExp][] = [
      [{ signals: { weights: { keyword: 0.1, vector: 0.3 } } }, /weights\.keyword \(0\.1\) must be >= weights\.vector \(0\.3\)/],
      [{ signals: { keyword_topk: 0 } }, /signals\.keyword_topk must be an integer >= 1, got 0/],
      [{ signals: { keyword_method: "textrank" } }, /keyword_method "textrank" is not implemented/],
      [{ budget: { min_recent_turns: 6 } }, /min_recent_turns \(6\) is above max_recent_turns \(5\)/],
      [{ budget: { generation_reserve: -1 } }, /budget\.generation_reserve must be an integer >= 0/],
      [{ summary: { strategy: "llm" } }, /summary\.strategy "llm" is not implemented/],
      [{ fact_call: { max_rounds: 1.5 } }, /fact_call\.max_rounds must be an integer/],
      [{ scope: "global" }, /scope must be one of "session", "user", got "global"/],
      [{ signals: { vector_treshold: 0.2 } }, /recall\.signals has no key "vector_treshold"/],
      [{ enabled: "yes" }, /recall\.enabled must be true or false/],
      [{ budget: 3 }, /recall\.budget must be an object, got 3/],
      [{ enabled: true, prompt_formatter: "mistral" }, /prompt_formatter must be one of "auto", "generic", "chatml", "llama3", "deepseek", "glm", got "mistral"/],
      // Without Recall v4's turns a formatter would change nothing: refused rather than ignored.
      [{ prompt_formatter: "glm" }, /prompt_formatter "glm" frames Recall v4's turns: set recall\.enabled/],
    ];
    for (const [input, message] of bad) expect(() => resolveRecallConfig(input as never), JSON.stringify(input)).toThrow(message);
    expect(() => resolveRecallConfig({ scope: "x" } as never)).toThrow(DkiArgumentError);
  });
});

test("reference resolution: 刚才 / just now narrow, 上次 / earlier / last time widen, nothing otherwise", () => {
  expect(resolveReference("你刚才说的餐厅叫什么？")).toEqual({ kind: "recent", phrase: "刚才" });
  expect(resolveReference("What did you just now suggest?")).toEqual({ kind: "recent", phrase: "just now" });
  expect(resolveReference("上次我们聊的那本书")).toEqual({ kind: "earlier", phrase: "上次" });
  expect(resolveReference("What did I say last time about the cabin?")?.kind).toBe("earlier");
  expect(resolveReference("You mentioned it earlier")?.kind).toBe("earlier");
  expect(resolveReference("What is the wifi password?")).toBeNull();
  expect(resolveReference("Check the beforehand list")).toBeNull(); // a word, not "before"
});

describe("signals", () => {
  test("English keywords are kept, the vector signal reads the messages (not the memory index), recency orders equal matches newest first", async () => {
    const recaller = new MultiSignalRecall(store, store.embedder, config({ budget: { min_recent_turns: 0, max_recent_turns: 0 } }));
    const msgs = ["I bought a red kayak for the river.", "Nothing much today.", "The red kayak needs a new paddle.", "Lunch was fine."];
    const ids = await record({ messages: msgs.map((content, i) => ({ role: i % 2 === 0 ? "user" : "assistant", content })) }, "sig", "s");
    // A memory with the same words: were the vector signal searching memories (the original's
    // defect), it would surface this id.
    const [mem] = await store.memories.add("red kayak paddle river", { userId: "sig" });
    const r = await recaller.recall({ query: "Where is my red kayak?", userId: "sig", sessionId: "s" });
    expect(r.keywords).toEqual(expect.arrayContaining(["kayak", "red"]));
    expect(r.messages.map((m) => m.id)).not.toContain(mem!.id);
    const [first, second] = [r.messages.find((m) => m.id === ids[0])!, r.messages.find((m) => m.id === ids[2])!];
    expect(first.signals.keyword).toBeCloseTo(second.signals.keyword, 12);
    // Same keyword share; the newer one has the higher recency, and so the better priority.
    expect(second.signals.recency).toBeGreaterThan(first.signals.recency);
    expect(second.priority).toBeLessThan(first.priority);
    // Time order out, whatever the ranking.
    expect(r.messages.map((m) => ids.indexOf(m.id))).toEqual([...r.messages.map((m) => ids.indexOf(m.id))].sort((a, b) => a - b));

    const dense = new MultiSignalRecall(store, store.embedder, config({ signals: { vector_threshold: 0 }, budget: { min_recent_turns: 0, max_recent_turns: 0 } }));
    const d = await dense.recall({ query: "red kayak", userId: "sig", sessionId: "s" });
    const v = d.messages.find((m) => m.id === ids[0])!.signals.vector;
    const [q, doc] = await store.embedder.embed(["red kayak", msgs[0]!]);
    expect(v).toBeCloseTo(q!.reduce((s, x, i) => s + x * doc![i]!, 0), 5);
  });

  test("min_recent_turns are always in, even with no signal; session scope leaves other sessions out, user scope takes them in", async () => {
    const a = await record({ messages: [{ role: "user", content: "The cabin code is 7781." }, { role: "assistant", content: "Noted." }] }, "scope", "old");
    const b = await record({ messages: Array.from({ length: 10 }, (_, i) => ({ role: i % 2 === 0 ? ("user" as const) : ("assistant" as const), content: `Unrelated line ${i}.` })) }, "scope", "new");
    const session = await new MultiSignalRecall(store, store.embedder, config()).recall({ query: "What is the cabin code?", userId: "scope", sessionId: "new" });
    expect(session.messages.map((m) => m.id)).not.toContain(a[0]);
    expect(session.messages.filter((m) => m.reason === "recent").map((m) => m.id)).toEqual(b.slice(-4));
    const user = await new MultiSignalRecall(store, store.embedder, config({ scope: "user" })).recall({ query: "What is the cabin code?", userId: "scope", sessionId: "new" });
    expect(user.messages.find((m) => m.id === a[0])?.reason).toBe("signal");
  });

  test("the index follows the store: turns recorded later are recalled, an erased user's are gone", async () => {
    const recaller = new MultiSignalRecall(store, store.embedder, config());
    await record({ messages: [{ role: "user", content: "hello" }, { role: "assistant", content: "hi" }] }, "later", "s");
    expect((await recaller.recall({ query: "zebra", userId: "later", sessionId: "s" })).messages.some((m) => m.signals.keyword > 0)).toBe(false);
    const [z] = await record({ messages: [{ role: "user", content: "I saw a zebra." }, { role: "assistant", content: "Wow." }] }, "later", "s");
    const r = await recaller.recall({ query: "zebra", userId: "later", sessionId: "s" });
    expect(r.messages.find((m) => m.id === z)!.signals.keyword).toBe(1);
    await store.eraseUser("later");
    expect((await recaller.recall({ query: "zebra", userId: "later", sessionId: "s" })).messages).toEqual([]);
  });
});

/** `inner`, counting the texts it embeds. */
function counting(inner: Embedder): Embedder & { texts: number } {
  const e = { id: inner.id, dim: inner.dim, relevanceThreshold: inner.relevanceThreshold, texts: 0, embed: async (texts: string[]) => ((e.texts += texts.length), inner.embed(texts)) };
  return e;
}

describe("message vectors", () => {
  test("made when a turn is recorded or imported and kept in the store; recall reads them instead of embedding again (another embedder's are not used); a blank message has none and is not recalled; erased with the user", async () => {
    const hashing = new HashingEmbedder();
    const embedder = counting(hashing);
    const s = await MemoryStore.open({ dir: tempDir(), embedder });
    try {
      const ids: string[] = [];
      const texts: string[] = [];
      for (let i = 0; i < 5; i++) {
        // The last answer was aborted before its first token: recorded empty.
        const [query, response] = [`Question ${i} about the lake cabin and its wifi`, i === 4 ? "" : `Answer number ${i} about the cabin`];
        const r = await s.conversations.recordTurn({ userId: "v", sessionId: "s", query, response, injectionMode: "none", memoryIds: [], latencyMs: 1, auditAction: "test" });
        ids.push(r.userTurn.id, r.assistantTurn.id);
        texts.push(query, response);
      }
      expect(embedder.texts).toBe(9);
      const stored = await s.conversations.vectors(ids, { userId: "v" });
      expect(stored.embedderId).toBe(hashing.id);
      expect(stored.vectors.slice(0, 9)).toEqual(await hashing.embed(texts.slice(0, 9)));
      expect(stored.vectors[9]).toBeUndefined();
      // Scoped by user like every read: another user's ids read as none.
      expect((await s.conversations.vectors(ids, { userId: "w" })).vectors.every((v) => v === undefined)).toBe(true);

      embedder.texts = 0;
      const r = await new MultiSignalRecall(s, embedder, config()).recall({ query: "lake cabin wifi", userId: "v", sessionId: "s" });
      expect(embedder.texts).toBe(1); // the query alone
      expect(r.messages.map((m) => m.id)).not.toContain(ids[9]);
      expect(r.messages.length).toBeGreaterThan(0);
      const other = counting(new HashingEmbedder({ dim: 256 }));
      await new MultiSignalRecall(s, other, config()).recall({ query: "lake cabin wifi", userId: "v", sessionId: "s" });
      expect(other.texts).toBe(9 + 1);

      const file = join(tempDir(), "locomo.json");
      writeFileSync(file, JSON.stringify(locomoSample()));
      await s.importConversations(file, { as: "history" });
      const imported = await s.conversations.listUser({ userId: "conv-26" });
      const iv = await s.conversations.vectors(imported.map((t) => t.id), { userId: "conv-26" });
      expect(iv.vectors).toEqual(await hashing.embed(imported.map((t) => t.content)));

      await s.eraseUser("v");
      expect((await s.conversations.vectors(ids, { userId: "v" })).vectors.every((v) => v === undefined)).toBe(true);
    } finally {
      await s.close();
    }
  });

  test("a store re-embedded with another embedder re-embeds its messages too: no vector of the previous one is left", async () => {
    const dir = tempDir();
    const first = await MemoryStore.open({ dir });
    const r = await first.conversations.recordTurn({ userId: "v", sessionId: "s", query: "The cabin wifi password is maple-42.", response: "Noted.", injectionMode: "none", memoryIds: [], latencyMs: 1, auditAction: "test" });
    await first.memories.add("a memory too", { userId: "v" });
    await first.close();
    const e256 = new HashingEmbedder({ dim: 256 });
    const again = await MemoryStore.open({ dir, embedder: e256, reembed: true });
    try {
      const got = await again.conversations.vectors([r.userTurn.id, r.assistantTurn.id], { userId: "v" });
      expect(got.embedderId).toBe(e256.id);
      expect(got.vectors).toEqual(await e256.embed(["The cabin wifi password is maple-42.", "Noted."]));
    } finally {
      await again.close();
    }
  });
});

type Method = "recall" | "newest" | "bm25";

describe("synthetic long conversations (200 messages, the answer in one old message)", () => {
  const cases: { conv: SyntheticConversation; userId: string; ids: string[] }[] = [];
  // The same conversations with the question's subject coming up in 30 short messages instead of 14.
  const recurring: typeof cases = [];
  // One provider per method for all cases: each keeps its users' message indexes between calls.
  let providers: Record<"recall" | "bm25", RecallHistoryProvider>;
  beforeAll(async () => {
    providers = {
      recall: new RecallHistoryProvider(store, store.embedder, config()),
      bm25: new RecallHistoryProvider(store, store.embedder, config({ signals: { keyword_enabled: false, vector_enabled: false, weights: { keyword: 0, bm25: 1, vector: 0, recency: 0 } } })),
    };
    for (let seed = 0; seed < 10; seed++) {
      for (const language of ["en", "cn"] as const) {
        const conv = syntheticConversation(1000 + seed, language, 100);
        const userId = `long-${language}-${seed}`;
        cases.push({ conv, userId, ids: await record(conv, userId, "s") });
        const often = syntheticConversation(1000 + seed, language, 100, 30);
        recurring.push({ conv: often, userId: `often-${language}-${seed}`, ids: await record(often, `often-${language}-${seed}`, "s") });
      }
    }
  }, 1_200_000);

  /** The ids of the messages in the suffix a method builds, in suffix order. */
  async function suffixIds(method: Method, c: (typeof cases)[number], contextWindow: number): Promise<string[]> {
    const query = c.conv.needle.question;
    const language = c.conv.language;
    if (method === "newest") {
      // Today's flat history: the newest messages that fit the same message budget.
      const turns = await store.conversations.list({ userId: c.userId, sessionId: "s" });
      const budget = new SuffixBuilder(config()).build({ query, messages: [], contextWindow, preferenceTokens: 0, language, counter }).messageBudget;
      return formatHistory(turns.map((t) => ({ role: t.role as "user", content: t.content, id: t.id })), language, counter, budget).messages.map((m) => m.id!);
    }
    const out = await providers[method].run({ query, userId: c.userId, sessionId: "s", language, counter, contextWindow });
    return out.suffix.items.map((i) => i.id);
  }

  /** Per method and language, the conversations whose evidence message is in the suffix. */
  async function evidenceHits(list: typeof cases, methods: readonly Method[]): Promise<Record<string, number>> {
    const hits: Record<string, number> = {};
    for (const c of list) {
      expect(c.conv.messages.length).toBeGreaterThanOrEqual(200);
      for (const m of methods) {
        const got = await suffixIds(m, c, 2048);
        const at = got.map((id) => c.ids.indexOf(id));
        expect(at).toEqual([...at].sort((a, b) => a - b));
        const key = `${m}-${c.conv.language}`;
        hits[key] = (hits[key] ?? 0) + (got.includes(c.ids[c.conv.evidenceAt]!) ? 1 : 0);
      }
    }
    return hits;
  }

  test("at a 2048-token window the evidence message is in the suffix for >= 90% of cases, English and Chinese, more often than with the newest messages and at least as often as with BM25 alone; the suffix is in time order", async () => {
    const hits = await evidenceHits(cases, ["recall", "newest", "bm25"]);
    console.log(`evidence in the suffix at 2048 tokens (of 10 conversations per language): ${JSON.stringify(hits)}`);
    for (const lang of ["en", "cn"]) {
      expect(hits[`recall-${lang}`]!, lang).toBeGreaterThanOrEqual(9);
      expect(hits[`recall-${lang}`]!, lang).toBeGreaterThan(hits[`newest-${lang}`]!);
      // Measured 10/10 against BM25 alone's 10/10 on these conversations: a tie (the next test
      // has the conversations where they differ); it must at least not lose.
      expect(hits[`recall-${lang}`]!, lang).toBeGreaterThanOrEqual(hits[`bm25-${lang}`]!);
    }
  }, 600_000);

  test("when the question's subject recurs in 30 short messages, BM25 alone (whose length normalisation favours them) loses the long evidence message where recall keeps it: recall beats BM25 alone in both languages", async () => {
    const hits = await evidenceHits(recurring, ["recall", "bm25"]);
    // Measured: recall 10/10 in both languages, BM25 alone 9/10 (English) and 7/10 (Chinese).
    console.log(`evidence in the suffix at 2048 tokens, subject recurring (of 10 per language): ${JSON.stringify(hits)}`);
    for (const lang of ["en", "cn"]) {
      expect(hits[`recall-${lang}`]!, lang).toBeGreaterThanOrEqual(9);
      expect(hits[`recall-${lang}`]!, lang).toBeGreaterThan(hits[`bm25-${lang}`]!);
    }
  }, 600_000);

  test("property: the suffix never exceeds context − generation reserve − preferences − query, whatever the window, thresholds and preferences", async () => {
    const r = prng(77);
    const recalled = new Map<string, RecalledMessage[]>();
    for (let i = 0; i < 40; i++) {
      const { conv, userId } = cases[Math.floor(r() * cases.length)]!;
      let messages = recalled.get(userId);
      if (messages === undefined) recalled.set(userId, (messages = (await providers.recall.recaller.recall({ query: conv.needle.question, userId, sessionId: "s" })).messages));
      const c = config({ summary: { per_message_threshold: 1 + Math.floor(r() * 300), max_tokens_per_summary: 1 + Math.floor(r() * 200) }, budget: { instruction_reserve: Math.floor(r() * 200) } });
      const contextWindow = 100 + Math.floor(r() * 4000);
      const preferenceTokens = Math.floor(r() * 300);
      const suffix = new SuffixBuilder(c).build({ query: conv.needle.question, messages, contextWindow, preferenceTokens, language: conv.language, counter });
      const available = Math.max(0, contextWindow - c.budget.generation_reserve - preferenceTokens - counter.count(conv.needle.question));
      expect(suffix.available).toBe(available);
      expect(suffix.tokens).toBe(counter.count(suffix.text));
      expect(suffix.tokens, JSON.stringify({ contextWindow, preferenceTokens })).toBeLessThanOrEqual(available);
      expect(suffix.summaryCount + suffix.messageCount).toBe(suffix.items.length);
      expect(suffix.traceIds.length).toBe(suffix.summaryCount);
      expect(suffix.items.length + suffix.leftOut.length).toBe(messages.length);
    }
  }, 600_000);

  test("summaries carry [SUMMARY] blocks whose trace ids resolve to the summarised message, for its user only", async () => {
    const { conv, userId, ids } = cases[0]!;
    const p = providers.recall;
    const messages = (await p.recaller.recall({ query: conv.needle.question, userId, sessionId: "s" })).messages;
    const suffix = new SuffixBuilder(config({ summary: { per_message_threshold: 40 } })).build({ query: conv.needle.question, messages, contextWindow: 2048, preferenceTokens: 0, language: "en", counter });
    const out = { suffix };
    expect(out.suffix.summaryCount).toBeGreaterThan(0);
    expect(out.suffix.hasFactCallInstruction).toBe(true);
    expect(out.suffix.text).toContain("retrieve_fact(trace_id=...)");
    const blocks = [...out.suffix.text.matchAll(/\[SUMMARY\]\nfacts_covered: (.*)\nfacts_missing: (.*)\nconfidence: (high|medium|low)\ntrace_id: (\S+)\n\[\/SUMMARY\]/g)];
    expect(blocks.map((b) => b[4])).toEqual(out.suffix.traceIds);
    const other = cases[1]!.userId;
    for (const id of out.suffix.traceIds) {
      const fact = await p.facts.retrieve(id, { userId, sessionId: "s" });
      expect(fact?.text).toBe(conv.messages[ids.indexOf(id)]!.content);
      expect(await p.facts.retrieve(id, { userId: other })).toBeUndefined();
      expect(await p.facts.retrieve(id, { userId, sessionId: "another" })).toBeUndefined();
    }
    // Chunks: offset and limit in characters, has_more until the end.
    const id = out.suffix.traceIds[0]!;
    const text = conv.messages[ids.indexOf(id)]!.content;
    const a = await p.facts.retrieve(id, { userId }, { offset: 0, limit: 50 });
    const b = await p.facts.retrieve(id, { userId }, { offset: 50 });
    expect(a).toMatchObject({ text: text.slice(0, 50), hasMore: true, totalChars: text.length });
    expect(b).toMatchObject({ text: text.slice(50), hasMore: false });
    await expect(p.facts.retrieve(id, { userId }, { offset: -1 })).rejects.toThrow(/offset must be an integer >= 0/);
  });
});

describe("fact calls", () => {
  test("detection: the generic form and the tool-call forms of ChatML/Qwen, Llama 3, DeepSeek and GLM-4", () => {
    expect(detectFactCall('Let me check. retrieve_fact(trace_id="turn_1", offset=500, limit=200)')).toEqual({ traceId: "turn_1", offset: 500, limit: 200, form: "generic" });
    expect(detectFactCall("retrieve_fact(trace_id='turn_2')")).toEqual({ traceId: "turn_2", offset: 0, form: "generic" });
    expect(detectFactCall('retrieve_fact("turn_3")')).toEqual({ traceId: "turn_3", offset: 0, form: "generic" });
    expect(detectFactCall('<tool_call>\n{"name": "retrieve_fact", "arguments": {"trace_id": "turn_4", "offset": 10}}\n</tool_call>')).toEqual({ traceId: "turn_4", offset: 10, form: "tool_call" });
    expect(detectFactCall('<|python_tag|>{"name": "retrieve_fact", "parameters": {"trace_id": "turn_5", "limit": "300"}}')).toEqual({ traceId: "turn_5", offset: 0, limit: 300, form: "json" });
    expect(detectFactCall('{"name": "retrieve_fact", "arguments": "{\\"trace_id\\": \\"turn_6\\"}"}')).toEqual({ traceId: "turn_6", offset: 0, form: "json" });
    expect(detectFactCall('{"name": "search", "parameters": {"trace_id": "x"}}')).toBeNull();
    expect(detectFactCall("The answer is 4:30 pm.")).toBeNull();
    expect(detectFactCall("retrieve_fact()")).toBeNull();
    // DeepSeek: the function named between its tool-call markers, the arguments in a json block.
    const ds = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>retrieve_fact\n```json\n{"trace_id": "turn_7", "offset": 20, "limit": 100}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>';
    expect(detectFactCall(ds)).toEqual({ traceId: "turn_7", offset: 20, limit: 100, form: "deepseek" });
    expect(detectFactCall(ds.replace("retrieve_fact", "web_search"))).toBeNull();
    // GLM-4: the function name on its own line, its arguments on the next.
    expect(detectFactCall('I need the exact code.\nretrieve_fact\n{"trace_id": "turn_8"}')).toEqual({ traceId: "turn_8", offset: 0, form: "glm" });
    expect(detectFactCall('retrieve_fact\n{"trace_id": ""}')).toBeNull();
    expect(detectFactCall('You could use retrieve_fact here. {"trace_id": "turn_9"}')).toBeNull();
  });

  /** A generation backend that answers from a script, and records the prompts' fact segments. */
  class ScriptedBackend implements FactCallBackend<{ text: string }> {
    readonly seen: string[] = [];
    constructor(private readonly script: string[]) {}
    async generateWithFacts(factText: string): Promise<{ text: string }> {
      this.seen.push(factText);
      return { text: this.script.shift() ?? "done" };
    }
  }

  test("the loop fetches, appends and generates again; stops on no call, an unknown or another user's id, max_rounds and max_fact_tokens", async () => {
    const ids = await record({ messages: [{ role: "user", content: "The boat is moored at pier 9, berth C." }, { role: "assistant", content: "Got it." }] }, "facts-a", "s");
    const [other] = await record({ messages: [{ role: "user", content: "Bob's secret is 1234." }, { role: "assistant", content: "ok" }] }, "facts-b", "s");
    const p = new RecallHistoryProvider(store, store.embedder, config());
    const opts = (maxRounds = 3, maxFactTokens = 800) => ({ retrieve: (r: Parameters<typeof p.retrieveFact>[0]) => p.retrieveFact(r, { userId: "facts-a", sessionId: "s" }), counter, maxRounds, maxFactTokens, language: "en" as const });

    const one = new ScriptedBackend(["Pier 9, berth C."]);
    const r1 = await runFactCallLoop({ text: `retrieve_fact(trace_id="${ids[0]}")` }, one, opts());
    expect(r1).toMatchObject({ rounds: 1, stoppedBy: "no_call", output: { text: "Pier 9, berth C." } });
    expect(one.seen[0]).toContain("The boat is moored at pier 9, berth C.");
    expect(one.seen[0]).toContain(`[FACT trace_id: ${ids[0]}]`);

    const cross = new ScriptedBackend([]);
    const r2 = await runFactCallLoop({ text: `retrieve_fact(trace_id="${other}")` }, cross, opts());
    expect(r2).toMatchObject({ rounds: 0, stoppedBy: "not_found", calls: [{ traceId: other, found: false }] });
    expect(cross.seen).toEqual([]);

    const call = `<tool_call>{"name": "retrieve_fact", "arguments": {"trace_id": "${ids[0]}"}}</tool_call>`;
    const greedy = new ScriptedBackend([call, call, call, call]);
    const r3 = await runFactCallLoop({ text: call }, greedy, opts(2));
    expect(r3).toMatchObject({ rounds: 2, stoppedBy: "max_rounds" });
    expect(greedy.seen.length).toBe(2);

    const tight = new ScriptedBackend([call, call, call]);
    const r4 = await runFactCallLoop({ text: call }, tight, opts(3, 30));
    expect(r4.factTokens).toBeLessThanOrEqual(30);
    expect(r4.stoppedBy).toBe("max_fact_tokens");
    for (const s of tight.seen) expect(counter.count(s.split("\n\nPlease answer")[0]!)).toBeLessThanOrEqual(30);
  });
});
