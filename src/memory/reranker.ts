// A Reranker's scores as its callers use them (memory routing, the RAG pipeline's rerank): its
// contract checked, so a broken reranker fails loudly instead of reordering by garbage.
import { DkiArgumentError } from "../errors.js";
import type { Reranker } from "./types.js";

/** Whether `x` has a Reranker's shape (checked where one is passed in, before any turn uses it). */
export function isReranker(x: unknown): x is Reranker {
  return typeof x === "object" && x !== null && typeof (x as Reranker).score === "function";
}

/** The reranker's scores of `texts`, one per text, each a number in [0, 1]; `noun` names a text in errors ([one, many]). */
export async function rerankerScores(reranker: Reranker, query: string, texts: string[], noun: readonly [string, string]): Promise<number[]> {
  const scores = await reranker.score(query, texts);
  if (!Array.isArray(scores) || scores.length !== texts.length) {
    throw new DkiArgumentError(`reranker ${reranker.id} gave ${Array.isArray(scores) ? scores.length : "no"} scores for ${texts.length} ${noun[1]}`);
  }
  scores.forEach((s, i) => {
    if (typeof s !== "number" || !(s >= 0 && s <= 1)) throw new DkiArgumentError(`reranker ${reranker.id} gave ${noun[0]} ${i} the score ${String(s)}; scores must be numbers in [0, 1]`);
  });
  return scores;
}

/** `items` with their scores, highest first; ties keep the items' order (the search's ranking). */
export function byScore<T>(items: readonly T[], scores: readonly number[]): { item: T; score: number }[] {
  return items.map((item, i) => ({ item, i, score: scores[i]! })).sort((a, b) => b.score - a.score || a.i - b.i).map(({ item, score }) => ({ item, score }));
}
