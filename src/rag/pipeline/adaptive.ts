// Adaptive RAG (seed 001): the query is classified first (a constrained choice of the step model),
// the class picks a retrieval strategy, and statistics are kept per strategy so an operator can see
// what each costs and how often it fails.
//
//   class         the model's word   default strategy
//   no_retrieval  "none"             direct     (no knowledge-base search: small talk, general knowledge)
//   simple        "simple"           standard   (one hybrid search)
//   multi_hop     "complex"          decompose  (sub-queries, iterative retrieval)
//
// A classification that fails or does not parse is "simple": the standard search is what the turn
// would have done without Adaptive RAG, so a bad step costs nothing but its call.
import { DkiArgumentError } from "../../errors.js";
import type { StepRunner } from "./steps.js";

export type QueryClass = "no_retrieval" | "simple" | "multi_hop";
export const QUERY_CLASSES: readonly QueryClass[] = ["no_retrieval", "simple", "multi_hop"];
export type Strategy = "direct" | "standard" | "rerank" | "decompose" | "self_rag";
export const STRATEGIES: readonly Strategy[] = ["direct", "standard", "rerank", "decompose", "self_rag"];

export const DEFAULT_STRATEGIES: Readonly<Record<QueryClass, Strategy>> = Object.freeze({ no_retrieval: "direct", simple: "standard", multi_hop: "decompose" });

const WORDS = ["none", "simple", "complex"] as const;
const CLASS_OF: Record<(typeof WORDS)[number], QueryClass> = { none: "no_retrieval", simple: "simple", complex: "multi_hop" };

export const CLASSIFY_PROMPT = (query: string) =>
  `Classify the question below. Answer with one word:\nnone: small talk or general knowledge, no documents needed\nsimple: one fact to look up\ncomplex: several facts that depend on each other, or a comparison\n\nQuestion: ${query}\n\nClass:`;

export function resolveStrategies(input: Partial<Record<QueryClass, Strategy>> | undefined): Record<QueryClass, Strategy> {
  if (input === undefined) return { ...DEFAULT_STRATEGIES };
  if (input === null || typeof input !== "object") throw new DkiArgumentError("adaptive strategies must be an object of query class → strategy");
  for (const [k, v] of Object.entries(input)) {
    if (!QUERY_CLASSES.includes(k as QueryClass)) throw new DkiArgumentError(`unknown query class ${JSON.stringify(k)}; classes: ${QUERY_CLASSES.join(", ")}`);
    if (!STRATEGIES.includes(v as Strategy)) throw new DkiArgumentError(`strategy for ${k} must be one of ${STRATEGIES.join(", ")}, got ${JSON.stringify(v)}`);
  }
  return { ...DEFAULT_STRATEGIES, ...input };
}

export async function classifyQuery(steps: StepRunner, query: string): Promise<QueryClass> {
  const word: (typeof WORDS)[number] = await steps.choice("classify", CLASSIFY_PROMPT(query), WORDS, "simple" as const);
  return CLASS_OF[word];
}

export interface StrategyStats {
  queries: number;
  failures: number;
  /** Means over the queries that succeeded. */
  meanLatencyMs: number;
  meanRetrieved: number;
  meanModelCalls: number;
}

/** Per-strategy counts and running means (kept in memory for the system's life). */
export class StrategyLedger {
  private readonly s = new Map<Strategy, { queries: number; failures: number; ms: number; retrieved: number; calls: number }>();

  record(strategy: Strategy, outcome: { ok: boolean; latencyMs: number; retrieved: number; modelCalls: number }): void {
    const e = this.s.get(strategy) ?? { queries: 0, failures: 0, ms: 0, retrieved: 0, calls: 0 };
    e.queries++;
    if (!outcome.ok) e.failures++;
    else {
      e.ms += outcome.latencyMs;
      e.retrieved += outcome.retrieved;
      e.calls += outcome.modelCalls;
    }
    this.s.set(strategy, e);
  }

  stats(): Partial<Record<Strategy, StrategyStats>> {
    const out: Partial<Record<Strategy, StrategyStats>> = {};
    for (const [k, e] of this.s) {
      const ok = e.queries - e.failures;
      out[k] = { queries: e.queries, failures: e.failures, meanLatencyMs: ok > 0 ? e.ms / ok : 0, meanRetrieved: ok > 0 ? e.retrieved / ok : 0, meanModelCalls: ok > 0 ? e.calls / ok : 0 };
    }
    return out;
  }
}
