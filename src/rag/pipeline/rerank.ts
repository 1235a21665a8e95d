// Reranking of retrieved passages, after a deeper search than the prompt needs, so the order that
// decides what enters the context is made by a finer judge than rank fusion:
//
//   lexical  0.5 · cosine(query, passage) (the knowledge base's embedder) + 0.5 · coverage, where
//            coverage is the share of the query's distinct content terms (stop words aside, unless
//            the query has nothing else) that occur in the passage. Fusion ranks by each signal's
//            rank alone, so a passage repeating one query word can outrank one that answers every
//            part of the question; coverage rewards the latter. No model call.
//   llm      a pointwise yes/no judgement by the step model ("does this passage help answer the
//            question?"): with a constrained backend, the probability of "yes" against "no" from
//            their log-probabilities; otherwise the parsed word (yes 1, no 0). A judgement that
//            fails or does not parse keeps the passage's fused score, so a bad step cannot sink it.
//   cross-encoder  the scores of a Reranker the caller passes (OnnxCrossEncoder: a cross-encoder
//            ONNX folder given by path; no weights ship with this package). It reads query and
//            passage together, so it can judge meaning the lexical signals cannot see, at one
//            small-model run per passage instead of the llm judge's generation. A reranker that
//            fails fails the rerank: there is no honest score to fall back to.
//
// Ties keep the retrieval order. Every score is in [0, 1].
import { DkiArgumentError } from "../../errors.js";
import { cosine } from "../../memory/embedders/common.js";
import { STOP_WORDS, terms } from "../../memory/text-terms.js";
import type { Embedder, Reranker } from "../../memory/types.js";
import { byScore, rerankerScores } from "../../memory/reranker.js";
import { yesProbability, type StepRunner } from "./steps.js";

export type RerankMethod = "lexical" | "llm" | "cross-encoder";
export const RERANK_METHODS: readonly RerankMethod[] = ["lexical", "llm", "cross-encoder"];

export interface RerankCandidate {
  id: string;
  text: string;
  /** The retrieval's score in [0, 1] (the llm method's fallback). */
  score: number;
}

export interface Reranked {
  method: RerankMethod;
  /** Ids in retrieval order, then in reranked order. */
  before: string[];
  after: string[];
  /** The rerank score of each id. */
  scores: Record<string, number>;
}

export function checkRerankMethod(m: unknown, what = "rerank"): asserts m is RerankMethod | undefined {
  if (m !== undefined && !RERANK_METHODS.includes(m as RerankMethod)) throw new DkiArgumentError(`${what} must be "lexical", "llm" or "cross-encoder", got ${JSON.stringify(m)}`);
}

/** The share of the query's distinct content terms found in the passage. */
export function termCoverage(query: string, passage: string): number {
  const all = [...new Set(terms(query))];
  const content = all.filter((t) => !STOP_WORDS.has(t));
  const q = content.length > 0 ? content : all;
  if (q.length === 0) return 0;
  const p = new Set(terms(passage));
  return q.filter((t) => p.has(t)).length / q.length;
}

export async function lexicalScores(query: string, candidates: readonly RerankCandidate[], embedder: Embedder): Promise<number[]> {
  if (candidates.length === 0) return [];
  const [qv, ...pv] = await embedder.embed([query, ...candidates.map((c) => c.text)]);
  return candidates.map((c, i) => 0.5 * Math.max(0, cosine(qv!, pv[i]!)) + 0.5 * termCoverage(query, c.text));
}

/** Characters of a passage the llm judge reads: enough for a chunk, bounded for the step's prompt. */
const JUDGE_PASSAGE_CHARS = 1500;

export const RELEVANCE_PROMPT = (query: string, passage: string) =>
  `Does the passage below help answer the question? Answer yes or no.\n\nQuestion: ${query}\n\nPassage: ${passage.slice(0, JUDGE_PASSAGE_CHARS)}\n\nAnswer:`;

export async function llmScores(steps: StepRunner, query: string, candidates: readonly RerankCandidate[], step = "rerank"): Promise<number[]> {
  const out: number[] = [];
  for (const c of candidates) out.push((await yesProbability(steps, step, RELEVANCE_PROMPT(query, c.text))) ?? c.score);
  return out;
}

/** The reranker's scores of the passages, checked: one per passage, each a number in [0, 1]. */
export function crossEncoderScores(reranker: Reranker, query: string, candidates: readonly RerankCandidate[]): Promise<number[]> {
  return rerankerScores(reranker, query, candidates.map((c) => c.text), ["passage", "passages"]);
}

export interface RerankDeps {
  /** The lexical method's cosine. */
  embedder: Embedder;
  /** The llm method's judge. */
  steps: StepRunner;
  /** The cross-encoder method's scorer; that method without one is an error. */
  reranker?: Reranker | null;
}

async function methodScores(method: RerankMethod, query: string, candidates: readonly RerankCandidate[], deps: RerankDeps): Promise<number[]> {
  switch (method) {
    case "lexical":
      return lexicalScores(query, candidates, deps.embedder);
    case "llm":
      return llmScores(deps.steps, query, candidates);
    case "cross-encoder":
      if (!deps.reranker) throw new DkiArgumentError('rerank "cross-encoder" needs a reranker (e.g. OnnxCrossEncoder.load(dir)) and none was given');
      return crossEncoderScores(deps.reranker, query, candidates);
  }
}

/** Reorders `candidates` by the method's score (ties: retrieval order). */
export async function rerank<C extends RerankCandidate>(method: RerankMethod, query: string, candidates: readonly C[], deps: RerankDeps): Promise<{ ranked: C[]; trace: Reranked }> {
  checkRerankMethod(method);
  const scores = await methodScores(method, query, candidates, deps);
  const order = byScore(candidates, scores);
  return {
    ranked: order.map((x) => x.item),
    trace: { method, before: candidates.map((c) => c.id), after: order.map((x) => x.item.id), scores: Object.fromEntries(order.map((x) => [x.item.id, x.score])) },
  };
}
