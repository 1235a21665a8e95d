// OpenAI's API over the systems: chat completions (a DKI, RAG or memory-less turn, streamed as
// SSE or not), completions (the model continuing a text), models and embeddings (the store's
// embedder). Field names, objects and errors are OpenAI's; what DKI adds travels in `dki` objects
// (request: session, mode, α, max memories; response and last chunk: what was injected and why).
import { randomUUID } from "node:crypto";
import { PassThrough } from "node:stream";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import type { FinishReason } from "../engine/generate.js";
import type { SamplingOptions } from "../engine/generate.js";
import type { DKIResponse } from "../dki/system.js";
import type { RAGResponse } from "../rag/rag-system.js";
import { MAX_MEMORIES_PER_TURN } from "../dki/open.js";
import { snakeKeys } from "../util/snake-keys.js";
import { MAX_ID_LENGTH, type ServerContext } from "./context.js";
import { ApiError, badRequest, body as errorBody, toApiError } from "./errors.js";

export type Mode = "dki" | "rag" | "none";

/** Longest text a message, prompt or embedding input may hold (characters). */
export const MAX_TEXT_CHARS = 100_000;
/** Answer tokens when a request gives no max_tokens. */
export const DEFAULT_MAX_TOKENS = 256;

const text = { type: "string", maxLength: MAX_TEXT_CHARS } as const;
const id = { type: "string", minLength: 1, maxLength: MAX_ID_LENGTH } as const;
const sampling = {
  max_tokens: { type: "integer", minimum: 1 },
  temperature: { type: "number", minimum: 0, maximum: 2 },
  top_p: { type: "number", exclusiveMinimum: 0, maximum: 1 },
  seed: { type: "integer", minimum: 0, maximum: 4294967295 },
  stop: { anyOf: [{ type: "string", minLength: 1, maxLength: 256 }, { type: "array", maxItems: 4, items: { type: "string", minLength: 1, maxLength: 256 } }, { type: "null" }] },
  n: { type: "integer", minimum: 1, maximum: 1 },
  stream: { type: "boolean" },
  stream_options: { type: ["object", "null"], additionalProperties: false, properties: { include_usage: { type: "boolean" } } },
  user: id,
} as const;

const contentPart = { type: "object", additionalProperties: false, required: ["type", "text"], properties: { type: { const: "text" }, text } } as const;

const chatSchema = {
  type: "object",
  additionalProperties: false,
  required: ["model", "messages"],
  properties: {
    model: id,
    messages: {
      type: "array",
      minItems: 1,
      maxItems: 256,
      items: {
        type: "object",
        additionalProperties: false,
        required: ["role", "content"],
        properties: { role: { enum: ["system", "developer", "user", "assistant"] }, content: { anyOf: [text, { type: "array", maxItems: 64, items: contentPart }] }, name: id },
      },
    },
    ...sampling,
    max_completion_tokens: { type: "integer", minimum: 1 },
    dki: {
      type: "object",
      additionalProperties: false,
      properties: { session: id, mode: { enum: ["dki", "rag", "none"] }, alpha: { type: "number", minimum: 0, maximum: 1 }, tau: { type: "number", minimum: 0, maximum: 1 }, collection: { type: "string", minLength: 1, maxLength: 64 }, max_memories: { type: "integer", minimum: 0, maximum: MAX_MEMORIES_PER_TURN } },
    },
  },
} as const;

const completionSchema = {
  type: "object",
  additionalProperties: false,
  required: ["model", "prompt"],
  properties: { model: id, prompt: { anyOf: [text, { type: "array", minItems: 1, maxItems: 1, items: text }] }, ...sampling },
} as const;

const embeddingSchema = {
  type: "object",
  additionalProperties: false,
  required: ["model", "input"],
  properties: {
    model: id,
    input: { anyOf: [{ ...text, minLength: 1 }, { type: "array", minItems: 1, maxItems: 2048, items: { ...text, minLength: 1 } }] },
    encoding_format: { enum: ["float", "base64"] },
    dimensions: { type: "integer", minimum: 1 },
    user: id,
  },
} as const;

