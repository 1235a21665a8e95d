// Exactness of the retrieval indexes against brute force, under seeded random workloads of adds,
// replacements and removals (so freed slots get reused): BM25 against Okapi BM25 written out from
// its definition, and the exact-scan dense index against float64 cosine over every vector. A
// failing case prints its seed, which replays it.
import { describe, expect, test } from "vitest";
import { Bm25Index } from "../src/memory/retrieval/bm25.js";
import { FlatIndex, type DenseHit } from "../src/memory/retrieval/flat-index.js";
import { prng } from "./support/prng.js";

const SEEDS = Array.from({ length: 40 }, (_, i) => i + 1);

/** Okapi BM25 computed from scratch for every query: idf ln(1 + (N − df + 0.5)/(df + 0.5)) (Lucene's), k1 1.2, b 0.75. */
class ReferenceBm25 {
  readonly docs = new Map<string, readonly string[]>();

  score(id: string, query: readonly string[]): number {
    const doc = this.docs.get(id);
    if (doc === undefined) return 0;
    const k1 = 1.2;
    const b = 0.75;
    const n = this.docs.size;
    let total = 0;
    for (const d of this.docs.values()) total += d.length;
    const avgdl = total / n || 1;
    let s = 0;
    // Each distinct query term once, in the order the query names them.
    for (const t of new Set(query)) {
      const tf = doc.filter((x) => x === t).length;
      if (tf === 0) continue;
      let df = 0;
      for (const d of this.docs.values()) if (d.includes(t)) df++;
      const idf = Math.log(1 + (n - df + 0.5) / (df + 0.5));
      s += idf * ((tf * (k1 + 1)) / (tf + k1 * (1 - b + (b * doc.length) / avgdl)));
    }
    return s;
  }

  /** Every accepted document sharing a term with the query, best first, ties by id, the first `limit`. */
  search(query: readonly string[], limit: number, accept?: (id: string) => boolean): { id: string; score: number }[] {
    const hits: { id: string; score: number }[] = [];
    for (const [id, doc] of this.docs) {
      if (!query.some((t) => doc.includes(t)) || (accept !== undefined && !accept(id))) continue;
      hits.push({ id, score: this.score(id, query) });
    }
    hits.sort((x, y) => y.score - x.score || (x.id < y.id ? -1 : 1));
    return hits.slice(0, Math.max(0, limit));
  }
}

/** The largest difference between two lists of numbers of the same length. */
function maxDiff(a: readonly number[], b: readonly number[]): number {
  expect(a.length).toBe(b.length);
  return a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);
}

describe("BM25 is Okapi BM25, exactly", () => {
  test.each(SEEDS)("search, score and scores match the definition through adds, replacements, removals and re-adds, with filters and limits (seed %i)", (seed) => {
    const rand = prng(seed);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)];
    // A small, skewed vocabulary and short documents: common terms, repeated terms, empty
    // documents and whole documents alike, so equal scores (ties) are frequent.
    const vocabulary = Array.from({ length: 3 + Math.floor(rand() * 20) }, (_, i) => `w${i}`);
    const term = () => vocabulary[Math.floor(rand() ** 2 * vocabulary.length)];
    const ids = Array.from({ length: 5 + Math.floor(rand() * 60) }, (_, i) => `d${String(i).padStart(2, "0")}`);
    const index = new Bm25Index();
    const reference = new ReferenceBm25();
    for (let step = 0; step < 400; step++) {
      const r = rand();
      if (r < 0.45) {
        const id = pick(ids);
        const doc = Array.from({ length: Math.floor(rand() * 12) }, term);
        index.add(id, doc);
        reference.docs.set(id, doc);
      } else if (r < 0.65) {
        const id = pick(ids);
        expect(index.remove(id)).toBe(reference.docs.delete(id));
      } else {
        // Repeats, and a term no document holds.
        const query = Array.from({ length: 1 + Math.floor(rand() * 5) }, () => (rand() < 0.1 ? "absent" : term()));
        const limit = Math.floor(rand() * 12) - 1;
        const modulus = 2 + Math.floor(rand() * 3);
        const accept = rand() < 0.4 ? (id: string) => Number(id.slice(1)) % modulus !== 0 : undefined;
        const got = index.search(query, limit, accept);
        const want = reference.search(query, limit, accept);
        expect(got.map((h) => h.id)).toEqual(want.map((h) => h.id));
        expect(maxDiff(got.map((h) => h.score), want.map((h) => h.score))).toBeLessThanOrEqual(1e-12);
        const some = ids.filter(() => rand() < 0.5);
        const scores = index.scores(query, some);
        expect(maxDiff(scores, some.map((id) => reference.score(id, query)))).toBeLessThanOrEqual(1e-12);
        expect(some.map((id) => index.score(id, query))).toEqual(scores);
        expect(index.size).toBe(reference.docs.size);
        expect(ids.filter((id) => index.has(id))).toEqual(ids.filter((id) => reference.docs.has(id)));
      }
    }
  });
});

