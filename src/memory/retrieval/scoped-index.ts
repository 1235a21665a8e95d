// Hybrid retrieval (dense HNSW + BM25, fused, with recency) kept per scope: a scope is a user for
// the memory store, a collection for a knowledge base. Isolation is structural: every scope has
// its own indexes, so a search cannot even see another scope's documents, and a filter (session,
// metadata) runs inside each index's search instead of after it, so it cannot starve the results.
//
// The owner (a store) is the truth; the index is derived from it and kept in step:
//   - the owner keeps a generation per scope, bumped by every write that changes its documents,
//     and tells this class about each write (put/remove) with the generation it produced;
//   - saved index files carry the generation they reflect and a checksum, both recorded by the
//     owner (indexSaved), so on open a missing, damaged or older file is detected and the scope
//     is rebuilt from the owner's documents. Every rebuild is reported (onRebuild and rebuilds),
//     never silent;
//   - BM25 lives in memory only, rebuilt from the texts when a scope is opened: tokenising is
//     cheap next to embedding, and the stored vectors make the dense side cheap to rebuild too.
// Index files are written some time after a write (flushDelayMs) and at close(), not on every
// write: a crash in between leaves an older generation on disk, which the next open rebuilds.
//
// Several processes (or several owners in one process) may share one store. Each keeps its own
// loaded scopes, so a loaded scope is only used while the owner's generation still matches it:
// every open and search reads the generation (one cheap read) and reloads a scope another writer
// moved on or erased. A write is applied to the loaded scope only if it was at the generation
// just before that write (`previous`), else the scope is dropped and reloaded on its next use. A
// save is recorded by the owner only if the scope is still at the saved generation; files a
// record replaced, or that were not recorded, are deleted.
//
// A small scope (fewer than hnswFrom documents, default 1000) is searched exactly by a scan
// (flat-index.ts says why: hnswlib's per-index overhead) and has no index files: it is loaded
// from the owner's documents, which is what a rebuild would do anyway. A scope that reaches
// hnswFrom moves to HNSW for good and from then on is saved, checked and rebuilt as above.
//
// Everything here is synchronous, so within one scope a write and a load can never interleave:
// the owner embeds (asynchronously) first, then opens the scope, commits and applies in one go.
import { createHash } from "node:crypto";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { terms as defaultTerms } from "../text-terms.js";
import { Bm25Index, type Bm25Options } from "./bm25.js";
import { DEFAULT_FUSION, fuse, fusionWeights, recency, type Fusion, type Signals } from "./fusion.js";
import { FlatIndex, type DenseIndex } from "./flat-index.js";
import { IndexFileError, VectorIndex, type VectorIndexOptions } from "./vector-index.js";

export interface IndexedDocument {
  id: string;
  text: string;
  /** Time the recency signal measures from (ms since the epoch). */
  at: number;
  vector: Float32Array;
}

/** What the index files of a scope reflect, as recorded by the owner. */
export interface SavedIndex {
  generation: number;
  checksum: string;
}

/** What ScopedHybridIndex needs from the store that owns the documents. */
export interface ScopeSource {
  /** The scope's current generation (0 for a scope never written). */
  generation(scope: string): number;
  savedIndex(scope: string): SavedIndex | undefined;
  /**
   * Records what the scopes' files now hold (called after they are written; one call per flush),
   * for each scope still at the saved generation, and says per scope what is recorded now.
   */
  indexesSaved(saved: ReadonlyMap<string, SavedIndex>): ReadonlyMap<string, SaveOutcome>;
  /** Every live document of the scope, for a rebuild. */
  documents(scope: string): Iterable<IndexedDocument>;
  /**
   * One document's vector, if the owner can read it cheaply. Used for the dense signal of a
   * candidate only BM25 found: reading a point back out of hnswlib copies it into a JS array,
   * which costs more than the whole graph search.
   */
  vector?(scope: string, id: string): Float32Array | undefined;
}

/** What the owner made of one saved scope: recorded or not, and the record it holds now and held before. */
export interface SaveOutcome {
  recorded: boolean;
  /** The owner's record before this save (undefined: none). */
  before: SavedIndex | undefined;
}

export interface RebuildReport {
  scope: string;
  reason: "missing" | "stale" | "corrupt";
  detail: string;
  documents: number;
  ms: number;
}