type Content = string | { type: "text"; text: string }[];
interface SamplingBody {
  max_tokens?: number;
  temperature?: number;
  top_p?: number;
  seed?: number;
  stop?: string | string[] | null;
  n?: number;
  stream?: boolean;
  stream_options?: { include_usage?: boolean } | null;
  user?: string;
}
interface ChatBody extends SamplingBody {
  model: string;
  messages: { role: "system" | "developer" | "user" | "assistant"; content: Content; name?: string }[];
  max_completion_tokens?: number;
  dki?: { session?: string; mode?: Mode; alpha?: number; tau?: number; collection?: string; max_memories?: number };
}
interface CompletionBody extends SamplingBody {
  model: string;
  prompt: string | [string];
}
interface EmbeddingBody {
  model: string;
  input: string | string[];
  encoding_format?: "float" | "base64";
  dimensions?: number;
  user?: string;
}

/** One memory a turn used, as the response's `dki.memories` lists it. */
export interface MemoryInfo {
  id: string;
  text: string;
  relevance: number;
  /** The α it was injected with; null when it went into the prompt as text (rag). */
  alpha: number | null;
  /** The cache tier its K/V came from (L1–L3, L4: computed now), or "prompt" (rag). */
  tier: string;
  /** The store's fused score (routing order). */
  score: number;
  /** Its tokens (as K/V, or as its context line in the prompt in rag). */
  tokens: number;
}

/** One K/V block a "dki" turn injected: where it came from and at what α. */
export interface TierInfo {
  kind: "preferences" | "memory";
  /** The memory's id (a joint block's ids joined by "+"); null for preferences. */
  id: string | null;
  tier: string;
  load_ms: number;
  tokens: number;
  alpha: number;
}

/** Every stage of a turn, in milliseconds (the engine's LatencyBreakdown), and the server's own time to the first token. */
export interface LatencyInfo {
  ttft_ms: number;
  total_ms: number;
  queue_ms: number;
  routing_ms: number;
  prompt_ms: number;
  gating_ms: number;
  entropy_probe_ms: number;
  kv_load_ms: { L1: number; L2: number; L3: number };
  kv_compute_ms: number;
  prefill_ms: number;
  decode_ms: number;
  record_ms: number;
  server_ttft_ms: number;
}

/** What DKI adds to a chat completion (and its last SSE chunk). */
export interface DkiInfo {
  mode: Mode;
  user: string;
  session: string;
  memories: MemoryInfo[];
  memories_left_out: { id: string; reason: string }[];
  /** Knowledge-base chunks in the prompt (rag with dki.collection), numbered as the prompt numbers them. */
  chunks: { marker: number; chunk_id: string; doc_id: string; collection: string; heading_path: string[] }[];
  preferences_injected: boolean;
  /** entropy: Ĥ of the query, null when the gate did not need it. */
  gate: { inject: boolean; alpha: number; relevance: number; reason: string; forced: boolean; entropy: number | null } | null;
  /** The K/V blocks injected, with the tier each came from ("dki"; empty otherwise). */
  tiers: TierInfo[];
  /** Every injected block came from L1–L3 (false when none was injected). */
  cache_hit: boolean;
  /** Memory tokens injected as K/V (not in the prompt), and those that went into the prompt as text. */
  memory_tokens_kv: number;
  memory_tokens_prompt: number;
  /** Preference tokens injected as K/V; of the prompt, the session history's tokens (null: not counted, rag) and the retrieved context's (rag). */
  preference_tokens: number;
  history_tokens: number | null;
  context_tokens: number;
  /** The engine's own reason (eos, stop, length, context, aborted); the choice's finish_reason is OpenAI's. */
  finish_reason: FinishReason;
  /** The token and attention budgets of RAG and DKI for this turn (snake_case BudgetAnalysis). */
  budget: unknown;
  latency: LatencyInfo;
}

interface TurnOut {
  text: string;
  finishReason: FinishReason;
  promptTokens: number;
  completionTokens: number;
  dki: DkiInfo | null;
}

const now = () => Math.floor(Date.now() / 1000);

function openaiFinish(f: FinishReason): "stop" | "length" {
  return f === "length" || f === "context" ? "length" : "stop";
}

function contentText(c: Content): string {
  return typeof c === "string" ? c : c.map((p) => p.text).join("");
}

function samplingOf(b: SamplingBody): SamplingOptions {
  return { temperature: b.temperature ?? 0, topP: b.top_p, seed: b.seed };
}

function stopOf(b: SamplingBody): string[] | undefined {
  return b.stop === undefined || b.stop === null ? undefined : typeof b.stop === "string" ? [b.stop] : b.stop;
}

