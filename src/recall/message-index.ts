// A user's conversation messages, indexed for recall: BM25 and per-term document sets over the
// messages' terms (text-terms.ts, CJK-aware), and their vectors (the store's embedder) in an exact
// FlatIndex. Derived data, kept in memory: the store's conversation records are the truth, and
// sync() brings the index in step with them before every recall (messages new to it take the
// vectors the store made when they were recorded, and only those it has none of are embedded
// here, in one batch; messages gone from the store are dropped), so a missing or stale index is
// never read.
import type { ConversationTurn, Embedder } from "../memory/types.js";
import { Bm25Index } from "../memory/retrieval/bm25.js";
import { FlatIndex } from "../memory/retrieval/flat-index.js";
import { terms } from "../memory/text-terms.js";
import { HISTORY_MARKERS } from "../dki/prompt.js";

/** The store's vectors of messages, by turn id, and the embedder that made them. */
export type StoredVectors = (ids: string[]) => Promise<{ embedderId: string; vectors: (Float32Array | undefined)[] }>;

export interface IndexedMessage {
  turn: ConversationTurn;
  /** The message's distinct terms. */
  termSet: ReadonlySet<string>;
}

export class MessageIndex {
  readonly bm25 = new Bm25Index();
  readonly dense: FlatIndex;
  private readonly byId = new Map<string, IndexedMessage>();
  /** term → ids of the messages holding it (document frequency for TF-IDF, keyword hits). */
  private readonly docs = new Map<string, Set<string>>();
  /** The user's messages as the last sync saw them, oldest first. */
  private order: IndexedMessage[] = [];

  constructor(private readonly embedder: Embedder) {
    this.dense = new FlatIndex(embedder.dim);
  }

  get size(): number {
    return this.byId.size;
  }

  get messages(): readonly IndexedMessage[] {
    return this.order;
  }

  get(id: string): IndexedMessage | undefined {
    return this.byId.get(id);
  }

  /** Messages (of the ids given) holding the term. */
  holders(term: string): ReadonlySet<string> | undefined {
    return this.docs.get(term);
  }

  /** Smoothed inverse document frequency (BM25's "+1" form, never negative). */
  idf(term: string): number {
    const df = this.docs.get(term)?.size ?? 0;
    return Math.log(1 + (this.size - df + 0.5) / (df + 0.5));
  }

  /**
   * Brings the index in step with the user's turns as the store lists them (oldest first). Only
   * user and assistant messages with text count, and none holding a history-template marker (seed 003 §7.2:
   * an echoed suffix must not be recalled into the next one).
   */
  async sync(turns: readonly ConversationTurn[], stored?: StoredVectors): Promise<{ added: number; removed: number; embedded: number }> {
    // A blank message (an answer aborted before its first token) has nothing to recall, and no vector.
    const live = turns.filter((t) => (t.role === "user" || t.role === "assistant") && t.content.trim() !== "" && !HISTORY_MARKERS.some((m) => t.content.includes(m)));
    const liveIds = new Set(live.map((t) => t.id));
    let removed = 0;
    for (const id of [...this.byId.keys()]) if (!liveIds.has(id)) this.remove(id), removed++;
    const fresh = live.filter((t) => !this.byId.has(t.id));
    const vectors: (Float32Array | undefined)[] = new Array(fresh.length).fill(undefined);
    if (fresh.length > 0 && stored !== undefined) {
      // Another embedder's vectors (a store opened with another one) are not comparable: unused.
      const s = await stored(fresh.map((t) => t.id));
      if (s.embedderId === this.embedder.id) s.vectors.forEach((v, i) => (vectors[i] = v?.length === this.embedder.dim ? v : undefined));
    }
    const missing = fresh.flatMap((t, i) => (vectors[i] === undefined ? [i] : []));
    if (missing.length > 0) {
      const made = await this.embedder.embed(missing.map((i) => fresh[i]!.content));
      if (made.length !== missing.length) throw new Error(`embedder ${this.embedder.id} returned ${made.length} vectors for ${missing.length} messages`);
      missing.forEach((i, j) => (vectors[i] = made[j]));
    }
    fresh.forEach((t, i) => this.add(t, vectors[i]!));
    this.order = live.map((t) => this.byId.get(t.id)!);
    return { added: fresh.length, removed, embedded: missing.length };
  }

  private add(turn: ConversationTurn, vector: Float32Array): void {
    const list = terms(turn.content);
    const termSet = new Set(list);
    this.bm25.add(turn.id, list);
    this.dense.add(turn.id, vector);
    for (const t of termSet) {
      let s = this.docs.get(t);
      if (s === undefined) this.docs.set(t, (s = new Set()));
      s.add(turn.id);
    }
    this.byId.set(turn.id, { turn, termSet });
  }

  private remove(id: string): void {
    const m = this.byId.get(id);
    if (m === undefined) return;
    this.bm25.remove(id);
    this.dense.remove(id);
    for (const t of m.termSet) {
      const s = this.docs.get(t)!;
      s.delete(id);
      if (s.size === 0) this.docs.delete(t);
    }
    this.byId.delete(id);
  }
}