export interface ScopedHybridIndexOptions {
  /** Folder of the index files (created if missing). */
  dir: string;
  dim: number;
  source: ScopeSource;
  /** Tokeniser for BM25 (default: text-terms.ts's terms, CJK-aware). */
  terms?: (text: string) => string[];
  bm25?: Bm25Options;
  hnsw?: VectorIndexOptions;
  /** Size at which a scope moves from an exact scan to HNSW (default 1000; 0: HNSW always). */
  hnswFrom?: number;
  /**
   * Scopes kept loaded in memory (default 4096), the least recently used unloaded beyond that
   * (saved first if changed): a small scope reloads from the owner, a large one from its files.
   */
  maxLoadedScopes?: number;
  /** Delay between a write and the saving of the index files (default 1000 ms). */
  flushDelayMs?: number;
  onRebuild?: (report: RebuildReport) => void;
}

export interface HybridQuery {
  terms: string[];
  vector: Float32Array;
}

export interface HybridSearchOptions {
  limit: number;
  /** Candidates taken from each index before fusion (default max(4 × limit, 40)). */
  depth?: number;
  /** Which documents may be returned; runs inside each index's search. */
  accept?: (id: string) => boolean;
  fusion?: Fusion;
  /** For the recency signal (default Date.now()). */
  now?: number;
  /** Recency half-life (default 30 days). */
  halfLifeMs?: number;
  /** Results with a fused score below this are left out (default 0). */
  minScore?: number;
}

export interface HybridHit {
  id: string;
  score: number;
  signals: Signals;
}

interface Scope {
  vectors: DenseIndex;
  bm25: Bm25Index;
  at: Map<string, number>;
  generation: number;
  dirty: boolean;
}

const DAY_MS = 86_400_000;

export class ScopedHybridIndex {
  private readonly scopes = new Map<string, Scope>();
  private readonly terms: (text: string) => string[];
  private timer: NodeJS.Timeout | null = null;
  private closed = false;
  /** Every rebuild since this object was made, oldest first. */
  readonly rebuilds: RebuildReport[] = [];
  /** Why the last background save of index files failed, until one succeeds. */
  lastSaveError: string | undefined;

  constructor(private readonly options: ScopedHybridIndexOptions) {
    mkdirSync(options.dir, { recursive: true });
    this.terms = options.terms ?? defaultTerms;
  }

  /** Loads a scope's indexes (rebuilding them if their files are missing, damaged or stale); cached. */
  open(scope: string): void {
    this.scopeOf(scope);
  }

  /**
   * Adds or replaces documents after the owner committed them at `generation`; `previous` is the
   * scope's generation just before that write (unknown: the loaded scope is taken to be it).
   */
  put(scope: string, docs: readonly IndexedDocument[], generation: number, previous?: number): void {
    const s = this.current(scope, previous);
    if (s === undefined) return;
    for (const d of docs) {
      s.vectors.add(d.id, d.vector);
      s.bm25.add(d.id, this.terms(d.text));
      s.at.set(d.id, d.at);
    }
    if (s.vectors instanceof FlatIndex && s.vectors.size >= this.hnswFrom) {
      const hnsw = VectorIndex.create(this.options.dim, this.options.hnsw);
      for (const [id, v] of s.vectors.entries()) hnsw.add(id, v);
      s.vectors = hnsw;
    }
    this.changed(s, generation);
  }

  /** Removes documents after the owner committed their removal at `generation` (`previous` as for put). */
  remove(scope: string, ids: readonly string[], generation: number, previous?: number): void {
    const s = this.current(scope, previous);
    if (s === undefined) return;
    for (const id of ids) {
      s.vectors.remove(id);
      s.bm25.remove(id);
      s.at.delete(id);
    }
    this.changed(s, generation);
  }

  /** Forgets a scope's in-memory indexes (its files stay); the next use loads it again. */
  forget(scope: string): void {
    this.scopes.delete(scope);
  }

  /** Forgets a scope and deletes its files (the owner erases its record of them). */
  drop(scope: string): void {
    this.scopes.delete(scope);
    VectorIndex.removeAll(this.base(scope));
  }