/** The OpenAI `messages` as a DKI turn: the last message is the query, system messages the system prompt. */
function turnInput(messages: ChatBody["messages"]): { query: string; systemPrompt: string | undefined } {
  const last = messages[messages.length - 1];
  if (last.role !== "user") throw badRequest(`the last message must be the user's (got role "${last.role}")`, `messages[${messages.length - 1}].role`);
  const system: string[] = [];
  messages.slice(0, -1).forEach((m, i) => {
    if (m.role === "system" || m.role === "developer") system.push(contentText(m.content));
    else
      throw badRequest(
        `messages[${i}] is a ${m.role} message: this server keeps each conversation itself (the memory store's session), so send only system messages and the new user message, with dki.session to continue a session`,
        `messages[${i}]`,
        "history_in_request",
      );
  });
  const query = contentText(last.content);
  if (query.trim() === "") throw badRequest("the user message is empty", `messages[${messages.length - 1}].content`);
  return { query, systemPrompt: system.length > 0 ? system.join("\n\n") : undefined };
}

function dkiInfoOf(mode: Mode, user: string, session: string, r: DKIResponse | RAGResponse, serverTtftMs: number): DkiInfo {
  const lat = r.latency;
  const latency: LatencyInfo = {
    ttft_ms: lat.ttftMs,
    total_ms: lat.totalMs,
    queue_ms: lat.queueMs,
    routing_ms: lat.routingMs,
    prompt_ms: lat.promptMs,
    gating_ms: lat.gatingMs,
    entropy_probe_ms: lat.entropyProbeMs,
    kv_load_ms: { ...lat.kvLoadMs },
    kv_compute_ms: lat.kvComputeMs,
    prefill_ms: lat.prefillMs,
    decode_ms: lat.decodeMs,
    record_ms: lat.recordMs,
    server_ttft_ms: serverTtftMs,
  };
  if ("gating" in r) {
    const tiers = r.cache.tiers;
    return {
      mode,
      user,
      session,
      memories: r.memoriesUsed.map((m) => {
        const t = tiers.find((b) => b.kind === "memory" && b.id !== undefined && b.id.split("+").includes(m.id));
        return { id: m.id, text: m.text, relevance: m.relevance, alpha: t?.alpha ?? r.gating.alpha, tier: t?.tier ?? "L4", score: m.score, tokens: m.tokens };
      }),
      memories_left_out: r.metadata.memoriesLeftOut,
      chunks: [],
      preferences_injected: r.metadata.hybridInjection.enabled,
      gate: { inject: r.gating.inject, alpha: r.gating.alpha, relevance: r.gating.relevance, reason: r.gating.reason, forced: r.gating.forced, entropy: r.gating.entropy },
      tiers: tiers.map((b) => ({ kind: b.kind, id: b.id ?? null, tier: b.tier, load_ms: b.loadMs, tokens: b.tokens, alpha: b.alpha })),
      cache_hit: r.cache.hit,
      memory_tokens_kv: tiers.reduce((n, b) => n + b.tokens, 0),
      memory_tokens_prompt: 0,
      preference_tokens: r.metadata.hybridInjection.preferenceTokens,
      history_tokens: r.metadata.hybridInjection.historyTokens,
      context_tokens: 0,
      finish_reason: r.finishReason,
      budget: snakeKeys(r.budget),
      latency,
    };
  }
  return {
    mode,
    user,
    session,
    memories: r.memoriesUsed.map((m) => ({ id: m.id, text: m.text, relevance: m.relevance, alpha: null, tier: "prompt", score: m.score, tokens: m.tokens })),
    memories_left_out: r.metadata.memoriesLeftOut,
    chunks: r.sources.flatMap((x, i) => (x.kind === "chunk" ? [{ marker: i + 1, chunk_id: x.chunkId, doc_id: x.docId, collection: x.collection, heading_path: x.headingPath }] : [])),
    preferences_injected: false,
    gate: null,
    tiers: [],
    cache_hit: false,
    memory_tokens_kv: 0,
    memory_tokens_prompt: r.memoriesUsed.reduce((n, m) => n + m.tokens, 0),
    preference_tokens: 0,
    history_tokens: null,
    context_tokens: r.metadata.contextTokens,
    finish_reason: r.finishReason,
    budget: snakeKeys(r.budget),
    latency,
  };
}

function usageOf(o: TurnOut) {
  return {
    prompt_tokens: o.promptTokens,
    completion_tokens: o.completionTokens,
    total_tokens: o.promptTokens + o.completionTokens,
    // Beyond OpenAI's fields: memory that reached the model as K/V, outside the prompt's tokens.
    memory_tokens_kv: o.dki?.memory_tokens_kv ?? 0,
  };
}

