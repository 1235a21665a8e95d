// DKISystem: one chat turn as seed 003 §8 describes it, done right.
//
//   route    the user's memories for the query (the memory layer's fused search)
//   prompt   active preferences → one text; session history → the trust-template suffix;
//            System → History → Query through the chat template (history dropped if it would
//            leave the answer less than generationReserve tokens)
//   queue    one turn at a time on the model, round-robin over users (FairQueue)
//   gate     relevance decides whether, the entropy of the bare query how strongly (gating.ts)
//   assemble preference block (preferenceAlpha) then memory blocks (the gate's α), each from the
//            tiered cache or computed there, at [−M, −1] by the engine's shift (assembly.ts)
//   generate stream tokens; an abort cancels this turn only
//   record   user row (the original query), assistant row, audit row: one transaction
//
// Preferences reach the model as K/V only, history as text only, and each segment's α is applied
// once, by the engine. The system depends on the engine's public API (Model, TieredKVCache,
// KVBlock) and the memory layer's MemoryStoreApi.
import { performance } from "node:perf_hooks";
import type { Model, InjectionOptions, PositionStrategy, Segment } from "../engine/model.js";
import type { FinishReason, GenerateResult } from "../engine/generate.js";
import type { TieredKVCache, CacheStats, Tier } from "../cache/tiered-cache.js";
import { DkiArgumentError } from "../errors.js";
import type { MemoryStoreApi } from "../memory/types.js";
import { afterBos, applyBlockFix, assembleBlocks, systemTurnTokens, type Assembly, type BlockSpec } from "./assembly.js";
import { addBlockLoads, analyzeBudget, emptyLatency, layerCostMs, type BudgetAnalysis, type LatencyBreakdown } from "./budget.js";
import type { BlockFix, DKIConfig, EncodingPrefix, MemoryEncoding, MemoryOrder } from "./config.js";
import { FairQueue } from "./fair-queue.js";
import { checkForceAlpha, decideGating, type GatingDecision } from "./gating.js";
import { checkTurn, closeSystem, openSystem, SessionTurns, TurnLedger, type SystemOpenOptions, type TurnOptions } from "./open.js";
import { FlatHistoryProvider, type HistoryProvider, type HistorySuffix } from "./history.js";
import { buildHybridPrompt, detectLanguage, mergePreferences, renderPrompt, TokenMemo, type HistoryLanguage, type HistoryMessage, type HybridPrompt } from "./prompt.js";
import { routedList, routeMemories, type MemoryRerank, type Routed, type RoutedMemory } from "./routing.js";
import { RecallHistoryProvider, type RecallOutcome } from "../recall/provider.js";
import { runFactCallLoop, type FactCallRound, type FactLoopResult } from "../recall/facts.js";
import { formattedTokenizer, type FormattableTokenizer } from "../recall/formatters.js";

export interface DKISystemOptions extends SystemOpenOptions {
  /** Where history comes from (default: the session's recent messages, FlatHistoryProvider). */
  history?: (store: MemoryStoreApi) => HistoryProvider;
}

/** Sessions whose injected blocks clearSessionCache can find (the most recently active). */
export const TRACKED_SESSIONS = 10_000;

/** Texts (memories, merged preferences, history messages) whose tokens are remembered across turns. */
const ENCODED_TEXTS = 4096;

export interface ChatOptions extends TurnOptions {
  /** α for the memories routed to the turn, whatever the gate would say. */
  forceAlpha?: number;
  /** false: no K/V this turn (neither memories nor preferences); the history stays. */
  allowInjection?: boolean;
  /** The gate's τ for this turn, in [0, 1] (default config.gating.relevanceThreshold). */
  relevanceThreshold?: number;
}

export interface MemoryUsed {
  id: string;
  text: string;
  /** The memory store's fused score (routing order). */
  score: number;
  /** What gating read as its relevance (config.gating.relevanceSignal). */
  relevance: number;
  tokens: number;
}

/** Where one injected block came from. */
export interface BlockOrigin {
  kind: "preferences" | "memory";
  /** The memory's id (memories only; a joint block's is its memories' ids joined by "+"). */
  id?: string;
  tier: Tier;
  loadMs: number;
  tokens: number;
  alpha: number;
}

