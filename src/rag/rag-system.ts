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
import { performance } from "node:perf_hooks";
import type { Model, Segment } from "../engine/model.js";
import type { FinishReason } from "../engine/generate.js";
import { TieredKVCache, type CacheBudgets } from "../cache/tiered-cache.js";
import { DkiArgumentError } from "../errors.js";
import type { Filter, MemoryStoreApi, SearchResult } from "../memory/types.js";
import { afterBos, assembleBlocks, systemTurnTokens, type Assembly } from "../dki/assembly.js";
import { addBlockLoads, analyzeBudget, emptyLatency, type BudgetAnalysis, type LatencyBreakdown } from "../dki/budget.js";
import type { DKIConfig, DKIConfigInput } from "../dki/config.js";
import { FairQueue } from "../dki/fair-queue.js";
import type { LeftOut } from "../dki/system.js";
import { routeMemories } from "../dki/routing.js";
import { tokenCounter, type TokenCounter } from "../dki/prompt.js";
import { checkTurn, closeSystem, openSystem, SessionTurns, TurnLedger, type SystemOpenOptions, type TurnOptions } from "../dki/open.js";
import { contextBlock, extractCitations, sourceLabel, type CitationMap, type CitationSource } from "./citations.js";
import { buildRagPrompt, type HistoryMessage, type PromptLayout, type RagPromptInfo } from "./prompt-builder.js";
import type { KbSearchOptions, KbSearchResult } from "./kb/search.js";
import type { KbRetriever } from "./kb/tenancy.js";

export type KbMode = "text" | "kv";

export interface RAGConfig {
  /** The largest share of the prompt budget (after the fixed part) retrieved context may take. Default 0.5. */
  contextShare: number;
  /** "auto": the chat template when the model has one and config.chatTemplate is "auto" (as DKI); else "seed" or "chat". */
  layout: PromptLayout | "auto";
  /** Knowledge-base chunks per turn. Default 5. */
  kbTopK: number;
  /**
   * false: retrieval is off: turns search neither memories nor the knowledge base (a collection
   * asked for is named in metadata.warnings), and answer from the history and the query alone.
   * Default true.
   */
  enabled: boolean;
}

export const DEFAULT_RAG_CONFIG: Readonly<RAGConfig> = Object.freeze({ contextShare: 0.5, layout: "auto", kbTopK: 5, enabled: true });

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
    /** Routed memories the turn left out: over config.memoryMaxTokens, as DKI leaves them out. */
    memoriesLeftOut: LeftOut[];
    warnings: string[];
    log: string[];
    kbQueries: string[];
  };
}

export class RAGSystem {
  private readonly queue = new FairQueue();
  private readonly counter: TokenCounter;
  private readonly ledger = new TurnLedger("RAGSystem");
  private readonly sessions = new SessionTurns();
  private cache: TieredKVCache | null = null;

  private constructor(
    readonly model: Model,
    private readonly ownsModel: boolean,
    readonly store: MemoryStoreApi,
    readonly config: DKIConfig,
    readonly rag: RAGConfig,
    readonly knowledgeBase: KbRetriever | null,
    private readonly cacheDir: string,
    private readonly budgets: CacheBudgets,
  ) {
    this.counter = tokenCounter(model.tokenizer);
  }

  static async open(o: RAGSystemOptions): Promise<RAGSystem> {
    return openSystem(
      "RAGSystem",
      o,
      async (p, rag) => {
        const { store, config } = await p.openStore();
        return new RAGSystem(p.model, p.ownsModel, store, config, rag, o.knowledgeBase ?? null, p.cacheDir, p.budgets);
      },
      () => resolveRagConfig(o.rag),
    );
  }

  /** The memories a turn for this query would use (seed 000 §7.3: retrieval only, nothing generated or recorded). */
  async searchMemories(query: string, scope: { userId: string }): Promise<SearchResult[]> {
    this.ledger.checkOpen();
    return routeMemories(this.store, query, { userId: scope?.userId, limit: this.config.maxMemories });
  }

