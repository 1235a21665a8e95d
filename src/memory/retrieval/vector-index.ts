// One cosine HNSW index (hnswlib-node) over string ids, for one scope (a user, a collection).
// hnswlib works with integer labels; this class hands them out and keeps the label ↔ id map.
//
// On disk an index is two files written beside each other: `<base>-<c>.hnsw` (hnswlib's own
// format) and `<base>-<c>.ids.json` (the label map), where <c> starts their checksum. Each is
// written to a temporary name of its own and renamed, and save() returns the checksum of both. The
// owner keeps that checksum in its store and passes it to load(), which refuses files that do not
// match before hnswlib reads them: hnswlib trusts its input, and a damaged file could make it read
// out of bounds instead of failing. Naming the files by their content makes a saved pair
// immutable: two processes saving the same scope at once write different names (or the same
// bytes), so neither can leave the other's .hnsw beside its own .ids.json.
import { createHash, randomBytes } from "node:crypto";
import { readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import hnswlib from "hnswlib-node";
import type { DenseHit, DenseIndex } from "./flat-index.js";

const { HierarchicalNSW } = hnswlib;
type Hnsw = InstanceType<typeof HierarchicalNSW>;

export interface VectorIndexOptions {
  /** Links per node (hnswlib's M, default 16). */
  m?: number;
  /** Candidate list size while building (default 100). */
  efConstruction?: number;
  /** Least candidate list size while searching (default 64); a search for more results uses more. */
  ef?: number;
}

export type VectorHit = DenseHit;

/** An index file that is missing, damaged or not the one the owner saved last. */
export class IndexFileError extends Error {
  constructor(
    readonly reason: "missing" | "corrupt",
    message: string,
  ) {
    super(message);
    this.name = "IndexFileError";
  }
}

const INITIAL_CAPACITY = 64;
const IDS_FORMAT = "dki-vector-index-ids/v1";

interface IdsFile {
  format: string;
  dim: number;
  /** [label, id] of every live point */
  labels: [number, string][];
  nextLabel: number;
  /** Slots of deleted points that hnswlib can reuse */
  deleted: number;
}

export class VectorIndex implements DenseIndex {
  private readonly labelOf = new Map<string, number>();
  private readonly idOf = new Map<number, string>();
  private nextLabel = 0;
  private deletedSlots = 0;

  private constructor(
    readonly dim: number,
    private readonly hnsw: Hnsw,
    private readonly ef: number,
  ) {}

  static create(dim: number, options: VectorIndexOptions = {}): VectorIndex {
    if (!Number.isInteger(dim) || dim < 1) throw new RangeError(`VectorIndex: dim must be a positive integer, got ${dim}`);
    const hnsw = new HierarchicalNSW("cosine", dim);
    hnsw.initIndex({ maxElements: INITIAL_CAPACITY, m: options.m ?? 16, efConstruction: options.efConstruction ?? 100, allowReplaceDeleted: true });
    return new VectorIndex(dim, hnsw, options.ef ?? 64);
  }

  /**
   * Reads an index saved by save(), after checking both files against `checksum` (what save()
   * returned). Throws IndexFileError when a file is missing, damaged or does not match.
   */
  static load(base: string, dim: number, checksum: string, options: VectorIndexOptions = {}): VectorIndex {
    if (!/^[0-9a-f]{64}$/.test(checksum)) throw new IndexFileError("corrupt", `the checksum recorded for index ${base} is not a SHA-256 hex digest`);
    const { hnswPath, idsPath } = paths(base, checksum);
    let hnswBytes: Buffer;
    let idsBytes: Buffer;
    try {
      hnswBytes = readFileSync(hnswPath);
      idsBytes = readFileSync(idsPath);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") throw new IndexFileError("missing", `index file ${(e as NodeJS.ErrnoException).path} is missing`);
      throw e;
    }
    const actual = checksumOf(hnswBytes, idsBytes);
    if (actual !== checksum) throw new IndexFileError("corrupt", `index files ${hnswPath} and ${idsPath} do not match the checksum the store recorded (damaged, or left by an interrupted save)`);
    let ids: IdsFile;
    try {
      ids = JSON.parse(idsBytes.toString("utf8")) as IdsFile;
    } catch (e) {
      throw new IndexFileError("corrupt", `${idsPath}: not JSON (${(e as Error).message})`);
    }
    if (ids.format !== IDS_FORMAT || ids.dim !== dim) throw new IndexFileError("corrupt", `${idsPath}: format ${ids.format}, dimension ${ids.dim}; expected ${IDS_FORMAT}, ${dim}`);
    const hnsw = new HierarchicalNSW("cosine", dim);
    try {
      hnsw.readIndexSync(hnswPath, true);
    } catch (e) {
      throw new IndexFileError("corrupt", `${hnswPath}: ${(e as Error).message}`);
    }
    const index = new VectorIndex(dim, hnsw, options.ef ?? 64);
    for (const [label, id] of ids.labels) {
      index.labelOf.set(id, label);
      index.idOf.set(label, id);
    }
    index.nextLabel = ids.nextLabel;
    index.deletedSlots = ids.deleted;
    return index;
  }

  get size(): number {
    return this.labelOf.size;
  }

  has(id: string): boolean {
    return this.labelOf.has(id);
  }

  /** Adds a point, replacing the one with the same id. The vector need not be normalised. */
  add(id: string, vector: Float32Array): void {
    if (vector.length !== this.dim) throw new RangeError(`VectorIndex: vector of ${vector.length} values for an index of dimension ${this.dim}`);
    this.remove(id);
    const reuse = this.deletedSlots > 0;
    if (!reuse && this.hnsw.getCurrentCount() >= this.hnsw.getMaxElements()) this.hnsw.resizeIndex(this.hnsw.getMaxElements() * 2);
    const label = this.nextLabel++;
    this.hnsw.addPoint(Array.from(vector), label, reuse);
    if (reuse) this.deletedSlots--;
    this.labelOf.set(id, label);
    this.idOf.set(label, id);
  }

  remove(id: string): boolean {
    const label = this.labelOf.get(id);
    if (label === undefined) return false;
    this.hnsw.markDelete(label);
    this.deletedSlots++;
    this.labelOf.delete(id);
    this.idOf.delete(label);
    return true;
  }

  /** Cosine similarity of the query to one stored point (undefined if the id is not here). */
  similarity(id: string, query: Float32Array): number | undefined {
    const label = this.labelOf.get(id);
    if (label === undefined) return undefined;
    // hnswlib's cosine space stores points normalised, so only the query's norm is needed.
    const p = this.hnsw.getPoint(label);
    let dot = 0;
    let qq = 0;
    for (let i = 0; i < p.length; i++) {
      dot += p[i] * query[i];
      qq += query[i] * query[i];
    }
    return qq === 0 ? 0 : dot / Math.sqrt(qq);
  }

  /**
   * The `k` nearest points by cosine, nearest first, among those `accept` lets through. The filter
   * runs inside the graph search, so a selective filter still fills the result when it can.
   */
  search(query: Float32Array, k: number, accept?: (id: string) => boolean): VectorHit[] {
    if (query.length !== this.dim) throw new RangeError(`VectorIndex: query of ${query.length} values for an index of dimension ${this.dim}`);
    const n = Math.min(k, this.size);
    if (n <= 0) return [];
    this.hnsw.setEf(Math.max(this.ef, n));
    const filter = accept === undefined ? undefined : (label: number) => accept(this.idOf.get(label)!);
    const { distances, neighbors } = this.hnsw.searchKnn(Array.from(query), n, filter);
    return neighbors.map((label, i) => ({ id: this.idOf.get(label)!, similarity: 1 - distances[i] }));
  }

  /** Writes both files atomically (a temporary name of this call's own, then rename) and returns their checksum. */
  save(base: string): string {
    const ids: IdsFile = { format: IDS_FORMAT, dim: this.dim, labels: [...this.idOf], nextLabel: this.nextLabel, deleted: this.deletedSlots };
    const idsBytes = Buffer.from(JSON.stringify(ids));
    const tmp = `${base}.${process.pid}-${randomBytes(6).toString("hex")}.tmp`;
    try {
      this.hnsw.writeIndexSync(tmp);
      const hnswBytes = readFileSync(tmp);
      const checksum = checksumOf(hnswBytes, idsBytes);
      const { hnswPath, idsPath } = paths(base, checksum);
      // The label map first: a pair is only loaded by its .hnsw's checksum, which covers both.
      writeFileSync(`${tmp}.ids`, idsBytes);
      renameSync(`${tmp}.ids`, idsPath);
      renameSync(tmp, hnswPath);
      return checksum;
    } finally {
      rmSync(tmp, { force: true });
      rmSync(`${tmp}.ids`, { force: true });
    }
  }

  /**
   * Deletes the files of the index saved at `base` with `checksum` (missing files are fine);
   * without a checksum, those of the layout before file names carried it (`<base>.hnsw`).
   */
  static remove(base: string, checksum?: string): void {
    const { hnswPath, idsPath } = checksum === undefined ? { hnswPath: `${base}.hnsw`, idsPath: `${base}.ids.json` } : paths(base, checksum);
    rmSync(hnswPath, { force: true });
    rmSync(idsPath, { force: true });
  }

  /** Deletes every index file saved at `base`, whatever its checksum, and any left by an interrupted save. */
  static removeAll(base: string): void {
    const dir = dirname(base);
    const name = basename(base);
    let entries: string[];
    try {
      entries = readdirSync(dir);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return;
      throw e;
    }
    for (const e of entries) if (e.startsWith(`${name}-`) || e.startsWith(`${name}.`)) rmSync(join(dir, e), { force: true });
  }
}

function paths(base: string, checksum: string): { hnswPath: string; idsPath: string } {
  const name = `${base}-${checksum.slice(0, 16)}`;
  return { hnswPath: `${name}.hnsw`, idsPath: `${name}.ids.json` };
}

function checksumOf(hnswBytes: Buffer, idsBytes: Buffer): string {
  return createHash("sha256").update(createHash("sha256").update(hnswBytes).digest()).update(createHash("sha256").update(idsBytes).digest()).digest("hex");
}
