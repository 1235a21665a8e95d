// `dki mcp`: the memory of a user as an MCP server, for agents and MCP clients. Over stdio (the
// default) it serves the one user named by --user or DKI_MCP_USER; with --port, Streamable HTTP
// on 127.0.0.1, each request serving the user its key maps to in --keys. No tool takes a user.
// Nothing but the protocol is written to stdout; what the server says goes to stderr.
import type { Command } from "commander";
import { DKISystem } from "../dki/system.js";
import { defaultCacheDir } from "../dki/open.js";
import { EMBEDDER_HELP, embedderOption, intOption, newSessionId, rerankDepthOption, rerankModelOption, withMemoryRerank } from "./options.js";
import { checkCacheFolder, checkModelPath } from "./paths.js";
import { loadOptions, systemOptions, turnConfig } from "./turn.js";
import type { Device } from "../engine/model.js";
import { packageVersion } from "./version.js";

/** The environment variable naming the user of a stdio server (for clients that set env, not args). */
export const MCP_USER_ENV = "DKI_MCP_USER";

interface McpFlags {
  model: string;
  data: string;
  cache?: string;
  embedder?: string;
  user?: string;
  port?: number;
  keys?: string;
  session?: string;
  system?: string;
  rerankModel?: string;
  rerankDepth?: number;
  threads?: number;
  device: Device;
  contextSize?: number;
  maxMemories?: number;
  memoryMaxTokens?: number;
}

/** Who the server serves: one user (stdio), or the users of a key file (HTTP). Checked before the model loads. */
function servedBy(flags: McpFlags): { user: string } | { keys: string; port: number } {
  const envUser = process.env[MCP_USER_ENV];
  if (flags.port !== undefined) {
    if (flags.keys === undefined) throw new Error("--port serves over HTTP, where each request's user comes from its key: give --keys FILE (a JSON object of key → user id)");
    if (flags.user !== undefined) throw new Error("--user names the user of a stdio server; over HTTP (--port) each request's user comes from its key in --keys");
    if (envUser !== undefined) throw new Error(`${MCP_USER_ENV} names the user of a stdio server; over HTTP (--port) each request's user comes from its key in --keys: unset it`);
    return { keys: flags.keys, port: flags.port };
  }
  if (flags.keys !== undefined) throw new Error("--keys is for the HTTP server: give --port with it");
  const user = flags.user ?? envUser;
  if (user === undefined || user.trim() === "") throw new Error(`dki mcp needs the user it serves: --user ID or ${MCP_USER_ENV} (the tools never take a user)`);
  return { user };
}

async function mcp(flags: McpFlags): Promise<void> {
  const served = servedBy(flags);
  if (flags.session !== undefined && flags.session.trim() === "") throw new Error("--session must not be empty");
  // The SDK is loaded only by this command, not by every `dki` run.
  const { readKeyFile } = await import("../integrations/mcp/keys.js");
  const keys = "keys" in served ? readKeyFile(served.keys) : null;
  await checkModelPath(flags.model, "--model");
  await checkCacheFolder(flags.cache ?? defaultCacheDir(flags.data), flags.cache === undefined ? "the K/V cache folder" : "--cache");
  const embedder = await embedderOption(flags.embedder);
  // --max-memories and --memory-max-tokens (and --system) reach the chat tool's turns.
  const config = await turnConfig(flags, flags.system === undefined ? {} : { systemPrompt: flags.system });
  await withMemoryRerank(flags.rerankModel, flags.rerankDepth, async (memoryRerank) => {
    const system = await DKISystem.open({ model: flags.model, loadOptions: loadOptions(flags), dataDir: flags.data, cacheDir: flags.cache, embedder, config, memoryRerank });
    for (const w of system.model.info.warnings) process.stderr.write(`dki: ${w}\n`);
    const common = { system, defaultSessionId: flags.session ?? newSessionId("mcp"), version: packageVersion() };
    const stopped = new Promise<string>((resolve) => {
      process.once("SIGINT", () => resolve("SIGINT"));
      process.once("SIGTERM", () => resolve("SIGTERM"));
    });
    try {
      if ("user" in served) {
        const [{ createMemoryServer }, { StdioServerTransport }] = await Promise.all([import("../integrations/mcp/server.js"), import("@modelcontextprotocol/sdk/server/stdio.js")]);
        const server = createMemoryServer({ ...common, userId: served.user });
        // The client closing our stdin is the end of the session.
        const ended = new Promise<string>((resolve) => process.stdin.once("end", () => resolve("stdin closed")));
        await server.connect(new StdioServerTransport());
        process.stderr.write(`dki mcp: serving the memory of user ${JSON.stringify(served.user)} over stdio (data ${flags.data})\n`);
        const why = await Promise.race([ended, stopped]);
        await server.close();
        await system.close();
        // Said once everything is closed (L3 writes flushed, the store closed): the end was orderly.
        process.stderr.write(`dki mcp: ${why}: stopped\n`);
      } else {
        const { serveMcpHttp } = await import("../integrations/mcp/http.js");
        const http = await serveMcpHttp({ ...common, keys: keys!, port: served.port });
        process.stderr.write(`dki mcp: listening on ${http.url} for ${keys!.size} key(s) (data ${flags.data})\n`);
        const why = await stopped;
        await http.close();
        await system.close();
        process.stderr.write(`dki mcp: ${why}: stopped\n`);
      }
    } finally {
      await system.close(); // (a second close does nothing)
    }
  });
}

export function registerMcpCommand(program: Command): void {
  systemOptions(
    program
      .command("mcp")
      .description(`serve a user's memory over MCP: tools (add/search/list/get/update/delete memories, add_preference, chat) and resources; the user is --user or ${MCP_USER_ENV} (stdio), or each request's key (--port)`)
      .requiredOption("-m, --model <path>", "model for the chat tool: a Hugging Face model folder or a .gguf file")
      .requiredOption("--data <dir>", "the memory store's folder (created by the first memory added)")
      .option("--cache <dir>", "the K/V cache's folder (default <data>.kv-cache, beside the store; one process at a time)")
      .option("--embedder <dir>", EMBEDDER_HELP)
      .option("--user <id>", `the user this stdio server serves (default: $${MCP_USER_ENV})`)
      .option("--port <n>", "serve Streamable HTTP on 127.0.0.1:<n>/mcp instead of stdio (0: any free port, printed on stderr)", intOption("--port", 0, 65535))
      .option("--keys <file>", "with --port: a JSON object of API key → user id; a request's Authorization: Bearer <key> picks its user")
      .option("--session <id>", "the session chat turns go to when a call names none (default: a new one per run)")
      .option("--system <text>", "system prompt of chat turns")
      .option(...rerankModelOption)
      .option(...rerankDepthOption("max memories")),
  ).action((flags: McpFlags) => mcp(flags));
}