  /** Turns answered and failed, and the mean latency of each stage over the answered ones (seed 000 §7.4). */
  stats(): { turns: number; failedTurns: number; meanLatency: LatencyBreakdown } {
    return this.ledger.stats();
  }

  /** One turn: retrieve, build the prompt, generate, record. Rejects (recording nothing) on failure or abort. */
  async chat(query: string, opts: RAGChatOptions): Promise<RAGResponse> {
    return this.ledger.track(() =>
      this.ledger.count(async () => {
        checkChat(query, opts);
        return this.sessions.run(opts.userId, opts.sessionId, opts.signal, (waitedMs) => this.turn(query, opts, waitedMs));
      }),
    );
  }

  private async turn(query: string, opts: RAGChatOptions, sessionWaitMs: number): Promise<RAGResponse> {
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
    const routed: SearchResult[] = opts.useMemories === false || !retrieval ? [] : await routeMemories(this.store, query, { userId: opts.userId, limit: opts.maxMemories ?? this.config.maxMemories });
    let kb: KbSearchResult[] = [];
    let kbQueries: string[] = [];
    if (collection !== undefined && this.knowledgeBase !== null) {
      const so: KbSearchOptions = { collection, limit: opts.kbTopK ?? this.rag.kbTopK, filter: opts.kbFilter, minScore: opts.kbMinScore };
      if (opts.kbMultiQuery !== undefined || opts.kbHyde) {
        so.expand = { multiQuery: opts.kbMultiQuery, hyde: opts.kbHyde, generate: (prompt, maxNewTokens) => this.expansion(opts.userId, prompt, maxNewTokens, opts.signal) };
      }
      const found = await this.knowledgeBase.retrieve(query, { ...so, userId: opts.userId });
      kb = found.results;
      kbQueries = found.queries;
    }
    lat.routingMs = performance.now() - t;

    // Prompt: memories then (text mode) chunks as numbered blocks, history, query.
    t = performance.now();
    // The same history switch and length as DKI's config (the budget then decides what fits).
    const withHistory = this.config.historyEnabled && this.config.historyMaxMessages > 0;
    const turns = withHistory ? await this.store.conversations.list({ userId: opts.userId, sessionId: opts.sessionId, limit: this.config.historyMaxMessages }) : [];
    const history: HistoryMessage[] = turns.filter((x) => x.role === "user" || x.role === "assistant").map((x) => ({ role: x.role as "user" | "assistant", content: x.content }));
    const { kept, leftOut } = this.withinMemoryBudget(routed);
    const candidates: { text: string; source: ContextSource }[] = kept.map((r) => ({ text: r.memory.text, source: { kind: "memory", memoryId: r.memory.id, score: r.score } }));
    const chunkSources = kb.map((r) => ({ kind: "chunk" as const, ...r.source, score: r.score }));
    if (kbMode === "text") kb.forEach((r, i) => candidates.push({ text: contextBlock(r.chunk.text, r.source), source: chunkSources[i] }));
    const systemPrompt = opts.systemPrompt ?? this.config.systemPrompt;
    const layout: PromptLayout = this.rag.layout !== "auto" ? this.rag.layout : this.config.chatTemplate === "auto" && this.model.tokenizer.chatTemplate !== null ? "chat" : "seed";
    const built = buildRagPrompt(this.model.tokenizer, { query, systemPrompt, contexts: candidates.map((c) => c.text), history }, { maxContext: this.model.contextSize, reserveForGeneration: this.config.generationReserve, contextShare: this.rag.contextShare, layout });
    const used = candidates.slice(0, built.contextsUsed);
    lat.promptMs = performance.now() - t;

    const tq = performance.now();
    let ttftAt = 0;
    const onToken = (text: string, id: number) => {
      if (ttftAt === 0) ttftAt = performance.now();
      opts.onToken?.(text, id);
    };
    const { result, genStart, assembly } = await this.queue.run(
      opts.userId,
      async () => {
        lat.queueMs = sessionWaitMs + (performance.now() - tq);
        let assembly: Assembly | null = null;
        if (kbMode === "kv" && kb.length > 0) assembly = await this.kvChunks(kb, systemPrompt ?? "", layout, lat);
        try {
          const segments: Segment[] = assembly?.segments ?? [];
          const genStart = performance.now();
          const result = await this.model.generate({ tokens: built.tokens }, { segments, positions: "negative", maxNewTokens: opts.maxNewTokens, sampling: opts.sampling, stop: opts.stop, onToken, signal: opts.signal, stopOnAbortSignal: opts.stopOnAbortSignal });
          return { result, genStart, assembly };
        } finally {
          assembly?.release();
        }
      },
      opts.signal,
    );
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
    const injectedTokens = assembly?.tokens ?? 0;
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
        memoriesLeftOut: leftOut,
        warnings: [...offWarnings, ...built.warnings],
        log: built.log,
        kbQueries,
      },
    };
    const tr = performance.now();
    await this.store.conversations.recordTurn({
      userId: opts.userId,
      sessionId: opts.sessionId,
      query,
      response: result.text,
      injectionMode: "rag",
      memoryIds: memoriesUsed.map((m) => m.id),
      latencyMs: tr - t0,
      auditAction: "rag_generate",
      auditMetadata: {
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
      },
    });
    lat.recordMs = performance.now() - tr;
    lat.totalMs = performance.now() - t0;
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

  /** A short generation for query expansion (multi-query, HyDE) with this system's model, in the user's turn. */
  private async expansion(userId: string, prompt: string, maxNewTokens: number, signal?: AbortSignal): Promise<string> {
    const r = await this.queue.run(userId, () => this.model.generate({ messages: [{ role: "user", content: prompt }] }, { maxNewTokens, signal }), signal);
    return r.text;
  }

  async close(): Promise<void> {
    if (await this.ledger.close()) await closeSystem(this.cache, this.store, this.ownsModel ? this.model : null);
  }
}

