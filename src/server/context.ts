// What every route reads: the systems (once loaded), who the caller is and whom it may act for,
// the admission bound, the metrics and the server's own abort (shutdown).
import type { FastifyRequest } from "fastify";
import type { Admission } from "./admission.js";
import { OPEN_PRINCIPAL, type Principal } from "./auth.js";
import { ApiError, badRequest, notFound } from "./errors.js";
import type { ServerMetrics } from "./metrics.js";
import type { ServerSystems } from "./systems.js";

declare module "fastify" {
  interface FastifyRequest {
    /** Set by the auth hook before any route runs. */
    principal: Principal;
  }
}

export type Phase = "loading" | "ready" | "failed" | "stopping";

/** The user of a turn that names none on a server without keys. */
export const DEFAULT_USER = "default";

/** Longest user, session and record id a request may name. */
export const MAX_ID_LENGTH = 256;

export class ServerContext {
  phase: Phase = "loading";
  private loaded: ServerSystems | null = null;
  loadError: string | null = null;
  readonly startedAt = Date.now();
  /** Aborted when a drain runs out of time: every turn still running stops. */
  readonly shutdown = new AbortController();

  constructor(
    readonly admission: Admission,
    readonly metrics: ServerMetrics,
    /** How long one turn may run before it is aborted. */
    readonly turnTimeoutMs: number,
  ) {}

  setSystems(s: ServerSystems): void {
    this.loaded = s;
    this.phase = "ready";
  }

  get systemsIfLoaded(): ServerSystems | null {
    return this.loaded;
  }

  /** The systems, or 503 while the model loads (or after it failed to, or while stopping). */
  systems(): ServerSystems {
    if (this.phase === "ready" && this.loaded) return this.loaded;
    const why = this.phase === "loading" ? "the model is still loading" : this.phase === "stopping" ? "the server is shutting down" : `the model failed to load: ${this.loadError ?? "unknown error"}`;
    throw new ApiError(503, "service_unavailable", `${why}; retry later`, null, this.phase, this.phase === "loading" ? { "retry-after": "1" } : {});
  }

  /**
   * The user a turn acts for: the request's `user`, or the key's one user when it names none. A
   * user the key may not act for is refused (403): the answer is about the key, the same whether
   * that user has data or not.
   */
  turnUser(request: FastifyRequest, user: string | undefined, param = "user"): string {
    const p = request.principal;
    const u = user ?? p.defaultUser ?? (p === OPEN_PRINCIPAL ? DEFAULT_USER : undefined);
    if (u === undefined) throw badRequest(`${param} is required: this API key may act for several users, so the request must name one`, param, "missing_user");
    if (!p.mayActFor(u)) throw new ApiError(403, "permission_error", `this API key may not act for the user named in ${param}`, param, "user_not_allowed");
    return u;
  }

  /**
   * The user whose data a memory route reads or writes. One the key may not act for reads as not
   * found (404), exactly as an id that names nothing: a key cannot tell another tenant's data from
   * none.
   */
  dataUser(request: FastifyRequest, user: string | undefined, param = "user_id"): string {
    const p = request.principal;
    const u = user ?? p.defaultUser;
    if (u === undefined) throw badRequest(`${param} is required`, param, "missing_user");
    if (!p.mayActFor(u)) throw notFound("user", param);
    return u;
  }
}
