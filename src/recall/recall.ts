// MultiSignalRecall (seed 003 §5.3): which of a user's past messages matter for this query.
//
//   keyword    the query's TF-IDF keywords (keyword_topk; idf over the user's messages): the share of
//              the keywords' idf a message holds
//   bm25       BM25 of the query over the messages, divided by the best score
//   vector     cosine of query and message (the store's embedder), clipped to [0, 1], at or above
//              vector_threshold, among the vector_top_k nearest
//   recency    0.5^(newer messages / recency_half_life), every candidate
//   reference  "刚才 / just now" narrows the search to the newest messages and doubles recency's
//              weight; "上次 / earlier / last time" widens it (recency off, twice the candidates)
//
// Fused as Σ wᵢ·signalᵢ / Σ wᵢ before ranking (so recency does change the order), the best
// `limit` kept, the newest min_recent_turns turns always added and up to max_recent_turns turns
// offered after them; the result comes back in time order, each message with its score, signals
// and priority (the order a suffix builder should spend its budget in).
import type { ConversationTurn, Embedder, MemoryStoreApi, Metadata } from "../memory/types.js";
import { STOP_WORDS, terms } from "../memory/text-terms.js";
import { DkiArgumentError } from "../errors.js";
import type { RecallConfig, RecallScope } from "./config.js";
import { MessageIndex } from "./message-index.js";

export interface RecallSignals {
  keyword: number;
  bm25: number;
  vector: number;
  recency: number;
}

export type RecallReason = "signal" | "recent" | "recent-extra";

export interface RecalledMessage {
  id: string;
  sessionId: string;
  role: "user" | "assistant";
  content: string;
  createdAt: number;
  score: number;
  signals: RecallSignals;
  /** Why it is here: it scored ("signal"), it is one of the min_recent_turns ("recent") or the max_recent_turns ("recent-extra"). */
  reason: RecallReason;
  /** 0 first: the order a budget is spent in (the required recent turns, then by score, then the extra recent turns). */
  priority: number;
  /** An imported message's source turn id, speaker and date (see importConversations as "history"). */
  metadata?: Metadata;
}

export type ReferenceKind = "recent" | "earlier";

export interface ReferenceResolution {
  kind: ReferenceKind;
  /** The phrase that decided it. */
  phrase: string;
}

export interface RecallResult {
  /** In time order. */
  messages: RecalledMessage[];
  keywords: string[];
  reference: ReferenceResolution | null;
  /** Messages searched (the scope's, after the marker filter). */
  searched: number;
}

export interface RecallRequest {
  query: string;
  userId: string;
  sessionId: string;
  /** Default: the config's scope. */
  scope?: RecallScope;
  /** Signal-ranked messages kept at most (default 30). */
  limit?: number;
}

// Longer phrases first, so "刚才说的" is not read as something shorter.
const RECENT_PHRASES = ["刚才", "刚刚", "方才", "just now", "a moment ago", "you just said", "just said", "just mentioned"];
const EARLIER_PHRASES = ["上次", "之前", "以前", "早些时候", "那次", "earlier", "last time", "previously", "a while ago", "the other day", "before"];

/** The seed's ReferenceResolver: whether the query points at the last moments or further back. */
export function resolveReference(query: string): ReferenceResolution | null {
  const q = query.toLowerCase();
  const hit = (phrase: string) => (/^[a-z ]+$/.test(phrase) ? new RegExp(`\\b${phrase}\\b`).test(q) : q.includes(phrase));
  for (const phrase of RECENT_PHRASES) if (hit(phrase)) return { kind: "recent", phrase };
  for (const phrase of EARLIER_PHRASES) if (hit(phrase)) return { kind: "earlier", phrase };
  return null;
}

/** Messages the "recent" reference narrows the search to, per max_recent_turns. */
const RECENT_WINDOW_PER_TURN = 4;

export class MultiSignalRecall {
  private readonly indexes = new Map<string, MessageIndex>();

  constructor(
    private readonly store: Pick<MemoryStoreApi, "conversations">,
    private readonly embedder: Embedder,
    readonly config: RecallConfig,
  ) {}

  /** The user's message index, in step with the store. */
  async index(userId: string): Promise<MessageIndex> {
    let ix = this.indexes.get(userId);
    if (ix === undefined) this.indexes.set(userId, (ix = new MessageIndex(this.embedder)));
    await ix.sync(await this.store.conversations.listUser({ userId }), (ids) => this.store.conversations.vectors(ids, { userId }));
    return ix;
  }

  /** Forgets a user's index (rebuilt from the store on the next recall). */
  forget(userId: string): void {
    this.indexes.delete(userId);
  }

