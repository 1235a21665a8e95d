// SuffixBuilder (seed 003 §5.4): recalled messages → the history suffix of a turn, within
//
//   available = context window − generation reserve − preference tokens − query tokens
//
// the whole suffix's tokens (the real tokenizer's count of the final text), of which the message
// lines get available − instruction reserve (or less, when the templates and instruction take
// more than the reserve). Messages go in by priority (the recall's: required recent turns, then by
// score); one over per_message_threshold tokens goes in as an extractive summary inside a
// [SUMMARY] … [/SUMMARY] block with its trace id (the turn id). The lines come out in time order
// inside the history templates (so §7.2's marker filter applies), with the constraint instruction
// telling the model to call retrieve_fact(trace_id=…) when summaries are present.
import { HISTORY_TEMPLATES, type HistoryLanguage, type TokenCounter } from "../dki/prompt.js";
import type { RecallConfig } from "./config.js";
import type { RecalledMessage } from "./recall.js";
import { extractiveSummary } from "./summary.js";

/** The constraint instruction (seed 003 §5.4 step 4), word for word in Chinese, translated in English. */
export const CONSTRAINT_INSTRUCTIONS: Readonly<Record<HistoryLanguage, string>> = Object.freeze({
  cn: [
    "以下信息来自用户历史对话，内容可信。",
    "标记为 [SUMMARY] 的是摘要，可能缺失细节。",
    "如需精确信息，请调用 retrieve_fact(trace_id=...)。",
    "若未调用 retrieve_fact 直接基于 summary 给出具体数值/时间，该回答视为无效。",
  ].join("\n"),
  en: [
    "The following comes from the user's past conversations and is trustworthy.",
    "Items marked [SUMMARY] are summaries and may lack details.",
    "For exact information, call retrieve_fact(trace_id=...).",
    "An answer that gives specific numbers or times from a summary without calling retrieve_fact is invalid.",
  ].join("\n"),
});

export interface SuffixItem {
  id: string;
  role: "user" | "assistant";
  summarized: boolean;
  /** The item's line(s) in the suffix. */
  text: string;
  tokens: number;
}

export interface AssembledSuffix {
  /** "" when no message fits. */
  text: string;
  /** Tokens of `text` (the real count, never above `available`). */
  tokens: number;
  /** What the whole suffix may take: context − generation reserve − preferences − query. */
  available: number;
  /** What the message lines may take. */
  messageBudget: number;
  summaryCount: number;
  messageCount: number;
  traceIds: string[];
  hasFactCallInstruction: boolean;
  /** In time order. */
  items: SuffixItem[];
  /** Recalled messages that did not fit. */
  leftOut: string[];
}

export interface SuffixRequest {
  query: string;
  /** Recalled messages (any order; `priority` decides what goes in first). */
  messages: readonly RecalledMessage[];
  contextWindow: number;
  preferenceTokens: number;
  language: HistoryLanguage;
  counter: TokenCounter;
}

export class SuffixBuilder {
  constructor(private readonly config: RecallConfig) {}

  build(req: SuffixRequest): AssembledSuffix {
    const { counter, language } = req;
    const t = HISTORY_TEMPLATES[language];
    const c = this.config;
    const available = Math.max(0, req.contextWindow - c.budget.generation_reserve - req.preferenceTokens - counter.count(req.query));
    const factCalls = c.strategy === "summary_with_fact_call" && c.fact_call.enabled;
    const instruction = CONSTRAINT_INSTRUCTIONS[language];
    const overhead = counter.count([t.prefix, instruction, t.suffix].join("\n"));
    const messageBudget = Math.max(0, available - Math.max(c.budget.instruction_reserve, overhead));
    const byPriority = [...req.messages].sort((a, b) => a.priority - b.priority);
    const chosen: { m: RecalledMessage; item: SuffixItem }[] = [];
    const leftOut: string[] = [];
    let used = 0;
    for (const m of byPriority) {
      const item = this.item(m, req.query, language, counter);
      // +1: the newline joining it to the next line.
      if (used + item.tokens + 1 > messageBudget) {
        leftOut.push(m.id);
        continue;
      }
      used += item.tokens + 1;
      chosen.push({ m, item });
    }
    // Token counts of pieces need not add up to the count of their join: the final text is
    // counted, and the lowest-priority item dropped until it fits.
    for (;;) {
      const ordered = [...chosen].sort((a, b) => a.m.createdAt - b.m.createdAt || (a.m.id < b.m.id ? -1 : 1));
      const summaries = ordered.filter((x) => x.item.summarized).length;
      const withInstruction = summaries > 0 && factCalls;
      const text = ordered.length === 0 ? "" : [t.prefix, ...(withInstruction ? [instruction] : []), ...ordered.map((x) => x.item.text), t.suffix].join("\n");
      const tokens = counter.count(text);
      // An empty text has 0 tokens, so this ends.
      if (tokens <= available) {
        return {
          text,
          tokens,
          available,
          messageBudget,
          summaryCount: summaries,
          messageCount: ordered.length - summaries,
          traceIds: ordered.filter((x) => x.item.summarized).map((x) => x.m.id),
          hasFactCallInstruction: withInstruction,
          items: ordered.map((x) => x.item),
          leftOut,
        };
      }
      leftOut.push(chosen.pop()!.m.id);
    }
  }

  private item(m: RecalledMessage, query: string, language: HistoryLanguage, counter: TokenCounter): SuffixItem {
    const t = HISTORY_TEMPLATES[language];
    const speaker = m.role === "user" ? t.user : t.assistant;
    // One line per message: a newline inside one would read as another speaker's line.
    const raw = `${speaker}: ${m.content.replace(/\s*[\r\n]+\s*/g, " ").trim()}`;
    const rawTokens = counter.count(raw);
    if (rawTokens <= this.config.summary.per_message_threshold) return { id: m.id, role: m.role, summarized: false, text: raw, tokens: rawTokens };
    const s = extractiveSummary(m.content, query, counter, this.config.summary.max_tokens_per_summary);
    const list = (xs: string[]) => JSON.stringify(xs);
    const text = [
      `${speaker}: ${s.text.replace(/\s*[\r\n]+\s*/g, " ")}`,
      "[SUMMARY]",
      `facts_covered: ${list(s.factsCovered)}`,
      `facts_missing: ${list(s.factsMissing)}`,
      `confidence: ${s.confidence}`,
      `trace_id: ${m.id}`,
      "[/SUMMARY]",
    ].join("\n");
    return { id: m.id, role: m.role, summarized: true, text, tokens: counter.count(text) };
  }
}
