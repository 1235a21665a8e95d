export { createServer, DEFAULT_BODY_LIMIT, DEFAULT_MAX_QUEUE, type DkiServer, type ServerOptions } from "./app.js";
export { ApiKeys, MIN_KEY_LENGTH, type Principal } from "./auth.js";
export { ApiError, type ErrorBody } from "./errors.js";
export { ServerSystems, type SystemsOptions } from "./systems.js";
export type { DkiInfo, MemoryInfo, Mode } from "./openai.js";
