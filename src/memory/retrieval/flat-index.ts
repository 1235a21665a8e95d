// Exact cosine search by scanning every vector: the dense index of a small scope. Below a few
// thousand vectors a scan is as fast as a graph search and exact, and it costs no more memory
// than the vectors themselves, whereas every hnswlib index allocates 65,536 mutexes for label
// locking at init (≈2.6 MB and ≈4 ms per index, measured here), which a thousand small per-user
// indexes cannot afford. ScopedHybridIndex moves a scope to HNSW (vector-index.ts) once it grows.

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
  /** Unit vectors, so a similarity is one dot product. */
  private readonly vectors = new Map<string, Float32Array>();

  constructor(readonly dim: number) {
    if (!Number.isInteger(dim) || dim < 1) throw new RangeError(`FlatIndex: dim must be a positive integer, got ${dim}`);
  }

  get size(): number {
    return this.vectors.size;
  }

  has(id: string): boolean {
    return this.vectors.has(id);
  }

  /** Every id and its unit vector, e.g. to build an HNSW index from. */
  entries(): IterableIterator<[string, Float32Array]> {
    return this.vectors.entries();
  }

  add(id: string, vector: Float32Array): void {
    if (vector.length !== this.dim) throw new RangeError(`FlatIndex: vector of ${vector.length} values for an index of dimension ${this.dim}`);
    this.vectors.set(id, unit(vector));
  }

  remove(id: string): boolean {
    return this.vectors.delete(id);
  }

  similarity(id: string, query: Float32Array): number | undefined {
    const v = this.vectors.get(id);
    return v === undefined ? undefined : dot(v, unit(query));
  }

  search(query: Float32Array, k: number, accept?: (id: string) => boolean): DenseHit[] {
    if (query.length !== this.dim) throw new RangeError(`FlatIndex: query of ${query.length} values for an index of dimension ${this.dim}`);
    const q = unit(query);
    const hits: DenseHit[] = [];
    for (const [id, v] of this.vectors) if (accept === undefined || accept(id)) hits.push({ id, similarity: dot(v, q) });
    hits.sort((a, b) => b.similarity - a.similarity || (a.id < b.id ? -1 : 1));
    return hits.slice(0, Math.max(0, k));
  }
}

function dot(a: Float32Array, b: Float32Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
}

/** The vector scaled to length 1 (a zero vector stays zero: it is similar to nothing). */
function unit(v: Float32Array): Float32Array {
  let n = 0;
  for (let i = 0; i < v.length; i++) n += v[i] * v[i];
  if (n === 0) return new Float32Array(v.length);
  const s = 1 / Math.sqrt(n);
  const out = new Float32Array(v.length);
  for (let i = 0; i < v.length; i++) out[i] = v[i] * s;
  return out;
}