export interface HybridInjectionInfo {
  /** Preferences were injected as K/V this turn. */
  enabled: boolean;
  preferenceTokens: number;
  preferenceAlpha: number;
  preferenceText: string;
  historyTokens: number;
  historySuffixText: string;
  historyMessages: HistoryMessage[];
  historyStrategy: string;
  historyLanguage: HistoryLanguage;
  /** Messages skipped for holding a template marker / oldest dropped to fit historyMaxTokens. */
  historySkippedForMarkers: number;
  historyTruncated: number;
  /** The history was dropped to leave the answer generationReserve tokens. */
  historyDropped: boolean;
  /** The prompt as the model got it (after the chat template). */
  finalInput: string;
}

/** A routed memory the turn did not inject, and why. */
export interface LeftOut {
  id: string;
  reason: string;
}

/** What Recall v4 did this turn (metadata.recallV4). */
export interface RecallV4Info {
  /** Trace ids of the summaries in the suffix. */
  traceIds: string[];
  summaryCount: number;
  messageCount: number;
  /** Fact-call rounds that generated again (0 when the model called none). */
  rounds: number;
  calls: FactCallRound[];
  factTokens: number;
  stoppedBy: FactLoopResult<unknown>["stoppedBy"] | "fact_calls_off";
}

export interface DKIMetadata {
  model: { dir: string; fingerprint: string };
  userId: string;
  sessionId: string;
  positions: PositionStrategy;
  encodingPrefix: EncodingPrefix;
  /** The fix applied to the separately encoded blocks (config.blockFix). */
  blockFix: BlockFix;
  memoryOrder: MemoryOrder;
  memoryEncoding: MemoryEncoding;
  /** The layer's own time (total − prefill − decode − K/V computes − queue − entropy probe). */
  layerMs: number;
  /** What routing returned, in its order, before the gate and the token budget (none when injection is off). */
  routed: RoutedMemory[];
  /** Routed memories the gate let through but the turn did not inject (below τ themselves, over the token budget). */
  memoriesLeftOut: LeftOut[];
  hybridInjection: HybridInjectionInfo;
  /** Present when Recall v4 provided the history. */
  recallV4?: RecallV4Info;
}

/** One turn's answer with every decision behind it (seed 003 §2.1). */
export interface DKIResponse {
  text: string;
  finishReason: FinishReason;
  /** The memories injected, in injection order. */
  memoriesUsed: MemoryUsed[];
  gating: GatingDecision;
  /** hit: every injected block came from L1–L3 (false when none was injected). */
  cache: { hit: boolean; tiers: BlockOrigin[] };
  budget: BudgetAnalysis;
  latency: LatencyBreakdown;
  /** Prompt tokens prefilled (n_u). */
  inputTokens: number;
  outputTokens: number;
  metadata: DKIMetadata;
}

export interface DKIStats {
  turns: number;
  /** Turns that failed or were aborted (nothing recorded for them). */
  failedTurns: number;
  waiting: number;
  /** Mean of each stage over the recorded turns. */
  meanLatency: LatencyBreakdown;
  cache: CacheStats;
}

/** A turn's routing, prompt and preference text, before the model is involved. */
interface Plan {
  routed: Routed[];
  prompt: HybridPrompt;
  history: HistorySuffix | null;
  language: HistoryLanguage;
  preferences: { text: string; tokens: number };
  prefix: number[];
  systemPrompt: string | undefined;
  useTemplate: boolean;
}

/** The injection of a turn, ready for the engine. */
interface Prepared {
  gating: GatingDecision;
  assembly: Assembly | null;
  memories: MemoryUsed[];
  preferenceInjected: boolean;
  leftOut: LeftOut[];
  injection: InjectionOptions;
}

export class DKISystem {
  private readonly queue = new FairQueue();
  /** Counts and encodes block texts and history; remembers the texts of recent turns. */
  private readonly counter: TokenMemo;
  private readonly ledger = new TurnLedger("DKISystem");
  private readonly sessions = new SessionTurns();
  private readonly sessionKeys = new Map<string, Set<string>>();

