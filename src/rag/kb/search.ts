// Knowledge-base search: the memory layer's hybrid retrieval over a collection's chunks (dense HNSW
// and BM25 over CJK-aware terms, fused by reciprocal rank fusion), with the metadata filter inside
// each index's search (so it cannot starve the results), then a similarity threshold. Multi-query
// expansion and HyDE (seed 004 §8.3.5) run with the caller's local model when asked for: every
// query searches, and a chunk keeps the best of each signal over them before one fusion.
import { DkiArgumentError } from "../../errors.js";
import { fuse, type Signals } from "../../memory/retrieval/fusion.js";
import { terms } from "../../memory/text-terms.js";
import type { Filter } from "../../memory/types.js";
import type { CitationSource } from "../citations.js";
import type { KbChunk, KnowledgeBase } from "./knowledge-base.js";

export type KbSearchMode = "hybrid" | "dense" | "bm25";

export interface QueryExpansion {
  /** Rewrites of the query to search with besides it (multi-query). 0 or absent: none. */
  multiQuery?: number;
  /** Search the dense arm with a hypothetical answer written by the model (HyDE). */
  hyde?: boolean;
  /** The local model: a prompt in, its continuation out. */
  generate: (prompt: string, maxNewTokens: number) => Promise<string>;
}

export interface KbSearchOptions {
  collection: string;
  /** Results returned at most. Default 5. */
  limit?: number;
  filter?: Filter;
  /**
   * Similarity threshold in [0, 1]: a result is kept when its dense cosine similarity (bm25 mode:
   * its BM25 score over the best one's) reaches it. Default 0: none.
   */
  minScore?: number;
  mode?: KbSearchMode;
  expand?: QueryExpansion;
}

export interface KbSearchResult {
  chunk: KbChunk;
  source: CitationSource;
  /** Fused score in [0, 1]: reciprocal rank fusion over the signals, over its largest possible value (1 = first in both). */
  score: number;
  signals: { dense: number; bm25: number };
}

export interface KbSearchDetail {
  results: KbSearchResult[];
  /** The queries searched (the original first, then rewrites). */
  queries: string[];
  /** The hypothetical answer HyDE searched with. */
  hydeText?: string;
}

/** RRF's k: 60, as in Cormack et al. and most engines. */
export const RRF_K = 60;
const WEIGHTS = { hybrid: { dense: 1, bm25: 1, recency: 0 }, dense: { dense: 1, bm25: 0, recency: 0 }, bm25: { dense: 0, bm25: 1, recency: 0 } } as const;

function checkOptions(o: KbSearchOptions): Required<Pick<KbSearchOptions, "limit" | "minScore" | "mode">> {
  if (o === null || typeof o !== "object") throw new DkiArgumentError("search options must be an object with a collection");
  const limit = o.limit ?? 5;
  const minScore = o.minScore ?? 0;
  const mode = o.mode ?? "hybrid";
  if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw new DkiArgumentError(`limit must be an integer from 1 to 1000, got ${String(limit)}`);
  if (typeof minScore !== "number" || !(minScore >= 0 && minScore <= 1)) throw new DkiArgumentError(`minScore must be in [0, 1], got ${String(minScore)}`);
  if (mode !== "hybrid" && mode !== "dense" && mode !== "bm25") throw new DkiArgumentError(`mode must be hybrid, dense or bm25, got ${JSON.stringify(mode)}`);
  if (o.expand !== undefined) {
    const m = o.expand.multiQuery ?? 0;
    if (!Number.isInteger(m) || m < 0 || m > 8) throw new DkiArgumentError(`multiQuery must be an integer from 0 to 8, got ${String(m)}`);
    if (typeof o.expand.generate !== "function") throw new DkiArgumentError("query expansion needs a generate function (the local model)");
  }
  return { limit, minScore, mode };
}

