// RAGSystem: the baseline of seed 000 §3, on the same store, routing and user scoping as DKISystem,
// so a comparison of the two measures how memory reaches the model and nothing else:
//
//   route    the user's memories for the query: routeMemories with DKI's maxMemories (shared code)
//   kb       optionally, a knowledge-base collection's chunks for the query (hybrid search)
//   history  the session's recent messages from the store
//   prompt   buildRagPrompt: 512 reserved, context ≤ 50% of the rest, history newest first, forced
//            fallback to the bare query; the chat template when the model has one (as DKI)
//   generate stream tokens (time to first token measured from the chat() call)
//   record   user row, assistant row (injection_mode "rag"), audit row "rag_generate": one transaction
//
// Knowledge as K/V (`kbMode: "kv"`): the chunks are injected as K/V blocks from the tiered cache,
// each computed once behind a shared encoding prefix (BOS + system prompt), instead of as prompt
// text (Prompt Cache / TurboRAG / Block-Attention). A model not trained for blocks encoded apart
// loses the attention between chunks and sees each start with its own prefix: expect lower answer
// quality than text on such a model.
import { createHash } from "node:crypto";
import { performance } from "node:perf_hooks";
import type { Segment } from "../engine/model.js";
import type { FinishReason, GenerateResult } from "../engine/generate.js";
import { TieredKVCache, type CacheBudgets } from "../cache/tiered-cache.js";
import { DkiArgumentError } from "../errors.js";
import { withTimeout } from "../util/either-signal.js";
import type { Filter, MemoryStoreApi, Metadata, Reranker, SearchResult } from "../memory/types.js";
import { afterBos, assembleBlocks, systemTurnTokens, type Assembly } from "../dki/assembly.js";
import { addBlockLoads, analyzeBudget, emptyLatency, type BudgetAnalysis, type LatencyBreakdown } from "../dki/budget.js";
import type { DKIConfig, DKIConfigInput } from "../dki/config.js";
import { FairQueue } from "../dki/fair-queue.js";
import type { LeftOut } from "../dki/system.js";
import { routedList, routeMemories, type MemoryRerank, type RoutedMemory } from "../dki/routing.js";
import { isReranker } from "../memory/reranker.js";
import { TokenMemo } from "../dki/prompt.js";
import { checkTurn, closeSystem, openSystem, SessionTurns, TurnLedger, type SystemOpenOptions, type TurnOptions } from "../dki/open.js";
import { contextBlock, extractCitations, sourceLabel, type CitationMap, type CitationSource } from "./citations.js";
import { buildRagPrompt, type HistoryMessage, type PromptLayout, type RagPromptInfo } from "./prompt-builder.js";
import type { KbSearchOptions, KbSearchResult } from "./kb/search.js";
import { Model, type LoadOptions } from "../engine/model.js";
import type { KbRetriever } from "./kb/tenancy.js";
import { KnowledgeBase } from "./kb/knowledge-base.js";
import { ModelStepBackend, StepRunner, type StepBackend, type StepRecord } from "./pipeline/steps.js";
import { checkQueryTransform, type QueryTransformOptions } from "./pipeline/query-transform.js";
import { retrieveTransformed, type RetrievalHop } from "./pipeline/transformed-retrieval.js";
import { checkRerankMethod, rerank, type Reranked, type RerankMethod } from "./pipeline/rerank.js";
import { checkPromptMode, withPromptMode, type PromptMode } from "./pipeline/prompt-modes.js";
import { resolveSelfRag, runSelfRag, type SelfRagConfig, type SelfRagTrace } from "./pipeline/self-rag.js";
import { citationConfidence, CITATION_FORMATS, formatCitations, unsupportedClaims, type CitationFormat, type ScoredCitation, type UnsupportedClaim } from "./pipeline/citation-quality.js";
import { resolveAnswerCache, SemanticAnswerCache, type AnswerCacheOptions, type CacheHit } from "./pipeline/answer-cache.js";
import { classifyQuery, resolveStrategies, StrategyLedger, type QueryClass, type Strategy, type StrategyStats } from "./pipeline/adaptive.js";

export type KbMode = "text" | "kv";

export interface RAGConfig {
  /** The largest share of the prompt budget (after the fixed part) retrieved context may take. Default 0.5. */
  contextShare: number;
  /** "auto": the chat template when the model has one and config.chatTemplate is "auto" (as DKI); else "seed" or "chat". */
  layout: PromptLayout | "auto";
  /** Knowledge-base chunks per turn. Default 5. */
  kbTopK: number;
  /** A first context block too long for the context share is cut to fit instead of dropped. Default false (seed 000 drops it). */
  truncateFirstContext: boolean;
  /** Self-RAG's rounds and thresholds for every turn that asks for Self-RAG (a turn's own selfRag object overrides them key by key). */
  selfRag: Partial<SelfRagConfig>;
  /**
   * false: retrieval is off: turns search neither memories nor the knowledge base (a collection
   * asked for is named in metadata.warnings), and answer from the history and the query alone.
   * Default true.
   */
  enabled: boolean;
  /**
   * Milliseconds a whole turn may take (its wait for the session, retrieval, every LLM step and
   * the answer), as seed 001's global request timeout; 0: no limit. Default 60000. Each LLM step
   * also has its own (steps.timeoutMs, default 30000), after which it falls back.
   */
  turnTimeoutMs: number;
}

export const DEFAULT_RAG_CONFIG: Readonly<RAGConfig> = Object.freeze({ contextShare: 0.5, layout: "auto", kbTopK: 5, truncateFirstContext: false, selfRag: Object.freeze({}), enabled: true, turnTimeoutMs: 60_000 });

/** What a turn answers, without generating, when its search found nothing (emptyRetrieval "answer"). */
export const NO_RELEVANT_INFORMATION = "I found no relevant information to answer this question.";

