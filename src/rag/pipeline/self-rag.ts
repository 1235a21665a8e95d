// Self-RAG (seed 001): the model decides around retrieval instead of always retrieving once.
//
//   1. need      does the query need retrieval at all? (a constrained yes/no). No: answer without
//                context, graded like any answer.
//   2. retrieve  search; grade the retrieval: each passage's relevance (the rerank judge's P(yes)),
//                their mean is the retrieval score. Below retrievalThreshold with rounds left:
//                reformulate the query (an LLM step; a failed one keeps the query) and search again.
//   3. answer    generate from the best retrieval so far.
//   4. grade     the answer on three dimensions, each a constrained yes/no read as P(yes):
//                supported (by the passages), relevant (to the question), complete (answers all of
//                it); their mean is the answer score. Below answerThreshold with rounds left:
//                reformulate and go back to 2.
//
// A round is one retrieval (2), and an answer (3, 4) once the retrieval passes or no round is left;
// at most maxRounds (1 to 3). The answer returned is the best graded one. Every decision, score and
// step is in the trace, so a caller sees why the turn went the way it did.
import { DkiArgumentError } from "../../errors.js";
import { llmScores, type RerankCandidate } from "./rerank.js";
import { parseSingleQuery } from "./query-transform.js";
import { yesProbability, type StepRunner } from "./steps.js";

export interface SelfRagConfig {
  /** Rounds at most (1 to 3). Default 3. */
  maxRounds: number;
  /** Mean passage relevance in [0, 1] a retrieval needs to be answered from. Default 0.5. */
  retrievalThreshold: number;
  /** Mean answer grade in [0, 1] that accepts an answer. Default 0.6. */
  answerThreshold: number;
  /** Ask first whether the query needs retrieval. Default true. */
  checkNeed: boolean;
}

export const DEFAULT_SELF_RAG: Readonly<SelfRagConfig> = Object.freeze({ maxRounds: 3, retrievalThreshold: 0.5, answerThreshold: 0.6, checkNeed: true });

export function resolveSelfRag(input: Partial<SelfRagConfig> | true | undefined): SelfRagConfig {
  if (input !== true && input !== undefined && (input === null || typeof input !== "object")) throw new DkiArgumentError("selfRag must be true or an object");
  const c = { ...DEFAULT_SELF_RAG, ...(input === true || input === undefined ? {} : input) };
  if (!(Number.isInteger(c.maxRounds) && c.maxRounds >= 1 && c.maxRounds <= 3)) throw new DkiArgumentError(`selfRag.maxRounds must be an integer from 1 to 3, got ${String(c.maxRounds)}`);
  for (const k of ["retrievalThreshold", "answerThreshold"] as const) {
    if (!(typeof c[k] === "number" && c[k] >= 0 && c[k] <= 1)) throw new DkiArgumentError(`selfRag.${k} must be in [0, 1], got ${String(c[k])}`);
  }
  if (typeof c.checkNeed !== "boolean") throw new DkiArgumentError(`selfRag.checkNeed must be a boolean, got ${JSON.stringify(c.checkNeed)}`);
  return c;
}

export const ANSWER_DIMENSIONS = ["supported", "relevant", "complete"] as const;
export type AnswerDimension = (typeof ANSWER_DIMENSIONS)[number];

export const NEED_RETRIEVAL_PROMPT = (query: string) =>
  `Does answering the question below need facts from documents (names, numbers, policies, events), rather than general knowledge or small talk? Answer yes or no.\n\nQuestion: ${query}\n\nAnswer:`;
export const REFORMULATE_PROMPT = (query: string) =>
  `The search for the question below found nothing useful. Write a different search query for the same information, using other words. Answer with the query only, on one line.\n\nQuestion: ${query}\n\nQuery:`;
const PASSAGES_CHARS = 2000;
const GRADE_PROMPTS: Record<AnswerDimension, (q: string, a: string, passages: string) => string> = {
  supported: (q, a, p) => `Is every statement of the answer supported by the passages? Answer yes or no.\n\nPassages:\n${p}\n\nQuestion: ${q}\n\nAnswer to check: ${a}\n\nSupported:`,
  relevant: (q, a) => `Does the answer address the question? Answer yes or no.\n\nQuestion: ${q}\n\nAnswer to check: ${a}\n\nRelevant:`,
  complete: (q, a) => `Does the answer answer every part of the question? Answer yes or no.\n\nQuestion: ${q}\n\nAnswer to check: ${a}\n\nComplete:`,
};