  private constructor(
    readonly model: Model,
    private readonly ownsModel: boolean,
    readonly store: MemoryStoreApi,
    readonly cache: TieredKVCache,
    readonly config: DKIConfig,
    private readonly history: HistoryProvider,
    private readonly memoryRerank: MemoryRerank | undefined,
  ) {
    this.counter = new TokenMemo(model.tokenizer, ENCODED_TEXTS);
    this.recallV4 = history instanceof RecallHistoryProvider ? history : null;
    this.promptTok = this.recallV4 === null ? model.tokenizer : formattedTokenizer(model.tokenizer, config.recall.prompt_formatter);
  }

  /** The history provider when it is Recall v4 (fact calls need it). */
  private readonly recallV4: RecallHistoryProvider | null;
  /** The tokenizer as prompts are framed with: Recall v4's prompt_formatter applied (the model's own otherwise). */
  private readonly promptTok: FormattableTokenizer;

  static async open(o: DKISystemOptions): Promise<DKISystem> {
    return openSystem("DKISystem", o, async (p) => {
      const cache = await p.openCache();
      const { store, config } = await p.openStore();
      const fix = config.blockFix.kind;
      // (What was opened is closed again by openSystem.)
      if (p.model.info.device === "cuda" && (fix === "cacheblend" || fix === "ape")) {
        throw new DkiArgumentError(`config.blockFix ${JSON.stringify(fix)} runs on the CPU only; this model is loaded on CUDA (use "none" or "epic" there)`);
      }
      const r = config.recall;
      const history = o.history ? o.history(store) : r.enabled && r.strategy === "summary_with_fact_call" ? new RecallHistoryProvider(store, store.embedder, r) : new FlatHistoryProvider(store);
      return new DKISystem(p.model, p.ownsModel, store, cache, config, history, o.memoryRerank);
    }, () => {
      // Checked with the other settings, before any model is loaded or folder opened.
      if (o.config?.gating?.relevanceSignal === "rerank" && o.memoryRerank === undefined) {
        throw new DkiArgumentError('config.gating.relevanceSignal "rerank" gates on the routing reranker\'s scores: give memoryRerank');
      }
    });
  }

  /** The memory layer's API, scoped by the userId each call takes. */
  get memories(): MemoryStoreApi["memories"] {
    return this.store.memories;
  }
  get preferences(): MemoryStoreApi["preferences"] {
    return this.store.preferences;
  }
  get conversations(): MemoryStoreApi["conversations"] {
    return this.store.conversations;
  }
  get audit(): MemoryStoreApi["audit"] {
    return this.store.audit;
  }

  /**
   * One turn: route, gate, inject, generate, record. Rejects (and records nothing) when the turn
   * fails or its signal aborts it; other users' turns go on.
   */
  async chat(query: string, opts: ChatOptions): Promise<DKIResponse> {
    return this.ledger.track(async () => {
      const t0 = performance.now();
      checkChat(query, opts);
      const lat = emptyLatency();
      return this.ledger.count(() => this.sessions.run(opts.userId, opts.sessionId, opts.signal, async (sessionWaitMs) => {
        const plan = await this.plan(query, opts, lat);
        let ttftAt = 0;
        const onToken = (text: string, id: number) => {
          if (ttftAt === 0) ttftAt = performance.now();
          opts.onToken?.(text, id);
        };
        const tq = performance.now();
        const { prepared, result, facts, genStart } = await this.queue.run(
          opts.userId,
          async () => {
            lat.queueMs = sessionWaitMs + (performance.now() - tq);
            const prepared = await this.prepare(query, opts, plan, lat);
            try {
              const genStart = performance.now();
              const generate = (tokens: number[]) =>
                this.model.generate({ tokens }, { ...prepared.injection, maxNewTokens: opts.maxNewTokens, sampling: opts.sampling, stop: opts.stop, onToken, signal: opts.signal, stopOnAbortSignal: opts.stopOnAbortSignal });
              const first = await generate(plan.prompt.tokens);
              // Fact calls run here, in the same queued turn, with the same injection.
              const facts = await this.factCalls(query, opts, plan, first, generate);
              return { prepared, result: facts?.output ?? first, facts, genStart };
            } finally {
              prepared.assembly?.release();
            }
          },
          opts.signal,
        );
        lat.prefillMs = result.stats.prefillMs;
        lat.decodeMs = result.stats.decodeMs;
        lat.ttftMs = ttftAt > 0 ? ttftAt - t0 : genStart - t0 + result.stats.timeToFirstTokenMs;
        const response = this.response(query, opts, plan, prepared, lat, { text: result.text, finishReason: result.finishReason, outputTokens: result.tokens.length }, facts);
        const tr = performance.now();
        await this.record(query, opts, response, tr - t0);
        lat.recordMs = performance.now() - tr;
        lat.totalMs = performance.now() - t0;
        response.metadata.layerMs = layerCostMs(lat);
        this.noteKeys(opts.sessionId, prepared.assembly);
        return response;
      }));
    });
  }