/** DKISystem's open options (the same checks, model ownership and store opening), and: */
export interface RAGSystemOptions extends SystemOpenOptions {
  /** The shared settings: maxMemories, memoryMaxTokens, systemPrompt, historyMaxMessages, generationReserve, chatTemplate (the same DKIConfig as DKISystem's). */
  config?: DKIConfigInput;
  rag?: Partial<RAGConfig>;
  /**
   * What `collection` turns retrieve from (the caller keeps owning it): a KnowledgeBase, or any
   * KbRetriever (InMemoryRetriever for tests). It is asked as the turn's user, so a collection
   * owned by another tenant is not found.
   */
  knowledgeBase?: KbRetriever;
  /** K/V cache folder for kbMode "kv" (default: DKISystem's, beside the store's folder; opened on the first kv turn). */
  cacheDir?: string;
  /** The LLM steps of the query pipeline (rewrite, decompose, step-back, …). */
  steps?: StepsOptions;
  /** Adaptive RAG's strategy per query class (default: no_retrieval direct, simple standard, multi_hop decompose). */
  adaptive?: Partial<Record<QueryClass, Strategy>>;
  /** A semantic answer cache with a time to live (true: the defaults; see answer-cache.ts). Default: none. */
  answerCache?: true | Partial<AnswerCacheOptions>;
  /**
   * What turns with `rerank: "cross-encoder"` score knowledge-base passages with, e.g.
   * OnnxCrossEncoder.load(dir) (memoryRerank is the memories'; the same reranker may serve both).
   * The caller keeps owning it (the system does not close it). Default: none, and such turns are refused.
   */
  reranker?: Reranker;
}

export interface StepsOptions {
  /**
   * The model the steps run on: the system's own model by default, a loaded Model (the caller
   * keeps owning it), a model path (loaded on open, disposed on close), or any StepBackend.
   */
  model?: Model | string | StepBackend;
  /** Used when `model` is a path. */
  loadOptions?: LoadOptions;
  /** Milliseconds a step may take before its fallback is used. Default 30000. */
  timeoutMs?: number;
}

export interface RAGChatOptions extends TurnOptions {
  /** false: no memory search this turn (knowledge base and history stay). */
  useMemories?: boolean;
  /** Search this knowledge-base collection too. */
  collection?: string;
  kbMode?: KbMode;
  kbFilter?: Filter;
  kbTopK?: number;
  kbMinScore?: number;
  /** Multi-query expansion / HyDE for the knowledge-base search, with this system's model. */
  kbMultiQuery?: number;
  kbHyde?: boolean;
  /** Query transformations before the knowledge-base search (needs a collection): rewrite, decompose, step-back. */
  queryTransform?: QueryTransformOptions;
  /** Rerank the knowledge-base results (needs a collection): "lexical" (no model call), "llm" (the step model's yes/no judgement) or "cross-encoder" (the system's reranker). */
  rerank?: RerankMethod;
  /** With rerank: how many results are searched and reranked before the best kbTopK are kept. Default max(20, 4 × kbTopK), at most 100. */
  rerankDepth?: number;
  /** How the model is told to use the context: "simple", "advanced" or "precise" (see prompt-modes.ts). Default: none (the system prompt as it is). */
  promptMode?: PromptMode;
  /** Self-RAG (needs a collection): true for the defaults, or thresholds and rounds (see self-rag.ts). The chosen answer reaches onToken whole. */
  selfRag?: boolean | Partial<SelfRagConfig>;
  /** Adaptive RAG (needs a collection): classify the query and apply the strategy of its class (RAGSystemOptions.adaptive). */
  adaptive?: boolean;
  /** Score the answer's citations, find its unsupported claims, and render it in a citation format (metadata.citationQuality). */
  citations?: { format?: CitationFormat; unsupportedThreshold?: number };
  /**
   * When the collection search finds nothing and no memory is used: "generate" (default, seed 000:
   * answer without context) or "answer": reply NO_RELEVANT_INFORMATION without calling the model.
   */
  emptyRetrieval?: "generate" | "answer";
  /** false: neither read nor fill the system's answer cache this turn. */
  useCache?: boolean;
}

export interface CitationQuality {
  /** Per cited block: 0.4 similarity + 0.4 position + 0.2 coverage (citation-quality.ts). */
  confidence: ScoredCitation[];
  unsupported: UnsupportedClaim[];
  /** The answer in the asked format; null without one. */
  formatted: string | null;
}

/** Everything that shapes a turn's answer (its options and the history its prompt carries; not the session id, callbacks or signal): a cache scope. */
function cacheScope(o: RAGChatOptions, history: readonly HistoryMessage[]): string {
  const historyHash = createHash("sha256").update(JSON.stringify(history)).digest("hex");
  const { userId, useMemories, maxMemories, systemPrompt, maxNewTokens, sampling, stop, collection, kbMode, kbFilter, kbTopK, kbMinScore, kbMultiQuery, kbHyde, queryTransform, rerank, rerankDepth, promptMode, selfRag, adaptive, citations, emptyRetrieval } = o;
  return JSON.stringify({ historyHash, userId, useMemories, maxMemories, systemPrompt, maxNewTokens, sampling, stop, collection, kbMode, kbFilter, kbTopK, kbMinScore, kbMultiQuery, kbHyde, queryTransform, rerank, rerankDepth, promptMode, selfRag, adaptive, citations, emptyRetrieval });
}

/** One query of a batch: its response, or why it failed. */
export type RAGBatchItem = { index: number; query: string } & ({ ok: true; response: RAGResponse } | { ok: false; error: string });

/** The class Adaptive RAG gave a query and the strategy it applied. */
export interface AdaptiveChoice {
  queryClass: QueryClass;
  strategy: Strategy;
}

/** Self-RAG's decisions as the response shows them (chunk ids instead of chunks). */
export type SelfRagSummary = Omit<SelfRagTrace<string>, "rounds"> & { rounds: (Omit<SelfRagTrace<string>["rounds"][number], "results"> & { chunkIds: string[] })[] };

function selfRagSummary(t: SelfRagTrace<KbSearchResult>): SelfRagSummary {
  return { ...t, rounds: t.rounds.map(({ results, ...r }) => ({ ...r, chunkIds: results.map((x) => x.chunk.id) })) };
}

/** A turn's options with its strategy applied (what the caller set explicitly stays); "rerank" uses the system's cross-encoder when it has one. */
function withStrategy(opts: RAGChatOptions, strategy: Strategy, rerankMethod: RerankMethod): RAGChatOptions {
  switch (strategy) {
    case "direct":
    case "standard":
      return opts;
    case "rerank":
      return { ...opts, rerank: opts.rerank ?? rerankMethod };
    case "decompose":
      return { ...opts, queryTransform: { ...opts.queryTransform, decompose: opts.queryTransform?.decompose ?? 3 } };
    case "self_rag":
      return { ...opts, selfRag: opts.selfRag ?? true };
  }
}