describe("BM25 search from inside a filter", () => {
  test("a search run by `accept` on the same index leaves the outer search's scores alone", () => {
    const index = new Bm25Index();
    const reference = new ReferenceBm25();
    for (let i = 0; i < 30; i++) {
      const doc = [`w${i % 3}`, `w${i % 5}`, `w${i % 7}`];
      index.add(`d${String(i).padStart(2, "0")}`, doc);
      reference.docs.set(`d${String(i).padStart(2, "0")}`, doc);
    }
    const inner: string[][] = [];
    const accept = (id: string) => {
      inner.push(index.search(["w1", "w2"], 3).map((h) => h.id));
      return id !== "d04";
    };
    // Twice: the first search of an index has nothing to share yet.
    for (let round = 0; round < 2; round++) {
      expect(index.search(["w0", "w1", "w4"], 10, accept)).toEqual(reference.search(["w0", "w1", "w4"], 10, accept));
    }
    const innerWant = reference.search(["w1", "w2"], 3).map((h) => h.id);
    expect(inner.length).toBeGreaterThan(0);
    for (const ids of inner) expect(ids).toEqual(innerWant);
  });
});

/** float64 cosine of the vectors as given (0 when either is zero). */
function cosine(a: Float32Array, b: Float32Array): number {
  let dot = 0;
  let aa = 0;
  let bb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return aa === 0 || bb === 0 ? 0 : dot / Math.sqrt(aa * bb);
}

/** Every accepted vector by cosine to the query, most similar first, ties by id, the first `k`. */
function bruteForce(vectors: ReadonlyMap<string, Float32Array>, query: Float32Array, k: number, accept?: (id: string) => boolean): DenseHit[] {
  const hits: DenseHit[] = [];
  for (const [id, v] of vectors) if (accept === undefined || accept(id)) hits.push({ id, similarity: cosine(v, query) });
  hits.sort((x, y) => y.similarity - x.similarity || (x.id < y.id ? -1 : 1));
  return hits.slice(0, Math.max(0, k));
}

/**
 * Drives a FlatIndex and a plain map of the same vectors through random adds, replacements and
 * removals, and hands each random query to `check` with the brute-force answer.
 */
