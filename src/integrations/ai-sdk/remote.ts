// The provider's turns and embeddings over a `dki serve` URL: each SDK call is one request to the
// server's OpenAI routes with its `dki` request object (session, mode, α), and the answer is read
// back from its `dki` response object into the same metadata, usage and finish reason the
// in-process provider gives (turnOutcome), so an application can switch by configuration.
import { APICallError, type SharedV3Warning } from "@ai-sdk/provider";
import { z } from "zod";
import { DEFAULT_MAX_NEW_TOKENS } from "../../engine/generate.js";
import type { DkiCall } from "./call.js";
import type { EmbedTexts } from "./embedding-model.js";
import type { DkiTurns } from "./language-model.js";
import { priorWarningsAgainst, turnOutcome, type TurnMetadata, type TurnOutcome } from "./turn.js";

export interface DkiServerSettings {
  /** The server's base URL, e.g. "http://127.0.0.1:8080" (its routes are under /v1). */
  url: string;
  /** A key of the server's --api-key-file, sent as `Authorization: Bearer …`. */
  apiKey?: string;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
}

const finishReasons = z.enum(["eos", "stop", "length", "context", "aborted"]);
const memory = z.object({ id: z.string(), text: z.string(), score: z.number(), relevance: z.number(), tokens: z.number() });
const latency = z.object({
  ttft_ms: z.number(),
  total_ms: z.number(),
  queue_ms: z.number(),
  routing_ms: z.number(),
  prompt_ms: z.number(),
  gating_ms: z.number(),
  entropy_probe_ms: z.number(),
  kv_load_ms: z.object({ L1: z.number(), L2: z.number(), L3: z.number() }),
  kv_compute_ms: z.number(),
  prefill_ms: z.number(),
  decode_ms: z.number(),
  record_ms: z.number(),
});
/** The fields of the server's `dki` response object (src/server/openai.ts, DkiInfo) the metadata is read from. */
const dkiInfo = z.object({
  mode: z.enum(["dki", "rag", "none"]),
  user: z.string(),
  session: z.string(),
  memories: z.array(memory),
  memories_left_out: z.array(z.object({ id: z.string(), reason: z.string() })),
  gate: z.object({ inject: z.boolean(), alpha: z.number(), relevance: z.number(), reason: z.string(), forced: z.boolean(), entropy: z.number().nullable() }).nullable(),
  tiers: z.array(z.object({ kind: z.enum(["preferences", "memory"]), id: z.string().nullable(), tier: z.string(), load_ms: z.number(), tokens: z.number(), alpha: z.number() })),
  cache_hit: z.boolean(),
  preference_tokens: z.number(),
  history_tokens: z.number().nullable(),
  context_tokens: z.number(),
  finish_reason: finishReasons,
  budget: z.object({ memory_tokens: z.number() }),
  latency,
});
const usage = z.object({ prompt_tokens: z.number(), completion_tokens: z.number() });
const completion = z.object({ choices: z.array(z.object({ message: z.object({ content: z.string().nullable() }) })).length(1), usage, dki: dkiInfo });
const chunk = z.object({
  choices: z.array(z.object({ delta: z.object({ content: z.string().nullish() }), finish_reason: z.string().nullable() })),
  usage: usage.optional(),
  dki: dkiInfo.optional(),
});
const openaiError = z.object({ error: z.object({ message: z.string(), type: z.string().nullish(), code: z.string().nullish(), param: z.string().nullish() }) });
const models = z.object({ data: z.array(z.object({ id: z.string() })).min(1) });
const embeddings = z.object({ data: z.array(z.object({ index: z.number(), embedding: z.array(z.number()) })), model: z.string() });

type DkiInfo = z.infer<typeof dkiInfo>;

