// Knowledge-base search: a collection's chunks ranked by dense similarity and BM25 (CJK-aware
// terms), fused by reciprocal rank fusion, restricted first by the metadata filter (structurally:
// unselected documents are never scored), then cut by a similarity threshold. Multi-query
// expansion and HyDE (seed 004 §8.3.5) run with the caller's local model when asked for.
import { DkiArgumentError } from "../../errors.js";
import type { Filter } from "../../memory/types.js";
import type { CitationSource } from "../citations.js";
import type { KbChunk, KnowledgeBase } from "./knowledge-base.js";
import { collectionIndex, type RankedHit } from "./index-cache.js";

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
  /** Fused score: the RRF sum over the arms and queries, divided by its largest possible value (1 = first everywhere). */
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
  const index = await collectionIndex(kb, o.collection);

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

  // Candidate pool per arm and query: deep enough that fusion can reorder what the threshold and
  // the limit then cut.
  const depth = Math.max(50, limit * 10);
  const lists: RankedHit[][] = [];
  const dense = new Map<number, number>();
  const bm25 = new Map<number, number>();
  const note = (into: Map<number, number>, hits: RankedHit[]) => {
    for (const h of hits) into.set(h.index, Math.max(into.get(h.index) ?? 0, h.score));
  };
  for (const q of queries) {
    if (mode !== "bm25") {
      const hits = await index.dense(q, depth, allowed);
      lists.push(hits);
      note(dense, hits);
    }
    if (mode !== "dense") {
      const hits = index.bm25(q, depth, allowed);
      lists.push(hits);
      note(bm25, hits);
    }
  }
  if (hydeText !== undefined && mode !== "bm25") {
    const hits = await index.dense(hydeText, depth, allowed);
    lists.push(hits);
    note(dense, hits);
  }
  // BM25 scores are unbounded: reported over the best of this search, so they read in [0, 1].
  const bestBm25 = Math.max(0, ...bm25.values());
  const fused = new Map<number, number>();
  for (const list of lists) list.forEach((h, rank) => fused.set(h.index, (fused.get(h.index) ?? 0) + 1 / (RRF_K + rank + 1)));
  const maxFused = lists.length / (RRF_K + 1);
  const results: KbSearchResult[] = [];
  for (const [i, f] of [...fused.entries()].sort((a, b) => b[1] - a[1] || a[0] - b[0])) {
    const signals = { dense: dense.get(i) ?? 0, bm25: bestBm25 > 0 ? (bm25.get(i) ?? 0) / bestBm25 : 0 };
    if ((mode === "bm25" ? signals.bm25 : signals.dense) < minScore) continue;
    const chunk = index.chunks[i];
    const doc = index.documents.get(chunk.docId);
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
      score: f / maxFused,
      signals,
    });
    if (results.length === limit) break;
  }
  return { results, queries, ...(hydeText !== undefined ? { hydeText } : {}) };
}
