// The HTTP server: Fastify with JSON schemas at the edge (unknown fields refused, not dropped),
// API keys checked before any route, OpenAI's error objects for every failure, Prometheus
// metrics, and a lifecycle that answers 503 while the model loads and drains on shutdown.
// The routes are thin: each checks its input and calls the systems (DKISystem, RAGSystem, the
// memory store), which do the work.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import Fastify, { type FastifyInstance, type FastifyServerOptions } from "fastify";
import { packageRoot } from "../engine/native.js";
import { Admission } from "./admission.js";
import { ApiKeys, NO_ONE, OPEN_PRINCIPAL, type Principal } from "./auth.js";
import { ServerContext } from "./context.js";
import { ApiError, badRequest, errorHandler } from "./errors.js";
import { registerKbRoutes } from "./kb-api.js";
import { registerMemoryRoutes } from "./memory-api.js";
import { ServerMetrics } from "./metrics.js";
import { registerOpenAIRoutes } from "./openai.js";
import type { ServerSystems } from "./systems.js";

export interface ServerOptions {
  /** API keys; none: every request may act for any user (fit for a loopback-only server). */
  keys?: ApiKeys;
  /** Turns held at once (running or waiting for the model) before a request gets 429 (default 16). */
  maxQueue?: number;
  /** Largest request body in bytes (default 1 MiB). */
  bodyLimit?: number;
  /** A turn running longer is aborted (default 10 minutes). */
  turnTimeoutMs?: number;
  /** Fastify's logger (pino): false for none, true for JSON lines on stdout, or its options. */
  logger?: FastifyServerOptions["logger"];
  /** Origins allowed to call from a browser; none (the default): no CORS headers at all. */
  corsOrigins?: string[];
}

export interface DkiServer {
  app: FastifyInstance;
  context: ServerContext;
  /** The systems are open: routes start answering. */
  ready(systems: ServerSystems): void;
  /** Loading failed: /health says why, and routes answer 503. */
  failed(e: unknown): void;
  /**
   * Stops taking requests, lets the turns in flight finish (aborting those still running after
   * `drainMs`), closes the systems (store, cache, model) and the listener.
   */
  close(o?: { drainMs?: number }): Promise<void>;
}

/** Routes that need no key: liveness, metrics and the web UI's files carry no user's data. */
const PUBLIC = new Set(["/health", "/metrics", "/", "/ui/app.js", "/ui/app.css"]);

/** The web UI's files, shipped built in ui/public (npm run build:ui), read once. */
function uiFiles(): Map<string, { type: string; body: Buffer }> {
  const dir = join(packageRoot(), "ui", "public");
  return new Map([
    ["/", { type: "text/html; charset=utf-8", body: readFileSync(join(dir, "index.html")) }],
    ["/ui/app.js", { type: "text/javascript; charset=utf-8", body: readFileSync(join(dir, "app.js")) }],
    ["/ui/app.css", { type: "text/css; charset=utf-8", body: readFileSync(join(dir, "app.css")) }],
  ]);
}

export const DEFAULT_MAX_QUEUE = 16;
export const DEFAULT_BODY_LIMIT = 1024 * 1024;

