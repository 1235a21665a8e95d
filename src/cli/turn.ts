// What `dki chat` and `dki rag` share: the options of a turn, their checks, one answer to --query
// (streamed with a summary line on stderr, or the response as JSON with snake_case keys) and the
// interactive loop (Ctrl-C cancels the answer being written; at the prompt it ends the session).
import { createInterface } from "node:readline";
import type { Command } from "commander";
import { choiceOption, EMBEDDER_HELP, intOption } from "./options.js";
import { snakeKeys } from "./output.js";

/** The flags of a chat-like command. */
export interface TurnFlags {
  model: string;
  data: string;
  cache?: string;
  embedder?: string;
  user: string;
  session: string;
  query?: string;
  system?: string;
  memory: boolean; // --no-memory sets it false
  format: "text" | "json";
  maxTokens: number;
  threads?: number;
  contextSize?: number;
}

/** The checks of the flags every chat-like command takes. */
export function checkTurnFlags(flags: TurnFlags): void {
  if (flags.format === "json" && flags.query === undefined) throw new Error("--format json prints one answer: give --query with it");
  if (flags.user.trim() === "") throw new Error("--user must not be empty");
  if (flags.session.trim() === "") throw new Error("--session must not be empty");
}

/** The model's load options from the flags. */
export const loadOptions = (flags: TurnFlags) => ({ threads: flags.threads, contextSize: flags.contextSize });

/** A turn's options from the flags, the part every system takes; `stream`: the answer's tokens to stdout. */
export function baseTurnOptions(flags: TurnFlags, signal: AbortSignal, stream: boolean) {
  return {
    userId: flags.user,
    sessionId: flags.session,
    maxNewTokens: flags.maxTokens,
    systemPrompt: flags.system,
    signal,
    onToken: stream ? (text: string) => void process.stdout.write(text) : undefined,
  };
}

/**
 * The answer to --query: with --format json the response as one line of snake_case JSON, else
 * the answer streamed (by `ask`'s onToken) and `summary`'s lines on stderr. Ctrl-C cancels it.
 */
export async function answerOnce<R>(format: "text" | "json", ask: (signal: AbortSignal, stream: boolean) => Promise<R>, summary: (r: R) => string[]): Promise<void> {
  const abort = new AbortController();
  const onSigint = () => abort.abort(new Error("interrupted"));
  process.once("SIGINT", onSigint);
  try {
    const r = await ask(abort.signal, format === "text");
    if (format === "json") process.stdout.write(JSON.stringify(snakeKeys(r)) + "\n");
    else {
      process.stdout.write("\n");
      for (const line of summary(r)) process.stderr.write(line + "\n");
    }
  } finally {
    process.off("SIGINT", onSigint);
  }
}

/**
 * An interactive session on stdin: `greeting`, then each line up to `/exit` goes to `command`
 * (true: it was one, handled) or else is a turn: `ask` streams its answer and returns the summary
 * shown after it. An error is shown and the session goes on.
 */
export async function chatLoop(o: {
  prompt: string;
  greeting: string;
  ask: (line: string, signal: AbortSignal) => Promise<string>;
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
        const summary = await o.ask(line, turn.signal);
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
    .option("--session <id>", "session id", "default")
    .option("-q, --query <text>", "answer this one query and exit")
    .option("--system <text>", "system prompt");
}

/** The options after --no-memory (and chat's --alpha) that every chat-like command takes. */
export function outputOptions(c: Command): Command {
  return c
    .option("--format <format>", "text or json (json needs --query)", choiceOption("--format", ["text", "json"] as const), "text")
    .option("-n, --max-tokens <n>", "maximum new tokens", intOption("--max-tokens"), 128)
    .option("--threads <n>", "worker threads, 0 to 1024 (default and 0: all cores)", intOption("--threads", 0, 1024))
    .option("--context-size <n>", "context window in tokens (default: the model's maximum positions, at most 4096)", intOption("--context-size", 1));
}