  search(scope: string, query: HybridQuery, options: HybridSearchOptions): HybridHit[] {
    const s = this.scopeOf(scope);
    const fusion = options.fusion ?? DEFAULT_FUSION;
    const w = fusionWeights(fusion);
    const depth = options.depth ?? Math.max(4 * options.limit, 40);
    const dense = new Map<string, number>();
    if (w.dense > 0) for (const h of s.vectors.search(query.vector, depth, options.accept)) dense.set(h.id, h.similarity);
    const ids = new Set(dense.keys());
    if (w.bm25 > 0) for (const h of s.bm25.search(query.terms, depth, options.accept)) ids.add(h.id);
    if (ids.size === 0) return [];
    const now = options.now ?? Date.now();
    const halfLife = options.halfLifeMs ?? 30 * DAY_MS;
    // Every candidate gets all three signals, found by its index or not, so the fused order does
    // not depend on which list happened to surface it.
    const list = [...ids];
    const raw = s.bm25.scores(query.terms, list);
    const top = Math.max(...raw);
    // Those the dense search did not return get their similarity here, all in one call.
    const unseen = list.filter((id) => !dense.has(id));
    const similarities = this.similarities(scope, s, unseen, query.vector);
    for (let i = 0; i < unseen.length; i++) dense.set(unseen[i], similarities[i]);
    const signals: Signals[] = list.map((id, i) => ({
      dense: Math.max(0, dense.get(id)!),
      bm25: top > 0 ? raw[i] / top : 0,
      recency: recency(s.at.get(id) ?? 0, now, halfLife),
    }));
    const scores = fuse(signals, fusion);
    const minScore = options.minScore ?? 0;
    return list
      .map((id, i) => ({ id, score: scores[i], signals: signals[i] }))
      .filter((h) => h.score >= minScore && h.score > 0)
      .sort((a, b) => b.score - a.score || (a.id < b.id ? -1 : 1))
      .slice(0, options.limit);
  }

  /** Writes the files of every scope changed since its last save, and records them with the owner. */
  flush(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    const saved = new Map<string, SavedIndex>();
    try {
      for (const [scope, s] of this.scopes) {
        if (!s.dirty || !(s.vectors instanceof VectorIndex)) continue;
        // Moved on by another writer (or erased): this scope is stale and reloads on its next use.
        if (this.options.source.generation(scope) === s.generation) saved.set(scope, { generation: s.generation, checksum: s.vectors.save(this.base(scope)) });
        s.dirty = false;
      }
    } finally {
      // What was written is recorded even if a later save failed (a full disk): the others stay
      // dirty and are tried again, and until then their older files read as stale, not as current.
      if (saved.size > 0) this.recordSaved(saved);
    }
  }

  /** Has the owner record the saved files, then deletes the files no record names any more. */
  private recordSaved(saved: ReadonlyMap<string, SavedIndex>): void {
    const outcomes = this.options.source.indexesSaved(saved);
    for (const [scope, ours] of saved) {
      const outcome = outcomes.get(scope);
      if (outcome === undefined) continue;
      // Not recorded: another writer moved the scope on or erased it meanwhile. Recorded: the
      // record's previous files are no one's now. (Same checksum, same files: kept.)
      const unused = outcome.recorded ? outcome.before?.checksum : ours.checksum;
      const now = outcome.recorded ? ours.checksum : outcome.before?.checksum;
      if (unused !== undefined && unused !== now && /^[0-9a-f]{64}$/.test(unused)) VectorIndex.remove(this.base(scope), unused);
      // Files an older version saved without the checksum in their names are no one's either.
      if (outcome.recorded) VectorIndex.remove(this.base(scope));
    }
  }

  /** Saves what is unsaved and stops the flush timer. */
  close(): void {
    if (this.closed) return;
    this.flush();
    this.closed = true;
    this.scopes.clear();
  }

  /** Counts for stats: scopes loaded and documents in them. */
  loaded(): { scopes: number; documents: number } {
    let documents = 0;
    for (const s of this.scopes.values()) documents += s.vectors.size;
    return { scopes: this.scopes.size, documents };
  }

  /** The dense signal of candidates the dense search did not return (0 for one it does not hold). */
  private similarities(scope: string, s: Scope, ids: readonly string[], query: Float32Array): number[] {
    const { vectors } = s;
    if (vectors instanceof FlatIndex) return vectors.similarities(ids, query).map((x) => x ?? 0);
    const read = vectors instanceof VectorIndex ? this.options.source.vector : undefined;
    const qq = squaredNorm(query);
    return ids.map((id) => {
      const v = read?.(scope, id);
      return (v === undefined ? vectors.similarity(id, query) : cosine(v, query, qq)) ?? 0;
    });
  }

  private get hnswFrom(): number {
    return this.options.hnswFrom ?? 1000;
  }

  private changed(s: Scope, generation: number): void {
    s.generation = generation;
    if (!(s.vectors instanceof VectorIndex)) return; // nothing on disk to keep in step
    s.dirty = true;
    if (this.timer === null && !this.closed) {
      this.timer = setTimeout(() => {
        try {
          this.flush();
          this.lastSaveError = undefined;
        } catch (e) {
          // A timer has no caller to throw to: kept for stats, retried after the next write and at close().
          this.lastSaveError = e instanceof Error ? e.message : String(e);
        }
      }, this.options.flushDelayMs ?? 1000);
      this.timer.unref();
    }
  }

