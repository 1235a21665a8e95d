// The knowledge base: collections of documents, each parsed, chunked and embedded, stored in LMDB
// beside the memory store, searched with the memory layer's retrieval: its ScopedHybridIndex with
// one scope per collection (HNSW + BM25 over CJK-aware terms, fused by RRF), whose files sit in
// `<dir>/index` and are rebuilt from the chunks here when missing, stale or damaged.
//
// Writes are atomic per document: everything that can fail (reading, parsing, chunking, embedding)
// happens before the one LMDB transaction that replaces a document's chunks, so a failed ingestion
// leaves the collection exactly as it was, and a reader never sees half of a re-ingested document.
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readFile, realpath, stat } from "node:fs/promises";
import { resolve } from "node:path";
import { open, type Database, type RootDatabase } from "lmdb";
import { DkiArgumentError } from "../../errors.js";
import { checkLmdbFile } from "../../memory/store-file.js";
import { ScopedHybridIndex, type HybridHit, type HybridQuery, type HybridSearchOptions, type IndexedDocument, type RebuildReport, type SavedIndex, type SaveOutcome } from "../../memory/retrieval/scoped-index.js";
import type { Embedder, Filter, JsonValue, Metadata } from "../../memory/types.js";
import { chunkDocument, resolveChunkOptions, type ChunkOptions, type ChunkTokenizer, type TextChunk } from "./chunk.js";
import { checkFilter, DOCUMENT_FIELDS, matchesFilter } from "./filter.js";
import { docTypeOf, parseDocument, DOC_TYPES, type DocType } from "./parse.js";
import { searchKnowledgeBase, type KbSearchDetail, type KbSearchOptions, type KbSearchResult } from "./search.js";
import { KbTenantView, noCollectionError, ownerAdmits, type CollectionOwner, type KbRetrieveOptions, type KbRetriever } from "./tenancy.js";

export const KB_SCHEMA_VERSION = 2; // 2: [collection, id] array keys (1 had "collection\0id" strings)

export interface KnowledgeBaseOptions {
  /** The knowledge base's folder (LMDB files). */
  dir: string;
  embedder: Embedder;
  /** Counts tokens for chunking: the model's tokenizer, so a 512-token chunk is 512 of the model's tokens. */
  tokenizer: ChunkTokenizer;
  /** Documents larger than this are refused before they are read. Default 32 MiB. */
  maxDocumentBytes?: number;
  /** A document that would make more chunks than this is refused. Default 20 000. */
  maxChunksPerDocument?: number;
  /** Told of every rebuild of a collection's index (it is never silent: also in `indexRebuilds`). */
  onIndexRebuild?: (report: RebuildReport) => void;
  /** Collections with fewer chunks are searched exactly by a scan, larger ones by HNSW (default: the memory layer's, 1000). */
  hnswFrom?: number;
}

/** The fields of a document that filters can name (beside docId, title, docType). */
export interface DocumentMetadata {
  category?: string;
  source?: string;
  chapter?: string | number;
  sessionId?: string;
  /** ms since the epoch, or an ISO-8601 date. Default: the time of ingestion. */
  createdAt?: number | string;
  [custom: string]: JsonValue | undefined;
}

export interface CollectionInfo {
  name: string;
  createdAt: number;
  embedderId: string;
  dim: number;
  documents: number;
  chunks: number;
  /** Custom metadata keys its documents carry (filterable beside the standard fields). */
  customFields: string[];
  /** The chunk settings an ingestion without its own uses (the defaults unless the collection was created with others). */
  chunk: Required<ChunkOptions>;
  /** The tenant it belongs to; absent: shared by every user. */
  owner?: CollectionOwner;
}

/** What a collection is created with; getOrCreateCollection refuses an existing one whose settings differ. */
export interface CollectionSettings {
  /** Chunk settings for its documents (an ingestion's own `chunk` options override them field by field). */
  chunk?: ChunkOptions;
  /** Scope it to one user or a user prefix: only that tenant's scoped reads (forUser, retrieve, RAG turns) see it. */
  owner?: CollectionOwner;
}

/** What deleteWhere removed. */
export interface DeleteResult {
  /** The documents removed, in key order. */
  documents: string[];
  chunks: number;
}

export interface KbDocument {
  collection: string;
  docId: string;
  title?: string;
  docType: DocType;
  /** sha256 of the bytes, the chunk settings and the metadata: equal means re-ingesting changes nothing. */
  contentHash: string;
  /** Filterable fields: docId, title, docType, category, source, chapter, sessionId, createdAt and custom keys. */
  fields: Metadata;
  chunkIds: string[];
  bytes: number;
  chars: number;
  ingestedAt: number;
}

