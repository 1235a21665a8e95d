// The routing step both systems run (DKI injects what it returns, the RAG baseline puts it in the
// prompt), so a comparison of the two measures the injection and nothing else.
//
// With a reranker, the store's hybrid search only proposes candidates (a deeper search than the
// turn keeps; a memory that shares no signal with the query is not among them) and the reranker, which reads the query and each memory together, decides which of
// them reach the model and in what order. The memories keep the search's scores and carry the
// reranker's beside them (`rerank`), which gating reads with relevanceSignal "rerank".
import { DkiArgumentError } from "../errors.js";
import type { Filter, MemoryStoreApi, Reranker, SearchResult } from "../memory/types.js";
import { byScore, isReranker, rerankerScores } from "../memory/reranker.js";

export interface RouteOptions {
  userId: string;
  sessionId?: string;
  /** Memories returned at most. */
  limit: number;
  filter?: Filter;
  minScore?: number;
  rerank?: MemoryRerank;
}

/** How routing reranks the search's candidates (SystemOpenOptions.memoryRerank). */
export interface MemoryRerank {
  reranker: Reranker;
  /** Candidates searched and reranked before the best `limit` are kept: default max(20, 4 × limit), at most 100. */
  depth?: number;
}

export const MAX_RERANK_DEPTH = 100;

/** A memory as routing returns it: the search's result and, when a reranker ordered them, its score in [0, 1]. */
export interface Routed extends SearchResult {
  rerank?: number;
}

/** A memory as routing returned it, in its order: a turn's response lists them (metadata.routed). */
export interface RoutedMemory {
  id: string;
  /** The search's fused score (with a reranker, the order is the reranker's, the score the search's). */
  score: number;
}

export const routedList = (routed: readonly SearchResult[]): RoutedMemory[] => routed.map((r) => ({ id: r.memory.id, score: r.score }));

export function checkMemoryRerank(r: MemoryRerank | undefined): void {
  if (r === undefined) return;
  if (typeof r !== "object" || r === null || !isReranker(r.reranker)) throw new DkiArgumentError("memoryRerank.reranker must be a Reranker (an object with score(query, passages))");
  if (r.depth !== undefined && (!Number.isInteger(r.depth) || r.depth < 1 || r.depth > MAX_RERANK_DEPTH)) {
    throw new DkiArgumentError(`memoryRerank.depth must be an integer from 1 to ${MAX_RERANK_DEPTH}, got ${String(r.depth)}`);
  }
}

/** The user's memories for a query, best first (ties by id, so the order is deterministic; with a reranker, its order). */
export async function routeMemories(store: Pick<MemoryStoreApi, "memories">, query: string, o: RouteOptions): Promise<Routed[]> {
  if (typeof query !== "string" || query.trim() === "") throw new DkiArgumentError("the query is empty");
  if (typeof o.userId !== "string" || o.userId === "") throw new DkiArgumentError("userId must be a non-empty string");
  if (o.limit === 0) return [];
  const depth = o.rerank === undefined ? o.limit : Math.max(o.limit, o.rerank.depth ?? Math.min(MAX_RERANK_DEPTH, Math.max(20, 4 * o.limit)));
  const found = await store.memories.search(query, { userId: o.userId, sessionId: o.sessionId, limit: depth, filter: o.filter, minScore: o.minScore });
  // The store searches by user structurally; a result of another user here would be its bug, and
  // injecting it would leak that user's memory: refused outright.
  for (const r of found) if (r.memory.userId !== o.userId) throw new Error(`the memory store returned memory ${r.memory.id} of another user for user ${JSON.stringify(o.userId)}`);
  const ranked = [...found].sort((a, b) => b.score - a.score || (a.memory.id < b.memory.id ? -1 : a.memory.id > b.memory.id ? 1 : 0));
  if (o.rerank === undefined || ranked.length === 0) return ranked;
  const scores = await rerankerScores(o.rerank.reranker, query, ranked.map((r) => r.memory.text), ["memory", "memories"]);
  return byScore(ranked, scores).slice(0, o.limit).map((x) => ({ ...x.item, rerank: x.score }));
}
