// What `dki chat` and `dki rag` share: the options of a turn, their checks, one answer to --query
// (streamed with a summary line on stderr, or the response as JSON with snake_case keys) and the
// interactive loop (Ctrl-C cancels the answer being written; at the prompt it ends the session).
import { createInterface } from "node:readline";
import type { Command } from "commander";
import type { Device } from "../engine/model.js";
import type { DKIConfigInput } from "../dki/config.js";
import { defaultCacheDir } from "../dki/open.js";
import { choiceOption, deviceOption, EMBEDDER_HELP, intOption, newSessionId, snippet, threadsOption } from "./options.js";
import { mergeConfig, readConfigFile } from "./config-file.js";
import { snakeKeys } from "./output.js";
import { checkCacheFolder, checkStoreExists } from "./paths.js";

/** The flags of a chat-like command. */
export interface TurnFlags {
  model: string;
  data: string;
  cache?: string;
  embedder?: string;
  user: string;
  /** Absent: a new session for this run (newSessionId). */
  session?: string;
  query?: string;
  system?: string;
  memory: boolean; // --no-memory sets it false
  format: "text" | "json";
  maxTokens: number;
  threads?: number;
  device: Device;
  contextSize?: number;
  maxMemories?: number;
  memoryMaxTokens?: number;
  /** --config: a JSON or YAML file of DKIConfig's keys, under the flags. */
  config?: string;
}

/** The checks of the flags every chat-like command takes. */
function checkTurnFlags(flags: TurnFlags): void {
  if (flags.format === "json" && flags.query === undefined) throw new Error("--format json prints one answer: give --query with it");
  if (flags.user.trim() === "") throw new Error("--user must not be empty");
  if (flags.session !== undefined && flags.session.trim() === "") throw new Error("--session must not be empty");
}

/**
 * What a chat-like command checks before it loads the model: its flags, that the store exists
 * (a turn reads it; a mistyped --data must not start an empty one) and that the K/V cache folder
 * is one. Returns the session its turns go to: --session, else a new one for this run.
 */
export async function prepareTurns(flags: TurnFlags, command: "chat" | "rag"): Promise<string> {
  checkTurnFlags(flags);
  checkStoreExists(flags.data);
  await checkCacheFolder(flags.cache ?? defaultCacheDir(flags.data), flags.cache === undefined ? "the K/V cache folder" : "--cache");
  return flags.session ?? newSessionId(command);
}

/** The model's load options from the flags. */
export const loadOptions = (flags: Pick<TurnFlags, "threads" | "contextSize" | "device">) => ({ threads: flags.threads, contextSize: flags.contextSize, device: flags.device });

/**
 * The system's config: --config's file, then the flags on top (`extra`: a command's own), so a
 * flag given wins over the file and what neither gives keeps its default.
 */
export async function turnConfig(flags: Pick<TurnFlags, "maxMemories" | "memoryMaxTokens" | "config">, extra: DKIConfigInput = {}): Promise<DKIConfigInput> {
  const file = flags.config === undefined ? {} : await readConfigFile(flags.config);
  const given = { ...(flags.maxMemories !== undefined ? { maxMemories: flags.maxMemories } : {}), ...(flags.memoryMaxTokens !== undefined ? { memoryMaxTokens: flags.memoryMaxTokens } : {}) };
  return mergeConfig(file, mergeConfig(given, extra));
}

/**
 * How a turn runs: its abort signal, whether its tokens stream to stdout, and whether it is the
 * one answer of --query (then Ctrl-C keeps the answer so far, as `dki generate` does; in the
 * interactive session it cancels the turn).
 */
export interface TurnControl {
  signal: AbortSignal;
  stream: boolean;
  oneShot: boolean;
}

/** A turn's options from the flags, the part every system takes. */
export function baseTurnOptions(flags: TurnFlags, sessionId: string, c: TurnControl) {
  return {
    userId: flags.user,
    sessionId,
    maxNewTokens: flags.maxTokens,
    systemPrompt: flags.system,
    signal: c.signal,
    stopOnAbortSignal: c.oneShot,
    onToken: c.stream ? (text: string) => void process.stdout.write(text) : undefined,
  };
}

/**
 * The answer to --query: with --format json the response as one line of snake_case JSON, else
 * the answer streamed (by `ask`'s onToken) and `summary`'s lines on stderr. Ctrl-C stops it as it
 * stops `dki generate`: the answer so far is printed (finish reason "aborted") and the exit status
 * is 130; before the first token there is no answer, and it says so. A second Ctrl-C kills.
 */