/** A stored chunk: the chunker's TextChunk, and where it belongs. */
export interface KbChunk extends TextChunk {
  id: string;
  collection: string;
  docId: string;
}

export interface IngestOptions {
  collection: string;
  /**
   * Default (ingestFile): the file's absolute path, symbolic links resolved, so the same file is
   * one document whatever the working directory; a moved file is a new document (remove the old).
   */
  docId?: string;
  /** Default: from the file's extension. */
  docType?: DocType;
  /** Default: on re-ingestion, the document's metadata from before (give {} to clear it); else none. */
  metadata?: DocumentMetadata;
  chunk?: ChunkOptions;
  /** Read bytes that are not UTF-8 as U+FFFD (counted in the result) instead of refusing the document. */
  replaceInvalidUtf8?: boolean;
}

export interface IngestResult {
  docId: string;
  status: "added" | "replaced" | "unchanged";
  chunks: number;
  /** Chunks dropped because the document already had one with the same id (same text). */
  duplicatesSkipped: number;
  /** Characters read as U+FFFD because the bytes there were not UTF-8 (replaceInvalidUtf8). */
  invalidUtf8: number;
}

interface CollectionRecord {
  name: string;
  createdAt: number;
  embedderId: string;
  dim: number;
  customFields: string[];
  /** Absent in collections made before collection settings: the defaults. */
  chunk?: Required<ChunkOptions>;
  owner?: CollectionOwner;
}

interface StoredChunk extends KbChunk {
  vector: Uint8Array;
}

/** Per collection: the generation of its chunks (bumped by every write) and what its index files hold. */
interface ScopeRecord {
  generation: number;
  saved?: SavedIndex;
}

const KB_FILE = "kb.lmdb";
const NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
const SEP = "\u0000";
// Keys are [collection, id] arrays, as the memory store's: a collection's records are the range
// [c] .. [c + U+0001] (names hold no control characters). A string key "c\0id" with the range
// "c\0" .. "c\u0001" missed long ids: lmdb's ordered-binary escapes NUL in short strings only.
type ScopedKey = [string, string];
const docKey = (c: string, d: string): ScopedKey => [c, d];
const chunkKey = (c: string, id: string): ScopedKey => [c, id];
const prefixRange = (c: string) => ({ start: [c], end: [`${c}\u0001`] });

export function checkCollectionName(name: unknown): asserts name is string {
  if (typeof name !== "string" || !NAME.test(name)) {
    throw new DkiArgumentError(`collection name ${JSON.stringify(name)} must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit`);
  }
}

function checkDocId(id: unknown): asserts id is string {
  if (typeof id !== "string" || id.trim() === "" || id.length > 512 || id.includes(SEP)) throw new DkiArgumentError(`document id ${JSON.stringify(id)} must be a non-empty string of at most 512 characters`);
}

function isScalar(v: unknown): v is string | number | boolean | null {
  return v === null || typeof v === "string" || (typeof v === "number" && Number.isFinite(v)) || typeof v === "boolean";
}

/** The document's filterable fields from the caller's metadata, each checked. */
function documentFields(docId: string, docType: DocType, title: string | undefined, meta: DocumentMetadata | undefined, now: number): Metadata {
  if (meta !== undefined && (meta === null || typeof meta !== "object" || Array.isArray(meta))) throw new DkiArgumentError("metadata must be a JSON object");
  const fields: Metadata = { docId, docType, createdAt: now };
  if (title !== undefined) fields.title = title;
  for (const [k, v] of Object.entries(meta ?? {})) {
    if (v === undefined) continue;
    if (k === "docId" || k === "docType" || k === "title") throw new DkiArgumentError(`metadata.${k} is set by the knowledge base; use the ${k === "docId" ? "document id" : k === "docType" ? "document type" : "document's own title"} option instead`);
    if (k === "category" || k === "source" || k === "sessionId") {
      if (typeof v !== "string") throw new DkiArgumentError(`metadata.${k} must be a string, got ${JSON.stringify(v)}`);
    } else if (k === "chapter") {
      if (typeof v !== "string" && !(typeof v === "number" && Number.isFinite(v))) throw new DkiArgumentError(`metadata.chapter must be a string or a number, got ${JSON.stringify(v)}`);
    } else if (k === "createdAt") {
      const t = typeof v === "number" ? v : typeof v === "string" ? Date.parse(v) : NaN;
      if (!Number.isFinite(t)) throw new DkiArgumentError(`metadata.createdAt must be ms since the epoch or an ISO-8601 date, got ${JSON.stringify(v)}`);
      fields.createdAt = t;
      continue;
    } else if (!isScalar(v) && !(Array.isArray(v) && v.every(isScalar))) {
      throw new DkiArgumentError(`metadata.${k} must be a string, number, boolean, null or an array of those`);
    }
    fields[k] = v as JsonValue;
  }
  return fields;
}