/** The server's `dki` object and usage as the provider's metadata (the in-process provider's fields, camelCase). */
function metadataOf(d: DkiInfo, u: z.infer<typeof usage>): TurnMetadata {
  const l = d.latency;
  const common = {
    userId: d.user,
    sessionId: d.session,
    memories: d.memories.map((m) => ({ id: m.id, text: m.text, score: m.score, relevance: m.relevance, tokens: m.tokens })),
    memoriesLeftOut: d.memories_left_out.map((x) => ({ id: x.id, reason: x.reason })),
    promptTokens: u.prompt_tokens,
    outputTokens: u.completion_tokens,
    ttftMs: l.ttft_ms,
    latency: {
      queueMs: l.queue_ms,
      routingMs: l.routing_ms,
      promptMs: l.prompt_ms,
      gatingMs: l.gating_ms,
      entropyProbeMs: l.entropy_probe_ms,
      kvLoadMs: { ...l.kv_load_ms },
      kvComputeMs: l.kv_compute_ms,
      prefillMs: l.prefill_ms,
      decodeMs: l.decode_ms,
      ttftMs: l.ttft_ms,
      recordMs: l.record_ms,
      totalMs: l.total_ms,
    },
    finishReason: d.finish_reason,
  };
  if (d.mode === "rag") return { ...common, mode: "rag", injected: false, alpha: null, gateReason: null, tiers: [], contextTokens: d.context_tokens, memoryTokens: 0 };
  const g = d.gate;
  if (g === null || d.history_tokens === null) throw new Error(`dki serve's answer for mode "${d.mode}" has no gate or history tokens: is the server an older dki-engine than this provider?`);
  return {
    ...common,
    mode: d.mode,
    injected: g.inject,
    alpha: g.alpha,
    gateReason: g.reason,
    forced: g.forced,
    relevance: g.relevance,
    entropy: g.entropy,
    tiers: d.tiers.map((b) => ({ kind: b.kind, id: b.id, tier: b.tier, loadMs: b.load_ms, tokens: b.tokens, alpha: b.alpha })),
    cacheHit: d.cache_hit,
    memoryTokens: d.budget.memory_tokens,
    preferenceTokens: d.preference_tokens,
    historyTokens: d.history_tokens,
  };
}

/** Requests to one `dki serve`: JSON in and out, every failure an APICallError that names the status and the server's message. */
export class DkiServerClient {
  readonly baseUrl: string;
  private modelId: Promise<string> | null = null;

  constructor(private readonly settings: DkiServerSettings) {
    let u: URL;
    try {
      u = new URL(settings.url);
    } catch {
      throw new TypeError(`createDki: url ${JSON.stringify(settings.url)} is not a URL (give the server's base URL, e.g. "http://127.0.0.1:8080")`);
    }
    if (u.protocol !== "http:" && u.protocol !== "https:") throw new TypeError(`createDki: url ${JSON.stringify(settings.url)} must be http: or https:`);
    // Accepted with or without the /v1 the OpenAI clients are given.
    this.baseUrl = u.href.replace(/\/+$/, "").replace(/\/v1$/, "");
  }