  /**
   * The logits of every prompt position for the turn chat() would run (same routing, gating and
   * injection; nothing generated or recorded): for experiments and for checking the injection
   * against running the memory as text.
   */
  async logits(query: string, opts: Omit<ChatOptions, "onToken" | "maxNewTokens" | "sampling" | "stop">): Promise<{ logits: Float32Array[]; promptTokens: number[]; gating: GatingDecision; memoriesUsed: MemoryUsed[]; tiers: BlockOrigin[] }> {
    return this.ledger.track(async () => {
      checkChat(query, opts);
      const lat = emptyLatency();
      const plan = await this.plan(query, opts, lat);
      return this.queue.run(
        opts.userId,
        async () => {
          const prepared = await this.prepare(query, opts, plan, lat);
          try {
            const logits = await this.model.logits(plan.prompt.tokens, prepared.injection);
            return { logits, promptTokens: plan.prompt.tokens, gating: prepared.gating, memoriesUsed: prepared.memories, tiers: origins(prepared) };
          } finally {
            prepared.assembly?.release();
          }
        },
        opts.signal,
      );
    });
  }

  stats(): DKIStats {
    return { ...this.ledger.stats(), waiting: this.queue.size, cache: this.cache.stats() };
  }

  /**
   * Drops from every cache tier the K/V blocks this system's turns of the session injected (they
   * are computed again when next needed, by any session of that user), and the history provider's
   * state for the session. Returns how many blocks were dropped. The stored memories and
   * conversation stay. Blocks are tracked for the TRACKED_SESSIONS most recently active sessions.
   */
  async clearSessionCache(sessionId: string): Promise<number> {
    if (typeof sessionId !== "string" || sessionId === "") throw new DkiArgumentError("clearSessionCache needs a session id");
    const keys = this.sessionKeys.get(sessionId) ?? new Set<string>();
    this.sessionKeys.delete(sessionId);
    for (const k of keys) await this.cache.invalidate(k);
    this.history.clearSession?.(sessionId);
    return keys.size;
  }

  /** Waits for the turns in flight, then closes the cache (L3 writes flushed) and the store. */
  async close(): Promise<void> {
    if (await this.ledger.close()) await closeSystem(this.cache, this.store, this.ownsModel ? this.model : null);
  }