export function createServer(o: ServerOptions = {}): DkiServer {
  const admission = new Admission(o.maxQueue ?? DEFAULT_MAX_QUEUE);
  const metrics = new ServerMetrics(() => admission.depth);
  const ctx = new ServerContext(admission, metrics, o.turnTimeoutMs ?? 10 * 60_000);
  const app = Fastify({
    logger: o.logger ?? false,
    bodyLimit: o.bodyLimit ?? DEFAULT_BODY_LIMIT,
    // A client has this long to send its whole request (a slow sender cannot hold a connection).
    requestTimeout: 30_000,
    // Unknown fields are errors here (OpenAI answers them with 400), never silently dropped; types are not coerced.
    ajv: { customOptions: { removeAdditional: false, coerceTypes: false, allErrors: false } },
    return503OnClosing: true,
    forceCloseConnections: "idle",
  });
  // Set for every request by the auth hook below (a decorator may not hold an object itself).
  app.decorateRequest("principal", null as unknown as Principal);

  // JSON bodies must be UTF-8: a body with bytes that are not is refused, not read with U+FFFD.
  const parseJson = app.getDefaultJsonParser("error", "error");
  // Only JSON is read: a text/plain body (Fastify's other default) is refused with 415.
  app.removeContentTypeParser(["application/json", "text/plain"]);
  app.addContentTypeParser("application/json", { parseAs: "buffer" }, (request, raw, done) => {
    const bytes = raw as Buffer;
    let text: string;
    try {
      text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    } catch {
      done(badRequest("the request body is not valid UTF-8", null, "invalid_utf8"), undefined);
      return;
    }
    parseJson(request, text, done);
  });

  app.setErrorHandler(errorHandler);
  app.setNotFoundHandler((request, reply) => {
    void reply.code(404).send({ error: { message: `no route ${request.method} ${request.url.split("?")[0]}`, type: "invalid_request_error", param: null, code: "unknown_route" } });
  });

  app.addHook("onRequest", async (request, reply) => {
    if (o.corsOrigins !== undefined) {
      const origin = request.headers.origin;
      if (origin !== undefined && o.corsOrigins.includes(origin)) {
        void reply.header("access-control-allow-origin", origin).header("vary", "origin").header("access-control-allow-headers", "authorization, content-type").header("access-control-allow-methods", "GET, POST, PUT, DELETE");
        if (request.method === "OPTIONS") return reply.code(204).send();
      }
    }
    if (o.keys === undefined) request.principal = OPEN_PRINCIPAL;
    else if (PUBLIC.has(request.url.split("?")[0])) request.principal = NO_ONE;
    else request.principal = o.keys.identify(request.headers.authorization);
  });

  app.addHook("onResponse", async (request, reply) => {
    const route = request.routeOptions.url ?? "unmatched";
    const status = String(reply.statusCode);
    metrics.requests.inc({ route, method: request.method, status });
    if (reply.statusCode >= 400) metrics.errors.inc({ route, status });
  });

  app.get("/health", async (_request, reply) => {
    const s = ctx.systemsIfLoaded;
    const uptime = (Date.now() - ctx.startedAt) / 1000;
    if (ctx.phase !== "ready" || s === null) return reply.code(503).send({ status: ctx.phase, uptime_s: uptime, ...(ctx.loadError ? { error: ctx.loadError } : {}) });
    return { status: "ok", model: s.modelId, device: s.model.info.device, context_size: s.model.contextSize, embedder: s.store.embedder.id, uptime_s: uptime, queue_depth: admission.depth, queue_bound: admission.limit };
  });

  app.get("/metrics", async (_request, reply) => {
    return reply.header("content-type", metrics.registry.contentType).send(await metrics.registry.metrics());
  });

  // The UI loads nothing from elsewhere: the policy says so to the browser too.
  for (const [path, file] of uiFiles()) {
    app.get(path, async (_request, reply) => reply.header("content-type", file.type).header("content-security-policy", "default-src 'self'").header("cache-control", "no-cache").send(file.body));
  }

  registerOpenAIRoutes(app, ctx);
  registerMemoryRoutes(app, ctx);
  registerKbRoutes(app, ctx);

  let closing: Promise<void> | null = null;
  const close = (c: { drainMs?: number } = {}): Promise<void> => {
    closing ??= (async () => {
      // New requests get 503 from here on; those in flight go on.
      const stopped = app.close();
      const wasReady = ctx.phase === "ready";
      ctx.phase = "stopping";
      const timer = setTimeout(() => ctx.shutdown.abort(new ApiError(503, "service_unavailable", "the server shut down", null, "shutting_down")), c.drainMs ?? 30_000);
      // A keep-alive connection whose last answer ends during the drain would otherwise hold the
      // listener open until its keep-alive timeout: closed as soon as it is idle.
      const idle = setInterval(() => app.server.closeIdleConnections(), 50);
      try {
        await stopped;
        if (wasReady) await ctx.systemsIfLoaded?.close();
      } finally {
        clearTimeout(timer);
        clearInterval(idle);
      }
    })();
    return closing;
  };

  return {
    app,
    context: ctx,
    ready: (s) => ctx.setSystems(s),
    failed: (e) => {
      ctx.phase = "failed";
      ctx.loadError = e instanceof Error ? e.message : String(e);
    },
    close,
  };
}