  /** Sends a request; resolves with the response once its status is 2xx. */
  async request(method: "GET" | "POST", path: string, body: unknown, signal: AbortSignal | undefined): Promise<Response> {
    const url = this.baseUrl + path;
    const headers: Record<string, string> = { accept: "application/json, text/event-stream", ...this.settings.headers };
    if (this.settings.apiKey !== undefined) headers.authorization = `Bearer ${this.settings.apiKey}`;
    if (body !== undefined) headers["content-type"] = "application/json";
    let response: Response;
    try {
      response = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal });
    } catch (e) {
      if (signal?.aborted) throw signal.reason;
      const cause = e instanceof Error && e.cause instanceof Error ? `${e.message}: ${e.cause.message}` : String(e);
      throw new APICallError({ message: `could not reach dki serve at ${this.baseUrl} (${method} ${path}): ${cause}`, url, requestBodyValues: body, cause: e, isRetryable: true });
    }
    if (response.ok) return response;
    const text = await response.text().catch(() => "");
    const responseHeaders = Object.fromEntries(response.headers.entries());
    const parsed = openaiError.safeParse(safeJson(text));
    const what = parsed.success ? `${parsed.data.error.message}${parsed.data.error.code ? ` (${parsed.data.error.code}${parsed.data.error.param ? `, ${parsed.data.error.param}` : ""})` : ""}` : text.slice(0, 500) || response.statusText;
    const retry = response.headers.get("retry-after");
    throw new APICallError({
      message: `dki serve answered ${response.status} to ${method} ${new URL(url).pathname}: ${what}${retry !== null ? ` (Retry-After: ${retry} s)` : ""}`,
      url,
      requestBodyValues: body,
      statusCode: response.status,
      responseHeaders,
      responseBody: text,
      data: parsed.success ? parsed.data : undefined,
      // 429 (the server's queue is full) and 5xx are worth a retry, which the SDK then spaces by Retry-After; 4xx is the request's fault.
      isRetryable: response.status === 429 || response.status >= 500,
    });
  }

  async json<T>(method: "GET" | "POST", path: string, body: unknown, schema: z.ZodType<T>, signal: AbortSignal | undefined): Promise<T> {
    const r = await this.request(method, path, body, signal);
    const text = await r.text();
    return this.parse(schema, text, { method, path, body });
  }

  /** A response body (or one SSE event's data) read with `schema`; anything else is an error naming the route and the fields at fault. */
  parse<T>(schema: z.ZodType<T>, text: string, at: { method: string; path: string; body: unknown; part?: string }): T {
    const parsed = schema.safeParse(safeJson(text));
    if (parsed.success) return parsed.data;
    const problems = parsed.error.issues.slice(0, 3).map((i) => `${i.path.join(".") || "(the body)"}: ${i.message}`).join("; ");
    throw new APICallError({
      message: `dki serve's answer to ${at.method} ${at.path}${at.part !== undefined ? ` (${at.part})` : ""} is not what this provider reads (${problems}): is ${this.baseUrl} a dki serve of this version?`,
      url: this.baseUrl + at.path,
      requestBodyValues: at.body,
      responseBody: text.slice(0, 2000),
      isRetryable: false,
    });
  }

  /** The model the server serves (its /v1/models), named in every request; asked once. */
  served(signal: AbortSignal | undefined): Promise<string> {
    // Shared by concurrent calls, so not tied to one call's signal: that call stops waiting instead.
    this.modelId ??= this.json("GET", "/v1/models", undefined, models, undefined).then(
      (m) => m.data[0]!.id,
      (e: unknown) => {
        this.modelId = null; // not kept: the next call asks again
        throw e;
      },
    );
    if (signal === undefined) return this.modelId;
    signal.throwIfAborted();
    const pending = this.modelId;
    return new Promise<string>((resolve, reject) => {
      const onAbort = () => reject(signal.reason);
      signal.addEventListener("abort", onAbort, { once: true });
      void pending.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
    });
  }
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** The chat completion request for a call: its prompt, settings and `dki` object. */
function chatBody(model: string, call: DkiCall, stream: boolean): Record<string, unknown> {
  const messages: { role: string; content: string }[] = [];
  if (call.systemPrompt !== undefined) messages.push({ role: "system", content: call.systemPrompt });
  messages.push({ role: "user", content: call.query });
  const s = call.sampling;
  return {
    model,
    messages,
    user: call.dki.userId,
    // The engine's own default, not the server's (256): the same call answers alike in process and over HTTP.
    max_tokens: call.maxNewTokens ?? DEFAULT_MAX_NEW_TOKENS,
    ...(s?.temperature !== undefined ? { temperature: s.temperature } : {}),
    ...(s?.topP !== undefined ? { top_p: s.topP } : {}),
    ...(s?.seed !== undefined ? { seed: s.seed } : {}),
    ...(call.stop !== undefined ? { stop: call.stop } : {}),
    stream,
    dki: { session: call.dki.sessionId, mode: call.modelId, ...(call.dki.alpha !== undefined ? { alpha: call.dki.alpha } : {}) },
  };
}

