// `dki chat`: the DKI system from the command line. With --query it answers once (text streamed,
// or the whole DKIResponse as JSON with snake_case keys, like the other commands' JSON); without
// it, an interactive session that streams each answer and shows, per turn, what was injected and
// why. Ctrl-C during an answer cancels that turn only.
import { createInterface } from "node:readline";
import type { Command } from "commander";
import { DKISystem, type DKIResponse } from "../dki/index.js";
import { intOption, numberOption, choiceOption } from "./options.js";
import { checkModelPath } from "./paths.js";
import { ragCommand } from "./rag.js";

/** `--mode rag`: the same turn through the RAG baseline (dki rag has its knowledge-base options). */
function chatAsRag(flags: ChatFlags): Promise<void> {
  if (flags.alpha !== undefined) throw new Error("--alpha applies to --mode dki only");
  return ragCommand({ ...flags, session: flags.session });
}

interface ChatFlags {
  model: string;
  data: string;
  cache?: string;
  user: string;
  session: string;
  query?: string;
  system?: string;
  alpha?: number;
  memory: boolean; // --no-memory sets it false
  format: "text" | "json";
  maxTokens: number;
  threads?: number;
  contextSize?: number;
}

/** camelCase keys → snake_case, recursively; keys without a lower-case letter ("L1") stay. */
export function snakeKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(snakeKeys);
  if (v === null || typeof v !== "object") return typeof v === "number" && !Number.isInteger(v) ? Number(v.toFixed(4)) : v;
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v)) out[/[a-z]/.test(k) ? k.replace(/([a-z0-9])([A-Z])/g, "$1_$2").toLowerCase() : k] = snakeKeys(x);
  return out;
}

/** One line on what the turn injected, why and from where. */
export function turnSummary(r: DKIResponse): string {
  const mems = r.memoriesUsed.length === 0 ? "none" : r.memoriesUsed.map((m) => `${m.id} (${m.score.toFixed(2)})`).join(", ");
  const tiers = r.cache.tiers.length === 0 ? "nothing injected" : r.cache.tiers.map((b) => `${b.kind === "preferences" ? "preferences" : b.id} ${b.tier}`).join(", ");
  const alpha = r.memoriesUsed.length > 0 ? r.gating.alpha.toFixed(2) : "-";
  return `[memories: ${mems} | α ${alpha} | gate: ${r.gating.reason} | cache: ${tiers} | ttft ${r.latency.ttftMs.toFixed(0)} ms, ${r.outputTokens} tokens]`;
}

async function chat(flags: ChatFlags): Promise<void> {
  if (flags.alpha !== undefined && !flags.memory) throw new Error("give at most one of --alpha and --no-memory");
  if (flags.format === "json" && flags.query === undefined) throw new Error("--format json prints one answer: give --query with it");
  if (flags.user.trim() === "") throw new Error("--user must not be empty");
  if (flags.session.trim() === "") throw new Error("--session must not be empty");
  await checkModelPath(flags.model, "--model");
  const system = await DKISystem.open({
    model: flags.model,
    loadOptions: { threads: flags.threads, contextSize: flags.contextSize },
    dataDir: flags.data,
    cacheDir: flags.cache,
  });
  try {
    const turnOptions = (signal: AbortSignal, stream: boolean) => ({
      userId: flags.user,
      sessionId: flags.session,
      maxNewTokens: flags.maxTokens,
      forceAlpha: flags.alpha,
      allowInjection: flags.memory,
      systemPrompt: flags.system,
      signal,
      onToken: stream ? (text: string) => void process.stdout.write(text) : undefined,
    });
    if (flags.query !== undefined) {
      const abort = new AbortController();
      const onSigint = () => abort.abort(new Error("interrupted"));
      process.once("SIGINT", onSigint);
      try {
        const r = await system.chat(flags.query, turnOptions(abort.signal, flags.format === "text"));
        if (flags.format === "json") process.stdout.write(JSON.stringify(snakeKeys(r)) + "\n");
        else {
          process.stdout.write("\n");
          process.stderr.write(turnSummary(r) + "\n");
        }
      } finally {
        process.off("SIGINT", onSigint);
      }
      return;
    }
    await interactive(system, flags, turnOptions);
  } finally {
    await system.close();
  }
}

