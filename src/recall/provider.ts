// Recall v4 as the DKI system's HistoryProvider: MultiSignalRecall picks the messages,
// SuffixBuilder assembles the suffix, and the fact retriever answers the turn's fact calls, all
// scoped to the turn's user (and session, when recall.scope is "session").
import type { HistoryProvider, HistoryRequest, HistorySuffix } from "../dki/history.js";
import type { HistoryLanguage, TokenCounter } from "../dki/prompt.js";
import type { Embedder, MemoryStoreApi } from "../memory/types.js";
import type { RecallConfig } from "./config.js";
import { FactRetriever, type FactChunk, type FactRequest } from "./facts.js";
import { MultiSignalRecall, type RecallResult, type RecalledMessage } from "./recall.js";
import { SuffixBuilder, type AssembledSuffix } from "./suffix.js";

export interface RecallQuery {
  query: string;
  userId: string;
  sessionId: string;
  language: HistoryLanguage;
  counter: TokenCounter;
  contextWindow: number;
  preferenceTokens?: number;
}

export interface RecallOutcome {
  recall: RecallResult;
  suffix: AssembledSuffix;
  /** The recalled messages that made it into the suffix, in time order, each marked summarised or not. */
  included: (RecalledMessage & { summarized: boolean })[];
}

export class RecallHistoryProvider implements HistoryProvider {
  readonly strategy = "recall_v4";
  readonly recaller: MultiSignalRecall;
  readonly builder: SuffixBuilder;
  readonly facts: FactRetriever;

  constructor(store: Pick<MemoryStoreApi, "conversations">, embedder: Embedder, readonly config: RecallConfig) {
    this.recaller = new MultiSignalRecall(store, embedder, config);
    this.builder = new SuffixBuilder(config);
    this.facts = new FactRetriever(store);
  }

  /** Recall and suffix for a query, nothing generated. */
  async run(q: RecallQuery): Promise<RecallOutcome> {
    const recall = await this.recaller.recall({ query: q.query, userId: q.userId, sessionId: q.sessionId });
    const suffix = this.builder.build({ query: q.query, messages: recall.messages, contextWindow: q.contextWindow, preferenceTokens: q.preferenceTokens ?? 0, language: q.language, counter: q.counter });
    const summarized = new Map(suffix.items.map((i) => [i.id, i.summarized]));
    const included = recall.messages.filter((m) => summarized.has(m.id)).map((m) => ({ ...m, summarized: summarized.get(m.id)! }));
    return { recall, suffix, included };
  }

  async suffix(req: HistoryRequest): Promise<HistorySuffix> {
    // Without the turn's window (a caller that does not pass it), the flat budget stands in for it.
    const contextWindow = req.contextSize ?? req.maxTokens + this.config.budget.generation_reserve;
    const { recall, suffix, included } = await this.run({ ...req, contextWindow, preferenceTokens: req.preferenceTokens });
    return {
      strategy: this.strategy,
      text: suffix.text,
      tokens: suffix.tokens,
      messages: included.map((m) => ({ role: m.role, content: m.content, id: m.id })),
      skippedForMarkers: 0,
      truncated: suffix.leftOut.length,
      metadata: {
        traceIds: suffix.traceIds,
        summaryCount: suffix.summaryCount,
        messageCount: suffix.messageCount,
        available: suffix.available,
        keywords: recall.keywords,
        reference: recall.reference?.phrase ?? null,
        searched: recall.searched,
        recalled: included.map((m) => ({ id: m.id, score: m.score, reason: m.reason, summarized: m.summarized, signals: { ...m.signals } })),
      },
    };
  }

  /** A fact call of a turn: resolved only within the turn's user (and session, by scope). */
  retrieveFact(req: FactRequest, scope: { userId: string; sessionId: string }): Promise<FactChunk | undefined> {
    const limit = req.limit ?? undefined;
    return this.facts.retrieve(req.traceId, this.config.scope === "session" ? scope : { userId: scope.userId }, { offset: req.offset, limit });
  }
}