  /**
   * Routing, preferences and the prompt: store reads and text work, no model time. The prompt's
   * chat template renders in its own process while this thread routes the memories.
   */
  private async plan(query: string, opts: ChatOptions, lat: LatencyBreakdown): Promise<Plan> {
    const c = this.config;
    const t = performance.now();
    const injectionOn = opts.allowInjection !== false;
    const language: HistoryLanguage = c.historyLanguage === "auto" ? detectLanguage(query) : c.historyLanguage;
    const systemPrompt = opts.systemPrompt ?? c.systemPrompt;
    const useTemplate = c.chatTemplate === "auto" && this.promptTok.chatTemplate !== null;
    let preferences = { text: "", tokens: 0 };
    if (injectionOn && c.preferenceEnabled) {
      const prefs = (await this.store.preferences.list({ userId: opts.userId })).filter((p) => p.active);
      for (const p of prefs) if (p.userId !== opts.userId) throw new Error(`the memory store returned preference ${p.id} of another user for user ${JSON.stringify(opts.userId)}`);
      preferences = mergePreferences(prefs, this.counter, c.preferenceMaxTokens);
    }
    const history = c.historyEnabled
      ? await this.history.suffix({
          userId: opts.userId,
          sessionId: opts.sessionId,
          query,
          language,
          maxTokens: c.historyMaxTokens,
          maxMessages: c.historyMaxMessages,
          counter: this.counter,
          signal: opts.signal,
          contextSize: await this.historyWindow(query, systemPrompt, language, useTemplate),
          preferenceTokens: preferences.tokens,
        })
      : null;
    const rendering = buildHybridPrompt(this.promptTok, { query, systemPrompt, history, language, useTemplate, contextSize: this.model.contextSize, generationReserve: c.generationReserve });
    // Awaited below in every case, so a failed render is never an unhandled rejection.
    rendering.catch(() => {});
    const tr = performance.now();
    const routed = injectionOn ? await routeMemories(this.store, query, { userId: opts.userId, limit: opts.maxMemories ?? c.maxMemories, rerank: this.memoryRerank }) : [];
    lat.routingMs = performance.now() - tr;
    const prompt = await rendering;
    const prefix = this.encodingPrefix(systemPrompt, useTemplate);
    // The prompt's share: the whole plan less the routing it overlapped with.
    lat.promptMs = performance.now() - t - lat.routingMs;
    return { routed, prompt, history, language, preferences, prefix, systemPrompt, useTemplate };
  }

  /** Gating and the blocks from the cache; runs in the model's queue (the probe and computes use the model). */
  private async prepare(query: string, opts: ChatOptions, plan: Plan, lat: LatencyBreakdown): Promise<Prepared> {
    const c = this.config;
    const g = opts.relevanceThreshold === undefined ? c.gating : { ...c.gating, relevanceThreshold: opts.relevanceThreshold };
    let t = performance.now();
    const relevance = (r: Routed) => (g.relevanceSignal === "dense" ? r.signals.dense : g.relevanceSignal === "rerank" ? r.rerank! : r.score);
    const scores = plan.routed.map(relevance).sort((a, b) => b - a);
    const gating = await decideGating(g, { scores, forceAlpha: opts.forceAlpha, allowInjection: opts.allowInjection }, async () => {
      const tp = performance.now();
      // The bare query (n_u tokens, no template, no memory): a prefill far shorter than the
      // prompt's, and the signal gating should see (the reference system probed the whole prompt).
      const probe = await this.model.nextTokenEntropy(query);
      lat.entropyProbeMs = performance.now() - tp;
      return probe.normalized;
    });
    lat.gatingMs = performance.now() - t;

    const memories: { r: Routed; tokens: readonly number[] }[] = [];
    const leftOut: LeftOut[] = [];
    if (gating.inject) {
      let budget = c.memoryMaxTokens;
      // Forced: every routed memory; gated: those that clear the relevance threshold themselves.
      for (const r of plan.routed) {
        const id = r.memory.id;
        if (!gating.forced && relevance(r) < g.relevanceThreshold) {
          leftOut.push({ id, reason: `relevance ${relevance(r).toFixed(3)} is below the threshold ${g.relevanceThreshold.toFixed(3)}` });
          continue;
        }
        const tokens = this.counter.tokens(r.memory.text);
        // Two memories with the same text would be one block injected twice: the first stands for both.
        const twin = memories.find((m) => m.tokens.length === tokens.length && m.tokens.every((t, i) => t === tokens[i]));
        if (twin) {
          leftOut.push({ id, reason: `same text as ${twin.r.memory.id}, injected once` });
          continue;
        }
        if (tokens.length === 0 || tokens.length > budget) {
          leftOut.push({ id, reason: tokens.length === 0 ? "its text has no tokens" : `its ${tokens.length} tokens exceed the ${budget} left of memoryMaxTokens (${c.memoryMaxTokens})` });
          continue;
        }
        budget -= tokens.length;
        memories.push({ r, tokens });
      }
      // Routing order is best first; memories past the token budget were left out in that order.
      if (c.memoryOrder === "score-last") memories.reverse();
      if (c.memoryOrder === "time") memories.sort((a, b) => a.r.memory.createdAt - b.r.memory.createdAt || cmp(a.r.memory.id, b.r.memory.id));
    }
    const specs: BlockSpec[] = [];
    const prefTokens = plan.preferences.text === "" ? [] : this.counter.tokens(plan.preferences.text);
    // The engine's rule: a block is injected exactly when its α ≥ alphaThreshold (α = 0 included at threshold 0).
    const preferenceInjected = prefTokens.length > 0 && c.preferenceAlpha >= g.alphaThreshold;
    if (preferenceInjected) specs.push({ name: "preferences", tokens: prefTokens, alpha: c.preferenceAlpha });
    // APE: score/T + ln(s·α) on the memory blocks' columns (logit scaling carries s and α).
    const fix = c.blockFix;
    const memoryScores: Pick<BlockSpec, "alpha" | "scaling" | "temperature"> =
      fix.kind === "ape" ? { alpha: gating.alpha * fix.scale, scaling: "logit", temperature: fix.temperature } : { alpha: gating.alpha, scaling: c.alphaScaling };
    if (c.memoryEncoding === "joint" && memories.length > 0) {
      specs.push({ name: memories.map((m) => m.r.memory.id).join("+"), tokens: memories.flatMap((m) => m.tokens), ...memoryScores });
    } else {
      for (const m of memories) specs.push({ name: m.r.memory.id, tokens: m.tokens, ...memoryScores });
    }

    let assembly: Assembly | null = null;
    if (specs.length > 0) {
      t = performance.now();
      assembly = await assembleBlocks(this.cache, opts.userId, plan.prefix, specs);
      try {
        assembly = await applyBlockFix(assembly, fix, { cache: this.cache, model: this.model, userId: opts.userId, prefix: plan.prefix });
      } catch (e) {
        assembly.release();
        throw e;
      }
      addBlockLoads(lat, assembly.blocks);
    }
    const segments: Segment[] = assembly?.segments ?? [];
    return {
      gating,
      assembly,
      memories: memories.map((m) => ({ id: m.r.memory.id, text: m.r.memory.text, score: m.r.score, relevance: relevance(m.r), tokens: m.tokens.length })),
      preferenceInjected,
      leftOut,
      injection: { segments, positions: c.positions, alphaThreshold: g.alphaThreshold },
    };
  }