/** What the query pipeline did in a turn: its steps (prompt, raw output, parsed result) and its searches. */
export interface PipelineTrace {
  steps: StepRecord[];
  /** The query the knowledge base was searched with (after a rewrite). */
  query: string;
  subQueries: string[];
  stepBack: string | null;
  hops: RetrievalHop[];
  /** The rerank, when the turn asked for one. */
  rerank: Reranked | null;
  /** Adaptive RAG's class and strategy, when the turn asked for it. */
  adaptive: AdaptiveChoice | null;
  /** Self-RAG's rounds, scores and decisions, when the turn asked for it. */
  selfRag: SelfRagSummary | null;
}

export interface RAGMemoryUsed {
  id: string;
  text: string;
  /** The memory store's fused score (routing order). */
  score: number;
  /** The cosine similarity of query and memory (what DKI's gate reads by default). */
  relevance: number;
  /** Tokens of its context line in the prompt. */
  tokens: number;
}

/** What a numbered context block of the prompt came from. */
export type ContextSource = ({ kind: "memory"; memoryId: string } | ({ kind: "chunk" } & CitationSource)) & { score: number };

export interface RAGResponse {
  text: string;
  finishReason: FinishReason;
  /** The memories that made it into the prompt, in prompt order. */
  memoriesUsed: RAGMemoryUsed[];
  /** Every numbered block of the prompt ([1]..[n]) with its source; in kv mode the injected chunks, unnumbered. */
  sources: ContextSource[];
  /** The answer's markers mapped back to their blocks (text mode). */
  citations: CitationMap<ContextSource>;
  latency: LatencyBreakdown;
  inputTokens: number;
  outputTokens: number;
  budget: BudgetAnalysis;
  promptInfo: RagPromptInfo;
  metadata: {
    model: { dir: string; fingerprint: string };
    userId: string;
    sessionId: string;
    layout: PromptLayout;
    kbMode: KbMode | null;
    collection: string | null;
    /** Tokens of retrieved context in the prompt (memories and chunks as text). */
    contextTokens: number;
    /** Tokens of chunks injected as K/V (kv mode). */
    injectedTokens: number;
    contextsUsed: number;
    contextsRetrieved: number;
    historyKept: number;
    historyTotal: number;
    forcedFallback: boolean;
    /** What routing returned, in its order (the same call as DKISystem's), before the token budget. */
    routed: RoutedMemory[];
    /** Routed memories the turn left out: over config.memoryMaxTokens, as DKI leaves them out. */
    memoriesLeftOut: LeftOut[];
    warnings: string[];
    log: string[];
    kbQueries: string[];
    /** The query pipeline's trace; null when the turn used none of its steps. */
    pipeline: PipelineTrace | null;
    /**
     * With an answer cache: whether this turn's answer came from it (then the response is the cached
     * turn's, with no tokens processed now), the cached query and its similarity; null without a cache.
     */
    cache: { hit: boolean; similarity: number | null; cachedQuery: string | null; ageMs: number | null } | null;
    /** true when the turn answered NO_RELEVANT_INFORMATION without the model (emptyRetrieval "answer"). */
    noRelevantInformation: boolean;
    /** With the citations option: confidences, unsupported claims, the formatted answer; else null. */
    citationQuality: CitationQuality | null;
  };
}

interface ResolvedSteps {
  /** The model the steps run on (through the fair queue), or null with a custom backend. */
  model: Model | null;
  backend: StepBackend | null;
  timeoutMs: number | undefined;
  /** A step model loaded from a path: disposed on close. */
  owned: Model | null;
}

/** The result of a turn answered without the model (a fixed reply): no tokens generated, no time spent. */
function fixedResult(text: string, promptTokens: number): GenerateResult {
  return {
    text,
    tokens: [],
    finishReason: "stop",
    stats: { promptTokens, segmentTokens: 0, generatedTokens: 0, prefillMs: 0, prefillTokPerS: 0, decodeMs: 0, decodeTokPerS: 0, timeToFirstTokenMs: 0, firstTokenEntropy: 0 },
  };
}

function checkStepsOptions(o: StepsOptions | undefined): void {
  if (o === undefined) return;
  if (o === null || typeof o !== "object") throw new DkiArgumentError("steps must be an object");
  const m = o.model;
  if (m !== undefined && !(m instanceof Model) && !(typeof m === "string" && m !== "") && !(typeof m === "object" && m !== null && typeof (m as StepBackend).complete === "function")) {
    throw new DkiArgumentError("steps.model must be a loaded Model, a model path or a backend with complete()");
  }
  if (o.timeoutMs !== undefined && !(Number.isInteger(o.timeoutMs) && o.timeoutMs >= 1)) throw new DkiArgumentError(`steps.timeoutMs must be a positive integer, got ${String(o.timeoutMs)}`);
}

export class RAGSystem {
  private readonly queue = new FairQueue();
  /** Counts memory texts and prompt lines; remembers those of recent turns, as DKISystem does. */
  private readonly counter: TokenMemo;
  private readonly ledger = new TurnLedger("RAGSystem");
  private readonly sessions = new SessionTurns();
  private cache: TieredKVCache | null = null;
  private readonly strategyLedger = new StrategyLedger();

  private constructor(
    readonly model: Model,
    private readonly ownsModel: boolean,
    readonly store: MemoryStoreApi,
    readonly config: DKIConfig,
    readonly rag: RAGConfig,
    readonly knowledgeBase: KbRetriever | null,
    private readonly cacheDir: string,
    private readonly budgets: CacheBudgets,
    private readonly steps: ResolvedSteps,
    private readonly strategies: Record<QueryClass, Strategy>,
    private readonly answerCache: SemanticAnswerCache<RAGResponse> | null,
    private readonly memoryRerank: MemoryRerank | undefined,
    private readonly reranker: Reranker | null,
  ) {
    this.counter = new TokenMemo(model.tokenizer);
  }

