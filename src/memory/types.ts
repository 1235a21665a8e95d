// The memory layer's public types: the contract the DKI system and the RAG baseline build on.
// Scope (userId, sessionId) always comes from the API's own arguments, never from metadata:
// a caller's metadata cannot move a record to another user (mem0's known failure, designed out).
import type { Fusion } from "./retrieval/fusion.js";

/** JSON-serialisable metadata a caller attaches to a record. */
export type Metadata = { [key: string]: JsonValue };
export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };

/** Turns texts into unit-length vectors. `id` names the model and its settings: vectors of two ids are never mixed. */
export interface Embedder {
  readonly id: string;
  readonly dim: number;
  /**
   * DKI gating's default relevance threshold τ for this embedder's vectors: the cosine similarity
   * a query's best memory needs before memories are injected at all. How high a relevant memory
   * scores is a property of the embedder, so τ is measured per embedder on a labelled corpus
   * (calibrateRelevance, src/memory/calibrate.ts). Undefined: not calibrated, and gating falls back
   * to its own default. A DKI config that sets gating.relevanceThreshold overrides it.
   */
  readonly relevanceThreshold?: number;
  embed(texts: string[]): Promise<Float32Array[]>;
}

/**
 * Scores how relevant passages are to a query, reading each pair together (a cross-encoder),
 * finer than comparing two vectors made apart. `id` names the model, as Embedder.id does.
 */
export interface Reranker {
  readonly id: string;
  /** Relevance of each passage to the query, in [0, 1], higher is more relevant; one score per passage, in order. */
  score(query: string, passages: string[]): Promise<number[]>;
  close(): Promise<void>;
}

export interface Memory {
  id: string;
  userId: string;
  sessionId?: string;
  text: string;
  metadata: Metadata;
  createdAt: number; // ms since the epoch
  updatedAt: number;
  active: boolean;
}

export interface Preference {
  id: string;
  userId: string;
  text: string;
  type: string;
  priority: number; // higher first
  category?: string;
  active: boolean;
  createdAt: number;
  updatedAt: number;
}

export type Role = "user" | "assistant" | "system";

export interface ConversationTurn {
  id: string;
  userId: string;
  sessionId: string;
  role: Role;
  content: string; // the user's original query, never an assembled prompt
  injectionMode?: string; // "dki" | "rag" | "none" | …
  alpha?: number;
  memoryIds: string[];
  latencyMs?: number;
  createdAt: number;
  /** Imported history only (importConversations as "history"): the source's turn id, speaker, session and date. */
  metadata?: Metadata;
}

export interface AuditEntry {
  id: string;
  at: number;
  action: string;
  userId: string;
  sessionId?: string;
  memoryIds: string[];
  alpha?: number;
  mode?: string;
  metadata: Metadata;
}

/**
 * Per-signal scores of one search result, each in [0, 1]: cosine similarity (negative counts as
 * 0), BM25 divided by the best BM25 score among the candidates, and recency (1 now, ½ after the
 * half-life). Every candidate gets all three, whichever index surfaced it.
 */
export interface SearchSignals {
  dense: number;
  bm25: number;
  recency: number;
}

export interface SearchResult {
  memory: Memory;
  score: number;
  signals: SearchSignals;
}

/** A metadata filter: `{ eq: { key: value } }`, `{ in: { key: [values] } }`, `{ and: [...] }`, `{ or: [...] }`. */
export type Filter =
  | { eq: { [key: string]: JsonValue } }
  | { in: { [key: string]: JsonValue[] } }
  | { and: Filter[] }
  | { or: Filter[] };

export interface SearchOptions {
  userId: string;
  sessionId?: string;
  limit?: number; // default 5
  filter?: Filter;
  minScore?: number;
  /** How the signals combine (default: the store's, RRF k 60 over dense and BM25). */
  fusion?: Fusion;
  /** Recency half-life in ms (default 30 days). */
  halfLifeMs?: number;
  /** The time recency is measured at (default now): fixed, it makes results reproducible. */
  now?: number;
}

export interface AddMemoryOptions {
  userId: string;
  sessionId?: string;
  metadata?: Metadata;
}

/** What one chat turn writes, all in one transaction: the user row, the assistant row and the audit row. */
export interface TurnRecord {
  userId: string;
  sessionId: string;
  query: string; // the user's original query, never the assembled prompt
  response: string;
  injectionMode: string; // "dki" | "rag" | "none"
  alpha?: number;
  memoryIds: string[];
  latencyMs: number;
  auditAction: string; // e.g. "dki_generate", "rag_generate"
  auditMetadata?: Metadata;
}

/**
 * The surface of `MemoryStore` (src/memory/memory-store.ts) that the DKI system and the RAG
 * baseline use. Every call takes its scope as arguments; ids of another user read as "not found".
 */
export interface MemoryStoreApi {
  readonly embedder: Embedder;
  readonly memories: {
    add(input: string | { role: Role; content: string }[], opts: AddMemoryOptions): Promise<Memory[]>;
    search(query: string, opts: SearchOptions): Promise<SearchResult[]>;
    get(id: string, scope: { userId: string }): Promise<Memory | undefined>;
    getAll(opts: { userId: string; sessionId?: string; filter?: Filter }): Promise<Memory[]>;
    update(id: string, text: string, scope: { userId: string }): Promise<Memory>;
    delete(id: string, scope: { userId: string }): Promise<void>;
    history(id: string, scope: { userId: string }): Promise<AuditEntry[]>;
  };
  readonly preferences: {
    add(text: string, opts: { userId: string; type: string; priority?: number; category?: string }): Promise<Preference>;
    /** Active preferences first by priority (highest first), then by creation time. */
    list(scope: { userId: string; includeInactive?: boolean }): Promise<Preference[]>;
    update(id: string, patch: Partial<Pick<Preference, "text" | "type" | "priority" | "category" | "active">>, scope: { userId: string }): Promise<Preference>;
    delete(id: string, scope: { userId: string }): Promise<void>;
  };
  readonly conversations: {
    /** A session's turns, oldest first. */
    list(scope: { userId: string; sessionId: string; limit?: number }): Promise<ConversationTurn[]>;
    /** Writes the user row, the assistant row and the audit row of one turn in one transaction. */
    recordTurn(turn: TurnRecord): Promise<{ userTurn: ConversationTurn; assistantTurn: ConversationTurn; audit: AuditEntry }>;
    /** One turn by id, within the user (and the session, when given); any other reads as undefined. */
    get(id: string, scope: { userId: string; sessionId?: string }): Promise<ConversationTurn | undefined>;
    /** Every turn of the user across sessions, oldest first. */
    listUser(scope: { userId: string }): Promise<ConversationTurn[]>;
    /**
     * The messages' vectors by turn id, made by the store's embedder (named) when each was
     * recorded; undefined for one it has none of (recorded before the store kept them).
     */
    vectors(ids: string[], scope: { userId: string }): Promise<{ embedderId: string; vectors: (Float32Array | undefined)[] }>;
  };
  readonly audit: {
    list(scope: { userId: string; sessionId?: string; action?: string }): Promise<AuditEntry[]>;
  };
  close(): Promise<void>;
}
