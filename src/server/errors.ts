// Errors as OpenAI's API returns them: `{ error: { message, type, param, code } }` with the HTTP
// status its clients expect (the official client turns 400/401/403/404/429/5xx into its own error
// classes by status). Everything thrown in a route ends up here, so a bad request never reaches a
// client as a stack trace or a bare 500.
import type { FastifyError, FastifyReply, FastifyRequest } from "fastify";
import { DkiArgumentError } from "../errors.js";
import { MemoryNotFoundError } from "../memory/errors.js";

export type ErrorType = "invalid_request_error" | "authentication_error" | "permission_error" | "not_found_error" | "rate_limit_error" | "server_error" | "service_unavailable";

export interface ErrorBody {
  error: { message: string; type: ErrorType; param: string | null; code: string | null };
}

/** An error a route answers with: its status, OpenAI type, the request field at fault and a code. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly type: ErrorType,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
    /** Extra response headers (Retry-After on a 429). */
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = "ApiError";
  }
}

export const badRequest = (message: string, param: string | null = null, code: string | null = null) => new ApiError(400, "invalid_request_error", message, param, code);

/**
 * What a caller gets for a record or user it may not see: the same words whether it exists or
 * not, so a key cannot probe another tenant's ids.
 */
export const notFound = (what: string, param: string | null = null) => new ApiError(404, "not_found_error", `${what} not found`, param, "not_found");

export function body(e: ApiError): ErrorBody {
  return { error: { message: e.message, type: e.type, param: e.param, code: e.code } };
}

/** The parameter a JSON-schema error is about: the unknown property, the missing one, or the path. */
function schemaParam(e: FastifyError): string | null {
  const v = e.validation?.[0];
  if (!v) return null;
  const path = v.instancePath.replace(/^\//, "").replace(/\//g, ".");
  const params = v.params as { additionalProperty?: string; missingProperty?: string };
  const leaf = params.additionalProperty ?? params.missingProperty;
  if (leaf !== undefined) return path === "" ? leaf : `${path}.${leaf}`;
  return path === "" ? null : path;
}

/** Any error thrown while handling a request, as the ApiError the client gets. */
export function toApiError(e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  if (e instanceof MemoryNotFoundError) return notFound(e.kind, "id");
  if (e instanceof DkiArgumentError) return badRequest(e.message);
  const fe = e as Partial<FastifyError>;
  if (fe.validation) {
    const v = fe.validation[0];
    const params = v?.params as { additionalProperty?: string } | undefined;
    const param = schemaParam(fe as FastifyError);
    const what = fe.validationContext ?? "body";
    const message = params?.additionalProperty !== undefined ? `${what}: unknown field ${JSON.stringify(param)}` : `${what}${v?.instancePath.replace(/\//g, ".") ?? ""} ${v?.message ?? "is invalid"}`;
    return badRequest(message, param, params?.additionalProperty !== undefined ? "unknown_field" : "invalid_value");
  }
  switch (fe.code) {
    case "FST_ERR_CTP_BODY_TOO_LARGE":
      return new ApiError(413, "invalid_request_error", fe.message ?? "request body is too large", null, "body_too_large");
    case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
      return new ApiError(415, "invalid_request_error", `${fe.message ?? "unsupported media type"}; send application/json`, null, "unsupported_media_type");
    case "FST_ERR_CTP_EMPTY_JSON_BODY":
      return badRequest("the request body is empty; send a JSON object", null, "invalid_json");
    case "FST_ERR_CTP_INVALID_JSON_BODY":
      return badRequest(`the request body is not valid JSON: ${fe.message ?? ""}`, null, "invalid_json");
  }
  // Fastify's JSON parser reports malformed JSON as a SyntaxError carrying statusCode 400.
  if (fe.statusCode === 400 || e instanceof SyntaxError) return badRequest(`the request body is not valid JSON: ${fe.message ?? String(e)}`, null, "invalid_json");
  if (typeof fe.statusCode === "number" && fe.statusCode >= 400 && fe.statusCode < 500) return new ApiError(fe.statusCode, "invalid_request_error", fe.message ?? "bad request", null, fe.code ?? null);
  return new ApiError(500, "server_error", e instanceof Error ? e.message : String(e));
}

/** Fastify's error handler: every error as an OpenAI error object, logged when it is the server's fault. */
export function errorHandler(e: FastifyError, request: FastifyRequest, reply: FastifyReply): void {
  const api = toApiError(e);
  if (api.status >= 500) request.log.error({ err: e }, "request failed");
  void reply.code(api.status).headers(api.headers).send(body(api));
}
