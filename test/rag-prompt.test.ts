// Golden tests of the RAG prompt (seed 000 §4): the layouts are the seed's own worked examples,
// copied verbatim; the counts are the bundled SmolLM2 tokenizer's.
import { beforeAll, describe, expect, test } from "vitest";
import { buildRagPrompt, type HistoryMessage, type PromptTokenizer } from "../src/rag/prompt-builder.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { DkiArgumentError } from "../src/errors.js";
import { smollm2Tokenizer } from "./support/paths.js";

let tok: Tokenizer;
const count = (s: string): number => tok.encode(s, { addSpecialTokens: false }).length;

beforeAll(async () => {
  tok = await Tokenizer.fromFolder(smollm2Tokenizer);
});

// Seed 000 §4.1, character for character.
const FULL_EXAMPLE = `System: 你是一个美食推荐助手

Relevant information:
[1] 用户偏好: 素食主义者，不吃辣，喜欢日料
[2] 用户常去区域: 朝阳区、海淀区
[3] 用户预算偏好: 人均 100-200 元

Previous conversation:
User: 我最近想尝试一些新的餐厅
AI: 好的，您有什么特别的偏好吗？比如菜系、价位或者地区？
User: 主要在北京，预算不要太高
AI: 明白了，我可以帮您推荐一些性价比高的餐厅。

User: 推荐一家北京的餐厅

AI:`;

const FULL_HISTORY: HistoryMessage[] = [
  { role: "user", content: "我最近想尝试一些新的餐厅" },
  { role: "assistant", content: "好的，您有什么特别的偏好吗？比如菜系、价位或者地区？" },
  { role: "user", content: "主要在北京，预算不要太高" },
  { role: "assistant", content: "明白了，我可以帮您推荐一些性价比高的餐厅。" },
];
const FULL_MEMORIES = ["用户偏好: 素食主义者，不吃辣，喜欢日料", "用户常去区域: 朝阳区、海淀区", "用户预算偏好: 人均 100-200 元"];

/** `base` plus as many " ok" as make `measure` give exactly `target` tokens (fails the test if none does). */
function padTo(base: string, target: number, measure: (s: string) => number): string {
  let n = Math.max(0, target - measure(base));
  for (let step = 0; step < 50; step++) {
    const s = base + " ok".repeat(n);
    const m = measure(s);
    if (m === target) return s;
    n = Math.max(0, n + (m < target ? Math.max(1, target - m) : -Math.max(1, m - target)));
  }
  throw new Error(`cannot pad ${JSON.stringify(base.slice(0, 20))} to exactly ${target} tokens`);
}

