// Where a turn's history suffix comes from. The flat provider here formats the session's last
// messages (seed 003 §7.1); Recall v4 (§5: multi-signal recall, summaries, fact calls) plugs in
// as another HistoryProvider without touching the system.
import type { Metadata, MemoryStoreApi } from "../memory/types.js";
import { formatHistory, type FormattedHistory, type HistoryLanguage, type HistoryMessage, type TokenCounter } from "./prompt.js";

export interface HistoryRequest {
  userId: string;
  sessionId: string;
  /** The user's query of this turn (a recall strategy searches with it). */
  query: string;
  language: HistoryLanguage;
  maxTokens: number;
  maxMessages: number;
  counter: TokenCounter;
  signal?: AbortSignal;
  /** The turn's context window less the system prompt (Recall v4 budgets the suffix from it). */
  contextSize?: number;
  /** Tokens of the preferences injected as K/V this turn. */
  preferenceTokens?: number;
}

export interface HistorySuffix extends FormattedHistory {
  /** Names the strategy, e.g. "flat_history" (reported in the response's metadata). */
  strategy: string;
  metadata?: Metadata;
}

export interface HistoryProvider {
  readonly strategy: string;
  suffix(req: HistoryRequest): Promise<HistorySuffix>;
  /** Drops whatever the provider keeps for a session (optional). */
  clearSession?(sessionId: string): void;
}

/** The session's most recent messages, oldest first, in the trust templates (§4.3, §7). */
export class FlatHistoryProvider implements HistoryProvider {
  readonly strategy = "flat_history";

  constructor(private readonly store: Pick<MemoryStoreApi, "conversations">) {}

  async suffix(req: HistoryRequest): Promise<HistorySuffix> {
    if (req.maxMessages === 0) return { ...formatHistory([], req.language, req.counter, req.maxTokens), strategy: this.strategy };
    const turns = await this.store.conversations.list({ userId: req.userId, sessionId: req.sessionId, limit: req.maxMessages });
    const messages: HistoryMessage[] = turns
      .filter((t) => t.role === "user" || t.role === "assistant")
      .slice(-req.maxMessages)
      .map((t) => ({ role: t.role as "user" | "assistant", content: t.content, id: t.id }));
    return { ...formatHistory(messages, req.language, req.counter, req.maxTokens), strategy: this.strategy };
  }
}