/** A stored document's fields as the caller's metadata again: less those the knowledge base sets (and createdAt, kept apart). */
function callerMetadata(fields: Metadata): DocumentMetadata {
  const { docId: _id, docType: _type, title: _title, createdAt: _at, ...rest } = fields;
  return rest as DocumentMetadata;
}

const vectorBytes = (v: Float32Array): Uint8Array => new Uint8Array(v.buffer.slice(v.byteOffset, v.byteOffset + v.byteLength));
const vectorOf = (b: Uint8Array): Float32Array => new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));

/** A collection's whole contents, for inspection and tests (search goes through the index). */
export interface CollectionSnapshot {
  chunks: KbChunk[];
  vectors: Float32Array[];
  fields: Map<string, Metadata>;
  documents: Map<string, KbDocument>;
}

/** An owner as given: one of userId or userPrefix, a non-empty string (checked, copied). */
export function checkOwner(owner: unknown): CollectionOwner {
  if (owner === null || typeof owner !== "object" || Array.isArray(owner)) throw new DkiArgumentError('owner must be an object: { userId } or { userPrefix }');
  const o = owner as Record<string, unknown>;
  for (const k of Object.keys(o)) if (k !== "userId" && k !== "userPrefix") throw new DkiArgumentError(`owner.${k} is not a known field (userId, userPrefix)`);
  const given = (["userId", "userPrefix"] as const).filter((k) => o[k] !== undefined);
  if (given.length !== 1) throw new DkiArgumentError("owner must have exactly one of userId and userPrefix");
  const v = o[given[0]];
  if (typeof v !== "string" || v === "" || v.length > 256) throw new DkiArgumentError(`owner.${given[0]} must be a non-empty string of at most 256 characters`);
  return given[0] === "userId" ? { userId: v } : { userPrefix: v };
}

/** getOrCreateCollection on an existing collection set up otherwise (the server answers it with 409). */
export class CollectionSettingsError extends DkiArgumentError {
  constructor(
    message: string,
    /** Each difference, e.g. `chunk.chunkTokens is 512, not 256`. */
    readonly differences: string[],
  ) {
    super(message);
    this.name = "CollectionSettingsError";
  }
}

const ownerLabel = (o: CollectionOwner | undefined): string => (o === undefined ? "shared (no owner)" : o.userId !== undefined ? `user ${JSON.stringify(o.userId)}` : `users starting with ${JSON.stringify(o.userPrefix)}`);

export class KnowledgeBase implements KbRetriever {
  private closed = false;
  private readonly index: ScopedHybridIndex;

  private constructor(
    private readonly root: RootDatabase,
    private readonly collections: Database<CollectionRecord, string>,
    private readonly documents: Database<KbDocument, ScopedKey>,
    private readonly chunks: Database<StoredChunk, ScopedKey>,
    private readonly scopes: Database<ScopeRecord, string>,
    readonly embedder: Embedder,
    readonly tokenizer: ChunkTokenizer,
    private readonly maxDocumentBytes: number,
    private readonly maxChunks: number,
    dir: string,
    onRebuild: ((r: RebuildReport) => void) | undefined,
    hnswFrom: number | undefined,
  ) {
    this.index = new ScopedHybridIndex({
      dir: resolve(dir, "index"),
      dim: embedder.dim,
      onRebuild,
      ...(hnswFrom !== undefined ? { hnswFrom } : {}),
      source: {
        generation: (c) => this.scopes.get(c)?.generation ?? 0,
        savedIndex: (c) => this.scopes.get(c)?.saved,
        indexesSaved: (saved) =>
          this.root.transactionSync(() => {
            const outcomes = new Map<string, SaveOutcome>();
            for (const [c, s] of saved) {
              const rec = this.scopes.get(c);
              const recorded = rec?.generation === s.generation;
              if (recorded) this.scopes.putSync(c, { ...rec, saved: s });
              outcomes.set(c, { recorded, before: rec?.saved });
            }
            return outcomes;
          }),
        documents: (c) => this.indexedDocuments(c),
      },
    });
  }

  /** Every chunk of a collection as the index takes it. */
  private *indexedDocuments(collection: string): Iterable<IndexedDocument> {
    const at = new Map<string, number>();
    for (const { value } of this.documents.getRange(prefixRange(collection))) at.set(value.docId, Number(value.fields.createdAt ?? value.ingestedAt));
    for (const { value } of this.chunks.getRange(prefixRange(collection))) yield { id: value.id, text: value.text, at: at.get(value.docId) ?? 0, vector: vectorOf(value.vector) };
  }