describe("seed 000 §4 golden prompts (SmolLM2 tokenizer)", () => {
  test("§4.1 full example: system prompt, 3 memories, 2 rounds of history, query", () => {
    const r = buildRagPrompt(tok, { query: "推荐一家北京的餐厅", systemPrompt: "你是一个美食推荐助手", contexts: FULL_MEMORIES, history: FULL_HISTORY }, { maxContext: 2048 });
    expect(r.info.finalPrompt).toBe(FULL_EXAMPLE);
    expect(r.tokens).toEqual(tok.encode(FULL_EXAMPLE));
    expect(r.forcedFallback).toBe(false);
    expect(r.contextsUsed).toBe(3);
    expect(r.historyKept).toBe(4);
    expect(r.info.retrievedContext).toBe("Relevant information:\n[1] 用户偏好: 素食主义者，不吃辣，喜欢日料\n[2] 用户常去区域: 朝阳区、海淀区\n[3] 用户预算偏好: 人均 100-200 元");
    expect(r.info.historyMessages).toEqual(FULL_HISTORY);
    // The structure table of §4.1 with this tokenizer's counts (the seed's "~15/~80/~120/~15" were estimates).
    const parts = {
      system: count("System: 你是一个美食推荐助手\n\n"),
      context: count(r.info.retrievedContext),
      history: count(r.info.historyText),
      query: count("User: 推荐一家北京的餐厅\n\nAI:"),
    };
    console.log(`§4.1 with SmolLM2's tokenizer: ${JSON.stringify(parts)}, whole prompt ${r.tokens.length} tokens, fixed part ${r.tokenCounts.fixed}`);
    // Pinned: this tokenizer's counts of the seed's text (a changed tokenizer or layout shows here).
    expect(r.tokens.length).toBe(GOLDEN_FULL_TOKENS);
    expect(r.tokenCounts.fixed).toBe(count("System: 你是一个美食推荐助手\n\nUser: 推荐一家北京的餐厅\n\nAI:"));
    // Parts counted alone sum to within a few tokens of the whole (joins can merge "\n\n" pieces).
    const sum = parts.system + parts.context + count("\n\n") + parts.history + count("\n\n") + parts.query;
    expect(Math.abs(sum - r.tokens.length)).toBeLessThanOrEqual(4);
  });

  test("§4.2 query only: no memories, no history", () => {
    const r = buildRagPrompt(tok, { query: "今天天气怎么样？", contexts: [] }, { maxContext: 2048 });
    expect(r.info.finalPrompt).toBe("User: 今天天气怎么样？\n\nAI:");
    expect(r.info.retrievedContext).toBe("");
    expect(r.info.historyText).toBe("");
    expect(r.tokens.length).toBe(count("User: 今天天气怎么样？\n\nAI:"));
  });

  test("§4.3 truncation: 4096 context, 512 reserved, fixed 50, 3 memories of 80, 20 of 50 history messages kept", () => {
    const query = "Which of the restaurants we talked about is open late?";
    const systemPrompt = padTo("You are a restaurant assistant.", 50, (s) => count(`System: ${s}\n\nUser: ${query}\n\nAI:`));
    // Three memories whose context block (header + 3 lines) is exactly 80 tokens.
    const mem = ["The user is vegetarian.", "The user lives in Chaoyang district."];
    const third = padTo("The user's budget is 100 to 200 yuan a head.", 80 - count("Relevant information:\n") - mem.reduce((a, m, i) => a + count(`[${i + 1}] ${m}`), 0), (s) => count(`[3] ${s}`));
    // The seed says 20 messages kept "(~2000 tokens)" and 30 older ones cut, which cannot both hold with
    // 3454 tokens free; messages of 165 tokens make exactly 20 fit (20·165 + header ≤ 3454 < 21·165).
    const history: HistoryMessage[] = Array.from({ length: 50 }, (_, i) => {
      const role = i % 2 === 0 ? "user" : "assistant";
      return { role, content: padTo(`message ${i}:`, 165, (s) => count(`${role === "user" ? "User" : "AI"}: ${s}`)) };
    });
    const r = buildRagPrompt(tok, { query, systemPrompt, contexts: [...mem, third], history }, { maxContext: 4096 });
    expect(r.tokenCounts.maxPrompt).toBe(3584);
    expect(r.tokenCounts.fixed).toBe(50);
    expect(r.tokenCounts.remaining).toBe(3534);
    expect(r.tokenCounts.context).toBe(80);
    expect(r.contextsUsed).toBe(3);
    expect(r.historyKept).toBe(20);
    expect(r.info.historyMessages).toEqual(history.slice(30)); // the newest 20, in order
    expect(r.log).toContain("kept 20/50 history messages");
    expect(r.forcedFallback).toBe(false);
    expect(r.tokens.length).toBeLessThanOrEqual(3584);
    expect(r.tokens).toEqual(tok.encode(r.info.finalPrompt));
    console.log(`§4.3: fixed ${r.tokenCounts.fixed}, context ${r.tokenCounts.context}, history ${r.tokenCounts.history} (${r.historyKept}/${r.historyTotal}), final ${r.tokens.length} of ${r.tokenCounts.maxPrompt}`);
  });

  test("retrieved context stops at 50% of what remains, in rank order", () => {
    const contexts = Array.from({ length: 40 }, (_, i) => `memory ${i}: ` + "detail ".repeat(30));
    const r = buildRagPrompt(tok, { query: "q?", contexts }, { maxContext: 1024 });
    const limit = Math.floor(r.tokenCounts.remaining * 0.5);
    expect(r.tokenCounts.context).toBeLessThanOrEqual(limit);
    expect(r.contextsUsed).toBeGreaterThan(0);
    expect(r.contextsUsed).toBeLessThan(40);
    // One more would have crossed the limit.
    expect(r.tokenCounts.context + count(`[${r.contextsUsed + 1}] ${contexts[r.contextsUsed]}`)).toBeGreaterThan(limit);
    expect(r.info.retrievedContext.split("\n").slice(1)).toEqual(contexts.slice(0, r.contextsUsed).map((c, i) => `[${i + 1}] ${c}`));
    expect(r.log).toContain(`kept ${r.contextsUsed}/40 retrieved contexts`);
  });

  test("§4.4 forced fallback: an assembled prompt of 4000 tokens > 3584 keeps only the query, with a warning", () => {
    const query = "推荐一家北京的餐厅";
    const systemPrompt = padTo("你是一个美食推荐助手", 4000, (s) => tok.encode(`System: ${s}\n\nUser: ${query}\n\nAI:`).length);
    const r = buildRagPrompt(tok, { query, systemPrompt, contexts: FULL_MEMORIES, history: FULL_HISTORY }, { maxContext: 4096 });
    expect(r.forcedFallback).toBe(true);
    expect(r.info.finalPrompt).toBe(`User: ${query}\nAI:`);
    expect(r.info.retrievedContext).toBe("");
    expect(r.info.historyText).toBe("");
    expect(r.info.historyMessages).toEqual([]);
    expect(r.tokens).toEqual(tok.encode(`User: ${query}\nAI:`));
    expect(r.warnings).toHaveLength(1);
    expect(r.warnings[0]).toMatch(/prompt of 4000 tokens exceeds the 3584-token prompt budget/);
  });

  test("a query that cannot fit even alone is an error naming the sizes", () => {
    const query = "word ".repeat(700);
    expect(() => buildRagPrompt(tok, { query, contexts: [] }, { maxContext: 1024 })).toThrow(/query alone is \d+ tokens as a prompt, over the 512-token prompt budget/);
  });

  test("bad budgets and inputs are refused by name", () => {
    const t: PromptTokenizer = tok;
    expect(() => buildRagPrompt(t, { query: "", contexts: [] }, { maxContext: 100 })).toThrow(DkiArgumentError);
    expect(() => buildRagPrompt(t, { query: "q", contexts: [] }, { maxContext: 512 })).toThrow(/reserveForGeneration \(512\) leaves no room/);
    expect(() => buildRagPrompt(t, { query: "q", contexts: [] }, { maxContext: 2048, contextShare: 1.5 })).toThrow(/contextShare/);
    expect(() => buildRagPrompt(t, { query: "q", contexts: [3 as unknown as string] }, { maxContext: 2048 })).toThrow(/contexts must be/);
    expect(() => buildRagPrompt(t, { query: "q", contexts: [], history: [{ role: "system" as "user", content: "x" }] }, { maxContext: 2048 })).toThrow(/history message 0/);
  });

  test("chat layout: the same parts as messages through the chat template, within the same budget", () => {
    const r = buildRagPrompt(tok, { query: "推荐一家北京的餐厅", systemPrompt: "你是一个美食推荐助手", contexts: FULL_MEMORIES, history: FULL_HISTORY }, { maxContext: 2048, layout: "chat" });
    const expected = tok.applyChatTemplate(
      [
        { role: "system", content: "你是一个美食推荐助手\n\nRelevant information:\n[1] 用户偏好: 素食主义者，不吃辣，喜欢日料\n[2] 用户常去区域: 朝阳区、海淀区\n[3] 用户预算偏好: 人均 100-200 元" },
        ...FULL_HISTORY,
        { role: "user", content: "推荐一家北京的餐厅" },
      ],
      { addGenerationPrompt: true },
    );
    expect(r.info.finalPrompt).toBe(expected);
    expect(r.info.finalPrompt).toContain("<|im_start|>system\n你是一个美食推荐助手");
    expect(r.tokens).toEqual(tok.encode(expected, { addSpecialTokens: false }));
    // Small window: history is cut oldest first in this layout too.
    const small = buildRagPrompt(tok, { query: "推荐一家北京的餐厅", contexts: FULL_MEMORIES, history: FULL_HISTORY }, { maxContext: 512 + 110, layout: "chat" });
    expect(small.tokens.length).toBeLessThanOrEqual(110);
    expect(small.historyKept).toBeLessThan(4);
    expect(small.info.historyMessages).toEqual(FULL_HISTORY.slice(4 - small.historyKept));
  });
});

const GOLDEN_FULL_TOKENS = 316;