  async recall(req: RecallRequest): Promise<RecallResult> {
    if (typeof req.query !== "string" || req.query.trim() === "") throw new DkiArgumentError("recall: the query is empty");
    const c = this.config;
    const s = c.signals;
    const scope = req.scope ?? c.scope;
    const limit = req.limit ?? 30;
    if (!Number.isSafeInteger(limit) || limit < 0) throw new DkiArgumentError(`recall: limit must be an integer >= 0, got ${limit}`);
    const ix = await this.index(req.userId);
    let pool = ix.messages.filter((m) => scope === "user" || m.turn.sessionId === req.sessionId).map((m) => m.turn);
    const reference = s.reference_enabled ? resolveReference(req.query) : null;
    const w = { ...s.weights };
    let keep = limit;
    if (reference?.kind === "recent") {
      pool = pool.slice(-RECENT_WINDOW_PER_TURN * Math.max(1, c.budget.max_recent_turns));
      w.recency *= 2;
    } else if (reference?.kind === "earlier") {
      w.recency = 0;
      keep *= 2;
    }
    if (!s.keyword_enabled) w.keyword = 0;
    if (!s.vector_enabled) w.vector = 0;
    const inPool = new Set(pool.map((t) => t.id));
    const accept = (id: string) => inPool.has(id);
    const position = new Map(pool.map((t, i) => [t.id, i]));

    const signals = new Map<string, RecallSignals>();
    const entry = (id: string) => {
      let e = signals.get(id);
      if (e === undefined) signals.set(id, (e = { keyword: 0, bm25: 0, vector: 0, recency: 0 }));
      return e;
    };
    const queryTerms = terms(req.query);
    const keywords = w.keyword > 0 ? this.keywords(ix, queryTerms) : [];
    if (keywords.length > 0) {
      const total = keywords.reduce((sum, k) => sum + ix.idf(k), 0);
      for (const k of keywords) {
        const idf = ix.idf(k) / total;
        for (const id of ix.holders(k) ?? []) if (inPool.has(id)) entry(id).keyword += idf;
      }
    }
    if (w.bm25 > 0) {
      const hits = ix.bm25.search(queryTerms, Math.max(keep, 1) * 4, accept);
      const best = hits[0]?.score ?? 0;
      for (const h of hits) if (best > 0) entry(h.id).bm25 = h.score / best;
    }
    if (w.vector > 0 && pool.length > 0) {
      const [qv] = await this.embedder.embed([req.query]);
      for (const h of ix.dense.search(qv!, s.vector_top_k, accept)) if (h.similarity >= s.vector_threshold && h.similarity > 0) entry(h.id).vector = Math.min(1, h.similarity);
    }
    const weightSum = w.keyword + w.bm25 + w.vector + w.recency;
    const scoreOf = (id: string, e: RecallSignals) => {
      e.recency = Math.pow(0.5, (pool.length - 1 - position.get(id)!) / s.recency_half_life);
      return weightSum === 0 ? 0 : (w.keyword * e.keyword + w.bm25 * e.bm25 + w.vector * e.vector + w.recency * e.recency) / weightSum;
    };
    const ranked = [...signals].map(([id, e]) => ({ id, e, score: scoreOf(id, e) }));
    ranked.sort((a, b) => b.score - a.score || position.get(b.id)! - position.get(a.id)!);

    const out = new Map<string, RecalledMessage>();
    const put = (t: ConversationTurn, reason: RecallReason, priority: number) => {
      if (out.has(t.id)) return;
      const e = signals.get(t.id) ?? { keyword: 0, bm25: 0, vector: 0, recency: 0 };
      const score = scoreOf(t.id, e);
      out.set(t.id, { id: t.id, sessionId: t.sessionId, role: t.role as "user" | "assistant", content: t.content, createdAt: t.createdAt, score, signals: e, reason, priority, ...(t.metadata ? { metadata: t.metadata } : {}) });
    };
    let priority = 0;
    // Required recent turns first: a turn is a user message and its answer.
    for (const t of pool.slice(-2 * c.budget.min_recent_turns).reverse()) put(t, "recent", priority++);
    for (const r of ranked.slice(0, keep)) put(pool[position.get(r.id)!]!, "signal", priority++);
    for (const t of pool.slice(-2 * c.budget.max_recent_turns).reverse()) put(t, "recent-extra", priority++);
    const messages = [...out.values()].sort((a, b) => position.get(a.id)! - position.get(b.id)!);
    return { messages, keywords, reference, searched: pool.length };
  }

  /**
   * The query's keyword_topk keywords by TF-IDF (tf in the query × idf over the user's messages):
   * stop words and terms no message holds are left out; English words count as Chinese ones do.
   */
  private keywords(ix: MessageIndex, queryTerms: readonly string[]): string[] {
    const tf = new Map<string, number>();
    for (const t of queryTerms) if (!STOP_WORDS.has(t) && ix.holders(t) !== undefined) tf.set(t, (tf.get(t) ?? 0) + 1);
    return [...tf]
      .map(([t, n]) => ({ t, w: n * ix.idf(t) }))
      .sort((a, b) => b.w - a.w || (a.t < b.t ? -1 : 1))
      .slice(0, this.config.signals.keyword_topk)
      .map((k) => k.t);
  }
}
