// Exact cosine search by scanning every vector: the dense index of a small scope. Below a few
// thousand vectors a scan is as fast as a graph search and exact, and it costs no more memory
// than the vectors themselves, whereas every hnswlib index allocates 65,536 mutexes for label
// locking at init (≈2.6 MB and ≈4 ms per index, measured here), which a thousand small per-user
// indexes cannot afford. ScopedHybridIndex moves a scope to HNSW (vector-index.ts) once it grows.

import { TopK } from "./top-k.js";

export interface DenseHit {
  id: string;
  /** Cosine similarity to the query, in [-1, 1]. */
  similarity: number;
}

/** What ScopedHybridIndex needs of a dense index; FlatIndex and VectorIndex (HNSW) have it. */
export interface DenseIndex {
  readonly dim: number;
  readonly size: number;
  has(id: string): boolean;
  add(id: string, vector: Float32Array): void;
  remove(id: string): boolean;
  /** Cosine similarity of the query to one stored vector (undefined if the id is not here). */
  similarity(id: string, query: Float32Array): number | undefined;
  search(query: Float32Array, k: number, accept?: (id: string) => boolean): DenseHit[];
}

export class FlatIndex implements DenseIndex {
  /**
   * Unit vectors (a similarity is then one dot product), one after another by slot, so a scan
   * reads one block of memory. Slots 0 to size - 1 are all live: a removal moves the last vector
   * into the hole.
   */
  private data: Float32Array;
  /** By slot. */
  private readonly ids: string[] = [];
  /** In the order the ids were added (a replacement keeps its place), which entries() keeps. */
  private readonly slotOf = new Map<string, number>();

  constructor(readonly dim: number) {
    if (!Number.isInteger(dim) || dim < 1) throw new RangeError(`FlatIndex: dim must be a positive integer, got ${dim}`);
    this.data = new Float32Array(dim);
  }

  get size(): number {
    return this.ids.length;
  }

  has(id: string): boolean {
    return this.slotOf.has(id);
  }

  /**
   * Every id and (a copy of) its unit vector, e.g. to build an HNSW index from, in the order the
   * ids were first added: a graph depends on the order it is built in.
   */
  *entries(): IterableIterator<[string, Float32Array]> {
    for (const [id, slot] of this.slotOf) yield [id, this.data.slice(slot * this.dim, (slot + 1) * this.dim)];
  }

  /** Adds a vector, replacing the one with the same id. The vector need not be normalised. */
  add(id: string, vector: Float32Array): void {
    if (vector.length !== this.dim) throw new RangeError(`FlatIndex: vector of ${vector.length} values for an index of dimension ${this.dim}`);
    let slot = this.slotOf.get(id);
    if (slot === undefined) {
      slot = this.ids.length;
      if ((slot + 1) * this.dim > this.data.length) {
        // Grown by half, not doubled: thousands of small scopes can be loaded, and the slack adds up.
        const grown = new Float32Array(Math.ceil(slot * 1.5 + 1) * this.dim);
        grown.set(this.data);
        this.data = grown;
      }
      this.ids.push(id);
      this.slotOf.set(id, slot);
    }
    unitInto(vector, this.data, slot * this.dim);
  }

  remove(id: string): boolean {
    const slot = this.slotOf.get(id);
    if (slot === undefined) return false;
    const last = this.ids.length - 1;
    if (slot !== last) {
      this.data.copyWithin(slot * this.dim, last * this.dim, (last + 1) * this.dim);
      this.ids[slot] = this.ids[last];
      this.slotOf.set(this.ids[slot], slot);
    }
    this.ids.pop();
    this.slotOf.delete(id);
    return true;
  }

  similarity(id: string, query: Float32Array): number | undefined {
    return this.similarities([id], query)[0];
  }

  /** similarity() of several ids at once, normalising the query once (undefined for an id not here). */
  similarities(ids: readonly string[], query: Float32Array): (number | undefined)[] {
    if (query.length !== this.dim) throw new RangeError(`FlatIndex: query of ${query.length} values for an index of dimension ${this.dim}`);
    const q = unitQuery(query);
    return ids.map((id) => {
      const slot = this.slotOf.get(id);
      return slot === undefined ? undefined : dot(this.data, slot * this.dim, q);
    });
  }

  /** The `k` most similar vectors, most similar first (ties: lower id first), among those `accept` lets through. */
  search(query: Float32Array, k: number, accept?: (id: string) => boolean): DenseHit[] {
    if (query.length !== this.dim) throw new RangeError(`FlatIndex: query of ${query.length} values for an index of dimension ${this.dim}`);
    const n = Math.min(Math.trunc(k), this.size);
    if (!(n > 0)) return [];
    const q = unitQuery(query);
    const top = new TopK(n);
    const offer = (slot: number, similarity: number) => {
      const id = this.ids[slot];
      // The filter runs only on vectors that would make the list: it may be a database read.
      if (top.admits(similarity, id) && (accept === undefined || accept(id))) top.add(similarity, id);
    };
    // Four vectors per pass: each dot product is one chain of dependent additions, and four
    // independent chains keep the CPU busy while each waits on its last addition. Each sum still
    // adds its terms in order, so the results are bit for bit those of one vector at a time.
    const { data, dim } = this;
    let slot = 0;
    for (; slot + 4 <= this.size; slot += 4) {
      const a = slot * dim;
      const b = a + dim;
      const c = b + dim;
      const d = c + dim;
      let sa = 0;
      let sb = 0;
      let sc = 0;
      let sd = 0;
      for (let i = 0; i < dim; i++) {
        const qi = q[i];
        sa += data[a + i] * qi;
        sb += data[b + i] * qi;
        sc += data[c + i] * qi;
        sd += data[d + i] * qi;
      }
      offer(slot, sa);
      offer(slot + 1, sb);
      offer(slot + 2, sc);
      offer(slot + 3, sd);
    }
    for (; slot < this.size; slot++) offer(slot, dot(data, slot * dim, q));
    return top.ids.map((id, i) => ({ id, similarity: top.scores[i] }));
  }
}

/** Dot product of the stored vector at `offset` with the query, summed in order in float64. */
function dot(data: Float32Array, offset: number, q: Float64Array): number {
  let s = 0;
  for (let i = 0; i < q.length; i++) s += data[offset + i] * q[i];
  return s;
}

/** The vector scaled to length 1, written into `out` from `offset` (a zero vector stays zero: it is similar to nothing). */
function unitInto(v: Float32Array, out: Float32Array, offset: number): void {
  let n = 0;
  for (let i = 0; i < v.length; i++) n += v[i] * v[i];
  const s = n === 0 ? 0 : 1 / Math.sqrt(n);
  for (let i = 0; i < v.length; i++) out[offset + i] = v[i] * s;
}

/**
 * The query scaled to length 1 and rounded to float32 like the stored vectors (so a vector is as
 * similar to itself as its copies are), held in float64 to save a conversion per multiply.
 */
function unitQuery(query: Float32Array): Float64Array {
  const q = new Float32Array(query.length);
  unitInto(query, q, 0);
  return Float64Array.from(q);
}
