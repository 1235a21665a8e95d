// A semantic answer cache (seed 001): a query whose embedding is close enough (cosine ≥ threshold)
// to an earlier one's, in the same scope and within the time to live, gets that earlier answer
// without retrieval or generation. The scope is the caller's (RAGSystem: the user and every option
// that shapes the answer), so two users or two settings never share an answer. Bounded: expired
// entries go first, then the oldest, past maxEntries. In memory, for the process's life.
import { DkiArgumentError } from "../../errors.js";
import { cosine } from "../../memory/embedders/common.js";

export interface AnswerCacheOptions {
  /** Milliseconds an answer stays usable. Default 600000 (10 minutes). */
  ttlMs: number;
  /** Cosine similarity of the queries' vectors a hit needs, in (0, 1]. Default 0.95. */
  threshold: number;
  /** Entries kept at most. Default 1000. */
  maxEntries: number;
  /** The clock (milliseconds); tests move it instead of waiting. Default Date.now. */
  now?: () => number;
}

export const DEFAULT_ANSWER_CACHE: Readonly<Omit<AnswerCacheOptions, "now">> = Object.freeze({ ttlMs: 600_000, threshold: 0.95, maxEntries: 1000 });

export interface CacheHit<V> {
  value: V;
  /** The cached query and how close the new one is to it. */
  query: string;
  similarity: number;
  ageMs: number;
}

interface Entry<V> {
  scope: string;
  query: string;
  vector: Float32Array;
  value: V;
  at: number;
}

export function resolveAnswerCache(input: Partial<AnswerCacheOptions> | true): AnswerCacheOptions {
  if (input !== true && (input === null || typeof input !== "object")) throw new DkiArgumentError("answerCache must be true or an object { ttlMs?, threshold?, maxEntries? }");
  const c = { ...DEFAULT_ANSWER_CACHE, ...(input === true ? {} : input) };
  if (!(Number.isInteger(c.ttlMs) && c.ttlMs >= 1)) throw new DkiArgumentError(`answerCache.ttlMs must be a positive integer, got ${String(c.ttlMs)}`);
  if (!(typeof c.threshold === "number" && c.threshold > 0 && c.threshold <= 1)) throw new DkiArgumentError(`answerCache.threshold must be in (0, 1], got ${String(c.threshold)}`);
  if (!(Number.isInteger(c.maxEntries) && c.maxEntries >= 1)) throw new DkiArgumentError(`answerCache.maxEntries must be a positive integer, got ${String(c.maxEntries)}`);
  if (c.now !== undefined && typeof c.now !== "function") throw new DkiArgumentError("answerCache.now must be a function");
  return c;
}

export class SemanticAnswerCache<V> {
  private readonly entries: Entry<V>[] = [];
  private readonly now: () => number;
  hits = 0;
  misses = 0;

  constructor(readonly options: AnswerCacheOptions) {
    this.now = options.now ?? Date.now;
  }

  get size(): number {
    return this.entries.length;
  }

  /** The closest live entry of the scope at or above the threshold, or null. */
  lookup(scope: string, vector: Float32Array): CacheHit<V> | null {
    this.expire();
    let best: { e: Entry<V>; s: number } | null = null;
    for (const e of this.entries) {
      if (e.scope !== scope) continue;
      const s = cosine(vector, e.vector);
      if (s >= this.options.threshold && (best === null || s > best.s)) best = { e, s };
    }
    if (best === null) {
      this.misses++;
      return null;
    }
    this.hits++;
    return { value: best.e.value, query: best.e.query, similarity: best.s, ageMs: this.now() - best.e.at };
  }

  store(scope: string, query: string, vector: Float32Array, value: V): void {
    this.expire();
    this.entries.push({ scope, query, vector, value, at: this.now() });
    while (this.entries.length > this.options.maxEntries) this.entries.shift();
  }

  private expire(): void {
    const cutoff = this.now() - this.options.ttlMs;
    // Entries are in insertion order, so the expired ones are a prefix.
    let n = 0;
    while (n < this.entries.length && this.entries[n]!.at <= cutoff) n++;
    if (n > 0) this.entries.splice(0, n);
  }
}
