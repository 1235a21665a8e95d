// `dki rag` (and `dki chat --mode rag`): the RAG baseline from the command line, on the same store
// as `dki chat`, optionally over a knowledge-base collection (chunks as prompt text, or as K/V with
// --kb-mode kv). With --query it answers once (text streamed, or the RAGResponse as JSON with
// snake_case keys, like `dki chat`'s); without it, an interactive session.
import { createInterface } from "node:readline";
import type { Command } from "commander";
import type { Filter } from "../memory/types.js";
import { sourceLabel } from "../rag/citations.js";
import type { KnowledgeBase } from "../rag/kb/knowledge-base.js";
import { RAGSystem, type KbMode, type RAGChatOptions, type RAGResponse } from "../rag/rag-system.js";
import { snakeKeys } from "./chat.js";
import { jsonObjectOption, openKnowledgeBase } from "./kb.js";
import { choiceOption, intOption } from "./options.js";
import { checkModelPath } from "./paths.js";

export interface RagFlags {
  model: string;
  data: string;
  cache?: string;
  user: string;
  session: string;
  query?: string;
  system?: string;
  memory: boolean; // --no-memory sets it false
  collection?: string;
  kbMode?: KbMode;
  filter?: string;
  topK?: number;
  multiQuery?: number;
  hyde?: boolean;
  layout?: "auto" | "seed" | "chat";
  format: "text" | "json";
  maxTokens: number;
  threads?: number;
  contextSize?: number;
}

/** One line on what the turn put in the prompt and what it cost. */
export function ragSummary(r: RAGResponse): string {
  const mems = r.memoriesUsed.length === 0 ? "none" : r.memoriesUsed.map((m) => `${m.id} (${m.score.toFixed(2)})`).join(", ");
  const chunks = r.sources.flatMap((s, i) => (s.kind === "chunk" ? [r.metadata.kbMode === "kv" ? `kv ${sourceLabel(s)}` : `[${i + 1}] ${sourceLabel(s)}`] : []));
  const kb = chunks.length === 0 ? "" : ` | chunks: ${chunks.join("; ")}`;
  const cited = r.citations.citations.length === 0 ? "" : ` | cited: ${r.citations.citations.map((c) => `[${c.marker}]`).join(" ")}`;
  const fallback = r.metadata.forcedFallback ? " | FORCED FALLBACK: bare query" : "";
  return `[memories: ${mems}${kb}${cited} | prompt ${r.inputTokens} tokens (context ${r.metadata.contextTokens}) | ttft ${r.latency.ttftMs.toFixed(0)} ms, ${r.outputTokens} tokens${fallback}]`;
}

function checkFlags(flags: RagFlags): void {
  if (flags.format === "json" && flags.query === undefined) throw new Error("--format json prints one answer: give --query with it");
  if (flags.user.trim() === "") throw new Error("--user must not be empty");
  if (flags.session.trim() === "") throw new Error("--session must not be empty");
  const kbOnly: [keyof RagFlags, string][] = [["kbMode", "--kb-mode"], ["filter", "--filter"], ["topK", "--top-k"], ["multiQuery", "--multi-query"], ["hyde", "--hyde"]];
  for (const [k, name] of kbOnly) if (flags[k] !== undefined && flags.collection === undefined) throw new Error(`${name} needs --collection`);
}