/**
 * Runs one generation for a request: admitted against the bound, aborted when the client goes
 * away (its own turn only), the server's drain runs out, or the turn outlives its timeout; an
 * abort becomes the error that says which.
 */
async function admitted<T>(ctx: ServerContext, request: FastifyRequest, reply: FastifyReply, mode: string, run: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const release = ctx.admission.enter();
  const gone = new AbortController();
  // The response closing before it was finished: the client disconnected.
  const onClose = () => {
    if (!reply.raw.writableFinished) gone.abort(new ApiError(499, "invalid_request_error", "the client closed the connection", null, "client_closed"));
  };
  reply.raw.once("close", onClose);
  const signal = AbortSignal.any([gone.signal, ctx.shutdown.signal, AbortSignal.timeout(ctx.turnTimeoutMs)]);
  try {
    const out = await run(signal);
    ctx.metrics.turns.inc({ mode, outcome: "answered" });
    return out;
  } catch (e) {
    ctx.metrics.turns.inc({ mode, outcome: signal.aborted ? "aborted" : "failed" });
    if (signal.aborted && !(e instanceof ApiError)) {
      if (gone.signal.aborted) throw gone.signal.reason as ApiError;
      if (ctx.shutdown.signal.aborted) throw new ApiError(503, "service_unavailable", "the server shut down before the answer was finished", null, "shutting_down");
      throw new ApiError(504, "server_error", `the turn ran past the server's turn timeout (${ctx.turnTimeoutMs} ms)`, null, "turn_timeout");
    }
    throw e;
  } finally {
    reply.raw.off("close", onClose);
    release();
  }
}

/** The SSE side of a streamed answer: headers go out with the first piece, so an error before it is a plain JSON error. */
class SseReply {
  private stream: PassThrough | null = null;
  private sent: ((r: FastifyReply) => void) | null = null;
  readonly started: Promise<FastifyReply>;

  constructor(private readonly reply: FastifyReply) {
    this.started = new Promise((resolve) => (this.sent = resolve));
  }

  get open(): boolean {
    return this.stream !== null;
  }

  event(data: unknown): void {
    if (this.stream === null) {
      this.stream = new PassThrough();
      this.reply.code(200).header("content-type", "text/event-stream; charset=utf-8").header("cache-control", "no-cache").header("x-accel-buffering", "no");
      this.sent?.(this.reply.send(this.stream));
    }
    this.stream.write(`data: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`);
  }

  end(): void {
    this.stream?.end();
  }
}

/**
 * Answers a generation request: JSON from `finish` when not streamed; when streamed, `chunk` for
 * each piece of text, `last`'s chunks at the end, then `[DONE]`. An error before the first piece
 * is the usual JSON error; after it, an SSE error event ends the stream (no [DONE]).
 */
async function answer<O>(
  request: FastifyRequest,
  reply: FastifyReply,
  stream: boolean,
  run: (onText: (t: string) => void) => Promise<O>,
  finish: (o: O) => unknown,
  chunk: (t: string, first: boolean) => unknown,
  last: (o: O) => unknown[],
): Promise<unknown> {
  if (!stream) return finish(await run(() => {}));
  const sse = new SseReply(reply);
  let first = true;
  const turn = run((t) => {
    sse.event(chunk(t, first));
    first = false;
  }).then(
    (o) => {
      if (first) sse.event(chunk("", true));
      for (const c of last(o)) sse.event(c);
      sse.event("[DONE]");
      sse.end();
    },
    (e: unknown) => {
      if (!sse.open) throw e;
      const api = toApiError(e);
      request.log.warn({ err: e }, "stream ended by an error");
      sse.event(errorBody(api));
      sse.end();
    },
  );
  // Whichever comes first: the stream's start (the reply is then sent) or the turn's error before it.
  return Promise.race([sse.started, turn.then(() => sse.started)]);
}