  static async open(o: RAGSystemOptions): Promise<RAGSystem> {
    return openSystem(
      "RAGSystem",
      o,
      async (p, rag) => {
        const { store, config } = await p.openStore();
        const sm = o.steps?.model;
        const ownedStepModel = typeof sm === "string" ? await Model.load(sm, o.steps?.loadOptions) : null;
        const model = ownedStepModel ?? (sm instanceof Model ? sm : sm === undefined ? p.model : null);
        const steps: ResolvedSteps = { model, backend: model === null ? (sm as StepBackend) : null, timeoutMs: o.steps?.timeoutMs, owned: ownedStepModel };
        return new RAGSystem(p.model, p.ownsModel, store, config, rag, o.knowledgeBase ?? null, p.cacheDir, p.budgets, steps, resolveStrategies(o.adaptive), o.answerCache === undefined ? null : new SemanticAnswerCache(resolveAnswerCache(o.answerCache)), o.memoryRerank, o.reranker ?? null);
      },
      () => {
        checkStepsOptions(o.steps);
        resolveStrategies(o.adaptive);
        if (o.answerCache !== undefined) resolveAnswerCache(o.answerCache);
        if (o.reranker !== undefined && !isReranker(o.reranker)) {
          throw new DkiArgumentError("reranker must be a Reranker: an object with score(query, passages), e.g. OnnxCrossEncoder.load(dir)");
        }
        return resolveRagConfig(o.rag);
      },
    );
  }

  /** The memories a turn for this query would use (seed 000 §7.3: retrieval only, nothing generated or recorded). */
  async searchMemories(query: string, scope: { userId: string }): Promise<SearchResult[]> {
    this.ledger.checkOpen();
    return routeMemories(this.store, query, { userId: scope?.userId, limit: this.config.maxMemories, rerank: this.memoryRerank });
  }

  /** Turns answered and failed, and the mean latency of each stage over the answered ones (seed 000 §7.4). */
  stats(): { turns: number; failedTurns: number; meanLatency: LatencyBreakdown } {
    return this.ledger.stats();
  }

  /** The answer cache's hits, misses and entries; null without one. */
  cacheStats(): { hits: number; misses: number; entries: number } | null {
    const c = this.answerCache;
    return c === null ? null : { hits: c.hits, misses: c.misses, entries: c.size };
  }

  /** Adaptive RAG's statistics per strategy: queries, failures, mean latency, chunks and model calls. */
  strategyStats(): Partial<Record<Strategy, StrategyStats>> {
    return this.strategyLedger.stats();
  }

  /**
   * Several queries, one turn each in order (the same options and session), every one answered or
   * failed on its own: a bad or failing query becomes an error item, the others still run. An abort
   * of opts.signal fails the queries not yet answered (each says so).
   */
  async batch(queries: readonly string[], opts: RAGChatOptions): Promise<RAGBatchItem[]> {
    this.ledger.checkOpen();
    if (!Array.isArray(queries)) throw new DkiArgumentError("batch needs an array of queries");
    const out: RAGBatchItem[] = [];
    for (let index = 0; index < queries.length; index++) {
      const query = queries[index]!;
      try {
        out.push({ index, query, ok: true, response: await this.chat(query, opts) });
      } catch (e) {
        out.push({ index, query, ok: false, error: e instanceof Error ? e.message : String(e) });
      }
    }
    return out;
  }

  /**
   * One turn: retrieve, build the prompt, generate, record. Rejects (recording nothing) on failure
   * or abort. rag.turnTimeoutMs bounds the whole turn, its wait for the session included, as
   * opts.signal would abort it (with stopOnAbortSignal, the answer so far comes back "aborted").
   */
  async chat(query: string, opts: RAGChatOptions): Promise<RAGResponse> {
    return this.ledger.track(() =>
      this.ledger.count(async () => {
        checkChat(query, opts);
        if (opts.rerank === "cross-encoder" && this.reranker === null) {
          throw new DkiArgumentError('rerank "cross-encoder" needs a reranker: open the RAGSystem with one (RAGSystem.open({ reranker: await OnnxCrossEncoder.load(dir) }))');
        }
        const limitMs = this.rag.turnTimeoutMs;
        if (limitMs === 0) return this.sessions.run(opts.userId, opts.sessionId, opts.signal, (waitedMs) => this.turn(query, opts, waitedMs));
        const bounded = withTimeout(opts.signal, limitMs, `the turn took longer than ${limitMs} ms (rag.turnTimeoutMs)`);
        try {
          return await this.sessions.run(opts.userId, opts.sessionId, bounded.signal, (waitedMs) => this.turn(query, { ...opts, signal: bounded.signal }, waitedMs));
        } catch (e) {
          // The caller's own abort stays theirs; the timeout's is named.
          if (bounded.timeout.aborted && opts.signal?.aborted !== true) throw bounded.timeout.reason as Error;
          throw e;
        } finally {
          bounded.release();
        }
      }),
    );
  }

  /** The answer cache around a turn: a hit answers (and is recorded) without retrieval or generation. */
  private async turn(query: string, opts: RAGChatOptions, sessionWaitMs: number): Promise<RAGResponse> {
    const cache = this.answerCache;
    if (cache === null || opts.useCache === false) return this.adaptiveTurn(query, opts, sessionWaitMs);
    const t0 = performance.now() - sessionWaitMs;
    // The history the prompt would carry is part of the scope: the same words after another
    // exchange may ask something else, so a cached answer serves only the same history.
    const history = await this.recentHistory(opts);
    const scope = cacheScope(opts, history);
    const [vector] = await this.store.embedder.embed([query]);
    const hit = cache.lookup(scope, vector!);
    if (hit !== null) return this.cachedTurn(query, opts, hit, t0);
    const r = await this.adaptiveTurn(query, opts, sessionWaitMs, history);
    r.metadata.cache = { hit: false, similarity: null, cachedQuery: null, ageMs: null };
    // A copy: what the caller does with its response does not change the cache.
    if (r.finishReason !== "aborted") cache.store(scope, query, vector!, structuredClone(r));
    return r;
  }

