// Extractive summaries of long messages (seed 003 §5.4, strategy "extractive"): the message's
// sentences that share most with the query (the first sentence breaking ties), in their original
// order, within max_tokens_per_summary; and what the summary holds and leaves out of the
// message's salient facts (numbers, capitalised names, Chinese words), so the model knows when it
// must fetch the original (retrieve_fact).
import { STOP_WORDS, terms } from "../memory/text-terms.js";
import type { TokenCounter } from "../dki/prompt.js";

export interface ExtractiveSummary {
  text: string;
  factsCovered: string[];
  factsMissing: string[];
  confidence: "high" | "medium" | "low";
}

const SENTENCE = /[^.!?。！？；;\n]+[.!?。！？；;]*/gu;
const FACTS_LISTED = 5;

/** The message's salient facts: numbers (times, prices, dates), capitalised words, Chinese words of two or more characters. */
export function salientFacts(text: string): string[] {
  const found = new Set<string>();
  for (const m of text.matchAll(/\p{N}+(?:[.,:/-]\p{N}+)*(?:\s?(?:%|am|pm|元|块|点|号|月|日|年|km|kg))?/giu)) found.add(m[0]);
  for (const m of text.matchAll(/(?<![.!?]\s|^)\b\p{Lu}[\p{L}'-]+/gu)) if (!STOP_WORDS.has(m[0].toLowerCase())) found.add(m[0]);
  for (const t of terms(text)) if (/^\p{Script=Han}{2,}$/u.test(t)) found.add(t);
  return [...found];
}

/** Cuts text to at most maxTokens tokens at a character boundary (binary search on its length). */
export function clipToTokens(text: string, counter: TokenCounter, maxTokens: number): string {
  if (counter.count(text) <= maxTokens) return text;
  const chars = Array.from(text);
  let lo = 0;
  let hi = chars.length;
  while (lo < hi) {
    const mid = (lo + hi + 1) >>> 1;
    if (counter.count(chars.slice(0, mid).join("") + "…") <= maxTokens) lo = mid;
    else hi = mid - 1;
  }
  return lo === 0 ? "" : chars.slice(0, lo).join("") + "…";
}

export function extractiveSummary(text: string, query: string, counter: TokenCounter, maxTokens: number): ExtractiveSummary {
  const sentences = (text.match(SENTENCE) ?? [text]).map((s) => s.trim()).filter((s) => s !== "");
  const queryTerms = new Set(terms(query).filter((t) => !STOP_WORDS.has(t)));
  const ranked = sentences
    .map((s, i) => ({ s, i, score: terms(s).filter((t) => queryTerms.has(t)).length + (i === 0 ? 0.5 : 0) }))
    .sort((a, b) => b.score - a.score || a.i - b.i);
  // Each sentence counted once, its tokens summed (+1 for the joining space); the join is then
  // counted for real and cut if the sum fell short of it.
  const chosen: { s: string; i: number }[] = [];
  let used = 0;
  for (const r of ranked) {
    const n = counter.count(r.s) + (chosen.length > 0 ? 1 : 0);
    if (used + n <= maxTokens) {
      chosen.push(r);
      used += n;
    }
  }
  const joined = chosen.sort((a, b) => a.i - b.i).map((x) => x.s).join(" ");
  const summary = clipToTokens(joined === "" ? (sentences[0] ?? text) : joined, counter, maxTokens);
  const facts = salientFacts(text);
  const covered = facts.filter((f) => summary.includes(f));
  const missing = facts.filter((f) => !summary.includes(f));
  const share = facts.length === 0 ? 1 : covered.length / facts.length;
  return {
    text: summary,
    factsCovered: covered.slice(0, FACTS_LISTED),
    factsMissing: missing.slice(0, FACTS_LISTED),
    confidence: share >= 0.7 ? "high" : share >= 0.4 ? "medium" : "low",
  };
}
