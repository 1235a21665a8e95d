// `dki serve`: the OpenAI-compatible server with memory (src/server). It listens first, so
// /health answers 503 while the model loads, then opens one model, one store and the DKI and RAG
// systems over them. SIGTERM or SIGINT drains: no new requests, turns in flight finish (or are
// aborted after --drain-timeout), then the store and cache close, so no turn is left half written.
import type { Command } from "commander";
import type { Device } from "../engine/model.js";
import { defaultCacheDir } from "../dki/open.js";
import { resolveConfig } from "../dki/config.js";
import { readConfigFile } from "./config-file.js";
import { createServer, DEFAULT_BODY_LIMIT, DEFAULT_MAX_QUEUE } from "../server/app.js";
import { ApiKeys } from "../server/auth.js";
import { ServerSystems } from "../server/systems.js";
import { deviceOption, EMBEDDER_HELP, embedderOption, intOption, memoryRerankOption, rerankDepthOption, threadsOption } from "./options.js";
import { checkCacheFolder, checkModelPath, checkStoreExists } from "./paths.js";
import { loadOptions } from "./turn.js";

interface ServeFlags {
  model: string;
  data: string;
  cache?: string;
  config?: string;
  embedder?: string;
  rerankModel?: string;
  rerankDepth?: number;
  device: Device;
  threads?: number;
  contextSize?: number;
  host: string;
  port: number;
  apiKeyFile?: string;
  maxQueue: number;
  bodyLimit: number;
  turnTimeout: number;
  drainTimeout: number;
  corsOrigin?: string[];
  init?: boolean;
  log: boolean;
}

const LOOPBACK = new Set(["127.0.0.1", "::1", "localhost"]);

async function serve(flags: ServeFlags): Promise<void> {
  await checkModelPath(flags.model, "--model");
  if (!flags.init) {
    try {
      checkStoreExists(flags.data);
    } catch (e) {
      throw new Error(`${(e as Error).message}; or give --init to start an empty one`);
    }
  }
  await checkCacheFolder(flags.cache ?? defaultCacheDir(flags.data), flags.cache === undefined ? "the K/V cache folder" : "--cache");
  const config = flags.config === undefined ? undefined : await readConfigFile(flags.config);
  // Loaded before listening; the systems own it from then on.
  const memoryRerank = await memoryRerankOption(flags.rerankModel, flags.rerankDepth);
  const embedder = await embedderOption(flags.embedder);
  // Checked before listening: a bad setting is a usage error, not a server that never gets ready.
  resolveConfig(config, embedder);
  const keys = flags.apiKeyFile === undefined ? undefined : await ApiKeys.load(flags.apiKeyFile);
  if (keys === undefined && !LOOPBACK.has(flags.host)) process.stderr.write(`dki: warning: listening on ${flags.host} without --api-key-file: anyone who reaches it may act for any user\n`);

  const server = createServer({ keys, maxQueue: flags.maxQueue, bodyLimit: flags.bodyLimit, turnTimeoutMs: flags.turnTimeout * 1000, corsOrigins: flags.corsOrigin, logger: flags.log ? { level: "info" } : false });
  const address = await server.app.listen({ host: flags.host, port: flags.port });
  process.stderr.write(`dki: listening on ${address} (loading ${flags.model})\n`);

  let stopping = false;
  const stop = (signal: NodeJS.Signals) => {
    if (stopping) {
      process.stderr.write(`dki: ${signal} again: exiting without draining\n`);
      process.exit(130);
    }
    stopping = true;
    process.stderr.write(`dki: ${signal}: draining (up to ${flags.drainTimeout} s), then closing the store\n`);
    server.close({ drainMs: flags.drainTimeout * 1000 }).then(
      () => {
        process.stderr.write("dki: stopped\n");
        process.exit(0);
      },
      (e: unknown) => {
        process.stderr.write(`dki: shutdown failed: ${e instanceof Error ? e.message : String(e)}\n`);
        process.exit(1);
      },
    );
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);

  let systems: ServerSystems;
  try {
    systems = await ServerSystems.open({ model: flags.model, loadOptions: loadOptions(flags), dataDir: flags.data, cacheDir: flags.cache, embedder, config, memoryRerank });
  } catch (e) {
    server.failed(e);
    await server.close();
    throw e;
  }
  if (stopping) {
    // A signal came while loading: nothing was served, so close what just opened.
    await systems.close();
    return;
  }
  server.ready(systems);
  process.stderr.write(`dki: ready: model ${systems.modelId} on ${systems.model.info.device}, store ${flags.data}\n`);
}

export function registerServeCommand(program: Command): void {
  program
    .command("serve")
    .description("an OpenAI-compatible HTTP server with memory: chat completions with DKI/RAG, the memory API, metrics")
    .requiredOption("-m, --model <path>", "model: a Hugging Face model folder or a .gguf file")
    .requiredOption("--data <dir>", "the memory store's folder (the server owns it while it runs)")
    .option("--cache <dir>", "the K/V cache's folder (default <data>.kv-cache, beside the store)")
    .option("--config <file>", "settings in a JSON or YAML file: DKIConfig's keys (maxMemories, gating, recall, …)")
    .option("--embedder <dir>", EMBEDDER_HELP)
    .option("--rerank-model <dir>", "a cross-encoder ONNX folder (e.g. models/memory-qa-reranker): it picks the memories both modes use from a deeper search, and serves RAG's cross-encoder rerank")
    .option(...rerankDepthOption("maxMemories"))
    .option(...deviceOption)
    .option(...threadsOption)
    .option("--context-size <n>", "context window in tokens (default: the model's maximum positions, at most 4096)", intOption("--context-size", 1))
    .option("--host <host>", "address to listen on", "127.0.0.1")
    .option("--port <n>", "port (0: any free port, printed)", intOption("--port", 0, 65535), 8080)
    .option("--api-key-file <file>", 'JSON { "keys": [{ "key", "name", "users", "userPrefix", "admin" }] }: every request then needs Authorization: Bearer KEY, and acts only for the users its key allows')
    .option("--max-queue <n>", `turns held at once before 429 (default ${DEFAULT_MAX_QUEUE})`, intOption("--max-queue", 1, 100_000), DEFAULT_MAX_QUEUE)
    .option("--body-limit <bytes>", `largest request body (default ${DEFAULT_BODY_LIMIT})`, intOption("--body-limit", 1024), DEFAULT_BODY_LIMIT)
    .option("--turn-timeout <s>", "a turn running longer is aborted (default 600)", intOption("--turn-timeout", 1), 600)
    .option("--drain-timeout <s>", "on SIGTERM/SIGINT, turns still running after this are aborted (default 30)", intOption("--drain-timeout", 0), 30)
    .option("--cors-origin <origin...>", "browser origins allowed to call the API (default: none, no CORS headers)")
    .option("--init", "create the store when --data holds none")
    .option("--no-log", "no request log (JSON lines on stdout)")
    .action((flags: ServeFlags) => serve(flags));
}
