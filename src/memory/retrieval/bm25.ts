// Okapi BM25 over documents given as term lists (the caller tokenises, with text-terms.ts's
// terms(), so queries and documents are cut the same way). In memory, one index per scope: it is
// rebuilt from the owning store's texts, which is cheap next to embedding them.
//
// Documents are numbered by slot (reused after a removal), so that a search works on arrays of
// numbers instead of maps keyed by id strings; ids are looked up only for the few best documents.
import { TopK } from "./top-k.js";

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

/** The documents holding one term, as parallel arrays: slot and term frequency. */
interface Posting {
  slots: number[];
  tfs: number[];
}

/** What search() adds scores up in, by slot; kept between searches so it is not allocated each time. */
interface Accumulator {
  /** All zero between searches. */
  scores: Float64Array;
  /** The slots with a score, in the order they got one. */
  touched: Int32Array;
}

export class Bm25Index {
  private readonly k1: number;
  private readonly b: number;
  private readonly postings = new Map<string, Posting>();
  private readonly slotOf = new Map<string, number>();
  /**
   * By slot: the document's id (undefined for a free slot), its length in terms, and its terms,
   * each with where the document sits in the term's posting, so remove() touches only its own entries.
   */
  private readonly ids: (string | undefined)[] = [];
  private readonly lengths: number[] = [];
  private readonly positions: (Map<string, number> | undefined)[] = [];
  private readonly freeSlots: number[] = [];
  private totalLength = 0;
  /** Undefined while a search uses it: a search from inside an `accept` callback gets its own. */
  private spare: Accumulator | undefined;

  constructor(options: Bm25Options = {}) {
    this.k1 = options.k1 ?? 1.2;
    this.b = options.b ?? 0.75;
    if (!(this.k1 >= 0) || !(this.b >= 0 && this.b <= 1)) throw new RangeError(`BM25: k1 must be >= 0 and b in [0, 1], got k1 ${this.k1}, b ${this.b}`);
  }

  get size(): number {
    return this.slotOf.size;
  }

  has(id: string): boolean {
    return this.slotOf.has(id);
  }

  /** Indexes a document, replacing an earlier one with the same id. */
  add(id: string, terms: readonly string[]): void {
    this.remove(id);
    const tf = new Map<string, number>();
    for (const t of terms) tf.set(t, (tf.get(t) ?? 0) + 1);
    const slot = this.freeSlots.pop() ?? this.ids.length;
    const positions = new Map<string, number>();
    for (const [t, n] of tf) {
      let p = this.postings.get(t);
      if (p === undefined) this.postings.set(t, (p = { slots: [], tfs: [] }));
      positions.set(t, p.slots.length);
      p.slots.push(slot);
      p.tfs.push(n);
    }
    this.ids[slot] = id;
    this.lengths[slot] = terms.length;
    this.positions[slot] = positions;
    this.slotOf.set(id, slot);
    this.totalLength += terms.length;
  }

  remove(id: string): boolean {
    const slot = this.slotOf.get(id);
    if (slot === undefined) return false;
    for (const [t, at] of this.positions[slot]!) {
      const p = this.postings.get(t)!;
      // The posting's last entry moves into the hole, and its document learns its new position.
      const movedSlot = p.slots.pop()!;
      const movedTf = p.tfs.pop()!;
      if (at < p.slots.length) {
        p.slots[at] = movedSlot;
        p.tfs[at] = movedTf;
        this.positions[movedSlot]!.set(t, at);
      }
      if (p.slots.length === 0) this.postings.delete(t);
    }
    this.totalLength -= this.lengths[slot];
    this.ids[slot] = undefined;
    this.positions[slot] = undefined;
    this.slotOf.delete(id);
    this.freeSlots.push(slot);
    return true;
  }

  /**
   * The best `limit` documents for the query terms (repeats in the query count once), highest
   * first (ties: lower id first), among those `accept` lets through; documents sharing no term
   * are never returned.
   */
  search(queryTerms: readonly string[], limit: number, accept?: (id: string) => boolean): ScoredId[] {
    if (limit <= 0) return [];
    const acc = this.borrowAccumulator();
    let touched = 0;
    const avg = this.averageLength();
    try {
      for (const t of new Set(queryTerms)) {
        const p = this.postings.get(t);
        if (p === undefined) continue;
        const idf = this.idf(p.slots.length);
        for (let i = 0; i < p.slots.length; i++) {
          const slot = p.slots[i];
          // Every term adds a positive amount, so a zero means the slot was not touched yet.
          if (acc.scores[slot] === 0) acc.touched[touched++] = slot;
          acc.scores[slot] += idf * this.saturate(p.tfs[i], this.lengths[slot], avg);
        }
      }
      const top = new TopK(limit);
      for (let i = 0; i < touched; i++) {
        const slot = acc.touched[i];
        const id = this.ids[slot]!;
        const score = acc.scores[slot];
        if (top.admits(score, id) && (accept === undefined || accept(id))) top.add(score, id);
      }
      return top.ids.map((id, i) => ({ id, score: top.scores[i] }));
    } finally {
      for (let i = 0; i < touched; i++) acc.scores[acc.touched[i]] = 0;
      this.spare = acc;
    }
  }

  /** One document's score for the query (0 when it shares no term or is not indexed). */
  score(id: string, queryTerms: readonly string[]): number {
    return this.scores(queryTerms, [id])[0];
  }

  /** score() of each id, in the order given: the query's postings and idf are looked up once. */
  scores(queryTerms: readonly string[], ids: readonly string[]): number[] {
    const avg = this.averageLength();
    const query: { term: string; tfs: number[]; idf: number }[] = [];
    for (const term of new Set(queryTerms)) {
      const p = this.postings.get(term);
      if (p !== undefined) query.push({ term, tfs: p.tfs, idf: this.idf(p.slots.length) });
    }
    return ids.map((id) => {
      const slot = this.slotOf.get(id);
      if (slot === undefined) return 0;
      const positions = this.positions[slot]!;
      // Summed in query order, as search() does, so both give the same score to the last bit.
      let s = 0;
      for (const { term, tfs, idf } of query) {
        const at = positions.get(term);
        if (at !== undefined) s += idf * this.saturate(tfs[at], this.lengths[slot], avg);
      }
      return s;
    });
  }

  private borrowAccumulator(): Accumulator {
    let acc = this.spare;
    this.spare = undefined;
    if (acc === undefined || acc.scores.length < this.ids.length) {
      // Room to grow, so that adding documents does not mean a new accumulator every search.
      const capacity = Math.max(64, 2 * this.ids.length);
      acc = { scores: new Float64Array(capacity), touched: new Int32Array(capacity) };
    }
    return acc;
  }

  // The "+1" form of idf (Lucene's), never negative, so a term in most documents still counts a little.
  private idf(df: number): number {
    return Math.log(1 + (this.size - df + 0.5) / (df + 0.5));
  }

  private averageLength(): number {
    return this.totalLength / this.size || 1;
  }

  private saturate(tf: number, length: number, avg: number): number {
    return (tf * (this.k1 + 1)) / (tf + this.k1 * (1 - this.b + (this.b * length) / avg));
  }
}