  /**
   * The loaded scope a write at `previous` applies to, or undefined when there is nothing to apply
   * it to: not loaded (its next load reads the write from the owner), or loaded at another
   * generation, which means another writer came in between, so it is dropped to be reloaded.
   */
  private current(scope: string, previous: number | undefined): Scope | undefined {
    if (this.closed) throw new Error("the index is closed");
    const s = this.scopes.get(scope);
    if (s !== undefined && previous !== undefined && s.generation !== previous) {
      this.scopes.delete(scope);
      return undefined;
    }
    return s;
  }

  private scopeOf(scope: string): Scope {
    if (this.closed) throw new Error("the index is closed");
    const cached = this.scopes.get(scope);
    // Another writer (another process, or another owner object here) may have moved the scope on
    // since it was loaded: then it is loaded again, from the files that writer saved or the documents.
    if (cached !== undefined && cached.generation !== this.options.source.generation(scope)) this.scopes.delete(scope);
    else if (cached !== undefined) {
      // Map order is the recency order: the least recently used scope comes first.
      this.scopes.delete(scope);
      this.scopes.set(scope, cached);
      return cached;
    }
    const s = this.load(scope);
    this.scopes.set(scope, s);
    this.unloadBeyondLimit();
    return s;
  }

  private unloadBeyondLimit(): void {
    const max = this.options.maxLoadedScopes ?? 4096;
    if (this.scopes.size <= max) return;
    if ([...this.scopes.values()].some((s) => s.dirty)) this.flush();
    for (const scope of this.scopes.keys()) {
      if (this.scopes.size <= max) break;
      this.scopes.delete(scope);
    }
  }

  private load(scope: string): Scope {
    const { source, dim, hnsw } = this.options;
    const generation = source.generation(scope);
    const bm25 = new Bm25Index(this.options.bm25);
    const at = new Map<string, number>();
    const docs = generation === 0 ? [] : [...source.documents(scope)];
    for (const d of docs) {
      bm25.add(d.id, this.terms(d.text));
      at.set(d.id, d.at);
    }
    const saved = source.savedIndex(scope);
    // A scope that has index files moved to HNSW once and stays there, so its results do not
    // change kind (and float rounding) when deletions shrink it.
    if (saved === undefined && (docs.length < this.hnswFrom || docs.length === 0)) {
      const vectors = this.hnswFrom === 0 ? VectorIndex.create(dim, hnsw) : new FlatIndex(dim);
      for (const d of docs) vectors.add(d.id, d.vector);
      return { vectors, bm25, at, generation, dirty: false };
    }

    let problem: Omit<RebuildReport, "documents" | "ms" | "scope"> | undefined;
    if (saved === undefined) problem = { reason: "missing", detail: "no index was saved for this scope" };
    else if (saved.generation !== generation) problem = { reason: "stale", detail: `the index files hold generation ${saved.generation}, the store is at ${generation}` };
    else {
      try {
        const vectors = VectorIndex.load(this.base(scope), dim, saved.checksum, hnsw);
        // The checksum matched, but files copied in from elsewhere could still disagree with the store.
        if (vectors.size === docs.length && docs.every((d) => vectors.has(d.id))) return { vectors, bm25, at, generation, dirty: false };
        problem = { reason: "stale", detail: `the index files hold ${vectors.size} points that are not the store's ${docs.length} documents` };
      } catch (e) {
        if (!(e instanceof IndexFileError)) throw e;
        problem = { reason: e.reason, detail: e.message };
      }
    }
    const t0 = performance.now();
    const vectors = VectorIndex.create(dim, hnsw);
    for (const d of docs) vectors.add(d.id, d.vector);
    const s: Scope = { vectors, bm25, at, generation, dirty: false };
    const report: RebuildReport = { scope, ...problem, documents: docs.length, ms: performance.now() - t0 };
    this.rebuilds.push(report);
    this.options.onRebuild?.(report);
    // Saved soon, so the next open does not rebuild again.
    this.changed(s, generation);
    return s;
  }

  private base(scope: string): string {
    return scopeFileBase(this.options.dir, scope);
  }
}

/** Cosine of a and b, given b's squaredNorm (a query's, computed once for all candidates). */
function cosine(a: Float32Array, b: Float32Array, bb: number): number {
  let dot = 0;
  let aa = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i];
    aa += a[i] * a[i];
  }
  return aa === 0 || bb === 0 ? 0 : dot / Math.sqrt(aa * bb);
}

function squaredNorm(v: Float32Array): number {
  let s = 0;
  for (let i = 0; i < v.length; i++) s += v[i] * v[i];
  return s;
}

/** Where a scope's index files live: `<base>.hnsw` and `<base>.ids.json`, named by a hash so any scope name is a safe file name. */
export function scopeFileBase(dir: string, scope: string): string {
  return join(dir, createHash("sha256").update(scope, "utf8").digest("hex").slice(0, 32));
}