/** The turns of a provider over `dki serve`. */
export function serverTurns(client: DkiServerClient): DkiTurns {
  return {
    async warnings(call, signal) {
      const w: SharedV3Warning[] = [];
      if (call.sampling?.topK !== undefined) w.push({ type: "unsupported", feature: "topK", details: "dki serve's chat completions take no top_k; not applied" });
      if (call.prior.length > 0) {
        // The session's record on the server, to tell whether the earlier messages are it (404: no such session yet).
        const path = `/v1/sessions/${encodeURIComponent(call.dki.sessionId)}/messages?user_id=${encodeURIComponent(call.dki.userId)}`;
        let turns: { role: string; text: string }[] = [];
        try {
          const r = await client.json("GET", path, undefined, z.object({ results: z.array(z.object({ role: z.string(), content: z.string() })) }), signal);
          turns = r.results.map((t) => ({ role: t.role, text: t.content }));
        } catch (e) {
          if (!(APICallError.isInstance(e) && e.statusCode === 404)) throw e;
        }
        w.push(...priorWarningsAgainst(call, turns));
      }
      return w;
    },

    async run(call, signal, onText): Promise<TurnOutcome> {
      const model = await client.served(signal);
      const body = chatBody(model, call, onText !== undefined);
      if (onText === undefined) {
        const r = await client.json("POST", "/v1/chat/completions", body, completion, signal);
        return turnOutcome(r.choices[0]!.message.content ?? "", metadataOf(r.dki, r.usage));
      }
      const at = { method: "POST", path: "/v1/chat/completions", body };
      const response = await client.request("POST", at.path, body, signal);
      let text = "";
      let outcome: TurnOutcome | null = null;
      for await (const data of sseData(response, signal)) {
        // Read up to [DONE] rather than leave once the answer is complete, so that the connection ends as the server ends it.
        if (data === "[DONE]") break;
        const failed = openaiError.safeParse(safeJson(data));
        if (failed.success) {
          // An error after the stream started (the turn failed, timed out, or the server shut down): the status was already 200.
          const e = failed.data.error;
          throw new APICallError({ message: `dki serve ended the stream with an error: ${e.message}${e.code ? ` (${e.code})` : ""}`, url: client.baseUrl + at.path, requestBodyValues: body, statusCode: 200, responseBody: data, data: failed.data, isRetryable: false });
        }
        const c = client.parse(chunk, data, { ...at, part: "a stream chunk" });
        const choice = c.choices[0];
        const delta = choice?.delta.content;
        if (outcome === null && delta !== undefined && delta !== null && delta !== "") {
          text += delta;
          onText(delta);
        }
        // The chunk with the finish reason carries the turn's usage and dki object; the text is the deltas'.
        if (outcome === null && choice?.finish_reason !== null && choice?.finish_reason !== undefined && c.dki !== undefined && c.usage !== undefined) {
          outcome = turnOutcome(text, metadataOf(c.dki, c.usage));
        }
      }
      if (outcome === null) throw new APICallError({ message: "dki serve's stream ended before the answer was finished (no chunk with a finish reason)", url: client.baseUrl + at.path, requestBodyValues: body, isRetryable: false });
      return outcome;
    },
  };
}

/** The `data:` payloads of an SSE response as they come. Aborting the signal (or leaving the loop) cancels the body, which closes the request. */
async function* sseData(response: Response, signal: AbortSignal | undefined): AsyncGenerator<string> {
  if (response.body === null) return;
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      buf += value.replace(/\r\n/g, "\n");
      for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
        const event = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = event
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, ""))
          .join("\n");
        if (data !== "") yield data;
      }
    }
  } catch (e) {
    if (signal?.aborted) throw signal.reason;
    throw e;
  } finally {
    await reader.cancel().catch(() => {});
  }
}

/** The store's embeddings from the server's /v1/embeddings. */
export function serverEmbeddings(client: DkiServerClient): EmbedTexts {
  return async (values, signal) => {
    const model = await client.served(signal);
    const r = await client.json("POST", "/v1/embeddings", { model, input: values }, embeddings, signal);
    const vectors = [...r.data].sort((a, b) => a.index - b.index).map((d) => d.embedding);
    if (vectors.length !== values.length) throw new APICallError({ message: `dki serve returned ${vectors.length} embeddings for ${values.length} texts`, url: client.baseUrl + "/v1/embeddings", requestBodyValues: { model, input: values }, isRetryable: false });
    return { embeddings: vectors, embedder: r.model, dimensions: vectors[0]?.length ?? 0 };
  };
}
