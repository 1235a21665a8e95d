// The top-k list the exact dense scan (flat-index.ts) and BM25 (bm25.ts) both keep.

/**
 * The best `k` (score, id) pairs offered, best first: higher score, then lower id. Cheaper than
 * sorting every candidate when, as in a search, k is small next to their number.
 */
export class TopK {
  readonly ids: string[] = [];
  readonly scores: number[] = [];

  constructor(private readonly k: number) {}

  /** Whether the pair would enter the list, so that costlier checks can be skipped for the rest. */
  admits(score: number, id: string): boolean {
    if (this.ids.length < this.k) return true;
    const last = this.k - 1;
    return score > this.scores[last] || (score === this.scores[last] && id < this.ids[last]);
  }

  /** Adds a pair that admits() let in, dropping the worst one if the list was full. */
  add(score: number, id: string): void {
    let lo = 0;
    let hi = this.ids.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (score > this.scores[mid] || (score === this.scores[mid] && id < this.ids[mid])) hi = mid;
      else lo = mid + 1;
    }
    this.ids.splice(lo, 0, id);
    this.scores.splice(lo, 0, score);
    if (this.ids.length > this.k) {
      this.ids.pop();
      this.scores.pop();
    }
  }
}
