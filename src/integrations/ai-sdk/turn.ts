// One AI SDK call as one turn of the provider's system ("dki": DKISystem; "none": DKISystem with
// no K/V; "rag": RAGSystem on the same store), and the turn's answer in the specification's terms:
// finish reason, usage and the `dki` provider metadata.
import type { LanguageModelV3FinishReason, LanguageModelV3Usage, SharedV3Warning } from "@ai-sdk/provider";
import type { FinishReason } from "../../engine/generate.js";
import type { DKIResponse, DKISystem } from "../../dki/system.js";
import type { LatencyBreakdown } from "../../dki/budget.js";
import type { MemoryStoreApi } from "../../memory/types.js";
import type { RAGResponse, RAGSystem } from "../../rag/rag-system.js";
import type { DkiCall, PriorMessage } from "./call.js";

/** The systems a provider has opened: one store, one model, both systems on them. */
export interface DkiSystems {
  dki: DKISystem;
  rag(): Promise<RAGSystem>;
}

export interface TurnOutcome {
  text: string;
  finishReason: LanguageModelV3FinishReason;
  usage: LanguageModelV3Usage;
  metadata: TurnMetadata;
}

/**
 * A turn's stage times in milliseconds: the systems' own breakdown, as a type alias (an
 * interface has no implicit index signature, so it would not be assignable to the SDK's JSON).
 */
export type TurnLatency = { [K in keyof LatencyBreakdown]: LatencyBreakdown[K] };

type MemoryMeta = { id: string; text: string; score: number; relevance: number; tokens: number };
type Common = {
  userId: string;
  sessionId: string;
  memories: MemoryMeta[];
  memoriesLeftOut: { id: string; reason: string }[];
  promptTokens: number;
  memoryTokens: number;
  outputTokens: number;
  ttftMs: number;
  latency: TurnLatency;
  /** The engine's own finish reason. */
  finishReason: FinishReason;
};

/**
 * `providerMetadata.dki` of a "dki" or "none" turn. Both providers (in-process and `dki serve`)
 * build this one type, so an application reads the same fields whichever it is configured with.
 * (Type aliases, not interfaces: the SDK's metadata is a JSON object, which an interface is not.)
 */
export type DkiTurnMetadata = Common & {
  mode: "dki" | "none";
  injected: boolean;
  alpha: number;
  gateReason: string;
  forced: boolean;
  relevance: number;
  entropy: number | null;
  tiers: { kind: "preferences" | "memory"; id: string | null; tier: string; loadMs: number; tokens: number; alpha: number }[];
  cacheHit: boolean;
  preferenceTokens: number;
  historyTokens: number;
};

/** `providerMetadata.dki` of a "rag" turn: the memories went into the prompt as text. */
export type RagTurnMetadata = Common & {
  mode: "rag";
  injected: false;
  alpha: null;
  gateReason: null;
  tiers: [];
  contextTokens: number;
};

export type TurnMetadata = DkiTurnMetadata | RagTurnMetadata;

/**
 * A turn's answer in the specification's terms, from its text and metadata alone: the one place
 * finish reason and usage are derived, whichever provider ran the turn.
 */
export function turnOutcome(text: string, metadata: TurnMetadata): TurnOutcome {
  // Blocks served from L1–L3 were read from the cache; L4 ones were computed for this turn.
  const fromCache = metadata.tiers.filter((b) => b.tier !== "L4").reduce((s, b) => s + b.tokens, 0);
  return {
    text,
    finishReason: finishReason(metadata.finishReason),
    usage: usage(metadata.promptTokens, metadata.outputTokens, { total: metadata.memoryTokens, fromCache, computed: metadata.memoryTokens - fromCache }),
    metadata,
  };
}

/** Runs the call's turn; `onText` sees the answer as it streams. */
export async function runTurn(systems: DkiSystems, call: DkiCall, signal: AbortSignal | undefined, onText?: (text: string) => void): Promise<TurnOutcome> {
  const base = {
    userId: call.dki.userId,
    sessionId: call.dki.sessionId,
    maxNewTokens: call.maxNewTokens,
    sampling: call.sampling,
    stop: call.stop,
    systemPrompt: call.systemPrompt,
    signal,
    onToken: onText === undefined ? undefined : (text: string) => onText(text),
  };
  if (call.modelId === "rag") return ragOutcome(await (await systems.rag()).chat(call.query, base));
  const r = await systems.dki.chat(call.query, { ...base, forceAlpha: call.dki.alpha, allowInjection: call.modelId === "dki" });
  return dkiOutcome(r, call.modelId);
}

/**
 * A turn reads its history from the session's record in the store, so earlier messages the
 * caller sends are not shown to the model as such. They normally are that record (the answers
 * this provider gave, sent back by the app); where they are not, the model did not see them, and
 * the call says so rather than answer as if it had.
 */
export async function priorWarnings(store: MemoryStoreApi, call: DkiCall): Promise<SharedV3Warning[]> {
  if (call.prior.length === 0) return [];
  const turns = await store.conversations.list({ userId: call.dki.userId, sessionId: call.dki.sessionId });
  return priorWarningsAgainst(call, turns.map((t) => ({ role: t.role, text: t.content })));
}

