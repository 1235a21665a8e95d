// A collection's search index, built from the store on first search and rebuilt after a write
// (the knowledge base's per-collection version says when). Dense: exact cosine over the stored
// unit vectors of the documents the filter selects, so a filtered search is exact however few
// documents it keeps (an approximate index would have to over-fetch and post-filter). BM25: over
// the memory layer's `terms()` (CJK-aware: jieba for Chinese), so chunks and memories are cut alike.
import { terms } from "../../memory/text-terms.js";
import type { KbChunk, KbDocument, KnowledgeBase } from "./knowledge-base.js";

export interface RankedHit {
  /** Position in `chunks`. */
  index: number;
  score: number;
}

export interface CollectionIndex {
  readonly version: number;
  readonly chunks: KbChunk[];
  readonly documents: Map<string, KbDocument>;
  dense(query: string, k: number, allowedDocs: Set<string> | null): Promise<RankedHit[]>;
  bm25(query: string, k: number, allowedDocs: Set<string> | null): RankedHit[];
}

const BM25_K1 = 1.2;
const BM25_B = 0.75;

function topK(scores: Float64Array | number[], k: number, keep: (i: number) => boolean): RankedHit[] {
  const hits: RankedHit[] = [];
  for (let i = 0; i < scores.length; i++) if (scores[i] > 0 && keep(i)) hits.push({ index: i, score: scores[i] });
  hits.sort((a, b) => b.score - a.score || a.index - b.index);
  return hits.slice(0, k);
}

function build(kb: KnowledgeBase, collection: string, version: number): CollectionIndex {
  const snap = kb.snapshot(collection);
  const { chunks, vectors, documents } = snap;
  // BM25 postings: term → [chunk, tf] pairs.
  const postings = new Map<string, { i: number; tf: number }[]>();
  const lengths = new Float64Array(chunks.length);
  chunks.forEach((c, i) => {
    const tf = new Map<string, number>();
    for (const t of terms(c.text)) tf.set(t, (tf.get(t) ?? 0) + 1);
    let len = 0;
    for (const [t, n] of tf) {
      len += n;
      let p = postings.get(t);
      if (!p) postings.set(t, (p = []));
      p.push({ i, tf: n });
    }
    lengths[i] = len;
  });
  const avgLen = chunks.length > 0 ? lengths.reduce((a, b) => a + b, 0) / chunks.length : 1;
  const keepOf = (allowed: Set<string> | null) => (i: number) => allowed === null || allowed.has(chunks[i].docId);
  return {
    version,
    chunks,
    documents,
    async dense(query, k, allowed) {
      const [q] = await kb.embedder.embed([query]);
      const scores = new Float64Array(chunks.length);
      const keep = keepOf(allowed);
      for (let i = 0; i < chunks.length; i++) {
        if (!keep(i)) continue;
        const v = vectors[i];
        let dot = 0;
        for (let d = 0; d < v.length; d++) dot += v[d] * q[d];
        // Both unit vectors: the dot is the cosine; negative similarity is no match.
        scores[i] = Math.max(0, Math.min(1, dot));
      }
      return topK(scores, k, keep);
    },
    bm25(query, k, allowed) {
      const scores = new Float64Array(chunks.length);
      const n = chunks.length;
      for (const t of new Set(terms(query))) {
        const p = postings.get(t);
        if (!p) continue;
        const idf = Math.log(1 + (n - p.length + 0.5) / (p.length + 0.5));
        for (const { i, tf } of p) scores[i] += (idf * tf * (BM25_K1 + 1)) / (tf + BM25_K1 * (1 - BM25_B + (BM25_B * lengths[i]) / avgLen));
      }
      return topK(scores, k, keepOf(allowed));
    },
  };
}

const cache = new WeakMap<KnowledgeBase, Map<string, CollectionIndex>>();

/** The collection's index at its current version (built or rebuilt as needed). */
export async function collectionIndex(kb: KnowledgeBase, collection: string): Promise<CollectionIndex> {
  let perKb = cache.get(kb);
  if (!perKb) cache.set(kb, (perKb = new Map()));
  const version = kb.version(collection);
  const have = perKb.get(collection);
  if (have && have.version === version) return have;
  const index = build(kb, collection, version);
  perKb.set(collection, index);
  return index;
}