  /** Rebuilds of collection indexes since this knowledge base was opened. */
  get indexRebuilds(): readonly RebuildReport[] {
    return this.index.rebuilds;
  }

  static async open(o: KnowledgeBaseOptions): Promise<KnowledgeBase> {
    if (o === null || typeof o !== "object" || typeof o.dir !== "string" || o.dir === "") throw new DkiArgumentError("KnowledgeBase.open needs { dir, embedder, tokenizer }");
    if (!o.embedder || typeof o.embedder.embed !== "function") throw new DkiArgumentError("KnowledgeBase.open: embedder must be an Embedder");
    if (!o.tokenizer || typeof o.tokenizer.encode !== "function") throw new DkiArgumentError("KnowledgeBase.open: tokenizer must be a Tokenizer");
    const maxBytes = o.maxDocumentBytes ?? 32 * 2 ** 20;
    const maxChunks = o.maxChunksPerDocument ?? 20000;
    if (!Number.isSafeInteger(maxBytes) || maxBytes < 1) throw new DkiArgumentError(`maxDocumentBytes must be a positive integer, got ${maxBytes}`);
    if (!Number.isSafeInteger(maxChunks) || maxChunks < 1) throw new DkiArgumentError(`maxChunksPerDocument must be a positive integer, got ${maxChunks}`);
    await mkdir(o.dir, { recursive: true });
    // LMDB would crash the process on a truncated or damaged file rather than fail: checked first.
    checkLmdbFile(resolve(o.dir, KB_FILE), "knowledge base");
    const root = open({ path: resolve(o.dir, KB_FILE), compression: false });
    const meta = root.openDB<{ version: number }, string>({ name: "meta" });
    const v = meta.get("schema");
    if (v === undefined) await meta.put("schema", { version: KB_SCHEMA_VERSION });
    else if (v.version !== KB_SCHEMA_VERSION) {
      await root.close();
      throw new DkiArgumentError(`${o.dir}: knowledge base schema version ${v.version}, this build reads ${KB_SCHEMA_VERSION}`);
    }
    return new KnowledgeBase(
      root,
      root.openDB<CollectionRecord, string>({ name: "collections" }),
      root.openDB<KbDocument, ScopedKey>({ name: "documents" }),
      root.openDB<StoredChunk, ScopedKey>({ name: "chunks" }),
      root.openDB<ScopeRecord, string>({ name: "scopes" }),
      o.embedder,
      o.tokenizer,
      maxBytes,
      maxChunks,
      o.dir,
      o.onIndexRebuild,
      o.hnswFrom,
    );
  }

  private live(): void {
    if (this.closed) throw new DkiArgumentError("this KnowledgeBase has been closed");
  }

  /** Every collection with its counts. */
  listCollections(): CollectionInfo[] {
    this.live();
    return [...this.collections.getRange()].map(({ value: c }) => this.info(c));
  }

  private info(c: CollectionRecord): CollectionInfo {
    let documents = 0;
    let chunks = 0;
    for (const { value } of this.documents.getRange(prefixRange(c.name))) {
      documents++;
      chunks += value.chunkIds.length;
    }
    return { name: c.name, createdAt: c.createdAt, embedderId: c.embedderId, dim: c.dim, documents, chunks, customFields: c.customFields, chunk: c.chunk ?? resolveChunkOptions(), ...(c.owner !== undefined ? { owner: c.owner } : {}) };
  }

  /**
   * Creates a collection with its settings; an existing one is refused (getOrCreateCollection
   * takes it when its settings are the same).
   */
  async createCollection(name: string, settings: CollectionSettings = {}): Promise<CollectionInfo> {
    const r = await this.getOrCreateCollection(name, settings);
    if (!r.created) throw new DkiArgumentError(`collection ${JSON.stringify(name)} already exists (getOrCreateCollection takes an existing one)`);
    return r.collection;
  }