  /** The tokens each block is encoded behind (part of its cache key). */
  private encodingPrefix(systemPrompt: string | undefined, useTemplate: boolean): number[] {
    const tok = this.promptTok;
    const bos = tok.bosId === null ? [] : [tok.bosId];
    const mode = this.config.encodingPrefix;
    if (mode === "none") return [];
    if (mode === "bos" || !systemPrompt) return bos;
    if (useTemplate) return afterBos(tok, systemTurnTokens(tok, systemPrompt));
    return [...bos, ...tok.encode(`${systemPrompt}\n\n`, { addSpecialTokens: false })];
  }

  /**
   * The window a history provider budgets from: the context less everything of the prompt but
   * the history and the query (system prompt, chat-template or `User:` frame, the blank line
   * between history and query), so a suffix that fills its budget still leaves the answer its
   * reserve and is not dropped. Rendered only for Recall v4 (the flat history has its own cap).
   */
  private async historyWindow(query: string, systemPrompt: string | undefined, language: HistoryLanguage, useTemplate: boolean): Promise<number> {
    if (this.recallV4 === null) return this.model.contextSize - this.counter.count(systemPrompt ?? "");
    const bare = await renderPrompt(this.promptTok, { query, systemPrompt, language }, useTemplate);
    // 4: the blank line joining history and query, and tokens merging across the joins.
    return this.model.contextSize - (bare.tokens.length - this.counter.count(query)) - 4;
  }