/** The rewrites of a multi-query prompt's answer: one per line, list markers and quotes dropped. */
export function parseRewrites(text: string, query: string, max: number): string[] {
  const seen = new Set([query.trim().toLowerCase()]);
  const out: string[] = [];
  for (const raw of text.split(/\r?\n/)) {
    const line = raw.replace(/^\s*(?:[-*•]|\d+[.)、]|[（(]?\d+[)）])\s*/, "").replace(/^["'“”「」]+|["'“”「」]+$/g, "").trim();
    if (line.length < 3 || line.length > 300 || seen.has(line.toLowerCase())) continue;
    seen.add(line.toLowerCase());
    out.push(line);
    if (out.length === max) break;
  }
  return out;
}

const MULTI_QUERY_PROMPT = (q: string, n: number) =>
  `Write ${n} different rewrites of the search query below, one per line, with no numbering and no other text. Keep its language.\n\nQuery: ${q}`;
const HYDE_PROMPT = (q: string) => `Write a short passage that answers the question below, as a reference document would. Keep its language.\n\nQuestion: ${q}`;

export async function searchKnowledgeBase(kb: KnowledgeBase, query: string, o: KbSearchOptions): Promise<KbSearchDetail> {
  if (typeof query !== "string" || query.trim() === "") throw new DkiArgumentError("the query must be a non-empty string");
  const { limit, minScore, mode } = checkOptions(o);
  const allowed = kb.selectDocuments(o.collection, o.filter);
  const accept = allowed === null ? undefined : (id: string) => allowed.has(kb.docOfChunk(o.collection, id) ?? "");

  const queries = [query];
  let hydeText: string | undefined;
  if (o.expand) {
    const n = o.expand.multiQuery ?? 0;
    if (n > 0) queries.push(...parseRewrites(await o.expand.generate(MULTI_QUERY_PROMPT(query, n), 48 * n), query, n));
    if (o.expand.hyde) {
      const h = (await o.expand.generate(HYDE_PROMPT(query), 128)).trim();
      if (h !== "") hydeText = h;
    }
  }
  // Each query searches with its own terms and vector; HyDE's passage stands in for the original
  // query's vector in one more search (its terms stay the query's: BM25 needs no guesswork).
  const texts = [...queries, ...(hydeText !== undefined ? [hydeText] : [])];
  const vectors = await kb.embedder.embed(texts);
  const fusion = { method: "rrf" as const, k: RRF_K, weights: WEIGHTS[mode] };
  // Deep enough that the threshold and the limit cut from a fused order, not from one arm's top.
  const depth = Math.max(50, limit * 10);
  const best = new Map<string, Signals>();
  texts.forEach((t, i) => {
    const qTerms = i < queries.length ? terms(t) : terms(query);
    for (const h of kb.hybridSearch(o.collection, { terms: qTerms, vector: vectors[i] }, { limit: depth, depth, accept, fusion })) {
      const b = best.get(h.id);
      best.set(h.id, b === undefined ? { ...h.signals } : { dense: Math.max(b.dense, h.signals.dense), bm25: Math.max(b.bm25, h.signals.bm25), recency: h.signals.recency });
    }
  });
  const ids = [...best.keys()];
  const scores = fuse(ids.map((id) => best.get(id)!), fusion);
  const order = ids.map((id, i) => ({ id, score: scores[i], signals: best.get(id)! })).sort((a, b) => b.score - a.score || (a.id < b.id ? -1 : 1));
  const results: KbSearchResult[] = [];
  for (const h of order) {
    if ((mode === "bm25" ? h.signals.bm25 : h.signals.dense) < minScore || h.score <= 0) continue;
    const chunk = kb.getChunk(o.collection, h.id);
    if (chunk === undefined) continue;
    const doc = kb.getDocument(o.collection, chunk.docId);
    results.push({
      chunk,
      source: {
        chunkId: chunk.id,
        docId: chunk.docId,
        collection: o.collection,
        start: chunk.start,
        end: chunk.end,
        headingPath: chunk.headingPath,
        ...(chunk.page !== undefined ? { page: chunk.page } : {}),
        ...(doc?.title !== undefined ? { title: doc.title } : {}),
      },
      score: h.score,
      signals: { dense: h.signals.dense, bm25: h.signals.bm25 },
    });
    if (results.length === limit) break;
  }
  return { results, queries, ...(hydeText !== undefined ? { hydeText } : {}) };
}