async function interactive(system: DKISystem, flags: ChatFlags, turnOptions: (signal: AbortSignal, stream: boolean) => Parameters<DKISystem["chat"]>[1]): Promise<void> {
  const rl = createInterface({ input: process.stdin, output: process.stderr, prompt: "> " });
  let turn: AbortController | null = null;
  // Ctrl-C cancels the answer being written; at the prompt it ends the session.
  rl.on("SIGINT", () => (turn ? turn.abort(new Error("interrupted")) : rl.close()));
  const say = (s: string) => process.stderr.write(s + "\n");
  say(`chatting as ${flags.user} in session ${flags.session}; /memories, /forget ID, /remember TEXT, /pref [TYPE TEXT], /exit`);
  rl.prompt();
  for await (const raw of rl) {
    const line = raw.trim();
    try {
      if (line === "/exit") break;
      else if (line === "") {
        // nothing
      } else if (line === "/memories") {
        const all = await system.memories.getAll({ userId: flags.user });
        say(all.length === 0 ? "(no memories)" : all.map((m) => `${m.id}  ${m.text}`).join("\n"));
      } else if (line.startsWith("/forget")) {
        const id = line.slice("/forget".length).trim();
        if (!id) say("usage: /forget ID");
        else {
          await system.memories.delete(id, { userId: flags.user });
          say(`forgot ${id}`);
        }
      } else if (line.startsWith("/remember")) {
        const text = line.slice("/remember".length).trim();
        if (!text) say("usage: /remember TEXT");
        else say(`remembered ${(await system.memories.add(text, { userId: flags.user, sessionId: flags.session })).map((m) => m.id).join(", ")}`);
      } else if (line.startsWith("/pref")) {
        const rest = line.slice("/pref".length).trim();
        if (rest === "") {
          const prefs = await system.preferences.list({ userId: flags.user });
          say(prefs.length === 0 ? "(no preferences)" : prefs.map((p) => `${p.id}  [${p.type}] ${p.text} (priority ${p.priority})`).join("\n"));
        } else {
          const space = rest.indexOf(" ");
          if (space < 0) say("usage: /pref TYPE TEXT");
          else say(`added preference ${(await system.preferences.add(rest.slice(space + 1).trim(), { userId: flags.user, type: rest.slice(0, space) })).id}`);
        }
      } else if (line.startsWith("/")) {
        say(`unknown command ${line.split(/\s/)[0]}; /memories, /forget ID, /remember TEXT, /pref [TYPE TEXT], /exit`);
      } else {
        turn = new AbortController();
        const r = await system.chat(line, turnOptions(turn.signal, true));
        process.stdout.write("\n");
        say(turnSummary(r));
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

export function registerChatCommand(program: Command): void {
  program
    .command("chat")
    .description("chat through the DKI system: memories and preferences injected as K/V, history as text")
    .requiredOption("-m, --model <path>", "model: a Hugging Face model folder or a .gguf file")
    .requiredOption("--data <dir>", "the memory store's folder")
    .option("--cache <dir>", "the K/V cache's folder (default <data>.kv-cache, beside the store)")
    .requiredOption("--user <id>", "user id")
    .option("--session <id>", "session id", "default")
    .option("-q, --query <text>", "answer this one query and exit")
    .option("--system <text>", "system prompt")
    .option("--alpha <a>", "force α for the memories routed to the turn, in [0, 1]", numberOption("--alpha", { min: 0, max: 1 }))
    .option("--no-memory", "inject nothing (no memories, no preferences)")
    .option("--format <format>", "text or json (json needs --query)", choiceOption("--format", ["text", "json"] as const), "text")
    .option("-n, --max-tokens <n>", "maximum new tokens", intOption("--max-tokens"), 128)
    .option("--threads <n>", "worker threads, 0 to 1024 (default and 0: all cores)", intOption("--threads", 0, 1024))
    .option("--context-size <n>", "context window in tokens (default: the model's maximum positions, at most 4096)", intOption("--context-size", 1))
    .option("--mode <mode>", "dki (memory as K/V) or rag (memory as prompt text: the RAG baseline, see dki rag)", choiceOption("--mode", ["dki", "rag"] as const), "dki")
    .action((flags: ChatFlags & { mode: "dki" | "rag" }) => (flags.mode === "rag" ? chatAsRag(flags) : chat(flags)));
}