  /**
   * Recall v4's fact-call loop (seed 003 §5.5): while the output calls retrieve_fact, the traced
   * message (the turn's user's only, and session's by recall.scope) is appended to the history
   * suffix and the model generates again. Null when Recall v4 is not this turn's history.
   */
  private async factCalls(query: string, opts: ChatOptions, plan: Plan, first: GenerateResult, generate: (tokens: number[]) => Promise<GenerateResult>): Promise<FactLoopResult<GenerateResult> | null> {
    const recall = this.recallV4;
    if (recall === null || plan.history === null || plan.prompt.historyDropped) return null;
    const fc = recall.config.fact_call;
    if (!fc.enabled) return null;
    const history = plan.history;
    return runFactCallLoop(
      first,
      {
        generateWithFacts: async (factText) => {
          const withFacts = { ...history, text: `${history.text}\n\n${factText}`, tokens: 0 };
          const prompt = await buildHybridPrompt(this.promptTok, { query, systemPrompt: plan.systemPrompt, history: withFacts, language: plan.language, useTemplate: plan.useTemplate, contextSize: this.model.contextSize, generationReserve: this.config.generationReserve });
          return generate(prompt.tokens);
        },
      },
      { retrieve: (req) => recall.retrieveFact(req, { userId: opts.userId, sessionId: opts.sessionId }), counter: this.counter, maxRounds: fc.max_rounds, maxFactTokens: fc.max_fact_tokens, language: plan.language },
    );
  }

  /**
   * Recall v4 for a query without generating: the recalled messages (scores, signals, summarised
   * or not) and the suffix a turn of this session would get. Needs recall.enabled.
   */
  async recall(query: string, opts: { userId: string; sessionId: string; contextSize?: number }): Promise<RecallOutcome> {
    checkTurn(query, opts);
    if (this.recallV4 === null) throw new DkiArgumentError("recall needs Recall v4 as the history provider: set config.recall.enabled (strategy summary_with_fact_call)");
    const contextWindow = opts.contextSize ?? this.model.contextSize;
    if (!Number.isSafeInteger(contextWindow) || contextWindow < 1) throw new DkiArgumentError(`contextSize must be a positive integer, got ${String(opts.contextSize)}`);
    const language = this.config.historyLanguage === "auto" ? detectLanguage(query) : this.config.historyLanguage;
    return this.recallV4.run({ query, userId: opts.userId, sessionId: opts.sessionId, language, counter: this.counter, contextWindow });
  }

  private response(query: string, opts: ChatOptions, plan: Plan, p: Prepared, lat: LatencyBreakdown, out: { text: string; finishReason: FinishReason; outputTokens: number }, facts: FactLoopResult<GenerateResult> | null = null): DKIResponse {
    const tiers = origins(p);
    const h = plan.history;
    return {
      text: out.text,
      finishReason: out.finishReason,
      memoriesUsed: p.memories,
      gating: p.gating,
      cache: { hit: tiers.length > 0 && tiers.every((b) => b.tier !== "L4"), tiers },
      budget: analyzeBudget(plan.prompt.tokens.length, p.assembly?.tokens ?? 0),
      latency: lat,
      inputTokens: plan.prompt.tokens.length,
      outputTokens: out.outputTokens,
      metadata: {
        model: { dir: this.model.info.dir, fingerprint: this.model.info.fingerprint },
        userId: opts.userId,
        sessionId: opts.sessionId,
        positions: this.config.positions,
        encodingPrefix: this.config.encodingPrefix,
        blockFix: this.config.blockFix,
        memoryOrder: this.config.memoryOrder,
        memoryEncoding: this.config.memoryEncoding,
        layerMs: 0,
        routed: routedList(plan.routed),
        memoriesLeftOut: p.leftOut,
        hybridInjection: {
          enabled: p.preferenceInjected,
          preferenceTokens: p.preferenceInjected ? plan.preferences.tokens : 0,
          preferenceAlpha: p.preferenceInjected ? this.config.preferenceAlpha : 0,
          preferenceText: plan.preferences.text,
          historyTokens: plan.prompt.historyTokens,
          historySuffixText: plan.prompt.historyText,
          historyMessages: plan.prompt.historyDropped ? [] : (h?.messages ?? []),
          historyStrategy: h?.strategy ?? "none",
          historyLanguage: plan.language,
          historySkippedForMarkers: h?.skippedForMarkers ?? 0,
          historyTruncated: h?.truncated ?? 0,
          historyDropped: plan.prompt.historyDropped,
          finalInput: plan.prompt.text,
        },
        ...(this.recallV4 !== null && h !== null ? { recallV4: recallInfo(h, facts) } : {}),
      },
    };
  }