  private async cachedTurn(query: string, opts: RAGChatOptions, hit: CacheHit<RAGResponse>, t0: number): Promise<RAGResponse> {
    const r = structuredClone(hit.value);
    const lat = emptyLatency();
    r.latency = lat;
    r.inputTokens = 0;
    r.outputTokens = 0;
    r.metadata.sessionId = opts.sessionId;
    r.metadata.cache = { hit: true, similarity: hit.similarity, cachedQuery: hit.query, ageMs: hit.ageMs };
    opts.onToken?.(r.text, -1);
    lat.ttftMs = performance.now() - t0;
    await this.recordRagTurn(query, opts, r, t0, { mode: "rag", cacheHit: true, cachedQuery: hit.query, similarity: hit.similarity, collection: opts.collection ?? null });
    return r;
  }

  /** Records a finished turn (the user row, the answer, the audit row) and times it into the response's latency. */
  private async recordRagTurn(query: string, opts: RAGChatOptions, r: RAGResponse, t0: number, auditMetadata: Metadata): Promise<void> {
    const tr = performance.now();
    await this.store.conversations.recordTurn({
      userId: opts.userId,
      sessionId: opts.sessionId,
      query,
      response: r.text,
      injectionMode: "rag",
      memoryIds: r.memoriesUsed.map((m) => m.id),
      latencyMs: tr - t0,
      auditAction: "rag_generate",
      auditMetadata,
    });
    r.latency.recordMs = performance.now() - tr;
    r.latency.totalMs = performance.now() - t0;
  }

  /** The session's recent messages a turn's prompt carries: the same switch and length as DKI's config (the budget then decides what fits). */
  private async recentHistory(opts: RAGChatOptions): Promise<HistoryMessage[]> {
    if (!this.config.historyEnabled || this.config.historyMaxMessages <= 0) return [];
    const turns = await this.store.conversations.list({ userId: opts.userId, sessionId: opts.sessionId, limit: this.config.historyMaxMessages });
    return turns.filter((x) => x.role === "user" || x.role === "assistant").map((x) => ({ role: x.role as "user" | "assistant", content: x.content }));
  }

  /** Adaptive RAG around a turn: the query classified, its strategy applied, the outcome counted per strategy. */
  private async adaptiveTurn(query: string, opts: RAGChatOptions, sessionWaitMs: number, history?: HistoryMessage[]): Promise<RAGResponse> {
    // One step runner per turn: every LLM step of the turn is recorded in order.
    const steps = this.stepRunner(opts.userId, opts.signal);
    // With retrieval off (rag.enabled false) there is no strategy to choose.
    if (opts.adaptive !== true || !this.rag.enabled) return this.answerTurn(query, opts, sessionWaitMs, steps, null, history);
    const queryClass = await classifyQuery(steps, query);
    const strategy = this.strategies[queryClass];
    try {
      const r = await this.answerTurn(query, withStrategy(opts, strategy, this.reranker === null ? "lexical" : "cross-encoder"), sessionWaitMs, steps, { queryClass, strategy }, history);
      this.strategyLedger.record(strategy, { ok: true, latencyMs: r.latency.totalMs, retrieved: r.sources.filter((x) => x.kind === "chunk").length, modelCalls: steps.calls + 1 });
      return r;
    } catch (e) {
      this.strategyLedger.record(strategy, { ok: false, latencyMs: 0, retrieved: 0, modelCalls: 0 });
      throw e;
    }
  }