export function resolveRagConfig(input: Partial<RAGConfig> = {}): RAGConfig {
  if (input === null || typeof input !== "object") throw new DkiArgumentError("rag config must be an object");
  const c = { ...DEFAULT_RAG_CONFIG, ...input };
  if (!(typeof c.contextShare === "number" && c.contextShare >= 0 && c.contextShare <= 1)) throw new DkiArgumentError(`rag.contextShare must be in [0, 1], got ${String(c.contextShare)}`);
  if (c.layout !== "auto" && c.layout !== "seed" && c.layout !== "chat") throw new DkiArgumentError(`rag.layout must be "auto", "seed" or "chat", got ${JSON.stringify(c.layout)}`);
  if (!Number.isInteger(c.kbTopK) || c.kbTopK < 1 || c.kbTopK > 100) throw new DkiArgumentError(`rag.kbTopK must be an integer from 1 to 100, got ${String(c.kbTopK)}`);
  if (typeof c.enabled !== "boolean") throw new DkiArgumentError(`rag.enabled must be true or false, got ${JSON.stringify(c.enabled)}`);
  return c;
}

function checkChat(query: unknown, opts: RAGChatOptions): void {
  checkTurn(query, opts);
  if (opts.kbMode !== undefined && opts.kbMode !== "text" && opts.kbMode !== "kv") throw new DkiArgumentError(`kbMode must be "text" or "kv", got ${JSON.stringify(opts.kbMode)}`);
  if (opts.kbMode !== undefined && opts.collection === undefined) throw new DkiArgumentError("kbMode needs a collection");
  if (opts.kbTopK !== undefined && (!Number.isInteger(opts.kbTopK) || opts.kbTopK < 1 || opts.kbTopK > 100)) throw new DkiArgumentError(`kbTopK must be an integer from 1 to 100, got ${String(opts.kbTopK)}`);
}
