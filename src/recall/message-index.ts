// A user's conversation messages, indexed for recall: BM25 and per-term document sets over the
// messages' terms (text-terms.ts, CJK-aware), and their vectors (the store's embedder) in an exact
// FlatIndex. Derived data, kept in memory: the store's conversation records are the truth, and
// sync() brings the index in step with them before every recall (messages new to it embedded in
// one batch, messages gone from the store dropped), so a missing or stale index is never read.
import type { ConversationTurn, Embedder } from "../memory/types.js";
import { Bm25Index } from "../memory/retrieval/bm25.js";
import { FlatIndex } from "../memory/retrieval/flat-index.js";
import { terms } from "../memory/text-terms.js";
import { HISTORY_MARKERS } from "../dki/prompt.js";

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
   * user and assistant messages count, and none holding a history-template marker (seed 003 §7.2:
   * an echoed suffix must not be recalled into the next one).
   */
  async sync(turns: readonly ConversationTurn[]): Promise<{ added: number; removed: number }> {
    const live = turns.filter((t) => (t.role === "user" || t.role === "assistant") && !HISTORY_MARKERS.some((m) => t.content.includes(m)));
    const liveIds = new Set(live.map((t) => t.id));
    let removed = 0;
    for (const id of [...this.byId.keys()]) if (!liveIds.has(id)) this.remove(id), removed++;
    const fresh = live.filter((t) => !this.byId.has(t.id));
    if (fresh.length > 0) {
      const vectors = await this.embedder.embed(fresh.map((t) => t.content));
      if (vectors.length !== fresh.length) throw new Error(`embedder ${this.embedder.id} returned ${vectors.length} vectors for ${fresh.length} messages`);
      fresh.forEach((t, i) => this.add(t, vectors[i]!));
    }
    this.order = live.map((t) => this.byId.get(t.id)!);
    return { added: fresh.length, removed };
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