export function registerOpenAIRoutes(app: FastifyInstance, ctx: ServerContext): void {
  const checkModel = (model: string): void => {
    const id = ctx.systems().modelId;
    if (model !== id) throw new ApiError(404, "invalid_request_error", `The model \`${model}\` does not exist; this server serves \`${id}\``, "model", "model_not_found");
  };
  const maxTokensOf = (b: SamplingBody & { max_completion_tokens?: number }, param: string): number => {
    const n = b.max_completion_tokens ?? b.max_tokens ?? DEFAULT_MAX_TOKENS;
    const window = ctx.systems().model.contextSize;
    if (n > window) throw badRequest(`${param} ${n} exceeds the model's context window (${window} tokens)`, param, "max_tokens_too_large");
    return Math.min(n, window);
  };

  app.post<{ Body: ChatBody }>("/v1/chat/completions", { schema: { body: chatSchema } }, async (request, reply) => {
    const b = request.body;
    const s = ctx.systems();
    checkModel(b.model);
    const { query, systemPrompt } = turnInput(b.messages);
    const user = ctx.turnUser(request, b.user);
    const mode: Mode = b.dki?.mode ?? "dki";
    for (const k of ["alpha", "tau"] as const) if (b.dki?.[k] !== undefined && mode !== "dki") throw badRequest(`dki.${k} applies to mode "dki" only (this request's mode is "${mode}")`, `dki.${k}`);
    if (b.dki?.collection !== undefined && mode !== "rag") throw badRequest(`dki.collection is searched by the RAG baseline: give dki.mode "rag" with it (this request's mode is "${mode}")`, "dki.collection");
    // The turn's user's view: another tenant's collection is as missing as one that does not exist.
    if (b.dki?.collection !== undefined && !s.kb.forUser(user).hasCollection(b.dki.collection)) throw new ApiError(404, "not_found_error", `collection ${JSON.stringify(b.dki.collection)} not found`, "dki.collection", "not_found");
    if (b.dki?.tau !== undefined && b.dki.alpha !== undefined) throw badRequest("dki.tau is the gate's threshold: it does nothing with dki.alpha, which bypasses the gate", "dki.tau");
    const maxNewTokens = maxTokensOf(b, b.max_completion_tokens !== undefined ? "max_completion_tokens" : "max_tokens");
    const session = b.dki?.session ?? `api-${randomUUID()}`;
    const id = `chatcmpl-${randomUUID()}`;
    const created = now();
    const t0 = performance.now();
    const run = (onText: (t: string) => void) =>
      admitted(ctx, request, reply, mode, async (signal): Promise<TurnOut> => {
        let firstAt = 0;
        const onToken = (t: string) => {
          if (firstAt === 0) firstAt = performance.now();
          onText(t);
        };
        const common = { userId: user, sessionId: session, maxNewTokens, sampling: samplingOf(b), stop: stopOf(b), onToken, signal, systemPrompt, maxMemories: b.dki?.max_memories };
        const r = mode === "rag" ? await s.rag.chat(query, { ...common, collection: b.dki?.collection }) : await s.dki.chat(query, { ...common, forceAlpha: b.dki?.alpha, relevanceThreshold: b.dki?.tau, allowInjection: mode !== "none" });
        const serverTtft = (firstAt || performance.now()) - t0;
        const dki = dkiInfoOf(mode, user, session, r, serverTtft);
        const m = ctx.metrics;
        m.ttft.observe({ mode }, serverTtft / 1000);
        m.latency.observe({ mode }, (performance.now() - t0) / 1000);
        m.tokens.inc({ kind: "prompt" }, r.inputTokens);
        m.tokens.inc({ kind: "completion" }, r.outputTokens);
        m.tokens.inc({ kind: "memory_kv" }, dki.memory_tokens_kv);
        if ("cache" in r) for (const t of r.cache.tiers) m.kvBlocks.inc({ tier: t.tier });
        return { text: r.text, finishReason: r.finishReason, promptTokens: r.inputTokens, completionTokens: r.outputTokens, dki };
      });
    const model = s.modelId;
    return answer(
      request,
      reply,
      b.stream === true,
      run,
      (o) => ({ id, object: "chat.completion", created, model, choices: [{ index: 0, message: { role: "assistant", content: o.text, refusal: null }, logprobs: null, finish_reason: openaiFinish(o.finishReason) }], usage: usageOf(o), dki: o.dki }),
      (t, first) => ({ id, object: "chat.completion.chunk", created, model, choices: [{ index: 0, delta: first ? { role: "assistant", content: t } : { content: t }, logprobs: null, finish_reason: null }] }),
      (o) => [
        { id, object: "chat.completion.chunk", created, model, choices: [{ index: 0, delta: {}, logprobs: null, finish_reason: openaiFinish(o.finishReason) }], usage: usageOf(o), dki: o.dki },
        ...(b.stream_options?.include_usage ? [{ id, object: "chat.completion.chunk", created, model, choices: [], usage: usageOf(o), dki: o.dki }] : []),
      ],
    );
  });

  app.post<{ Body: CompletionBody }>("/v1/completions", { schema: { body: completionSchema } }, async (request, reply) => {
    const b = request.body;
    const s = ctx.systems();
    checkModel(b.model);
    const prompt = typeof b.prompt === "string" ? b.prompt : b.prompt[0];
    if (prompt === "") throw badRequest("prompt is empty", "prompt");
    const maxNewTokens = maxTokensOf(b, "max_tokens");
    const id = `cmpl-${randomUUID()}`;
    const created = now();
    const t0 = performance.now();
    const run = (onText: (t: string) => void) =>
      admitted(ctx, request, reply, "completion", async (signal): Promise<TurnOut> => {
        let firstAt = 0;
        const r = await s.model.generate(prompt, {
          maxNewTokens,
          sampling: samplingOf(b),
          stop: stopOf(b),
          signal,
          onToken: (t) => {
            if (firstAt === 0) firstAt = performance.now();
            onText(t);
          },
        });
        ctx.metrics.ttft.observe({ mode: "completion" }, ((firstAt || performance.now()) - t0) / 1000);
        ctx.metrics.latency.observe({ mode: "completion" }, (performance.now() - t0) / 1000);
        ctx.metrics.tokens.inc({ kind: "prompt" }, r.stats.promptTokens);
        ctx.metrics.tokens.inc({ kind: "completion" }, r.tokens.length);
        return { text: r.text, finishReason: r.finishReason, promptTokens: r.stats.promptTokens, completionTokens: r.tokens.length, dki: null };
      });
    const model = s.modelId;
    const usage = (o: TurnOut) => ({ prompt_tokens: o.promptTokens, completion_tokens: o.completionTokens, total_tokens: o.promptTokens + o.completionTokens });
    return answer(
      request,
      reply,
      b.stream === true,
      run,
      (o) => ({ id, object: "text_completion", created, model, choices: [{ index: 0, text: o.text, logprobs: null, finish_reason: openaiFinish(o.finishReason) }], usage: usage(o) }),
      (t) => ({ id, object: "text_completion", created, model, choices: [{ index: 0, text: t, logprobs: null, finish_reason: null }] }),
      (o) => [{ id, object: "text_completion", created, model, choices: [{ index: 0, text: "", logprobs: null, finish_reason: openaiFinish(o.finishReason) }], usage: usage(o) }],
    );
  });

  const modelObject = () => ({ id: ctx.systems().modelId, object: "model", created: Math.floor(ctx.startedAt / 1000), owned_by: "dki-engine" });
  app.get("/v1/models", async () => ({ object: "list", data: [modelObject()] }));
  app.get<{ Params: { model: string } }>("/v1/models/:model", async (request) => {
    const m = modelObject();
    if (request.params.model !== m.id) throw new ApiError(404, "invalid_request_error", `The model \`${request.params.model}\` does not exist; this server serves \`${m.id}\``, "model", "model_not_found");
    return m;
  });

  app.post<{ Body: EmbeddingBody }>("/v1/embeddings", { schema: { body: embeddingSchema } }, async (request) => {
    const b = request.body;
    const s = ctx.systems();
    const embedder = s.store.embedder;
    // The served model's name or the embedder's own id both name the store's embedder.
    if (b.model !== s.modelId && b.model !== embedder.id) throw new ApiError(404, "invalid_request_error", `The model \`${b.model}\` does not exist; embeddings come from the store's embedder \`${embedder.id}\` (or name \`${s.modelId}\`)`, "model", "model_not_found");
    if (b.dimensions !== undefined && b.dimensions !== embedder.dim) throw badRequest(`dimensions ${b.dimensions}: the store's embedder gives ${embedder.dim}-dimensional vectors`, "dimensions");
    if (b.user !== undefined) ctx.turnUser(request, b.user);
    const inputs = typeof b.input === "string" ? [b.input] : b.input;
    const vectors = await embedder.embed(inputs);
    const tokens = inputs.reduce((n, t) => n + s.model.tokenizer.encode(t, { addSpecialTokens: false }).length, 0);
    return {
      object: "list",
      data: vectors.map((v, index) => ({ object: "embedding", index, embedding: b.encoding_format === "base64" ? Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("base64") : Array.from(v) })),
      model: embedder.id,
      // Counted with the served model's tokenizer: the store's embedder need not have tokens of its own.
      usage: { prompt_tokens: tokens, total_tokens: tokens },
    };
  });
}
