// Query transformation before retrieval (seed 001): a follow-up rewritten as a standalone query
// from the conversation, a multi-hop question decomposed into sub-queries retrieved one after the
// other (each later hop refined with what the earlier ones found), and a step-back question (the
// general principle behind a specific one) searched besides the query. Every step goes through a
// StepRunner, so a step whose output does not parse keeps its fallback and the turn goes on.
import { DkiArgumentError } from "../../errors.js";
import type { StepRunner } from "./steps.js";

export interface QueryTransformOptions {
  /** Rewrite a follow-up into a standalone query from the session's history (when it has any). */
  rewrite?: boolean;
  /** Decompose a multi-hop question into at most this many sub-queries (2 to 5); 0/absent: off. */
  decompose?: number;
  /** With decompose: refine each later sub-query with the passages the earlier hops found. Default true. */
  iterative?: boolean;
  /** Also search a step-back (more general) question. */
  stepBack?: boolean;
}

export function checkQueryTransform(o: QueryTransformOptions | undefined, what = "queryTransform"): void {
  if (o === undefined) return;
  if (o === null || typeof o !== "object") throw new DkiArgumentError(`${what} must be an object`);
  for (const k of ["rewrite", "iterative", "stepBack"] as const) {
    if (o[k] !== undefined && typeof o[k] !== "boolean") throw new DkiArgumentError(`${what}.${k} must be a boolean, got ${JSON.stringify(o[k])}`);
  }
  if (o.decompose !== undefined && o.decompose !== 0 && !(Number.isInteger(o.decompose) && o.decompose >= 2 && o.decompose <= 5)) {
    throw new DkiArgumentError(`${what}.decompose must be 0 or an integer from 2 to 5, got ${String(o.decompose)}`);
  }
}

/** A conversation turn as the rewrite prompt shows it. */
export interface TransformHistory {
  role: "user" | "assistant";
  content: string;
}

/** The most history a rewrite prompt shows: the last turns carry the reference to resolve. */
const REWRITE_HISTORY_MESSAGES = 6;
const HISTORY_LINE_CHARS = 400;

export const REWRITE_PROMPT = (query: string, history: readonly TransformHistory[]) =>
  `Rewrite the last question of the conversation below as one standalone search query: replace pronouns and references with what they refer to. Answer with the query only, on one line, in the question's language.\n\nConversation:\n${history
    .slice(-REWRITE_HISTORY_MESSAGES)
    .map((m) => `${m.role === "user" ? "User" : "Assistant"}: ${m.content.replace(/\s+/g, " ").slice(0, HISTORY_LINE_CHARS)}`)
    .join("\n")}\nUser: ${query}\n\nStandalone query:`;

export const DECOMPOSE_PROMPT = (query: string, max: number) =>
  `Break the question below into the simpler questions that must be answered one after the other to answer it (at most ${max}). If it is already simple, return it alone. Answer with a JSON array of strings only, e.g. ["first question", "second question"].\n\nQuestion: ${query}\n\nJSON:`;

export const STEP_BACK_PROMPT = (query: string) =>
  `Write a more general question about the principle or background behind the question below, one that a reference text would answer. Answer with the question only, on one line.\n\nQuestion: ${query}\n\nGeneral question:`;

export const REFINE_PROMPT = (subQuery: string, found: readonly string[]) =>
  `Facts found so far:\n${found.map((f) => `- ${f}`).join("\n")}\n\nRewrite the question below as a standalone search query, filling in what the facts tell (names, dates, places). Answer with the query only, on one line.\n\nQuestion: ${subQuery}\n\nQuery:`;

const MAX_QUERY_CHARS = 300;

/**
 * One query from a model's answer: the first non-empty line, a "Query:"-style label, list marker
 * and surrounding quotes dropped; undefined when nothing of 3 to 300 characters is left.
 */
export function parseSingleQuery(raw: string): string | undefined {
  for (const line of raw.split(/\r?\n/)) {
    const q = line
      .replace(/^\s*(?:[-*•]|\d+[.)])\s*/, "")
      .replace(/^\s*(?:standalone query|query|general question|question|rewritten query)\s*:\s*/i, "")
      .trim()
      .replace(/^["'“”«»`]+|["'“”«»`]+$/g, "")
      .trim();
    if (q === "") continue;
    return q.length >= 3 && q.length <= MAX_QUERY_CHARS ? q : undefined;
  }
  return undefined;
}

/**
 * Sub-queries from a decomposition answer: the first JSON array in it, of 1 to `max` non-empty
 * strings (duplicates dropped, each at most 300 characters); undefined when there is no such
 * array. Strict on purpose: a half-written list is not guessed at, the fallback (the query alone)
 * retrieves as if there were no decomposition.
 */
export function parseSubQueries(raw: string, max: number): string[] | undefined {
  const start = raw.indexOf("[");
  if (start < 0) return undefined;
  // The shortest well-formed array from the first "[": a model often adds prose after it.
  for (let end = raw.indexOf("]", start); end >= 0; end = raw.indexOf("]", end + 1)) {
    let value: unknown;
    try {
      value = JSON.parse(raw.slice(start, end + 1));
    } catch {
      continue;
    }
    if (!Array.isArray(value) || value.length === 0 || value.length > max) return undefined;
    const out: string[] = [];
    for (const v of value) {
      if (typeof v !== "string") return undefined;
      const q = v.trim();
      if (q.length < 3 || q.length > MAX_QUERY_CHARS) return undefined;
      if (!out.some((x) => x.toLowerCase() === q.toLowerCase())) out.push(q);
    }
    return out;
  }
  return undefined;
}

/** A follow-up as a standalone query; the query itself without history or when the output does not parse. */
export async function rewriteQuery(steps: StepRunner, query: string, history: readonly TransformHistory[]): Promise<string> {
  if (history.length === 0) return query;
  return steps.text("rewrite", REWRITE_PROMPT(query, history), 64, parseSingleQuery, query);
}

/** The sub-queries of a multi-hop question; [query] when it is simple or the output does not parse. */
export async function decomposeQuery(steps: StepRunner, query: string, max: number): Promise<string[]> {
  return steps.text("decompose", DECOMPOSE_PROMPT(query, max), 48 * max, (raw) => parseSubQueries(raw, max), [query]);
}

/** A step-back question; null when the output does not parse (nothing more is searched). */
export async function stepBackQuery(steps: StepRunner, query: string): Promise<string | null> {
  return steps.text<string | null>("step_back", STEP_BACK_PROMPT(query), 64, parseSingleQuery, null);
}

/** A later hop's sub-query with the earlier hops' findings filled in; itself when the output does not parse. */
export async function refineSubQuery(steps: StepRunner, subQuery: string, found: readonly string[]): Promise<string> {
  if (found.length === 0) return subQuery;
  return steps.text("refine", REFINE_PROMPT(subQuery, found), 64, parseSingleQuery, subQuery);
}
