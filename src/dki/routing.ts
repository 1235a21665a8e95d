// The routing step both systems run (DKI injects what it returns, the RAG baseline puts it in the
// prompt), so a comparison of the two measures the injection and nothing else.
import { DkiArgumentError } from "../errors.js";
import type { Filter, MemoryStoreApi, SearchResult } from "../memory/types.js";

export interface RouteOptions {
  userId: string;
  sessionId?: string;
  /** Memories returned at most. */
  limit: number;
  filter?: Filter;
  minScore?: number;
}

/** The user's memories for a query, best first (ties by id, so the order is deterministic). */
export async function routeMemories(store: Pick<MemoryStoreApi, "memories">, query: string, o: RouteOptions): Promise<SearchResult[]> {
  if (typeof query !== "string" || query.trim() === "") throw new DkiArgumentError("the query is empty");
  if (typeof o.userId !== "string" || o.userId === "") throw new DkiArgumentError("userId must be a non-empty string");
  if (o.limit === 0) return [];
  const found = await store.memories.search(query, { userId: o.userId, sessionId: o.sessionId, limit: o.limit, filter: o.filter, minScore: o.minScore });
  // The store searches by user structurally; a result of another user here would be its bug, and
  // injecting it would leak that user's memory: refused outright.
  for (const r of found) if (r.memory.userId !== o.userId) throw new Error(`the memory store returned memory ${r.memory.id} of another user for user ${JSON.stringify(o.userId)}`);
  return [...found].sort((a, b) => b.score - a.score || (a.memory.id < b.memory.id ? -1 : a.memory.id > b.memory.id ? 1 : 0));
}