  /** The turn's three rows, in one transaction (the store's recordTurn). */
  private async record(query: string, opts: ChatOptions, r: DKIResponse, latencyMs: number): Promise<void> {
    const injected = r.cache.tiers.length > 0;
    await this.store.conversations.recordTurn({
      userId: opts.userId,
      sessionId: opts.sessionId,
      query,
      response: r.text,
      injectionMode: injected ? "dki" : "none",
      alpha: r.memoriesUsed.length > 0 ? r.gating.alpha : undefined,
      memoryIds: r.memoriesUsed.map((m) => m.id),
      latencyMs,
      auditAction: "dki_generate",
      auditMetadata: {
        relevance: r.gating.relevance,
        margin: r.gating.margin,
        entropy: r.gating.entropy,
        reason: r.gating.reason,
        forced: r.gating.forced,
        preferenceAlpha: r.metadata.hybridInjection.preferenceAlpha,
        blocks: r.cache.tiers.map((b) => ({ kind: b.kind, id: b.id ?? null, tier: b.tier, alpha: b.alpha, tokens: b.tokens })),
        inputTokens: r.inputTokens,
        outputTokens: r.outputTokens,
        finishReason: r.finishReason,
      },
    });
  }

  /** Remembers the blocks a session's turn injected, for clearSessionCache; the most recent sessions only. */
  private noteKeys(sessionId: string, a: Assembly | null): void {
    if (!a) return;
    let keys = this.sessionKeys.get(sessionId);
    // Re-inserted at the end: the Map's order is then least recently used first.
    if (keys) this.sessionKeys.delete(sessionId);
    this.sessionKeys.set(sessionId, (keys ??= new Set()));
    for (const b of a.blocks) keys.add(b.key);
    for (const k of a.fixKeys) keys.add(k);
    // A long-running server sees sessions without end; what it remembers for them must not grow so.
    if (this.sessionKeys.size > TRACKED_SESSIONS) this.sessionKeys.delete(this.sessionKeys.keys().next().value!);
  }
}

function recallInfo(h: HistorySuffix, facts: FactLoopResult<GenerateResult> | null): RecallV4Info {
  const m = h.metadata ?? {};
  const traceIds = Array.isArray(m.traceIds) ? m.traceIds.filter((x): x is string => typeof x === "string") : [];
  return {
    traceIds,
    summaryCount: typeof m.summaryCount === "number" ? m.summaryCount : 0,
    messageCount: typeof m.messageCount === "number" ? m.messageCount : 0,
    rounds: facts?.rounds ?? 0,
    calls: facts?.calls ?? [],
    factTokens: facts?.factTokens ?? 0,
    stoppedBy: facts?.stoppedBy ?? "fact_calls_off",
  };
}

function origins(p: Prepared): BlockOrigin[] {
  return (p.assembly?.blocks ?? []).map((b, i) =>
    p.preferenceInjected && i === 0
      ? { kind: "preferences" as const, tier: b.tier, loadMs: b.loadMs, tokens: b.tokens, alpha: b.alpha }
      : { kind: "memory" as const, id: b.name, tier: b.tier, loadMs: b.loadMs, tokens: b.tokens, alpha: b.alpha },
  );
}

function checkChat(query: unknown, opts: ChatOptions): void {
  checkTurn(query, opts);
  checkForceAlpha(opts.forceAlpha);
  if (opts.allowInjection !== undefined && typeof opts.allowInjection !== "boolean") throw new DkiArgumentError(`allowInjection must be true or false, got ${String(opts.allowInjection)}`);
  if (opts.systemPrompt !== undefined && typeof opts.systemPrompt !== "string") throw new DkiArgumentError("systemPrompt must be a string");
  const tau = opts.relevanceThreshold;
  if (tau !== undefined && (typeof tau !== "number" || !(tau >= 0 && tau <= 1))) throw new DkiArgumentError(`relevanceThreshold must be a number in [0, 1], got ${String(tau)}`);
}

const cmp = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);
