// Retrieval driven by the query transformations: the (rewritten) query, or its sub-queries one hop
// after the other, and a step-back question, each searched, then merged. The merge takes the hops'
// results in turn (each hop's best, then each hop's second, …), each passage once, so every hop of a
// multi-hop question gets its best evidence into the context instead of the first hop taking all.
import { DkiArgumentError } from "../../errors.js";
import { decomposeQuery, refineSubQuery, rewriteQuery, stepBackQuery, type QueryTransformOptions, type TransformHistory } from "./query-transform.js";
import type { StepRunner } from "./steps.js";

export interface RetrievalHop {
  kind: "query" | "sub_query" | "step_back";
  /** The query searched (a refined sub-query where iterative retrieval filled it in). */
  query: string;
  /** Ids of what it found, in its own rank order. */
  found: string[];
}

export interface TransformedRetrieval<R> {
  results: R[];
  /** The query after rewriting (the query itself without a rewrite). */
  query: string;
  subQueries: string[];
  stepBack: string | null;
  hops: RetrievalHop[];
}

export interface Searcher<R> {
  search(query: string): Promise<R[]>;
  /** A result's identity, for the merge (a chunk id). */
  id(r: R): string;
  /** What a later hop's refinement reads of it (a chunk's text). */
  text(r: R): string;
}

/** Passages of earlier hops a refinement prompt shows per hop, and their characters at most. */
const REFINE_PASSAGES = 2;
const REFINE_PASSAGE_CHARS = 300;

export async function retrieveTransformed<R>(steps: StepRunner, query: string, history: readonly TransformHistory[], o: QueryTransformOptions, s: Searcher<R>, limit: number): Promise<TransformedRetrieval<R>> {
  if (!Number.isInteger(limit) || limit < 1) throw new DkiArgumentError(`limit must be a positive integer, got ${String(limit)}`);
  const q = o.rewrite === true ? await rewriteQuery(steps, query, history) : query;
  const subQueries = (o.decompose ?? 0) >= 2 ? await decomposeQuery(steps, q, o.decompose!) : [q];
  const hops: RetrievalHop[] = [];
  const lists: R[][] = [];
  const found: string[] = [];
  for (let i = 0; i < subQueries.length; i++) {
    const sq = i > 0 && o.iterative !== false ? await refineSubQuery(steps, subQueries[i]!, found) : subQueries[i]!;
    const results = await s.search(sq);
    hops.push({ kind: subQueries.length > 1 ? "sub_query" : "query", query: sq, found: results.map((r) => s.id(r)) });
    lists.push(results);
    for (const r of results.slice(0, REFINE_PASSAGES)) found.push(s.text(r).replace(/\s+/g, " ").slice(0, REFINE_PASSAGE_CHARS));
  }
  let stepBack: string | null = null;
  if (o.stepBack === true) {
    stepBack = await stepBackQuery(steps, q);
    if (stepBack !== null) {
      const results = await s.search(stepBack);
      hops.push({ kind: "step_back", query: stepBack, found: results.map((r) => s.id(r)) });
      lists.push(results);
    }
  }
  return { results: interleave(lists, s.id, limit), query: q, subQueries, stepBack, hops };
}

/** The lists' items taken in turn (rank 1 of each, then rank 2, …), each id once, up to `limit`. */
export function interleave<R>(lists: readonly R[][], id: (r: R) => string, limit: number): R[] {
  const seen = new Set<string>();
  const out: R[] = [];
  const depth = Math.max(0, ...lists.map((l) => l.length));
  for (let rank = 0; rank < depth && out.length < limit; rank++) {
    for (const l of lists) {
      const r = l[rank];
      if (r === undefined || seen.has(id(r))) continue;
      seen.add(id(r));
      out.push(r);
      if (out.length === limit) break;
    }
  }
  return out;
}