  /**
   * The collection, created with these settings if it does not exist. An existing one is taken
   * only when its settings are these (chunk settings and owner, the defaults where not given, and
   * the embedder): anything else is refused, naming each difference, so two callers never share a
   * collection believing it is set up differently (or another tenant's).
   */
  async getOrCreateCollection(name: string, settings: CollectionSettings = {}): Promise<{ collection: CollectionInfo; created: boolean }> {
    this.live();
    checkCollectionName(name);
    if (settings === null || typeof settings !== "object") throw new DkiArgumentError("collection settings must be an object: { chunk?, owner? }");
    for (const k of Object.keys(settings)) if (k !== "chunk" && k !== "owner") throw new DkiArgumentError(`collection settings: ${k} is not a known setting (chunk, owner)`);
    const chunk = resolveChunkOptions(settings.chunk);
    const owner = settings.owner === undefined ? undefined : checkOwner(settings.owner);
    const record = this.root.transactionSync(() => {
      const existing = this.collections.get(name);
      if (existing !== undefined) return { rec: existing, created: false };
      const rec: CollectionRecord = { name, createdAt: Date.now(), embedderId: this.embedder.id, dim: this.embedder.dim, customFields: [], chunk, ...(owner !== undefined ? { owner } : {}) };
      this.collections.putSync(name, rec);
      return { rec, created: true };
    });
    if (!record.created) {
      const had = record.rec;
      const diffs: string[] = [];
      const hadChunk = had.chunk ?? resolveChunkOptions();
      for (const k of Object.keys(chunk) as (keyof typeof chunk)[]) if (hadChunk[k] !== chunk[k]) diffs.push(`chunk.${k} is ${JSON.stringify(hadChunk[k])}, not ${JSON.stringify(chunk[k])}`);
      if (ownerLabel(had.owner) !== ownerLabel(owner)) diffs.push(`owner is ${ownerLabel(had.owner)}, not ${ownerLabel(owner)}`);
      if (had.embedderId !== this.embedder.id) diffs.push(`embedder is ${had.embedderId}, not ${this.embedder.id}`);
      if (diffs.length > 0) throw new CollectionSettingsError(`collection ${JSON.stringify(name)} exists with other settings: ${diffs.join("; ")}`, diffs);
    }
    return { collection: this.info(record.rec), created: record.created };
  }

  /** A collection's owner, or undefined for a shared one (an unknown collection is an error). */
  ownerOf(name: string): CollectionOwner | undefined {
    this.live();
    return this.collection(name).owner;
  }

  /**
   * The knowledge base as one user sees it: shared collections and those the user owns (userId
   * null: shared ones only). Every read of a tenant's request goes through one; the methods of the
   * KnowledgeBase itself are its owner's (the library caller, an admin) and see everything.
   */
  forUser(userId: string | null): KbTenantView {
    this.live();
    if (userId !== null && (typeof userId !== "string" || userId === "")) throw new DkiArgumentError("forUser needs a non-empty user id, or null for shared collections only");
    return new KbTenantView(this, userId);
  }

  /** Whether a user (null: none) may read a collection; false for one that does not exist. */
  visibleTo(name: string, userId: string | null): boolean {
    this.live();
    const c = typeof name === "string" ? this.collections.get(name) : undefined;
    return c !== undefined && ownerAdmits(c.owner, userId);
  }

  /** The retriever interface (RAGSystem's): a search of a collection as `userId` sees the knowledge base. */
  async retrieve(query: string, o: KbRetrieveOptions): Promise<KbSearchDetail> {
    return this.forUser(o?.userId ?? null).searchDetailed(query, o);
  }

  /** A collection's record, or an error naming it and the collections that exist. */
  private collection(name: string): CollectionRecord {
    checkCollectionName(name);
    const c = this.collections.get(name);
    if (c === undefined) {
      const names = [...this.collections.getKeys()].map(String);
      throw noCollectionError(name, names);
    }
    return c;
  }

  getCollection(name: string): CollectionInfo {
    this.live();
    return this.info(this.collection(name));
  }

  /** The fields a filter on this collection may name. */
  fieldsOf(collection: string): Set<string> {
    return new Set([...DOCUMENT_FIELDS, ...this.collection(collection).customFields]);
  }

  listDocuments(collection: string): KbDocument[] {
    this.live();
    this.collection(collection);
    return [...this.documents.getRange(prefixRange(collection))].map(({ value }) => value);
  }

  getDocument(collection: string, docId: string): KbDocument | undefined {
    this.live();
    this.collection(collection);
    return this.documents.get(docKey(collection, docId));
  }

  getChunk(collection: string, chunkId: string): KbChunk | undefined {
    this.live();
    const c = this.chunks.get(chunkKey(collection, chunkId));
    if (c === undefined) return undefined;
    const { vector: _v, ...chunk } = c;
    return chunk;
  }

  /** The chunk's document, or undefined (for filters inside the index's search). */
  docOfChunk(collection: string, chunkId: string): string | undefined {
    return this.chunks.get(chunkKey(collection, chunkId))?.docId;
  }