export async function answerOnce<R extends { finishReason: string }>(format: "text" | "json", ask: (c: TurnControl) => Promise<R>, summary: (r: R) => string[]): Promise<void> {
  const abort = new AbortController();
  const onSigint = () => abort.abort(new Error("interrupted"));
  process.once("SIGINT", onSigint);
  let r: R;
  try {
    r = await ask({ signal: abort.signal, stream: format === "text", oneShot: true });
  } catch (e) {
    if (!abort.signal.aborted) throw e;
    process.stderr.write("dki: interrupted before the first token\n");
    process.exitCode = 130;
    return;
  } finally {
    process.off("SIGINT", onSigint);
  }
  if (r.finishReason === "aborted") process.exitCode = 130;
  if (format === "json") process.stdout.write(JSON.stringify(snakeKeys(r)) + "\n");
  else {
    process.stdout.write("\n");
    for (const line of summary(r)) process.stderr.write(line + "\n");
  }
}

/** A memory as a summary shows it: id, relevance (what the gate reads) and the start of its text. */
export function memoryLabel(m: { id: string; relevance: number; text: string }): string {
  return `${m.id} (relevance ${m.relevance.toFixed(2)}) ${JSON.stringify(snippet(m.text))}`;
}

/** "| left out: ID (why); …" for the memories a turn routed but did not use, or nothing. */
export function leftOutSummary(leftOut: readonly { id: string; reason: string }[]): string {
  return leftOut.length === 0 ? "" : ` | left out: ${leftOut.map((l) => `${l.id} (${l.reason})`).join("; ")}`;
}

/** " | aborted" when Ctrl-C ended the answer, or nothing. */
export const abortedSummary = (r: { finishReason: string }): string => (r.finishReason === "aborted" ? " | aborted" : "");

/**
 * An interactive session on stdin: `greeting`, then each line up to `/exit` goes to `command`
 * (true: it was one, handled) or else is a turn: `ask` streams its answer and returns the summary
 * shown after it. An error is shown and the session goes on.
 */
export async function chatLoop(o: {
  prompt: string;
  greeting: string;
  ask: (line: string, c: TurnControl) => Promise<string>;
  command?: (line: string, say: (s: string) => void) => Promise<boolean>;
}): Promise<void> {
  const rl = createInterface({ input: process.stdin, output: process.stderr, prompt: o.prompt });
  let turn: AbortController | null = null;
  // Ctrl-C cancels the answer being written; at the prompt it ends the session.
  rl.on("SIGINT", () => (turn ? turn.abort(new Error("interrupted")) : rl.close()));
  const say = (s: string) => process.stderr.write(s + "\n");
  say(o.greeting);
  rl.prompt();
  for await (const raw of rl) {
    const line = raw.trim();
    try {
      if (line === "/exit") break;
      if (line !== "" && !(await o.command?.(line, say))) {
        turn = new AbortController();
        const summary = await o.ask(line, { signal: turn.signal, stream: true, oneShot: false });
        process.stdout.write("\n");
        say(summary);
      }
    } catch (e) {
      say(`dki: ${e instanceof Error ? e.message : String(e)}`);
    } finally {
      turn = null;
    }
    rl.prompt();
  }
  rl.close();
}

/** The options every chat-like command takes first (the K/V cache's folder described by the command). */
export function turnCommandOptions(c: Command, cacheHelp: string): Command {
  return c
    .requiredOption("-m, --model <path>", "model: a Hugging Face model folder or a .gguf file")
    .requiredOption("--data <dir>", "the memory store's folder")
    .option("--cache <dir>", cacheHelp)
    .option("--embedder <dir>", EMBEDDER_HELP)
    .requiredOption("--user <id>", "user id")
    .option("--session <id>", "session id (default: a new session for this run, named in the output)")
    .option("-q, --query <text>", "answer this one query and exit")
    .option("--system <text>", "system prompt")
    .option("--config <file>", "settings in a JSON or YAML file: DKIConfig's keys (maxMemories, gating, recall, …); flags win over it");
}

/** The options after --no-memory (and chat's --alpha) that every chat-like command takes. */
export function outputOptions(c: Command): Command {
  c.option("--format <format>", "text or json (json needs --query)", choiceOption("--format", ["text", "json"] as const), "text")
    .option("-n, --max-tokens <n>", "maximum new tokens", intOption("--max-tokens"), 128);
  return systemOptions(c);
}

/** The model's and the DKI system's settings every command that runs turns takes (chat, rag, mcp). */
export function systemOptions(c: Command): Command {
  return c
    .option(...threadsOption)
    .option(...deviceOption)
    .option("--context-size <n>", "context window in tokens (default: the model's maximum positions, at most 4096)", intOption("--context-size", 1))
    .option("--max-memories <n>", "memories routed to a turn at most (default 3)", intOption("--max-memories", 0, 1000))
    .option("--memory-max-tokens <n>", "memory tokens a turn takes at most (default 1024); memories past it are left out, and the output says so", intOption("--memory-max-tokens", 0));
}