function denseWorkload(
  seed: number,
  vector: (rand: () => number, dim: number) => Float32Array,
  check: (got: DenseHit[], want: DenseHit[], vectors: ReadonlyMap<string, Float32Array>, query: Float32Array) => void,
): void {
  const rand = prng(seed);
  const dim = 1 + Math.floor(rand() * 40);
  const ids = Array.from({ length: 5 + Math.floor(rand() * 80) }, (_, i) => `v${String(i).padStart(2, "0")}`);
  const index = new FlatIndex(dim);
  const vectors = new Map<string, Float32Array>();
  for (let step = 0; step < 300; step++) {
    const r = rand();
    const id = ids[Math.floor(rand() * ids.length)];
    if (r < 0.5) {
      const v = vector(rand, dim);
      index.add(id, v);
      vectors.set(id, v);
    } else if (r < 0.7) {
      expect(index.remove(id)).toBe(vectors.delete(id));
    } else {
      const query = vector(rand, dim);
      const k = Math.floor(rand() * 20) - 1;
      const modulus = 2 + Math.floor(rand() * 3);
      const accept = rand() < 0.4 ? (x: string) => Number(x.slice(1)) % modulus !== 0 : undefined;
      check(index.search(query, k, accept), bruteForce(vectors, query, k, accept), vectors, query);
      expect(ids.filter((x) => index.has(x))).toEqual(ids.filter((x) => vectors.has(x)));
      expect(ids.filter((x) => index.similarity(x, query) === undefined)).toEqual(ids.filter((x) => !vectors.has(x)));
      const held = [...vectors.keys()];
      expect(maxDiff(held.map((x) => index.similarity(x, query)!), held.map((x) => cosine(vectors.get(x)!, query)))).toBeLessThanOrEqual(1e-6);
      expect(index.size).toBe(vectors.size);
    }
  }
}

describe("FlatIndex is exact cosine search", () => {
  // Vectors of 0, 1, 4 or 16 entries of ±2^e: their lengths are powers of two, so normalising
  // them in float32 is exact, every cosine between them is exact in float64, and many are equal.
  // The search must then agree with brute force to the bit, ties broken by id included.
  const lattice = (rand: () => number, dim: number) => {
    const counts = [0, 1, 4, 16].filter((n) => n <= dim);
    const nonZero = counts[Math.floor(rand() * counts.length)];
    const scale = 2 ** (Math.floor(rand() * 20) - 10);
    const used = new Set<number>();
    while (used.size < nonZero) used.add(Math.floor(rand() * dim));
    const v = new Float32Array(dim);
    for (const i of used) v[i] = (rand() < 0.5 ? -1 : 1) * scale;
    return v;
  };

  test.each(SEEDS)("on vectors with exact cosines it returns the brute-force answer to the bit, ties by id (seed %i)", (seed) => {
    denseWorkload(seed, lattice, (got, want) => expect(got).toEqual(want));
  });

  // General vectors: normalised and stored in float32, so each similarity is within float32
  // rounding of the float64 cosine, and two hits may trade places only when they are that close.
  test.each(SEEDS)("on random vectors it ranks as brute force does, up to float32 rounding (seed %i)", (seed) => {
    const general = (rand: () => number, dim: number) => Float32Array.from({ length: dim }, () => rand() * 2 - 1);
    denseWorkload(seed, general, (got, want, vectors, query) => {
      expect(maxDiff(got.map((h) => h.similarity), want.map((h) => h.similarity))).toBeLessThanOrEqual(1e-6);
      // Where the ids differ, the one returned is as similar as the one expected, up to rounding.
      const swapped = got.filter((h, i) => h.id !== want[i].id);
      expect(maxDiff(swapped.map((h) => cosine(vectors.get(h.id)!, query)), swapped.map((h) => want[got.indexOf(h)].similarity))).toBeLessThanOrEqual(1e-6);
      expect(new Set(got.map((h) => h.id)).size).toBe(got.length);
    });
  });

  test("entries() lists every id once with its unit vector, in first-added order (an HNSW graph built from it depends on the order)", () => {
    const index = new FlatIndex(2);
    index.add("b", Float32Array.of(3, 4));
    index.add("a", Float32Array.of(0, 2));
    index.add("c", Float32Array.of(-1, 0));
    index.add("d", Float32Array.of(0, 0.5));
    index.add("b", Float32Array.of(0, -5)); // a replacement keeps its place
    index.remove("a"); // "d" moves into "a"'s storage, but not in the order
    index.add("a", Float32Array.of(8, 0)); // re-added: now last
    expect([...index.entries()].map(([id, v]) => [id, [...v]])).toEqual([
      ["b", [0, -1]],
      ["c", [-1, 0]],
      ["d", [0, 1]],
      ["a", [1, 0]],
    ]);
  });
});