  /** The memory layer's hybrid search over one collection's chunks. */
  hybridSearch(collection: string, query: HybridQuery, options: HybridSearchOptions): HybridHit[] {
    this.live();
    const c = this.collection(collection);
    // Vectors of two embedders are never compared: a query embedded by another one would rank by noise.
    if (c.embedderId !== this.embedder.id) throw new DkiArgumentError(`collection ${JSON.stringify(collection)} holds vectors of embedder ${c.embedderId}; this knowledge base was opened with ${this.embedder.id}: open it with that embedder (CLI: --embedder DIR for an ONNX model)`);
    return this.index.search(collection, query, options);
  }

  /** Whether `dir` holds a knowledge base (open() creates one: a read-only caller checks first). */
  static exists(dir: string): boolean {
    return existsSync(resolve(dir, KB_FILE));
  }

  /** Reads a file and ingests it. The document id defaults to its absolute path (symbolic links resolved). */
  async ingestFile(path: string, o: IngestOptions): Promise<IngestResult> {
    this.live();
    if (typeof path !== "string" || path === "") throw new DkiArgumentError("ingestFile needs a file path");
    const docType = o.docType ?? docTypeOf(path);
    let size: number;
    try {
      const s = await stat(path);
      if (!s.isFile()) throw new DkiArgumentError(`${path} is not a file`);
      size = s.size;
    } catch (e) {
      if (e instanceof DkiArgumentError) throw e;
      throw new DkiArgumentError(`cannot read ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
    }
    this.checkSize(path, size);
    const bytes = new Uint8Array(await readFile(path));
    this.checkSize(path, bytes.length);
    const docId = o.docId ?? (await realpath(path));
    return this.ingestBytes(bytes, { ...o, docId, docType }, path);
  }

  /** Ingests text (or a document's bytes) under a document id. */
  async ingestText(content: string | Uint8Array, o: IngestOptions & { docId: string; docType?: DocType }): Promise<IngestResult> {
    this.live();
    const bytes = typeof content === "string" ? new Uint8Array(Buffer.from(content, "utf8")) : content;
    if (!(bytes instanceof Uint8Array)) throw new DkiArgumentError("ingestText takes a string or a Uint8Array");
    checkDocId(o.docId);
    this.checkSize(o.docId, bytes.length);
    return this.ingestBytes(bytes, { ...o, docType: o.docType ?? "text" }, o.docId);
  }

  private checkSize(name: string, size: number): void {
    if (size > this.maxDocumentBytes) {
      throw new DkiArgumentError(`${name}: ${(size / 2 ** 20).toFixed(1)} MiB is over the ${(this.maxDocumentBytes / 2 ** 20).toFixed(1)} MiB limit of one document (maxDocumentBytes); split it`);
    }
  }

  private async ingestBytes(bytes: Uint8Array, o: IngestOptions & { docId: string; docType: DocType }, name: string): Promise<IngestResult> {
    checkCollectionName(o.collection);
    checkDocId(o.docId);
    if (!DOC_TYPES.includes(o.docType)) throw new DkiArgumentError(`unsupported document type ${JSON.stringify(o.docType)}; supported: ${DOC_TYPES.join(", ")}`);
    const existing = this.collections.get(o.collection);
    // The collection's chunk settings, each overridden by the ingestion's own where it gives one.
    const chunkOpts = resolveChunkOptions({ ...(existing?.chunk ?? {}), ...Object.fromEntries(Object.entries(o.chunk ?? {}).filter(([, v]) => v !== undefined)) });
    if (existing && existing.embedderId !== this.embedder.id) {
      throw new DkiArgumentError(`collection ${JSON.stringify(o.collection)} holds vectors of embedder ${existing.embedderId}; this knowledge base was opened with ${this.embedder.id}`);
    }
    const now = Date.now();
    // Everything that can fail happens here, before the transaction.
    const parsed = await parseDocument(bytes, o.docType, name, { replaceInvalidUtf8: o.replaceInvalidUtf8 });
    const invalidUtf8 = parsed.invalidUtf8 ?? 0;
    const old = this.documents.get(docKey(o.collection, o.docId));
    // Re-ingested without metadata: the document keeps its own (its createdAt is kept below).
    const metadata = o.metadata ?? (old ? callerMetadata(old.fields) : undefined);
    const fields = documentFields(o.docId, o.docType, parsed.title, metadata, now);
    const hash = createHash("sha256").update(bytes).update(JSON.stringify({ chunkOpts, fields: { ...fields, createdAt: metadata?.createdAt ?? null } })).digest("hex");
    if (old && old.contentHash === hash) return { docId: o.docId, status: "unchanged", chunks: old.chunkIds.length, duplicatesSkipped: 0, invalidUtf8 };
    if (old && metadata?.createdAt === undefined) fields.createdAt = old.fields.createdAt ?? now;
    const pieces = chunkDocument(this.tokenizer, parsed, chunkOpts);
    if (pieces.length === 0) throw new DkiArgumentError(`${name}: no text to index after chunking`);
    if (pieces.length > this.maxChunks) throw new DkiArgumentError(`${name}: ${pieces.length} chunks is over the ${this.maxChunks}-chunk limit of one document (maxChunksPerDocument); split it`);
    // De-duplication by chunk id: the id hashes the document and the chunk's text, so a passage
    // repeated in a document is indexed once, and an unchanged chunk keeps its id across versions.
    const seen = new Set<string>();
    const unique: (typeof pieces)[number][] = [];
    const ids: string[] = [];
    for (const p of pieces) {
      const id = createHash("sha256").update(o.docId).update(SEP).update(p.text).digest("hex").slice(0, 32);
      if (seen.has(id)) continue;
      seen.add(id);
      unique.push(p);
      ids.push(id);
    }
    const vectors = await this.embedder.embed(unique.map((p) => p.text));
    if (vectors.length !== unique.length || vectors.some((v) => v.length !== this.embedder.dim)) {
      throw new Error(`embedder ${this.embedder.id} returned ${vectors.length} vectors for ${unique.length} texts, or vectors not of its dimension ${this.embedder.dim}`);
    }
    const customKeys = Object.keys(fields).filter((k) => !DOCUMENT_FIELDS.includes(k));
    const doc: KbDocument = {
      collection: o.collection,
      docId: o.docId,
      ...(parsed.title !== undefined ? { title: parsed.title } : {}),
      docType: o.docType,
      contentHash: hash,
      fields,
      chunkIds: ids,
      bytes: bytes.length,
      chars: parsed.text.length,
      ingestedAt: now,
    };
    // Open the collection's index first (it may rebuild from the chunks as they are now), then
    // commit and apply in one synchronous run, so no search can see the index out of step.
    this.index.open(o.collection);
    const indexed: IndexedDocument[] = unique.map((p, i) => ({ id: ids[i], text: p.text, at: Number(fields.createdAt), vector: vectors[i] }));
    const { generation, dropped, replaced } = this.root.transactionSync(() => {
      // Read again inside the transaction: another ingestion may have changed the document since.
      const current = this.documents.get(docKey(o.collection, o.docId));
      const dropped = (current?.chunkIds ?? []).filter((id) => !seen.has(id));
      for (const id of current?.chunkIds ?? []) this.chunks.removeSync(chunkKey(o.collection, id));
      unique.forEach((p, i) => {
        const stored: StoredChunk = { id: ids[i], collection: o.collection, docId: o.docId, index: p.index, text: p.text, start: p.start, end: p.end, tokenCount: p.tokenCount, headingPath: p.headingPath, ...(p.page !== undefined ? { page: p.page } : {}), vector: vectorBytes(vectors[i]) };
        this.chunks.putSync(chunkKey(o.collection, ids[i]), stored);
      });
      this.documents.putSync(docKey(o.collection, o.docId), doc);
      const c = this.collections.get(o.collection) ?? { name: o.collection, createdAt: now, embedderId: this.embedder.id, dim: this.embedder.dim, customFields: [] };
      const custom = new Set([...c.customFields, ...customKeys]);
      this.collections.putSync(o.collection, { ...c, customFields: [...custom].sort() });
      return { generation: this.bump(o.collection), dropped, replaced: current !== undefined };
    });
    if (dropped.length > 0) this.index.remove(o.collection, dropped, generation);
    this.index.put(o.collection, indexed, generation);
    return { docId: o.docId, status: replaced ? "replaced" : "added", chunks: unique.length, duplicatesSkipped: pieces.length - unique.length, invalidUtf8 };
  }

  /** Removes a document and its chunks (one transaction). Returns whether it existed. */
  async removeDocument(collection: string, docId: string): Promise<boolean> {
    this.live();
    this.collection(collection);
    checkDocId(docId);
    this.index.open(collection);
    const removed = this.root.transactionSync(() => {
      const d = this.documents.get(docKey(collection, docId));
      if (d === undefined) return null;
      for (const id of d.chunkIds) this.chunks.removeSync(chunkKey(collection, id));
      this.documents.removeSync(docKey(collection, docId));
      return { ids: d.chunkIds, generation: this.bump(collection) };
    });
    if (removed === null) return false;
    this.index.remove(collection, removed.ids, removed.generation);
    return true;
  }

  /**
   * Removes every document of a collection whose fields match a filter (the search filters' own
   * language, checked the same way: an unknown field is an error), with all their chunks, in one
   * transaction: e.g. one game session's history, `{ eq: { sessionId: "s1" } }`. A filter is
   * required (removeCollection removes everything).
   */
  async deleteWhere(collection: string, filter: Filter): Promise<DeleteResult> {
    this.live();
    this.collection(collection);
    if (filter === undefined || filter === null) throw new DkiArgumentError("deleteWhere needs a filter (removeCollection removes a whole collection)");
    checkFilter(filter, this.fieldsOf(collection));
    this.index.open(collection);
    const removed = this.root.transactionSync(() => {
      // Read inside the transaction, then remove: what matched is what goes, whole documents only.
      const docs = [...this.documents.getRange(prefixRange(collection))].map(({ value }) => value).filter((d) => matchesFilter(d.fields, filter));
      if (docs.length === 0) return null;
      const ids: string[] = [];
      for (const d of docs) {
        for (const id of d.chunkIds) this.chunks.removeSync(chunkKey(collection, id));
        this.documents.removeSync(docKey(collection, d.docId));
        ids.push(...d.chunkIds);
      }
      return { documents: docs.map((d) => d.docId), ids, generation: this.bump(collection) };
    });
    if (removed === null) return { documents: [], chunks: 0 };
    this.index.remove(collection, removed.ids, removed.generation);
    return { documents: removed.documents, chunks: removed.ids.length };
  }

  /**
   * Removes every collection owned by exactly this user (owner.userId), with all their documents
   * and chunks: what erasing a user removes from the knowledge base. A collection owned by a user
   * prefix belongs to a group, not to the user, and stays. Returns the names removed.
   */
  async removeCollectionsOwnedBy(userId: string): Promise<string[]> {
    this.live();
    if (typeof userId !== "string" || userId === "") throw new DkiArgumentError("removeCollectionsOwnedBy needs a non-empty user id");
    const names = [...this.collections.getRange()].filter(({ value }) => value.owner?.userId === userId).map(({ value }) => value.name);
    for (const name of names) await this.removeCollection(name);
    return names;
  }

  /** Removes a collection with every document and chunk. */
  async removeCollection(name: string): Promise<void> {
    this.live();
    this.collection(name);
    this.root.transactionSync(() => {
      for (const { key } of this.chunks.getRange(prefixRange(name))) this.chunks.removeSync(key);
      for (const { key } of this.documents.getRange(prefixRange(name))) this.documents.removeSync(key);
      this.collections.removeSync(name);
      this.scopes.removeSync(name);
    });
    this.index.drop(name);
  }

  /** Bumps a collection's generation (inside a write transaction); returns the new one. */
  private bump(collection: string): number {
    const rec = this.scopes.get(collection);
    const generation = (rec?.generation ?? 0) + 1;
    this.scopes.putSync(collection, { ...(rec ?? {}), generation });
    return generation;
  }

  /** Every chunk of a collection with its vector and its document's fields (what the index is built from). */
  snapshot(collection: string): CollectionSnapshot {
    this.live();
    this.collection(collection);
    const documents = new Map<string, KbDocument>();
    const fields = new Map<string, Metadata>();
    for (const { value } of this.documents.getRange(prefixRange(collection))) {
      documents.set(value.docId, value);
      fields.set(value.docId, value.fields);
    }
    const chunks: KbChunk[] = [];
    const vectors: Float32Array[] = [];
    for (const { value } of this.chunks.getRange(prefixRange(collection))) {
      const { vector, ...chunk } = value;
      chunks.push(chunk);
      vectors.push(vectorOf(vector));
    }
    return { chunks, vectors, fields, documents };
  }

  /** The documents of a collection that a filter selects (checked first: an unknown field is an error). */
  selectDocuments(collection: string, filter: Filter | undefined): Set<string> | null {
    if (filter === undefined) return null;
    checkFilter(filter, this.fieldsOf(collection));
    const out = new Set<string>();
    for (const { value } of this.documents.getRange(prefixRange(collection))) if (matchesFilter(value.fields, filter)) out.add(value.docId);
    return out;
  }

  /** Hybrid search of a collection (see search.ts): the best chunks for a query, with their sources. */
  async search(query: string, o: KbSearchOptions): Promise<KbSearchResult[]> {
    return (await this.searchDetailed(query, o)).results;
  }

  /** search() with the queries it ran (multi-query rewrites) and HyDE's passage. */
  async searchDetailed(query: string, o: KbSearchOptions): Promise<KbSearchDetail> {
    this.live();
    return searchKnowledgeBase(this, query, o);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    try {
      this.index.close();
    } finally {
      await this.root.close();
    }
  }
}