/** The warning of `priorWarnings`, given the session's recorded messages (from the store or from a server). */
export function priorWarningsAgainst(call: DkiCall, turns: readonly { role: string; text: string }[]): SharedV3Warning[] {
  if (call.prior.length === 0) return [];
  const recorded: PriorMessage[] = turns.filter((t) => t.role === "user" || t.role === "assistant").map((t) => ({ role: t.role as PriorMessage["role"], text: t.text }));
  const tail = recorded.slice(-call.prior.length);
  const same = tail.length === call.prior.length && tail.every((m, i) => m.role === call.prior[i]!.role && m.text.trim() === call.prior[i]!.text.trim());
  if (same) return [];
  return [
    {
      type: "other",
      message: `${call.prior.length} earlier message(s) of the prompt are not the recorded turns of session ${JSON.stringify(call.dki.sessionId)} (${recorded.length} recorded messages), and the model did not see them: a DKI turn reads its history from the session's record in the store, not from the prompt`,
    },
  ];
}

/** The engine's finish reasons in the specification's terms, the engine's own kept as `raw`. */
export function finishReason(r: FinishReason): LanguageModelV3FinishReason {
  switch (r) {
    case "eos":
    case "stop":
      return { unified: "stop", raw: r };
    case "length":
    case "context": // the context window filled up: a length limit too
      return { unified: "length", raw: r };
    case "aborted":
      return { unified: "other", raw: r };
  }
}

/**
 * Every count the engine knows is given as a number, never left out: a count a provider leaves
 * out is one the SDK's users see as 0 or as missing, though it was known. The prompt is prefilled whole each turn, so no prompt token is read
 * from or written to a prompt cache (cacheRead/cacheWrite 0, known); the model reasons in no
 * separate channel (reasoning 0). The memory reaches attention as K/V, not as prompt tokens: its
 * tokens are in `raw` (and the `dki` metadata), split by whether the cache served them.
 */
function usage(promptTokens: number, outputTokens: number, memory: { total: number; fromCache: number; computed: number }): LanguageModelV3Usage {
  return {
    inputTokens: { total: promptTokens, noCache: promptTokens, cacheRead: 0, cacheWrite: 0 },
    outputTokens: { total: outputTokens, text: outputTokens, reasoning: 0 },
    raw: { promptTokens, outputTokens, memoryTokens: memory.total, memoryTokensFromCache: memory.fromCache, memoryTokensComputed: memory.computed },
  };
}

function dkiOutcome(r: DKIResponse, mode: "dki" | "none"): TurnOutcome {
  const h = r.metadata.hybridInjection;
  return turnOutcome(r.text, {
    mode,
    userId: r.metadata.userId,
    sessionId: r.metadata.sessionId,
    memories: r.memoriesUsed.map((m) => ({ id: m.id, text: m.text, score: m.score, relevance: m.relevance, tokens: m.tokens })),
    memoriesLeftOut: r.metadata.memoriesLeftOut.map((l) => ({ id: l.id, reason: l.reason })),
    injected: r.gating.inject,
    alpha: r.gating.alpha,
    gateReason: r.gating.reason,
    forced: r.gating.forced,
    relevance: r.gating.relevance,
    entropy: r.gating.entropy,
    tiers: r.cache.tiers.map((b) => ({ kind: b.kind, id: b.id ?? null, tier: b.tier, loadMs: b.loadMs, tokens: b.tokens, alpha: b.alpha })),
    cacheHit: r.cache.hit,
    promptTokens: r.inputTokens,
    memoryTokens: r.budget.memoryTokens,
    preferenceTokens: h.preferenceTokens,
    historyTokens: h.historyTokens,
    outputTokens: r.outputTokens,
    ttftMs: r.latency.ttftMs,
    latency: { ...r.latency, kvLoadMs: { ...r.latency.kvLoadMs } },
    finishReason: r.finishReason,
  });
}

function ragOutcome(r: RAGResponse): TurnOutcome {
  return turnOutcome(r.text, {
    mode: "rag",
    userId: r.metadata.userId,
    sessionId: r.metadata.sessionId,
    memories: r.memoriesUsed.map((m) => ({ id: m.id, text: m.text, score: m.score, relevance: m.relevance, tokens: m.tokens })),
    memoriesLeftOut: r.metadata.memoriesLeftOut.map((l) => ({ id: l.id, reason: l.reason })),
    // Memories go into the prompt as text: nothing is injected, no α, no gate, no K/V tiers.
    injected: false,
    alpha: null,
    gateReason: null,
    tiers: [],
    promptTokens: r.inputTokens,
    contextTokens: r.metadata.contextTokens,
    memoryTokens: 0,
    outputTokens: r.outputTokens,
    ttftMs: r.latency.ttftMs,
    latency: { ...r.latency, kvLoadMs: { ...r.latency.kvLoadMs } },
    finishReason: r.finishReason,
  });
}