export async function ragCommand(flags: RagFlags): Promise<void> {
  checkFlags(flags);
  const filter = flags.filter === undefined ? undefined : (jsonObjectOption("--filter", flags.filter) as Filter);
  await checkModelPath(flags.model, "--model");
  // The collection is checked before the model loads; searching it needs only its embedder.
  const kb: KnowledgeBase | null = flags.collection === undefined ? null : await openKnowledgeBase(flags.data);
  let system: RAGSystem | null = null;
  try {
    if (kb !== null && flags.collection !== undefined) kb.getCollection(flags.collection);
    system = await RAGSystem.open({ model: flags.model, loadOptions: { threads: flags.threads, contextSize: flags.contextSize }, dataDir: flags.data, cacheDir: flags.cache, knowledgeBase: kb ?? undefined, rag: flags.layout ? { layout: flags.layout } : undefined });
    const sys = system;
    const turnOptions = (signal: AbortSignal, stream: boolean): RAGChatOptions => ({
      userId: flags.user,
      sessionId: flags.session,
      maxNewTokens: flags.maxTokens,
      systemPrompt: flags.system,
      useMemories: flags.memory,
      signal,
      onToken: stream ? (text: string) => void process.stdout.write(text) : undefined,
      ...(flags.collection !== undefined ? { collection: flags.collection, kbMode: flags.kbMode, kbFilter: filter, kbTopK: flags.topK, kbMultiQuery: flags.multiQuery, kbHyde: flags.hyde } : {}),
    });
    if (flags.query !== undefined) {
      const abort = new AbortController();
      const onSigint = () => abort.abort(new Error("interrupted"));
      process.once("SIGINT", onSigint);
      try {
        const r = await sys.chat(flags.query, turnOptions(abort.signal, flags.format === "text"));
        if (flags.format === "json") process.stdout.write(JSON.stringify(snakeKeys(r)) + "\n");
        else {
          process.stdout.write("\n");
          process.stderr.write(ragSummary(r) + "\n");
          for (const w of r.metadata.warnings) process.stderr.write(`warning: ${w}\n`);
        }
      } finally {
        process.off("SIGINT", onSigint);
      }
      return;
    }
    await interactive(sys, flags, turnOptions);
  } finally {
    try {
      await system?.close();
    } finally {
      await kb?.close();
    }
  }
}

async function interactive(system: RAGSystem, flags: RagFlags, turnOptions: (signal: AbortSignal, stream: boolean) => RAGChatOptions): Promise<void> {
  const rl = createInterface({ input: process.stdin, output: process.stderr, prompt: "rag> " });
  let turn: AbortController | null = null;
  rl.on("SIGINT", () => (turn ? turn.abort(new Error("interrupted")) : rl.close()));
  const say = (s: string) => process.stderr.write(s + "\n");
  say(`RAG baseline as ${flags.user} in session ${flags.session}${flags.collection ? `, collection ${flags.collection}` : ""}; /exit to leave`);
  rl.prompt();
  for await (const raw of rl) {
    const line = raw.trim();
    try {
      if (line === "/exit") break;
      if (line !== "") {
        turn = new AbortController();
        const r = await system.chat(line, turnOptions(turn.signal, true));
        process.stdout.write("\n");
        say(ragSummary(r));
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

/** The options `dki rag` and `dki chat --mode rag` share. */
export function ragOptions(c: Command): Command {
  return c
    .option("--collection <name>", "also search this knowledge-base collection (the folder <data>.kb)")
    .option("--kb-mode <mode>", "text (chunks in the prompt, numbered with sources) or kv (chunks injected as K/V)", choiceOption("--kb-mode", ["text", "kv"] as const))
    .option("--filter <json>", "metadata filter on the collection's documents")
    .option("--top-k <n>", "chunks per turn (default 5)", intOption("--top-k", 1, 100))
    .option("--multi-query <n>", "search with N rewrites of the query written by the model", intOption("--multi-query", 1, 8))
    .option("--hyde", "search the dense index with a hypothetical answer written by the model (HyDE)")
    .option("--layout <layout>", "auto (chat template when the model has one), seed (seed 000's plain layout) or chat", choiceOption("--layout", ["auto", "seed", "chat"] as const));
}

export function registerRagCommand(program: Command): void {
  ragOptions(
    program
      .command("rag")
      .description("chat through the RAG baseline: memories (and knowledge-base chunks) as prompt text, seed 000's budget")
      .requiredOption("-m, --model <path>", "model: a Hugging Face model folder or a .gguf file")
      .requiredOption("--data <dir>", "the memory store's folder")
      .option("--cache <dir>", "the K/V cache's folder for --kb-mode kv (default <data>.kv-cache)")
      .requiredOption("--user <id>", "user id")
      .option("--session <id>", "session id", "default")
      .option("-q, --query <text>", "answer this one query and exit")
      .option("--system <text>", "system prompt")
      .option("--no-memory", "no memory search (knowledge base and history stay)")
      .option("--format <format>", "text or json (json needs --query)", choiceOption("--format", ["text", "json"] as const), "text")
      .option("-n, --max-tokens <n>", "maximum new tokens", intOption("--max-tokens"), 128)
      .option("--threads <n>", "worker threads, 0 to 1024 (default and 0: all cores)", intOption("--threads", 0, 1024))
      .option("--context-size <n>", "context window in tokens (default: the model's maximum positions, at most 4096)", intOption("--context-size", 1)),
  ).action((flags: RagFlags) => ragCommand(flags));
}