  /** One retrieval and answer; `known` is the session's history when the caller already read it (the answer cache's scope). */
  private async answerTurn(query: string, opts: RAGChatOptions, sessionWaitMs: number, steps: StepRunner, adaptive: AdaptiveChoice | null, known?: HistoryMessage[]): Promise<RAGResponse> {
    // From the call: the wait behind the session's earlier turns counts, as in DKISystem.
    const t0 = performance.now() - sessionWaitMs;
    if (opts.collection !== undefined && this.knowledgeBase === null) throw new DkiArgumentError("this RAGSystem has no knowledge base: open it with knowledgeBase to search a collection");
    // Retrieval switched off: no search of any kind, and the turn says what it did not search.
    const retrieval = this.rag.enabled;
    const collection = retrieval ? opts.collection : undefined;
    const offWarnings = !retrieval && opts.collection !== undefined ? [`retrieval is disabled (rag.enabled false): collection ${JSON.stringify(opts.collection)} not searched`] : [];
    const kbMode: KbMode | null = collection === undefined ? null : (opts.kbMode ?? "text");
    const lat = emptyLatency();

    // Retrieval: the same routing call as DKISystem's (same store, user scope and maxMemories).
    let t = performance.now();
    const routed: SearchResult[] = opts.useMemories === false || !retrieval ? [] : await routeMemories(this.store, query, { userId: opts.userId, limit: opts.maxMemories ?? this.config.maxMemories, rerank: this.memoryRerank });
    // The same history switch and length as DKI's config (the budget then decides what fits).
    // Read before the knowledge-base search: a history-aware rewrite needs it.
    const history = known ?? (await this.recentHistory(opts));
    const { kept, leftOut } = this.withinMemoryBudget(routed);
    const systemPrompt = withPromptMode(opts.systemPrompt ?? this.config.systemPrompt, opts.promptMode);
    const layout: PromptLayout = this.rag.layout !== "auto" ? this.rag.layout : this.config.chatTemplate === "auto" && this.model.tokenizer.chatTemplate !== null ? "chat" : "seed";

    // Prompt and generation for a set of chunks: memories then (text mode) chunks as numbered
    // blocks, history, query. Self-RAG drafts with it (not streamed: a draft may be rejected).
    const generateFrom = async (kb: KbSearchResult[], stream: boolean, fixedText?: string) => {
      const tp = performance.now();
      const candidates: { text: string; source: ContextSource }[] = kept.map((r) => ({ text: r.memory.text, source: { kind: "memory", memoryId: r.memory.id, score: r.score } }));
      const chunkSources = kb.map((r) => ({ kind: "chunk" as const, ...r.source, score: r.score }));
      if (kbMode === "text") kb.forEach((r, i) => candidates.push({ text: contextBlock(r.chunk.text, r.source), source: chunkSources[i] }));
      const built = buildRagPrompt(this.model.tokenizer, { query, systemPrompt, contexts: candidates.map((c) => c.text), history }, { maxContext: this.model.contextSize, reserveForGeneration: this.config.generationReserve, contextShare: this.rag.contextShare, layout, truncateFirstContext: this.rag.truncateFirstContext }, this.counter);
      const used = candidates.slice(0, built.contextsUsed);
      lat.promptMs += performance.now() - tp;
      const tq = performance.now();
      let ttftAt = 0;
      const onToken = (text: string, id: number) => {
        if (ttftAt === 0) ttftAt = performance.now();
        if (stream) opts.onToken?.(text, id);
      };
      const generate = () =>
        this.queue.run(
          opts.userId,
          async () => {
            lat.queueMs = sessionWaitMs + (performance.now() - tq);
            let assembly: Assembly | null = null;
            if (kbMode === "kv" && kb.length > 0) assembly = await this.kvChunks(kb, systemPrompt ?? "", layout, lat);
            try {
              const segments: Segment[] = assembly?.segments ?? [];
              const genStart = performance.now();
              const result = await this.model.generate({ tokens: built.tokens }, { segments, positions: "negative", maxNewTokens: opts.maxNewTokens, sampling: opts.sampling, stop: opts.stop, onToken, signal: opts.signal, stopOnAbortSignal: opts.stopOnAbortSignal });
              return { result, genStart, injectedTokens: assembly?.tokens ?? 0 };
            } finally {
              assembly?.release();
            }
          },
          opts.signal,
        );
      const g = fixedText !== undefined ? { result: fixedResult(fixedText, built.tokens.length), genStart: performance.now(), injectedTokens: 0 } : await generate();
      return { ...g, candidates, chunkSources, built, used, ttftAt };
    };

    let kb: KbSearchResult[] = [];
    let kbQueries: string[] = [];
    let pipeline: PipelineTrace | null = null;
    let gen: Awaited<ReturnType<typeof generateFrom>> | null = null;
    if (collection !== undefined && this.knowledgeBase !== null && adaptive?.strategy !== "direct") {
      const kbase = this.knowledgeBase;
      const limit = opts.kbTopK ?? this.rag.kbTopK;
      // A rerank needs more candidates than the prompt keeps: it decides which of them make it.
      const depth = opts.rerank === undefined ? limit : (opts.rerankDepth ?? Math.min(100, Math.max(20, 4 * limit)));
      const so: KbSearchOptions = { collection, limit: depth, filter: opts.kbFilter, minScore: opts.kbMinScore };
      if (opts.kbMultiQuery !== undefined || opts.kbHyde) {
        so.expand = { multiQuery: opts.kbMultiQuery, hyde: opts.kbHyde, generate: (prompt, maxNewTokens) => this.expansion(opts.userId, prompt, maxNewTokens, opts.signal) };
      }
      // The lexical rerank's cosine: the knowledge base's embedder, or the store's for another retriever.
      const rerankEmbedder = kbase instanceof KnowledgeBase ? kbase.embedder : this.store.embedder;
      const search = async (q: string): Promise<KbSearchResult[]> => {
        // As the turn's user: another tenant's collection is not found.
        const found = await kbase.retrieve(q, { ...so, userId: opts.userId });
        kbQueries.push(...found.queries);
        return found.results;
      };
      // The retrieval of one query: its transformations, then the rerank (each only when asked for).
      const qt = opts.queryTransform;
      const retrieve = async (q: string): Promise<{ results: KbSearchResult[]; trace: Omit<PipelineTrace, "steps" | "adaptive" | "selfRag"> }> => {
        const r = await retrieveTransformed(steps, q, history, qt ?? {}, { search, id: (x) => x.chunk.id, text: (x) => x.chunk.text }, depth);
        let results = r.results;
        let reranked: Reranked | null = null;
        if (opts.rerank !== undefined) {
          const rr = await rerank(opts.rerank, r.query, results.map((x) => ({ id: x.chunk.id, text: x.chunk.text, score: x.score, result: x })), { embedder: rerankEmbedder, steps, reranker: this.reranker });
          results = rr.ranked.slice(0, limit).map((c) => c.result);
          reranked = rr.trace;
        }
        return { results, trace: { query: r.query, subQueries: r.subQueries, stepBack: r.stepBack, hops: r.hops, rerank: reranked } };
      };
      if (opts.selfRag !== undefined && opts.selfRag !== false) {
        const cfg = resolveSelfRag({ ...this.rag.selfRag, ...(opts.selfRag === true ? {} : opts.selfRag) });
        const drafts: { results: KbSearchResult[]; gen: Awaited<ReturnType<typeof generateFrom>> }[] = [];
        let last: Omit<PipelineTrace, "steps" | "adaptive" | "selfRag"> | null = null;
        const sr = await runSelfRag(query, cfg, {
          steps,
          retrieve: async (q) => {
            const r = await retrieve(q);
            last = r.trace;
            return r.results;
          },
          candidate: (x) => ({ id: x.chunk.id, text: x.chunk.text, score: x.score }),
          answer: async (_q, results) => {
            const g = await generateFrom(results, false);
            drafts.push({ results, gen: g });
            return g.result.text;
          },
        });
        kb = sr.results;
        gen = drafts.find((d) => d.results === sr.results)!.gen;
        // The chosen answer reaches onToken whole, once it is accepted (drafts are not streamed).
        if (gen.result.text !== "") opts.onToken?.(gen.result.text, gen.result.tokens[gen.result.tokens.length - 1] ?? -1);
        const tr = last ?? { query, subQueries: [query], stepBack: null, hops: [], rerank: null };
        pipeline = { steps: steps.records, ...tr, adaptive, selfRag: selfRagSummary(sr.trace) };
      } else if ((qt !== undefined && (qt.rewrite === true || (qt.decompose ?? 0) >= 2 || qt.stepBack === true)) || opts.rerank !== undefined || adaptive !== null) {
        const r = await retrieve(query);
        kb = r.results;
        pipeline = { steps: steps.records, ...r.trace, adaptive, selfRag: null };
      } else kb = await search(query);
      kbQueries = [...new Set(kbQueries)];
    } else if (adaptive !== null) {
      pipeline = { steps: steps.records, query, subQueries: [], stepBack: null, hops: [], rerank: null, adaptive, selfRag: null };
    }
    // With Self-RAG, its drafts' generation counts here (retrieval decided by answering); prefill,
    // decode and time to first token below are the chosen draft's.
    lat.routingMs = performance.now() - t - lat.promptMs;

    // Nothing found and nothing remembered: the fixed answer, instead of the model without context.
    const searched = collection !== undefined && adaptive?.strategy !== "direct";
    // Not after Self-RAG: its own decisions (no retrieval needed, the best round) stand.
    const noContext = gen === null && searched && kb.length === 0 && kept.length === 0 && opts.emptyRetrieval === "answer";
    if (noContext) {
      gen = await generateFrom(kb, false, NO_RELEVANT_INFORMATION);
      opts.onToken?.(NO_RELEVANT_INFORMATION, -1);
    }
    gen ??= await generateFrom(kb, true);
    const { result, genStart, candidates, chunkSources, built, used, ttftAt, injectedTokens } = gen;
    lat.prefillMs = result.stats.prefillMs;
    lat.decodeMs = result.stats.decodeMs;
    lat.ttftMs = ttftAt > 0 ? ttftAt - t0 : genStart - t0 + result.stats.timeToFirstTokenMs;

    const memoriesUsed: RAGMemoryUsed[] = [];
    used.forEach((c, i) => {
      if (c.source.kind === "memory") {
        const r = routed.find((x) => x.memory.id === (c.source as { memoryId: string }).memoryId)!;
        memoriesUsed.push({ id: r.memory.id, text: r.memory.text, score: r.score, relevance: r.signals.dense, tokens: this.counter.count(`[${i + 1}] ${c.text}`) });
      }
    });
    const sources = kbMode === "kv" ? [...used.map((c) => c.source), ...chunkSources] : used.map((c) => c.source);
    const citations = extractCitations(result.text, used.map((c) => c.source));
    const contextTokens = built.tokenCounts.context;
    const response: RAGResponse = {
      text: result.text,
      finishReason: result.finishReason,
      memoriesUsed,
      sources,
      citations,
      latency: lat,
      inputTokens: built.tokens.length,
      outputTokens: result.tokens.length,
      // RAG's figures are the ones that apply: its memory tokens are in the prompt (n_m of n_m + n_u).
      budget: analyzeBudget(Math.max(0, built.tokens.length - contextTokens), contextTokens),
      promptInfo: built.info,
      metadata: {
        model: { dir: this.model.info.dir, fingerprint: this.model.info.fingerprint },
        userId: opts.userId,
        sessionId: opts.sessionId,
        layout,
        kbMode,
        collection: collection ?? null,
        contextTokens,
        injectedTokens,
        contextsUsed: built.contextsUsed,
        contextsRetrieved: candidates.length,
        historyKept: built.historyKept,
        historyTotal: built.historyTotal,
        forcedFallback: built.forcedFallback,
        routed: routedList(routed),
        memoriesLeftOut: leftOut,
        warnings: [...offWarnings, ...built.warnings],
        log: built.log,
        kbQueries,
        pipeline,
        noRelevantInformation: noContext,
        cache: null,
        citationQuality: opts.citations === undefined ? null : this.citationQuality(result.text, citations, used, opts.citations),
      },
    };
    await this.recordRagTurn(query, opts, response, t0, {
      mode: "rag",
      layout,
      kbMode,
      collection: collection ?? null,
      chunkIds: chunkSources.map((s) => s.chunkId),
      inputTokens: response.inputTokens,
      outputTokens: response.outputTokens,
      contextTokens,
      injectedTokens,
      forcedFallback: built.forcedFallback,
      finishReason: result.finishReason,
    });
    return response;
  }