export interface SelfRagRound<R> {
  query: string;
  results: R[];
  /** Mean passage relevance (0 with no passage). */
  retrievalScore: number;
  retrievalAccepted: boolean;
  /** Set when the round answered. */
  answer?: string;
  grades?: Record<AnswerDimension, number | null>;
  answerScore?: number;
  answerAccepted?: boolean;
}

export interface SelfRagTrace<R> {
  config: SelfRagConfig;
  /** The need step's P(yes); null when not asked or it fell back (retrieval then happens). */
  needScore: number | null;
  retrieved: boolean;
  rounds: SelfRagRound<R>[];
  /** Index in rounds of the answer returned (-1: answered without retrieval). */
  chosenRound: number;
}

export interface SelfRagDeps<R> {
  steps: StepRunner;
  retrieve(query: string): Promise<R[]>;
  /** A retrieved item as the judge reads it. */
  candidate(r: R): RerankCandidate;
  /** An answer from these results ([] = without context). */
  answer(query: string, results: R[]): Promise<string>;
}

export interface SelfRagResult<R> {
  answer: string;
  results: R[];
  trace: SelfRagTrace<R>;
}

async function gradeAnswer<R>(d: SelfRagDeps<R>, query: string, answer: string, results: R[]): Promise<{ grades: Record<AnswerDimension, number | null>; score: number }> {
  const passages = results
    .map((r, i) => `[${i + 1}] ${d.candidate(r).text}`)
    .join("\n")
    .slice(0, PASSAGES_CHARS);
  const grades = {} as Record<AnswerDimension, number | null>;
  // Without passages there is nothing to be supported by: that dimension is not graded.
  const dims: readonly AnswerDimension[] = results.length === 0 ? ANSWER_DIMENSIONS.filter((x) => x !== "supported") : ANSWER_DIMENSIONS;
  for (const dim of ANSWER_DIMENSIONS) grades[dim] = dims.includes(dim) ? await yesProbability(d.steps, `grade_${dim}`, GRADE_PROMPTS[dim](query, answer, passages)) : null;
  // A grade whose step fell back counts as 0.5: unknown, neither accepting nor rejecting on its own.
  const vals = dims.map((x) => grades[x] ?? 0.5);
  return { grades, score: vals.reduce((a, b) => a + b, 0) / vals.length };
}

export async function runSelfRag<R>(query: string, config: SelfRagConfig, d: SelfRagDeps<R>): Promise<SelfRagResult<R>> {
  const trace: SelfRagTrace<R> = { config, needScore: null, retrieved: true, rounds: [], chosenRound: -1 };
  if (config.checkNeed) {
    trace.needScore = await yesProbability(d.steps, "need_retrieval", NEED_RETRIEVAL_PROMPT(query));
    if (trace.needScore !== null && trace.needScore < 0.5) {
      trace.retrieved = false;
      // The same array answered from and returned: a caller may match its drafts by identity.
      const none: R[] = [];
      const answer = await d.answer(query, none);
      return { answer, results: none, trace };
    }
  }
  let q = query;
  let best: { answer: string; results: R[]; score: number; round: number } | null = null;
  for (let round = 0; round < config.maxRounds; round++) {
    const last = round === config.maxRounds - 1;
    if (round > 0) q = await d.steps.text("reformulate", REFORMULATE_PROMPT(q), 64, parseSingleQuery, q);
    const results = await d.retrieve(q);
    const rel = results.length === 0 ? [] : await llmScores(d.steps, q, results.map((r) => d.candidate(r)), "grade_passage");
    const retrievalScore = rel.length === 0 ? 0 : rel.reduce((a, b) => a + b, 0) / rel.length;
    const r: SelfRagRound<R> = { query: q, results, retrievalScore, retrievalAccepted: retrievalScore >= config.retrievalThreshold };
    trace.rounds.push(r);
    // A weak retrieval is retried while rounds are left; on the last round it is answered from anyway.
    if (!r.retrievalAccepted && !last) continue;
    const answer = await d.answer(query, results);
    const g = await gradeAnswer(d, query, answer, results);
    Object.assign(r, { answer, grades: g.grades, answerScore: g.score, answerAccepted: g.score >= config.answerThreshold });
    if (best === null || g.score > best.score) best = { answer, results, score: g.score, round };
    if (r.answerAccepted) break;
  }
  trace.chosenRound = best!.round;
  return { answer: best!.answer, results: best!.results, trace };
}
