// The memory store: users' memories, preferences, conversation turns and audit log in one LMDB
// file, and a hybrid retrieval index per user beside it. No model is needed.
//
// Folder layout:
//   store.lmdb (+ store.lmdb-lock)   every record, the vectors, the schema and embedder identity
//   index/                           HNSW files, one pair per user (retrieval/scoped-index.ts)
//   .lock                            held only for a step that must run alone (re-embedding)
//
// Several processes may have one store open at once, reading and writing (LMDB serialises the
// writes and gives every reader a consistent snapshot). The store file is checked before LMDB maps
// it (store-file.ts), and is created under a temporary name and linked into place whole, so no
// process ever sees a half-made store.lmdb.
//
// Rules this file keeps:
//   - Scope comes from arguments only. Every record's key starts with its user id, so a get with
//     another user's id reads another key and finds nothing; metadata never moves a record.
//   - Every write of several records is one LMDB transaction (transactionSync: it commits, and
//     with the default durability syncs, before returning), so a crash leaves each write whole or
//     absent. A call returns only after its transaction committed: what it acknowledged survives.
//   - The index follows the store: each memory write bumps the user's generation in the same
//     transaction and then updates the loaded index; index files record the generation they hold
//     (see scoped-index.ts), so after a crash an out-of-date index is rebuilt and reported. The
//     generation is read again at every search, so a process sees another's writes and erasures
//     at its next search. Generations come from one store-wide counter, so a user erased and
//     written again never comes back at a generation an old loaded index of it had.
//   - Vectors of two embedders are never mixed: the store records the embedder's id and dimension,
//     and opening with another embedder re-embeds everything (reembed: true) or is refused.
import { randomBytes, createHash } from "node:crypto";
import { existsSync, linkSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { open as openLmdb, type Database, type RootDatabase } from "lmdb";
import { DkiArgumentError } from "../errors.js";
import { FolderLock, FolderLockedError } from "../cache/tiers/folder-lock.js";
import { HashingEmbedder } from "./embedders/hashing.js";
import { MemoryNotFoundError, MemoryStoreError, StoreFileError } from "./errors.js";
import { checkLmdbFile } from "./store-file.js";
import { checkedJson, checkedVectorBytes, readCheckedVector } from "./checked-records.js";
import { importConversations, type ImportedTurn, type ImportOptions, type ImportResult } from "./import.js";
import { fusionWeights, type Fusion } from "./retrieval/fusion.js";
import { ScopedHybridIndex, type IndexedDocument, type RebuildReport, type SavedIndex, type SaveOutcome } from "./retrieval/scoped-index.js";
import { terms } from "./text-terms.js";
import type {
  AddMemoryOptions,
  AuditEntry,
  ConversationTurn,
  Embedder,
  Filter,
  Memory,
  MemoryStoreApi,
  Metadata,
  Preference,
  Role,
  SearchOptions,
  SearchResult,
  TurnRecord,
} from "./types.js";
import { checkFilter, checkId, checkInteger, checkMetadata, checkNumber, checkOptionalId, checkRole, checkText, matches } from "./validate.js";

/** 2: records carry checksums (checked-records.ts); version 1 stores are read and marked 2 on open. */
export const SCHEMA_VERSION = 2;
const FORMAT = "dki-memory-store";
const STORE_FILE = "store.lmdb";
const INDEX_DIR = "index";
/** What a store folder may hold besides the store file; anything else means it is someone else's folder. */
const OWN_ENTRIES = new Set([STORE_FILE, `${STORE_FILE}-lock`, ".lock", INDEX_DIR]);
/** A store file being created (or left by a creator that died): see createStoreFile. */
const NEW_STORE_FILE = /^store\.lmdb\.\d+-[0-9a-f]+\.new(-lock)?$/;
const DEFAULT_MAX_TEXT_CHARS = 10_000;
const MAX_LIMIT = 1000;
const EMBED_BATCH = 256;

export interface MemoryStoreOptions {
  /** The data folder (created if missing). */
  dir: string;
  /** Default: a HashingEmbedder (offline, 512 dimensions). */
  embedder?: Embedder;
  /** Longest memory, preference or query text accepted (default 10,000 characters). */
  maxTextChars?: number;
  /** When the folder's vectors came from another embedder: re-embed them (true) or refuse (default). */
  reembed?: boolean;
  /** Progress of a re-embedding, in memories. */
  onProgress?: (done: number, total: number) => void;
  /** Called for every index rebuild (missing, stale or corrupt index files). */
  onRebuild?: (report: RebuildReport) => void;
  /** Default fusion of search results (default RRF, k 60, dense and BM25 weighted 1, recency 0). */
  fusion?: Fusion;
  /** A user's memories at which its dense index moves from an exact scan to HNSW (default 1000; 0: HNSW always). */
  hnswFrom?: number;
  /** Users whose indexes stay loaded in memory (default 4096; the least recently used are unloaded beyond). */
  maxLoadedIndexes?: number;
  /** Delay before changed index files are saved (default 1000 ms; close() saves at once). */
  indexFlushDelayMs?: number;
  /**
   * When a write returns. "flush" (default): after its transaction is on disk (fsync), so it
   * survives a power loss (≈5 ms a write on this project's test VM). "commit": after it is
   * committed without fsync, which survives the process being killed but not the machine losing
   * power before the OS writes it out; far faster for single writes.
   */
  durability?: "flush" | "commit";
  /** How long a step that must run alone (re-embedding) waits for another process's to end (default 10,000 ms). */
  exclusiveWaitMs?: number;
}


export interface MemoryStoreStats {
  schemaVersion: number;
  embedder: { id: string; dim: number };
  users: number;
  memories: number;
  preferences: number;
  turns: number;
  auditEntries: number;
  /** Users whose indexes are loaded in memory, and their memories. */
  indexesLoaded: number;
  indexedMemories: number;
  /** Index rebuilds since open, oldest first. */
  rebuilds: RebuildReport[];
  lastRebuild?: RebuildReport;
  /** Bytes of the folder on disk (store file and index files). */
  bytesOnDisk: number;
  /** Why the last background save of index files failed (they are retried; a stale file is rebuilt on open). */
  indexSaveError?: string;
}

export interface EraseResult {
  memories: number;
  preferences: number;
  turns: number;
  auditEntries: number;
  cacheCleared: boolean;
}

/** What eraseUser needs of a K/V cache; TieredKVCache has it. */
export interface UserCache {
  clear(userId: string): Promise<void>;
}

interface UserRecord {
  createdAt: number;
  generation: number;
}

interface SchemaRecord {
  format: string;
  version: number;
  createdAt: number;
}

type Key = string[];

/** The store's LMDB tables. */
interface Tables {
  meta: Database<unknown, string>;
  users: Database<UserRecord, string>;
  sessions: Database<{ createdAt: number; updatedAt: number }, Key>;
  memories: Database<Memory, Key>;
  vectors: Database<Buffer, Key>;
  prefs: Database<Preference, Key>;
  turns: Database<ConversationTurn, Key>;
  /** Each message's vector (the store's embedder), made when it is recorded: Recall v4 reads them. */
  turnVectors: Database<Buffer, Key>;
  audit: Database<AuditEntry, Key>;
  history: Database<string, Key>;
  indexState: Database<SavedIndex, string>;
  systemAudit: Database<AuditEntry, string>;
}

function openTables(env: RootDatabase, file: string): Tables {
  const json = (name: string, plain = false) => ({ name, encoder: checkedJson(file, name, plain) });
  return {
    meta: env.openDB<unknown, string>(json("meta", true)),
    users: env.openDB<UserRecord, string>(json("users")),
    sessions: env.openDB<{ createdAt: number; updatedAt: number }, Key>(json("sessions")),
    memories: env.openDB<Memory, Key>(json("memories")),
    vectors: env.openDB<Buffer, Key>({ name: "vectors", encoding: "binary" }),
    prefs: env.openDB<Preference, Key>(json("preferences")),
    turns: env.openDB<ConversationTurn, Key>(json("turns")),
    turnVectors: env.openDB<Buffer, Key>({ name: "turn_vectors", encoding: "binary" }),
    audit: env.openDB<AuditEntry, Key>(json("audit")),
    history: env.openDB<string, Key>(json("history")),
    indexState: env.openDB<SavedIndex, string>(json("index_state")),
    systemAudit: env.openDB<AuditEntry, string>(json("system_audit")),
  };
}

/** Inside a transaction: what makes an empty LMDB file a store. */
function writeSchema(db: Tables, embedder: Embedder): void {
  db.meta.putSync("schema", { format: FORMAT, version: SCHEMA_VERSION, createdAt: Date.now() } satisfies SchemaRecord);
  db.meta.putSync("embedder", { id: embedder.id, dim: embedder.dim });
}

/**
 * Makes a new store file under a name of this process's own and links it into place whole. LMDB
 * creates its file empty and writes the meta pages after, so a process opening the store while
 * another creates it would otherwise see an empty (refused) or half-written file. Of two
 * processes creating at once, one link wins; the other's file is removed and the winner's opened.
 */
async function createStoreFile(dir: string, embedder: Embedder): Promise<void> {
  const temp = join(dir, `${STORE_FILE}.${process.pid}-${randomBytes(6).toString("hex")}.new`);
  try {
    const env = openLmdb({ path: temp, maxDbs: 16 });
    try {
      const db = openTables(env, temp);
      env.transactionSync(() => writeSchema(db, embedder));
    } finally {
      await env.close();
    }
    try {
      linkSync(temp, join(dir, STORE_FILE));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw new MemoryStoreError(`cannot create the memory store file in ${dir}: ${(e as Error).message}`);
    }
  } finally {
    rmSync(temp, { force: true });
    rmSync(`${temp}-lock`, { force: true });
  }
}

/**
 * A key range holding every key that starts with `prefix`. In LMDB's key encoding (ordered-binary)
 * an array's elements are separated by a 0 byte, so [a, b, …] sorts just after [a] and before
 * [a + "\u0001"] (ids hold no control characters, see validate.ts, so no id lies between). Not
 * "\u0000": ordered-binary escapes it in short strings but writes it raw in strings of 63 bytes
 * and more, where [a + "\u0000"] then sorts before [a, b] and the range came out empty.
 */
function prefixRange(prefix: Key): { start: Key; end: Key } {
  return { start: prefix, end: [...prefix.slice(0, -1), `${prefix[prefix.length - 1]}\u0001`] };
}

let lastMs = 0;
let seq = 0;
/** Ids that sort by creation time (ms in base 36, then a counter), with randomness against other processes. */
function newId(kind: string): string {
  const now = Date.now();
  if (now === lastMs) seq++;
  else [lastMs, seq] = [now, 0];
  return `${kind}_${now.toString(36).padStart(9, "0")}${seq.toString(36).padStart(4, "0")}${randomBytes(5).toString("hex")}`;
}


export class MemoryStore implements MemoryStoreApi {
  private closed = false;
  private readonly index: ScopedHybridIndex;

  readonly memories: MemoryStoreApi["memories"];
  readonly preferences: MemoryStoreApi["preferences"];
  readonly conversations: MemoryStoreApi["conversations"];
  readonly audit: MemoryStoreApi["audit"];

  private constructor(
    readonly dir: string,
    readonly embedder: Embedder,
    private readonly env: RootDatabase,
    private readonly db: Tables,
    readonly maxTextChars: number,
    private readonly fusion: Fusion | undefined,
    options: MemoryStoreOptions,
  ) {
    this.index = new ScopedHybridIndex({
      dir: join(dir, INDEX_DIR),
      dim: embedder.dim,
      flushDelayMs: options.indexFlushDelayMs,
      hnswFrom: options.hnswFrom,
      maxLoadedScopes: options.maxLoadedIndexes,
      onRebuild: options.onRebuild,
      source: {
        generation: (userId) => this.db.users.get(userId)?.generation ?? 0,
        savedIndex: (userId) => this.db.indexState.get(userId),
        indexesSaved: (saved) =>
          this.env.transactionSync(() => {
            const outcomes = new Map<string, SaveOutcome>();
            for (const [userId, state] of saved) {
              const before = this.db.indexState.get(userId);
              // Only users still at the saved generation: an erased user's index must not come
              // back as a record, nor one another process has written past since.
              const recorded = this.db.users.get(userId)?.generation === state.generation;
              if (recorded) this.db.indexState.putSync(userId, state);
              outcomes.set(userId, { recorded, before });
            }
            return outcomes;
          }),
        documents: (userId) => this.documents(userId),
        vector: (userId, id) => {
          const bytes = this.db.vectors.getBinary([userId, id]);
          return bytes === undefined ? undefined : this.toVector(bytes, userId, id);
        },
      },
    });
    this.memories = {
      add: (input, opts) => this.addMemories(input, opts),
      search: (query, opts) => this.search(query, opts),
      get: async (id, scope) => this.getMemory(id, scope),
      getAll: async (opts) => this.getAllMemories(opts),
      update: (id, text, scope) => this.updateMemory(id, text, scope),
      delete: async (id, scope) => this.deleteMemory(id, scope),
      history: async (id, scope) => this.memoryHistory(id, scope),
    };
    this.preferences = {
      add: async (text, opts) => this.addPreference(text, opts),
      list: async (scope) => this.listPreferences(scope),
      update: async (id, patch, scope) => this.updatePreference(id, patch, scope),
      delete: async (id, scope) => this.deletePreference(id, scope),
    };
    this.conversations = {
      list: async (scope) => this.listTurns(scope),
      recordTurn: async (turn) => {
        // Both messages embedded before the write, in it with them (bad input is refused by recordTurn).
        const texts = typeof turn?.query === "string" && typeof turn.response === "string" ? [turn.query, turn.response] : null;
        return this.recordTurn(turn, texts === null ? null : await this.embedMessages(texts));
      },
      get: async (id, scope) => this.getTurn(id, scope),
      listUser: async (scope) => this.listUserTurns(scope),
      vectors: async (ids, scope) => this.turnVectors(ids, scope),
    };
    this.audit = { list: async (scope) => this.listAudit(scope) };
  }

  /**
   * Opens (or creates) the store in `dir`. Refuses, with a MemoryStoreError that says why, a
   * folder that holds other files, a store file that is empty, truncated, damaged (a
   * StoreFileError) or of another schema version, and a store of another embedder (unless
   * `reembed`). Other processes may have the same store open.
   */
  static async open(options: MemoryStoreOptions): Promise<MemoryStore> {
    if (typeof options?.dir !== "string" || options.dir === "") throw new DkiArgumentError("MemoryStore.open: dir must be a non-empty path");
    const dir = resolve(options.dir);
    const maxTextChars = checkInteger("maxTextChars", options.maxTextChars ?? DEFAULT_MAX_TEXT_CHARS, 1, 10_000_000);
    if (options.hnswFrom !== undefined) checkInteger("hnswFrom", options.hnswFrom, 0, Number.MAX_SAFE_INTEGER);
    if (options.maxLoadedIndexes !== undefined) checkInteger("maxLoadedIndexes", options.maxLoadedIndexes, 1, Number.MAX_SAFE_INTEGER);
    const exclusiveWaitMs = checkInteger("exclusiveWaitMs", options.exclusiveWaitMs ?? 10_000, 0, 3_600_000);
    if (options.durability !== undefined && options.durability !== "flush" && options.durability !== "commit") throw new DkiArgumentError(`MemoryStore.open: durability must be "flush" or "commit", got ${JSON.stringify(options.durability)}`);
    if (options.fusion !== undefined) {
      try {
        fusionWeights(options.fusion);
      } catch (e) {
        throw new DkiArgumentError(`MemoryStore.open: ${(e as Error).message}`);
      }
    }
    const embedder = options.embedder ?? new HashingEmbedder();
    if (!Number.isInteger(embedder.dim) || embedder.dim < 1 || typeof embedder.id !== "string" || embedder.id === "") {
      throw new DkiArgumentError(`MemoryStore.open: the embedder needs a non-empty id and a positive integer dim, got id ${JSON.stringify(embedder.id)}, dim ${embedder.dim}`);
    }
    checkForeign(dir);
    const file = join(dir, STORE_FILE);
    if (!existsSync(file)) await createStoreFile(dir, embedder);
    checkLmdbFile(file, "memory store");
    let env: RootDatabase | undefined;
    try {
      try {
        // noSync: LMDB commits without fsync; the commit is in the OS's page cache, which a killed
        // process cannot lose, but a power cut can.
        env = openLmdb({ path: file, maxDbs: 16, noSync: options.durability === "commit" });
      } catch (e) {
        throw new MemoryStoreError(`${file} is not a readable memory store (damaged, or not an LMDB file): ${(e as Error).message}`);
      }
      const db = openTables(env, file);
      let schema = db.meta.get("schema") as SchemaRecord | undefined;
      if (schema === undefined) {
        // An empty LMDB file (an older dki-engine made the file first and wrote its schema after).
        if (db.memories.getKeysCount() + db.users.getKeysCount() > 0) throw new MemoryStoreError(`${file} holds data but no schema record: not a dki memory store, left untouched`);
        env.transactionSync(() => {
          if (db.meta.get("schema") === undefined) writeSchema(db, embedder);
        });
        schema = db.meta.get("schema") as SchemaRecord;
      }
      if (schema.format !== FORMAT) {
        throw new MemoryStoreError(`${file} is a ${JSON.stringify(schema.format)} file, not a dki memory store; left untouched`);
      } else if (schema.version === 1) {
        // Version 1 differs only in records without checksums, which this one still reads.
        env.transactionSync(() => {
          const now = db.meta.get("schema") as SchemaRecord;
          if (now.version === 1) db.meta.putSync("schema", { ...now, version: SCHEMA_VERSION } satisfies SchemaRecord);
        });
      } else if (schema.version !== SCHEMA_VERSION) {
        throw new MemoryStoreError(
          `${file} has schema version ${schema.version}; this dki-engine reads version ${SCHEMA_VERSION} and has no migration from ${schema.version}${schema.version > SCHEMA_VERSION ? " (it was written by a newer dki-engine)" : ""}; left untouched`,
        );
      }
      const store = new MemoryStore(dir, embedder, env, db, maxTextChars, options.fusion, options);
      const stored = db.meta.get("embedder") as { id: string; dim: number };
      if (stored.id !== embedder.id || stored.dim !== embedder.dim) {
        if (options.reembed !== true) {
          throw new MemoryStoreError(
            `${dir}: its vectors were made by embedder ${stored.id} (${stored.dim} dimensions), not ${embedder.id} (${embedder.dim}); open it with that embedder (CLI: --embedder DIR for an ONNX model), or with reembed: true (CLI: --reembed) to re-embed every memory`,
          );
        }
        await store.reembedAlone(exclusiveWaitMs, options.onProgress);
      }
      return store;
    } catch (e) {
      await env?.close();
      throw e;
    }
  }

  // ---- memories ----

  private async addMemories(input: string | { role: Role; content: string }[], opts: AddMemoryOptions): Promise<Memory[]> {
    this.checkOpen();
    const userId = checkId("userId", opts?.userId);
    const sessionId = checkOptionalId("sessionId", opts.sessionId);
    const metadata = checkMetadata(opts.metadata);
    return this.insert(userId, this.addItems(input, metadata, sessionId));
  }

  /** Import's way in (import.ts): turns already checked, each with its own session and metadata. */
  async insertTurns(userId: string, turns: ImportedTurn[]): Promise<number> {
    this.checkOpen();
    checkId("userId", userId);
    const items = turns.map((t) => ({ text: checkText(`${t.at} text`, t.text, this.maxTextChars), metadata: checkMetadata(t.metadata), sessionId: checkId(`${t.at} session`, t.sessionId) }));
    return (await this.insert(userId, items)).length;
  }

  /** Imported turns as the user's conversation history: messages in their sessions, in order, in one transaction. */
  async insertHistory(userId: string, turns: ImportedTurn[]): Promise<number> {
    this.checkOpen();
    checkId("userId", userId);
    const now = Date.now();
    const messages: ConversationTurn[] = turns.map((t) => ({
      id: newId("turn"),  // ids grow in file order: listUser returns the history as it was spoken
      userId,
      sessionId: checkId(`${t.at} session`, t.sessionId),
      role: checkRole(`${t.at} role`, t.role),
      content: checkText(`${t.at} text`, t.text, this.maxTextChars),
      memoryIds: [],
      createdAt: now,
      metadata: checkMetadata(t.metadata),
    }));
    const vectors = await this.embedMessages(messages.map((m) => m.content));
    this.checkOpen();
    this.env.transactionSync(() => {
      this.checkEmbedder();
      this.ensureUser(userId, now);
      for (const s of new Set(messages.map((m) => m.sessionId))) this.touchSession(userId, s, now);
      messages.forEach((m, i) => {
        this.db.turns.putSync([userId, m.sessionId, m.id], m);
        if (vectors[i] !== undefined) this.db.turnVectors.putSync([userId, m.id], checkedVectorBytes(vectors[i]));
      });
      this.writeAudit({ action: "history_import", userId, memoryIds: [], metadata: { messages: messages.length } }, now, false);
    });
    return messages.length;
  }

  /** Embeds, then writes the memories, their vectors, the user's new generation and one audit entry in one transaction. */
  private async insert(userId: string, items: { text: string; metadata: Metadata; sessionId?: string }[]): Promise<Memory[]> {
    const vectors = await this.embed(items.map((i) => i.text));
    this.checkOpen();
    const now = Date.now();
    const records: Memory[] = items.map((i) => ({ id: newId("mem"), userId, ...(i.sessionId === undefined ? {} : { sessionId: i.sessionId }), text: i.text, metadata: i.metadata, createdAt: now, updatedAt: now, active: true }));
    // Before the index loads vectors: another process may have re-embedded the store.
    this.checkEmbedder();
    // Opened before the commit, so a load (or rebuild) cannot see this write and then get it again.
    this.index.open(userId);
    const sessions = new Set(records.map((m) => m.sessionId));
    const generation = this.env.transactionSync(() => {
      this.checkEmbedder();
      const g = this.bumpUser(userId, now);
      for (const s of sessions) if (s !== undefined) this.touchSession(userId, s, now);
      records.forEach((m, i) => {
        this.db.memories.putSync([userId, m.id], m);
        this.db.vectors.putSync([userId, m.id], checkedVectorBytes(vectors[i]));
      });
      const sessionId = sessions.size === 1 ? records[0].sessionId : undefined;
      this.writeAudit({ action: "memory_add", userId, sessionId, memoryIds: records.map((m) => m.id), metadata: {} }, now);
      return g;
    });
    this.indexed(userId, () => this.index.put(userId, records.map((m, i) => ({ id: m.id, text: m.text, at: m.updatedAt, vector: vectors[i] })), generation.next, generation.previous));
    return records;
  }

  /** A text is one memory; a message list is one memory per message, its role kept in metadata. */
  private addItems(input: string | { role: Role; content: string }[], metadata: Metadata, sessionId: string | undefined): { text: string; metadata: Metadata; sessionId?: string }[] {
    if (typeof input === "string") return [{ text: checkText("text", input, this.maxTextChars), metadata, sessionId }];
    if (!Array.isArray(input) || input.length === 0) throw new DkiArgumentError("memories.add: expected a text or a non-empty array of { role, content } messages");
    return input.map((m, i) => {
      if (typeof m !== "object" || m === null) throw new DkiArgumentError(`messages[${i}] must be an object { role, content }`);
      const role = checkRole(`messages[${i}].role`, m.role);
      return { text: checkText(`messages[${i}].content`, m.content, this.maxTextChars), metadata: { ...metadata, role }, sessionId };
    });
  }

  private async search(query: string, opts: SearchOptions): Promise<SearchResult[]> {
    this.checkOpen();
    checkText("query", query, this.maxTextChars);
    const userId = checkId("userId", opts?.userId);
    const sessionId = checkOptionalId("sessionId", opts.sessionId);
    const limit = checkInteger("limit", opts.limit ?? 5, 1, MAX_LIMIT);
    const minScore = checkNumber("minScore", opts.minScore ?? 0, 0, 1);
    const filter = opts.filter === undefined ? undefined : checkFilter(opts.filter);
    try {
      if (opts.fusion !== undefined) fusionWeights(opts.fusion);
    } catch (e) {
      throw new DkiArgumentError(`search: ${(e as Error).message}`);
    }
    if (opts.halfLifeMs !== undefined) checkNumber("halfLifeMs", opts.halfLifeMs, 1, Number.MAX_SAFE_INTEGER);
    if (opts.now !== undefined) checkNumber("now", opts.now, 0, Number.MAX_SAFE_INTEGER);
    const [vector] = await this.embed([query]);
    this.checkOpen();
    // lmdb-js reads from a snapshot taken once per event-loop turn: a search reads the latest
    // commit of every process, and with it the user's generation its index must be at.
    this.env.resetReadTxn();
    this.checkEmbedder();
    if (this.db.users.get(userId) === undefined) return [];
    const accept =
      sessionId === undefined && filter === undefined
        ? undefined
        : (id: string) => {
            const m = this.db.memories.get([userId, id]);
            return m !== undefined && (sessionId === undefined || m.sessionId === sessionId) && (filter === undefined || matches(filter, m.metadata));
          };
    const hits = this.index.search(userId, { terms: terms(query), vector }, { limit, accept, minScore, fusion: opts.fusion ?? this.fusion, halfLifeMs: opts.halfLifeMs, now: opts.now });
    const results: SearchResult[] = [];
    for (const h of hits) {
      // Always there: the index only ever holds what a committed transaction wrote for this user.
      const memory = this.own(this.db.memories.get([userId, h.id]), userId, h.id);
      if (memory === undefined) throw new MemoryStoreError(`${this.dir}: the index of user ${JSON.stringify(userId)} names memory ${h.id}, which the store does not hold`);
      results.push({ memory, score: h.score, signals: h.signals });
    }
    return results;
  }

  private getMemory(id: string, scope: { userId: string }): Memory | undefined {
    this.checkOpen();
    const userId = checkId("userId", scope?.userId);
    checkId("id", id);
    return this.own(this.db.memories.get([userId, id]), userId, id);
  }

  private getAllMemories(opts: { userId: string; sessionId?: string; filter?: Filter }): Memory[] {
    this.checkOpen();
    const userId = checkId("userId", opts?.userId);
    const sessionId = checkOptionalId("sessionId", opts.sessionId);
    const filter = opts.filter === undefined ? undefined : checkFilter(opts.filter);
    const out: Memory[] = [];
    for (const { key, value } of this.db.memories.getRange(prefixRange([userId]))) {
      this.own(value, userId, key[1]);
      if (sessionId !== undefined && value.sessionId !== sessionId) continue;
      if (filter !== undefined && !matches(filter, value.metadata)) continue;
      out.push(value);
    }
    return out;
  }

  private async updateMemory(id: string, text: string, scope: { userId: string }): Promise<Memory> {
    this.checkOpen();
    const userId = checkId("userId", scope?.userId);
    checkText("text", text, this.maxTextChars);
    this.mustGetMemory(id, userId);
    const [vector] = await this.embed([text]);
    this.checkOpen();
    this.checkEmbedder();
    this.index.open(userId);
    const now = Date.now();
    const { updated, generation } = this.env.transactionSync(() => {
      // Read again inside the transaction: it may have been deleted while the text was embedded.
      const before = this.mustGetMemory(id, userId);
      this.checkEmbedder();
      const updated: Memory = { ...before, text, updatedAt: now };
      const generation = this.bumpUser(userId, now);
      this.db.memories.putSync([userId, id], updated);
      this.db.vectors.putSync([userId, id], checkedVectorBytes(vector));
      this.writeAudit({ action: "memory_update", userId, sessionId: before.sessionId, memoryIds: [id], metadata: { previousText: before.text, text } }, now);
      return { updated, generation };
    });
    this.indexed(userId, () => this.index.put(userId, [{ id, text, at: now, vector }], generation.next, generation.previous));
    return updated;
  }

  private deleteMemory(id: string, scope: { userId: string }): void {
    this.checkOpen();
    const userId = checkId("userId", scope?.userId);
    this.mustGetMemory(id, userId);
    this.checkEmbedder();
    this.index.open(userId);
    const now = Date.now();
    const generation = this.env.transactionSync(() => {
      const before = this.mustGetMemory(id, userId);
      const g = this.bumpUser(userId, now);
      this.db.memories.removeSync([userId, id]);
      this.db.vectors.removeSync([userId, id]);
      // The deleted text is not kept in the audit log: deleting a memory must delete its content.
      this.writeAudit({ action: "memory_delete", userId, sessionId: before.sessionId, memoryIds: [id], metadata: {} }, now);
      return g;
    });
    this.indexed(userId, () => this.index.remove(userId, [id], generation.next, generation.previous));
  }

  private memoryHistory(id: string, scope: { userId: string }): AuditEntry[] {
    this.checkOpen();
    const userId = checkId("userId", scope?.userId);
    checkId("id", id);
    const out: AuditEntry[] = [];
    for (const { value: auditId } of this.db.history.getRange(prefixRange([userId, id]))) {
      const entry = this.db.audit.get([userId, auditId]);
      if (entry !== undefined) out.push(entry);
    }
    return out;
  }

  private mustGetMemory(id: string, userId: string): Memory {
    checkId("id", id);
    const m = this.own(this.db.memories.get([userId, id]), userId, id);
    if (m === undefined) throw new MemoryNotFoundError("memory", id, userId);
    return m;
  }

  // ---- preferences ----

  private addPreference(text: string, opts: { userId: string; type: string; priority?: number; category?: string }): Preference {
    this.checkOpen();
    const userId = checkId("userId", opts?.userId);
    const p = this.checkPreferenceFields({ text, type: opts.type, priority: opts.priority ?? 0, category: opts.category, active: true });
    const now = Date.now();
    const pref: Preference = { id: newId("pref"), userId, ...p, createdAt: now, updatedAt: now };
    this.env.transactionSync(() => {
      this.ensureUser(userId, now);
      this.db.prefs.putSync([userId, pref.id], pref);
      this.writeAudit({ action: "preference_add", userId, memoryIds: [pref.id], metadata: {} }, now, false);
    });
    return pref;
  }

  private listPreferences(scope: { userId: string; includeInactive?: boolean }): Preference[] {
    this.checkOpen();
    const userId = checkId("userId", scope?.userId);
    const out: Preference[] = [];
    for (const { key, value } of this.db.prefs.getRange(prefixRange([userId]))) if (this.own(value, userId, key[1]).active || scope.includeInactive === true) out.push(value);
    return out.sort((a, b) => Number(b.active) - Number(a.active) || b.priority - a.priority || a.createdAt - b.createdAt || (a.id < b.id ? -1 : 1));
  }

  private updatePreference(id: string, patch: Partial<Pick<Preference, "text" | "type" | "priority" | "category" | "active">>, scope: { userId: string }): Preference {
    this.checkOpen();
    const userId = checkId("userId", scope?.userId);
    checkId("id", id);
    if (typeof patch !== "object" || patch === null) throw new DkiArgumentError("preferences.update: patch must be an object");
    const unknown = Object.keys(patch).filter((k) => !["text", "type", "priority", "category", "active"].includes(k));
    if (unknown.length > 0) throw new DkiArgumentError(`preferences.update: unknown field(s) ${unknown.join(", ")} (text, type, priority, category and active can change)`);
    const now = Date.now();
    return this.env.transactionSync(() => {
      const before = this.db.prefs.get([userId, id]);
      if (before === undefined) throw new MemoryNotFoundError("preference", id, userId);
      const merged = this.checkPreferenceFields({ ...before, ...patch });
      const after: Preference = { ...before, ...merged, updatedAt: now };
      if (merged.category === undefined) delete after.category;
      this.db.prefs.putSync([userId, id], after);
      this.writeAudit({ action: "preference_update", userId, memoryIds: [id], metadata: {} }, now, false);
      return after;
    });
  }

  private deletePreference(id: string, scope: { userId: string }): void {
    this.checkOpen();
    const userId = checkId("userId", scope?.userId);
    checkId("id", id);
    const now = Date.now();
    this.env.transactionSync(() => {
      if (this.db.prefs.get([userId, id]) === undefined) throw new MemoryNotFoundError("preference", id, userId);
      this.db.prefs.removeSync([userId, id]);
      this.writeAudit({ action: "preference_delete", userId, memoryIds: [id], metadata: {} }, now, false);
    });
  }

  private checkPreferenceFields(p: { text: unknown; type: unknown; priority: unknown; category?: unknown; active: unknown }): Pick<Preference, "text" | "type" | "priority" | "category" | "active"> {
    const text = checkText("text", p.text, this.maxTextChars);
    const type = checkId("type", p.type);
    const priority = checkInteger("priority", p.priority, -1_000_000, 1_000_000);
    const category = checkOptionalId("category", p.category);
    if (typeof p.active !== "boolean") throw new DkiArgumentError(`active must be true or false, got ${typeof p.active}`);
    return { text, type, priority, ...(category === undefined ? {} : { category }), active: p.active };
  }

  // ---- conversations and audit ----

  private listTurns(scope: { userId: string; sessionId: string; limit?: number }): ConversationTurn[] {
    this.checkOpen();
    const userId = checkId("userId", scope?.userId);
    const sessionId = checkId("sessionId", scope.sessionId);
    const range = prefixRange([userId, sessionId]);
    if (scope.limit === undefined) return [...this.db.turns.getRange(range).map((e) => e.value)];
    const limit = checkInteger("limit", scope.limit, 1, Number.MAX_SAFE_INTEGER);
    // The newest `limit`, read backwards, returned oldest first.
    return [...this.db.turns.getRange({ start: range.end, end: range.start, reverse: true, limit }).map((e) => e.value)].reverse();
  }

  // Recall v4 (src/recall/) reads a user's whole history and resolves trace ids (turn ids) to turns.
  /** Every turn of the user, all sessions, oldest first (ids grow with time). */
  private listUserTurns(scope: { userId: string }): ConversationTurn[] {
    this.checkOpen();
    const userId = checkId("userId", scope?.userId);
    return [...this.db.turns.getRange(prefixRange([userId])).map((e) => e.value)].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  /** One turn by id within the scope; another user's (or, given a session, another session's) turn reads as undefined. */
  private getTurn(id: string, scope: { userId: string; sessionId?: string }): ConversationTurn | undefined {
    this.checkOpen();
    if (typeof id !== "string" || id === "") return undefined;
    const userId = checkId("userId", scope?.userId);
    const prefix = scope.sessionId === undefined ? [userId] : [userId, checkId("sessionId", scope.sessionId)];
    for (const { value } of this.db.turns.getRange(prefixRange(prefix))) if (value.id === id) return value;
    return undefined;
  }

  /** The messages' stored vectors, by id (undefined: none, e.g. a turn recorded before vectors were kept). */
  private turnVectors(ids: string[], scope: { userId: string }): { embedderId: string; vectors: (Float32Array | undefined)[] } {
    this.checkOpen();
    const userId = checkId("userId", scope?.userId);
    if (!Array.isArray(ids)) throw new DkiArgumentError("conversations.vectors: ids must be an array of turn ids");
    const vectors = ids.map((id) => {
      const bytes = typeof id === "string" && id !== "" ? this.db.turnVectors.getBinary([userId, id]) : undefined;
      return bytes === undefined ? undefined : readCheckedVector(bytes, this.embedder.dim, join(this.dir, STORE_FILE), `message ${id} of user ${JSON.stringify(userId)}`);
    });
    return { embedderId: this.embedder.id, vectors };
  }

  private recordTurn(turn: TurnRecord, vectors: (Float32Array | undefined)[] | null): { userTurn: ConversationTurn; assistantTurn: ConversationTurn; audit: AuditEntry } {
    this.checkOpen();
    if (typeof turn !== "object" || turn === null) throw new DkiArgumentError("recordTurn: expected a TurnRecord object");
    const userId = checkId("userId", turn.userId);
    const sessionId = checkId("sessionId", turn.sessionId);
    if (typeof turn.query !== "string") throw new DkiArgumentError("recordTurn: query must be a string");
    if (typeof turn.response !== "string") throw new DkiArgumentError("recordTurn: response must be a string");
    const injectionMode = checkId("injectionMode", turn.injectionMode);
    const auditAction = checkId("auditAction", turn.auditAction);
    if (turn.alpha !== undefined) checkNumber("alpha", turn.alpha, 0, Number.MAX_VALUE);
    checkNumber("latencyMs", turn.latencyMs, 0, Number.MAX_VALUE);
    if (!Array.isArray(turn.memoryIds)) throw new DkiArgumentError("recordTurn: memoryIds must be an array of ids");
    turn.memoryIds.forEach((id, i) => checkId(`memoryIds[${i}]`, id));
    const auditMetadata = checkMetadata(turn.auditMetadata, "auditMetadata");
    const now = Date.now();
    const alpha = turn.alpha === undefined ? {} : { alpha: turn.alpha };
    const userTurn: ConversationTurn = { id: newId("turn"), userId, sessionId, role: "user", content: turn.query, memoryIds: [], createdAt: now };
    const assistantTurn: ConversationTurn = {
      id: newId("turn"),
      userId,
      sessionId,
      role: "assistant",
      content: turn.response,
      injectionMode,
      ...alpha,
      memoryIds: [...turn.memoryIds],
      latencyMs: turn.latencyMs,
      createdAt: now,
    };
    const audit = this.env.transactionSync(() => {
      this.checkEmbedder();
      this.ensureUser(userId, now);
      this.touchSession(userId, sessionId, now);
      this.db.turns.putSync([userId, sessionId, userTurn.id], userTurn);
      this.db.turns.putSync([userId, sessionId, assistantTurn.id], assistantTurn);
      if (vectors?.[0] !== undefined) this.db.turnVectors.putSync([userId, userTurn.id], checkedVectorBytes(vectors[0]));
      if (vectors?.[1] !== undefined) this.db.turnVectors.putSync([userId, assistantTurn.id], checkedVectorBytes(vectors[1]));
      return this.writeAudit({ action: auditAction, userId, sessionId, memoryIds: [...turn.memoryIds], ...alpha, mode: injectionMode, metadata: auditMetadata }, now, false);
    });
    return { userTurn, assistantTurn, audit };
  }

  private listAudit(scope: { userId: string; sessionId?: string; action?: string }): AuditEntry[] {
    this.checkOpen();
    const userId = checkId("userId", scope?.userId);
    const out: AuditEntry[] = [];
    for (const { value } of this.db.audit.getRange(prefixRange([userId]))) {
      if (scope.sessionId !== undefined && value.sessionId !== scope.sessionId) continue;
      if (scope.action !== undefined && value.action !== scope.action) continue;
      out.push(value);
    }
    return out;
  }

  // ---- users ----

  /**
   * Removes every record of a user (memories, vectors, preferences, sessions, turns, audit
   * entries), its index files and, given a K/V cache, its blocks in every tier. The cache goes
   * first: it is derived data, so if the store's erasure then failed nothing would be lost. The
   * audit row this writes names the user only by a hash and holds counts, no content.
   */
  async eraseUser(userId: string, options: { cache?: UserCache } = {}): Promise<EraseResult> {
    this.checkOpen();
    checkId("userId", userId);
    let cacheCleared = false;
    if (options.cache !== undefined) {
      await options.cache.clear(userId);
      cacheCleared = true;
    }
    this.checkOpen();
    const now = Date.now();
    const counts = this.env.transactionSync(() => {
      const removeAll = (db: Database<unknown, Key>): number => {
        // Keys collected first: deleting under a live cursor could make it skip entries.
        const keys = [...db.getKeys(prefixRange([userId]))];
        for (const key of keys) db.removeSync(key);
        return keys.length;
      };
      const memories = removeAll(this.db.memories);
      removeAll(this.db.vectors);
      const preferences = removeAll(this.db.prefs);
      const turns = removeAll(this.db.turns);
      removeAll(this.db.turnVectors);
      const auditEntries = removeAll(this.db.audit);
      removeAll(this.db.history);
      removeAll(this.db.sessions);
      // The counter stays past the erased user's generation, so the user, written again, starts above it.
      const generation = this.db.users.get(userId)?.generation ?? 0;
      if (generation > this.lastGeneration()) this.db.meta.putSync("generation", generation);
      this.db.users.removeSync(userId);
      this.db.indexState.removeSync(userId);
      const erased = { memories, preferences, turns, auditEntries };
      this.writeSystemAudit({ action: "user_erase", userId: erasedUserId(userId), memoryIds: [], metadata: { ...erased, cacheCleared } }, now);
      return erased;
    });
    this.index.drop(userId);
    return { ...counts, cacheCleared };
  }

  /** The store's own audit entries (re-embeddings, user erasures), oldest first. */
  systemAudit(): AuditEntry[] {
    this.checkOpen();
    return [...this.db.systemAudit.getRange().map((e) => e.value)];
  }

  /** User ids with any record, sorted. */
  listUsers(): string[] {
    this.checkOpen();
    return [...this.db.users.getKeys()];
  }

  /** Imports a LoCoMo or LongMemEval file: one user per conversation, one memory (or, as "history", one message) per turn (see import.ts). */
  async importConversations(file: string, options: ImportOptions = {}): Promise<ImportResult> {
    this.checkOpen();
    return importConversations(this, file, options);
  }

  /** Loads every user's index now (rebuilding what needs it, reported), instead of on first use. */
  checkIndexes(): RebuildReport[] {
    this.checkOpen();
    const before = this.index.rebuilds.length;
    this.checkEmbedder();
    for (const userId of this.db.users.getKeys()) this.index.open(userId);
    return this.index.rebuilds.slice(before);
  }

  /** Saves changed index files now (close() does too). */
  flushIndexes(): void {
    this.checkOpen();
    this.index.flush();
  }

  stats(): MemoryStoreStats {
    this.checkOpen();
    const loaded = this.index.loaded();
    const rebuilds = [...this.index.rebuilds];
    return {
      schemaVersion: SCHEMA_VERSION,
      embedder: { id: this.embedder.id, dim: this.embedder.dim },
      users: this.db.users.getKeysCount(),
      memories: this.db.memories.getKeysCount(),
      preferences: this.db.prefs.getKeysCount(),
      turns: this.db.turns.getKeysCount(),
      auditEntries: this.db.audit.getKeysCount(),
      indexesLoaded: loaded.scopes,
      indexedMemories: loaded.documents,
      rebuilds,
      ...(rebuilds.length > 0 ? { lastRebuild: rebuilds[rebuilds.length - 1] } : {}),
      bytesOnDisk: folderBytes(this.dir),
      ...(this.index.lastSaveError === undefined ? {} : { indexSaveError: this.index.lastSaveError }),
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    try {
      this.index.close();
    } finally {
      await this.env.close();
    }
  }

  // ---- internals ----

  /**
   * A record read under key [userId, id], checked to be that record: its checksum covers its
   * bytes but not its key, and a damaged key must not hand one user's record to another.
   */
  private own<T extends { id: string; userId: string }>(record: T, userId: string, id: string): T;
  private own<T extends { id: string; userId: string }>(record: T | undefined, userId: string, id: string): T | undefined;
  private own<T extends { id: string; userId: string }>(record: T | undefined, userId: string, id: string): T | undefined {
    if (record !== undefined && (record.userId !== userId || record.id !== id)) {
      throw new StoreFileError(join(this.dir, STORE_FILE), "memory store", `is damaged: the record filed as ${id} of user ${JSON.stringify(userId)} is ${record.id} of user ${JSON.stringify(record.userId)}`);
    }
    return record;
  }

  private toVector(bytes: Uint8Array, userId: string, id: string): Float32Array {
    return readCheckedVector(bytes, this.embedder.dim, join(this.dir, STORE_FILE), `memory ${id} of user ${JSON.stringify(userId)}`);
  }

  private checkOpen(): void {
    if (this.closed) throw new MemoryStoreError(`the memory store ${this.dir} is closed`);
  }

  /** Messages' vectors; none for a blank message (an aborted answer may be empty), which recall skips. */
  private async embedMessages(texts: string[]): Promise<(Float32Array | undefined)[]> {
    const blank = (t: string) => t.trim() === "";
    const made = await this.embed(texts.filter((t) => !blank(t)));
    let next = 0;
    return texts.map((t) => (blank(t) ? undefined : made[next++]));
  }

  private async embed(texts: string[]): Promise<Float32Array[]> {
    const out: Float32Array[] = [];
    for (let i = 0; i < texts.length; i += EMBED_BATCH) {
      const batch = texts.slice(i, i + EMBED_BATCH);
      const vectors = await this.embedder.embed(batch);
      if (!Array.isArray(vectors) || vectors.length !== batch.length) throw new MemoryStoreError(`embedder ${this.embedder.id} returned ${Array.isArray(vectors) ? vectors.length : "no"} vectors for ${batch.length} texts`);
      for (const v of vectors) {
        if (!(v instanceof Float32Array) || v.length !== this.embedder.dim) throw new MemoryStoreError(`embedder ${this.embedder.id} returned a vector of ${v?.length} values; its dim is ${this.embedder.dim}`);
        if (!v.every(Number.isFinite)) throw new MemoryStoreError(`embedder ${this.embedder.id} returned a vector with a non-finite value`);
        out.push(v);
      }
    }
    return out;
  }

  /**
   * Applies a committed write to the user's loaded index. The write is already durable, so a
   * failure here must not read as a failed write: the index is dropped from memory instead, and
   * the next use reloads it from the store (a rebuild, reported, if its files are behind).
   */
  private indexed(userId: string, apply: () => void): void {
    try {
      apply();
    } catch {
      this.index.forget(userId);
    }
  }

  /**
   * Inside a transaction: creates the user if new and moves its generation on (index content
   * changes) to the store-wide counter's next value; returns the generation before and after.
   */
  private bumpUser(userId: string, now: number): { previous: number; next: number } {
    const u = this.db.users.get(userId) ?? { createdAt: now, generation: 0 };
    // Stores written before the counter existed hold per-user generations only: above both.
    const next = Math.max(u.generation, this.lastGeneration()) + 1;
    this.db.meta.putSync("generation", next);
    this.db.users.putSync(userId, { ...u, generation: next });
    return { previous: u.generation, next };
  }

  /** The last generation handed out in this store. */
  private lastGeneration(): number {
    return (this.db.meta.get("generation") as number | undefined) ?? 0;
  }

  /** Refuses to write or search vectors of this embedder once another process re-embedded the store with another. */
  private checkEmbedder(): void {
    const stored = this.db.meta.get("embedder") as { id: string; dim: number };
    if (stored.id !== this.embedder.id || stored.dim !== this.embedder.dim) {
      throw new MemoryStoreError(`${this.dir} was re-embedded with embedder ${stored.id} (${stored.dim} dimensions) by another process since this one opened it with ${this.embedder.id}; reopen it with that embedder`);
    }
  }

  private ensureUser(userId: string, now: number): void {
    if (this.db.users.get(userId) === undefined) this.db.users.putSync(userId, { createdAt: now, generation: 0 });
  }

  private touchSession(userId: string, sessionId: string, now: number): void {
    const s = this.db.sessions.get([userId, sessionId]);
    this.db.sessions.putSync([userId, sessionId], { createdAt: s?.createdAt ?? now, updatedAt: now });
  }

  /** Inside a transaction: writes an audit entry and, for memory actions, each memory's history pointer. */
  private writeAudit(entry: Omit<AuditEntry, "id" | "at">, now: number, history = true): AuditEntry {
    const full: AuditEntry = { id: newId("audit"), at: now, ...entry };
    if (full.sessionId === undefined) delete full.sessionId;
    this.db.audit.putSync([entry.userId, full.id], full);
    if (history) for (const id of entry.memoryIds) this.db.history.putSync([entry.userId, id, full.id], full.id);
    return full;
  }

  /** Inside a transaction: an audit entry about the store itself or an erased user, kept apart from every user's log. */
  private writeSystemAudit(entry: Omit<AuditEntry, "id" | "at">, now: number): void {
    const full: AuditEntry = { id: newId("audit"), at: now, ...entry };
    this.db.systemAudit.putSync(full.id, full);
  }

  private *documents(userId: string): Iterable<IndexedDocument> {
    for (const { key, value } of this.db.memories.getRange(prefixRange([userId]))) {
      this.own(value, userId, key[1]);
      const bytes = this.db.vectors.getBinary(key);
      if (bytes === undefined) throw new StoreFileError(join(this.dir, STORE_FILE), "memory store", `is damaged: memory ${value.id} of user ${JSON.stringify(userId)} has no vector`);
      yield { id: value.id, text: value.text, at: value.updatedAt, vector: this.toVector(bytes, userId, value.id) };
    }
  }

  /**
   * Re-embeds every memory, holding the folder's lock so that two processes never re-embed one
   * store at once; waits at most `waitMs` for another process's re-embedding to end.
   */
  private async reembedAlone(waitMs: number, onProgress?: (done: number, total: number) => void): Promise<void> {
    const lock = await acquireAlone(this.dir, "re-embedded", waitMs);
    try {
      const stored = this.db.meta.get("embedder") as { id: string; dim: number };
      // The process waited for may have re-embedded it with this very embedder.
      if (stored.id === this.embedder.id && stored.dim === this.embedder.dim) return;
      await this.reembedAll(stored, onProgress);
    } finally {
      lock.release();
    }
  }

  /**
   * Re-embeds every memory with this store's embedder, then switches the store over in one
   * transaction. Other processes may add memories (with the previous embedder) while this one
   * embeds: the switch then finds memories it has no vector for and embeds those too, until a
   * switch finds none; after it, their writes are refused (checkEmbedder).
   */
  private async reembedAll(previous: { id: string; dim: number }, onProgress?: (done: number, total: number) => void): Promise<void> {
    const done = new Map<string, { text: string; vector: Float32Array }>();
    // Messages are never changed once written: their vectors by [user, turn id].
    const doneTurns = new Map<string, Float32Array | undefined>();
    const keyOf = (key: Key) => JSON.stringify(key);
    const turnsNow = () => [...this.db.turns.getRange().map((e) => ({ key: [e.value.userId, e.value.id] as Key, text: e.value.content }))];
    for (let round = 0; ; round++) {
      const all = [...this.db.memories.getRange().map((e) => ({ key: e.key, text: e.value.text }))];
      const todo = all.filter((m) => done.get(keyOf(m.key))?.text !== m.text);
      if (round === 0) onProgress?.(0, todo.length);
      for (let i = 0; i < todo.length; i += EMBED_BATCH) {
        const batch = todo.slice(i, i + EMBED_BATCH);
        const vectors = await this.embed(batch.map((m) => m.text));
        batch.forEach((m, j) => done.set(keyOf(m.key), { text: m.text, vector: vectors[j] }));
        if (round === 0) onProgress?.(Math.min(i + EMBED_BATCH, todo.length), todo.length);
      }
      const turnsTodo = turnsNow().filter((t) => !doneTurns.has(keyOf(t.key)));
      const turnVectors = await this.embedMessages(turnsTodo.map((t) => t.text));
      turnsTodo.forEach((t, j) => doneTurns.set(keyOf(t.key), turnVectors[j]));
      const now = Date.now();
      const switched = this.env.transactionSync(() => {
        const current = [...this.db.memories.getRange().map((e) => ({ key: e.key, text: e.value.text }))];
        if (current.some((m) => done.get(keyOf(m.key))?.text !== m.text)) return false;
        const currentTurns = turnsNow();
        if (currentTurns.some((t) => !doneTurns.has(keyOf(t.key)))) return false;
        // Vectors of the previous embedder must not survive anywhere, so the whole tables are rewritten.
        for (const key of [...this.db.vectors.getKeys()]) this.db.vectors.removeSync(key);
        for (const m of current) this.db.vectors.putSync(m.key, checkedVectorBytes(done.get(keyOf(m.key))!.vector));
        for (const key of [...this.db.turnVectors.getKeys()]) this.db.turnVectors.removeSync(key);
        for (const t of currentTurns) {
          const v = doneTurns.get(keyOf(t.key));
          if (v !== undefined) this.db.turnVectors.putSync(t.key, checkedVectorBytes(v));
        }
        for (const userId of this.db.users.getKeys()) this.bumpUser(userId, now);
        for (const key of [...this.db.indexState.getKeys()]) this.db.indexState.removeSync(key);
        this.db.meta.putSync("embedder", { id: this.embedder.id, dim: this.embedder.dim });
        this.writeSystemAudit({ action: "store_reembed", userId: "", memoryIds: [], metadata: { from: previous.id, to: this.embedder.id, memories: current.length } }, now);
        return true;
      });
      if (switched) break;
      if (round >= 10) throw new MemoryStoreError(`${this.dir}: other processes kept adding memories while it was re-embedded (10 rounds); stop them and open it again with reembed`);
    }
    // The files of the previous vectors; the folder stays, other processes may be saving into it.
    const indexDir = join(this.dir, INDEX_DIR);
    for (const f of readdirSync(indexDir)) rmSync(join(indexDir, f), { force: true });
  }

  // ---- for the CLI's read commands and `dki stats` ----

  /** Whether `dir` holds a store file: read commands refuse a folder without one instead of creating a store. */
  static exists(dir: string): boolean {
    return existsSync(join(resolve(dir), STORE_FILE));
  }

  /** Sessions with any record, over all users. */
  sessionCount(): number {
    this.checkOpen();
    return this.db.sessions.getKeysCount();
  }

  /** Where the store's files are: the store file and the index folder. */
  get paths(): { storeFile: string; indexDir: string } {
    return { storeFile: join(this.dir, STORE_FILE), indexDir: join(this.dir, INDEX_DIR) };
  }
}

/**
 * Takes the folder's lock for a step that must run alone, waiting up to `waitMs` for a process
 * that holds it; the refusal names that process and what it is doing.
 */
async function acquireAlone(dir: string, activity: string, waitMs: number): Promise<FolderLock> {
  const start = Date.now();
  for (;;) {
    try {
      return await FolderLock.acquire(dir);
    } catch (e) {
      if (!(e instanceof FolderLockedError)) throw e;
      if (Date.now() - start >= waitMs) {
        let holder = Number.NaN;
        try {
          holder = Number.parseInt(readFileSync(join(dir, ".lock"), "utf8"), 10);
        } catch {
          // named as "another process" below
        }
        const who = Number.isInteger(holder) && holder > 0 ? `process ${holder}` : "another process";
        throw new MemoryStoreError(`the memory store ${dir} is being ${activity} by ${who}; waited ${(waitMs / 1000).toFixed(waitMs % 1000 === 0 ? 0 : 1)} s. Try again when it is done`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/** How an erasure's audit row names the user: a salted hash, so the log proves the erasure without keeping the id. */
export function erasedUserId(userId: string): string {
  return "erased:" + createHash("sha256").update("dki-memory-erased-user/v1\0").update(userId, "utf8").digest("hex").slice(0, 32);
}

/** Refuses a folder that holds anything a store would not put there, before writing to it. */
function checkForeign(dir: string): void {
  let entries: string[];
  try {
    if (!statSync(dir).isDirectory()) throw new MemoryStoreError(`${dir} is not a folder`);
    entries = readdirSync(dir);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e instanceof MemoryStoreError ? e : new MemoryStoreError(`cannot use ${dir} as a memory store folder: ${(e as Error).message}`);
    mkdirSync(dir, { recursive: true });
    return;
  }
  const foreign = entries.filter((e) => !OWN_ENTRIES.has(e) && !NEW_STORE_FILE.test(e));
  if (foreign.length > 0) {
    const shown = foreign.slice(0, 3).join(", ") + (foreign.length > 3 ? `, … (${foreign.length} in all)` : "");
    throw new MemoryStoreError(`${dir} is not a memory store folder: it holds ${shown}; use an empty or new folder`);
  }
}

function folderBytes(dir: string): number {
  let total = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) total += folderBytes(p);
    else if (e.isFile()) total += statSync(p).size;
  }
  return total;
}