  /**
   * The routed memories whose tokens fit config.memoryMaxTokens, in routing order, as DKI counts
   * them (so both systems get the same memories), and the others with the reason.
   */
  private withinMemoryBudget(routed: SearchResult[]): { kept: SearchResult[]; leftOut: LeftOut[] } {
    const max = this.config.memoryMaxTokens;
    let left = max;
    const kept: SearchResult[] = [];
    const leftOut: LeftOut[] = [];
    for (const r of routed) {
      const n = this.counter.count(r.memory.text);
      if (n > left) leftOut.push({ id: r.memory.id, reason: `its ${n} tokens exceed the ${left} left of memoryMaxTokens (${max})` });
      else {
        left -= n;
        kept.push(r);
      }
    }
    return { kept, leftOut };
  }

  /** Knowledge-base chunks as K/V: each block computed once behind BOS + system prompt, then cached. */
  private async kvChunks(kb: KbSearchResult[], systemPrompt: string, layout: PromptLayout, lat: LatencyBreakdown): Promise<Assembly> {
    if (this.cache === null) this.cache = await TieredKVCache.open({ model: this.model, dir: this.cacheDir, budgets: this.budgets });
    const tok = this.model.tokenizer;
    const sys = systemPrompt === "" ? [] : layout === "chat" ? systemTurnTokens(tok, systemPrompt) : tok.encode(`System: ${systemPrompt}\n\n`, { addSpecialTokens: false });
    const prefix = afterBos(tok, sys);
    // Chunk blocks are shared knowledge, not a user's memory: one cache scope per collection.
    const scope = `kb:${kb[0].source.collection}`;
    const t = performance.now();
    const a = await assembleBlocks(this.cache, scope, prefix, kb.map((r) => ({ name: r.source.chunkId, tokens: tok.encode(`(source: ${sourceLabel(r.source)}) ${r.chunk.text}\n`, { addSpecialTokens: false }), alpha: 1 })));
    addBlockLoads(lat, a.blocks);
    if (a.blocks.length === 0) lat.kvComputeMs += performance.now() - t;
    return a;
  }

  private citationQuality(answer: string, map: CitationMap<ContextSource>, used: { text: string; source: ContextSource }[], o: NonNullable<RAGChatOptions["citations"]>): CitationQuality {
    const blocks = used.map((c) => ({ text: c.text, score: c.source.score }));
    const label = (s: ContextSource) => (s.kind === "chunk" ? sourceLabel(s) : `memory ${s.memoryId}`);
    return {
      confidence: citationConfidence(answer, map, blocks),
      unsupported: unsupportedClaims(answer, blocks, o.unsupportedThreshold),
      formatted: o.format === undefined ? null : formatCitations(answer, map, label, o.format),
    };
  }

