// Okapi BM25 over documents given as term lists (the caller tokenises, with text-terms.ts's
// terms(), so queries and documents are cut the same way). In memory, one index per scope: it is
// rebuilt from the owning store's texts, which is cheap next to embedding them.

export interface Bm25Options {
  /** Term-frequency saturation (default 1.2). */
  k1?: number;
  /** Length normalisation, 0 (none) to 1 (full) (default 0.75). */
  b?: number;
}

export interface ScoredId {
  id: string;
  score: number;
}

export class Bm25Index {
  private readonly k1: number;
  private readonly b: number;
  /** term → (document id → term frequency) */
  private readonly postings = new Map<string, Map<string, number>>();
  /** document id → its distinct terms and its length, so remove() touches only its own postings */
  private readonly docs = new Map<string, { terms: string[]; length: number }>();
  private totalLength = 0;

  constructor(options: Bm25Options = {}) {
    this.k1 = options.k1 ?? 1.2;
    this.b = options.b ?? 0.75;
    if (!(this.k1 >= 0) || !(this.b >= 0 && this.b <= 1)) throw new RangeError(`BM25: k1 must be >= 0 and b in [0, 1], got k1 ${this.k1}, b ${this.b}`);
  }

  get size(): number {
    return this.docs.size;
  }

  has(id: string): boolean {
    return this.docs.has(id);
  }

  /** Indexes a document, replacing an earlier one with the same id. */
  add(id: string, terms: readonly string[]): void {
    this.remove(id);
    const tf = new Map<string, number>();
    for (const t of terms) tf.set(t, (tf.get(t) ?? 0) + 1);
    for (const [t, n] of tf) {
      let p = this.postings.get(t);
      if (p === undefined) this.postings.set(t, (p = new Map()));
      p.set(id, n);
    }
    this.docs.set(id, { terms: [...tf.keys()], length: terms.length });
    this.totalLength += terms.length;
  }

  remove(id: string): boolean {
    const doc = this.docs.get(id);
    if (doc === undefined) return false;
    for (const t of doc.terms) {
      const p = this.postings.get(t)!;
      p.delete(id);
      if (p.size === 0) this.postings.delete(t);
    }
    this.docs.delete(id);
    this.totalLength -= doc.length;
    return true;
  }

  /**
   * The best `limit` documents for the query terms (repeats in the query count once), highest
   * first, among those `accept` lets through; documents sharing no term are never returned.
   */
  search(queryTerms: readonly string[], limit: number, accept?: (id: string) => boolean): ScoredId[] {
    if (limit <= 0) return [];
    const scores = new Map<string, number>();
    for (const t of new Set(queryTerms)) {
      const p = this.postings.get(t);
      if (p === undefined) continue;
      const idf = this.idf(p.size);
      for (const [id, tf] of p) scores.set(id, (scores.get(id) ?? 0) + idf * this.saturate(tf, this.docs.get(id)!.length));
    }
    // Keep the best `limit` in a small sorted list: common terms match most documents, and
    // sorting them all cost more than scoring them.
    const top: ScoredId[] = [];
    const better = (x: ScoredId, y: ScoredId) => x.score > y.score || (x.score === y.score && x.id < y.id);
    for (const [id, score] of scores) {
      const hit = { id, score };
      if (top.length === limit && !better(hit, top[limit - 1])) continue;
      if (accept !== undefined && !accept(id)) continue;
      let i = top.length;
      while (i > 0 && better(hit, top[i - 1])) i--;
      top.splice(i, 0, hit);
      if (top.length > limit) top.pop();
    }
    return top;
  }

  /** One document's score for the query (0 when it shares no term or is not indexed). */
  score(id: string, queryTerms: readonly string[]): number {
    const doc = this.docs.get(id);
    if (doc === undefined) return 0;
    let s = 0;
    for (const t of new Set(queryTerms)) {
      const p = this.postings.get(t);
      const tf = p?.get(id);
      if (tf !== undefined) s += this.idf(p!.size) * this.saturate(tf, doc.length);
    }
    return s;
  }

  // The "+1" form of idf (Lucene's), never negative, so a term in most documents still counts a little.
  private idf(df: number): number {
    return Math.log(1 + (this.docs.size - df + 0.5) / (df + 0.5));
  }

  private saturate(tf: number, length: number): number {
    const avg = this.totalLength / this.docs.size || 1;
    return (tf * (this.k1 + 1)) / (tf + this.k1 * (1 - this.b + (this.b * length) / avg));
  }
}