  /** A turn's LLM steps: on the step model through the user's place in the fair queue, or on the custom backend. */
  private stepRunner(userId: string, signal?: AbortSignal): StepRunner {
    const s = this.steps;
    const backend = s.model !== null ? new ModelStepBackend(s.model, (fn, sig) => this.queue.run(userId, fn, sig)) : s.backend!;
    return new StepRunner(backend, { timeoutMs: s.timeoutMs, signal });
  }

  /** A short generation for query expansion (multi-query, HyDE) with this system's model, in the user's turn. */
  private async expansion(userId: string, prompt: string, maxNewTokens: number, signal?: AbortSignal): Promise<string> {
    const r = await this.queue.run(userId, () => this.model.generate({ messages: [{ role: "user", content: prompt }] }, { maxNewTokens, signal }), signal);
    return r.text;
  }

  async close(): Promise<void> {
    if (await this.ledger.close()) {
      try {
        await closeSystem(this.cache, this.store, this.ownsModel ? this.model : null);
      } finally {
        this.steps.owned?.dispose();
      }
    }
  }
}

export function resolveRagConfig(input: Partial<RAGConfig> = {}): RAGConfig {
  if (input === null || typeof input !== "object") throw new DkiArgumentError("rag config must be an object");
  const c = { ...DEFAULT_RAG_CONFIG, ...input };
  if (!(typeof c.contextShare === "number" && c.contextShare >= 0 && c.contextShare <= 1)) throw new DkiArgumentError(`rag.contextShare must be in [0, 1], got ${String(c.contextShare)}`);
  if (c.layout !== "auto" && c.layout !== "seed" && c.layout !== "chat") throw new DkiArgumentError(`rag.layout must be "auto", "seed" or "chat", got ${JSON.stringify(c.layout)}`);
  if (!Number.isInteger(c.kbTopK) || c.kbTopK < 1 || c.kbTopK > 100) throw new DkiArgumentError(`rag.kbTopK must be an integer from 1 to 100, got ${String(c.kbTopK)}`);
  if (typeof c.truncateFirstContext !== "boolean") throw new DkiArgumentError(`rag.truncateFirstContext must be a boolean, got ${JSON.stringify(c.truncateFirstContext)}`);
  resolveSelfRag(c.selfRag);
  if (typeof c.enabled !== "boolean") throw new DkiArgumentError(`rag.enabled must be true or false, got ${JSON.stringify(c.enabled)}`);
  if (!Number.isInteger(c.turnTimeoutMs) || c.turnTimeoutMs < 0) throw new DkiArgumentError(`rag.turnTimeoutMs must be a whole number of milliseconds (0: no limit), got ${String(c.turnTimeoutMs)}`);
  return c;
}

function checkChat(query: unknown, opts: RAGChatOptions): void {
  checkTurn(query, opts);
  if (opts.kbMode !== undefined && opts.kbMode !== "text" && opts.kbMode !== "kv") throw new DkiArgumentError(`kbMode must be "text" or "kv", got ${JSON.stringify(opts.kbMode)}`);
  if (opts.kbMode !== undefined && opts.collection === undefined) throw new DkiArgumentError("kbMode needs a collection");
  if (opts.kbTopK !== undefined && (!Number.isInteger(opts.kbTopK) || opts.kbTopK < 1 || opts.kbTopK > 100)) throw new DkiArgumentError(`kbTopK must be an integer from 1 to 100, got ${String(opts.kbTopK)}`);
  checkQueryTransform(opts.queryTransform);
  if (opts.queryTransform !== undefined && opts.collection === undefined) throw new DkiArgumentError("queryTransform needs a collection: it transforms the knowledge-base search");
  checkRerankMethod(opts.rerank);
  if (opts.rerank !== undefined && opts.collection === undefined) throw new DkiArgumentError("rerank needs a collection: it reorders the knowledge-base results");
  if (opts.rerankDepth !== undefined && opts.rerank === undefined) throw new DkiArgumentError("rerankDepth needs rerank");
  if (opts.rerankDepth !== undefined && (!Number.isInteger(opts.rerankDepth) || opts.rerankDepth < 1 || opts.rerankDepth > 100)) throw new DkiArgumentError(`rerankDepth must be an integer from 1 to 100, got ${String(opts.rerankDepth)}`);
  checkPromptMode(opts.promptMode);
  if (opts.selfRag !== undefined && opts.selfRag !== false) {
    resolveSelfRag(opts.selfRag === true ? undefined : opts.selfRag);
    if (opts.collection === undefined) throw new DkiArgumentError("selfRag needs a collection: it decides around the knowledge-base search");
  }
  if (opts.citations !== undefined) {
    const c = opts.citations;
    if (c === null || typeof c !== "object") throw new DkiArgumentError("citations must be an object { format?, unsupportedThreshold? }");
    if (c.format !== undefined && !CITATION_FORMATS.includes(c.format)) throw new DkiArgumentError(`citations.format must be one of ${CITATION_FORMATS.join(", ")}, got ${JSON.stringify(c.format)}`);
    if (c.unsupportedThreshold !== undefined && !(typeof c.unsupportedThreshold === "number" && c.unsupportedThreshold >= 0 && c.unsupportedThreshold <= 1)) throw new DkiArgumentError(`citations.unsupportedThreshold must be in [0, 1], got ${String(c.unsupportedThreshold)}`);
  }
  if (opts.emptyRetrieval !== undefined && opts.emptyRetrieval !== "generate" && opts.emptyRetrieval !== "answer") throw new DkiArgumentError(`emptyRetrieval must be "generate" or "answer", got ${JSON.stringify(opts.emptyRetrieval)}`);
  if (opts.useCache !== undefined && typeof opts.useCache !== "boolean") throw new DkiArgumentError(`useCache must be a boolean, got ${JSON.stringify(opts.useCache)}`);
  if (opts.adaptive !== undefined && typeof opts.adaptive !== "boolean") throw new DkiArgumentError(`adaptive must be a boolean, got ${JSON.stringify(opts.adaptive)}`);
  if (opts.adaptive === true && opts.collection === undefined) throw new DkiArgumentError("adaptive needs a collection: its strategies are knowledge-base searches");
}
