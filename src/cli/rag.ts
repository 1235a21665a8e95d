// `dki rag` (and `dki chat --mode rag`): the RAG baseline from the command line, on the same store
// as `dki chat`, optionally over a knowledge-base collection (chunks as prompt text, or as K/V with
// --kb-mode kv). With --query it answers once (text streamed, or the RAGResponse as JSON with
// snake_case keys, like `dki chat`'s); without it, an interactive session. `--rerank
// cross-encoder --rerank-model DIR` loads a cross-encoder ONNX folder for the turns' rerank.
import type { Command } from "commander";
import type { Filter } from "../memory/types.js";
import { OnnxCrossEncoder } from "../memory/embedders/onnx-cross-encoder.js";
import { sourceLabel } from "../rag/citations.js";
import type { KnowledgeBase } from "../rag/kb/knowledge-base.js";
import { RAGSystem, type KbMode, type RAGChatOptions, type RAGResponse } from "../rag/rag-system.js";
import { openKnowledgeBase } from "./kb.js";
import { RERANK_METHODS, type RerankMethod } from "../rag/pipeline/rerank.js";
import { PROMPT_MODES, type PromptMode } from "../rag/pipeline/prompt-modes.js";
import { CITATION_FORMATS, type CitationFormat } from "../rag/pipeline/citation-quality.js";
import type { MemoryRerank } from "../dki/routing.js";
import { choiceOption, embedderOption, intOption, jsonObjectOption, memoryRerankOption } from "./options.js";
import { checkModelPath } from "./paths.js";
import { abortedSummary, answerOnce, baseTurnOptions, chatLoop, leftOutSummary, loadOptions, memoryLabel, outputOptions, prepareTurns, turnCommandOptions, turnConfig, type TurnControl, type TurnFlags } from "./turn.js";

export interface RagFlags extends TurnFlags {
  collection?: string;
  kbMode?: KbMode;
  filter?: string;
  topK?: number;
  multiQuery?: number;
  hyde?: boolean;
  layout?: "auto" | "seed" | "chat";
  rewrite?: boolean;
  decompose?: number;
  iterative?: boolean;
  stepBack?: boolean;
  stepModel?: string;
  stepTimeout?: number;
  rerank?: RerankMethod;
  rerankDepth?: number;
  rerankModel?: string;
  promptMode?: PromptMode;
  selfRag?: boolean;
  adaptive?: boolean;
  citations?: CitationFormat;
  emptyRetrieval?: "generate" | "answer";
  truncateFirstContext?: boolean;
  /** `dki chat --mode rag --rerank-model`: the routing reranker (the memories), not the collection's. */
  memoryRerank?: { model?: string; depth?: number };
}

/** One line on what the turn put in the prompt and what it cost, and the session it went to. */
export function ragSummary(r: RAGResponse): string {
  const mems = (r.memoriesUsed.length === 0 ? "none" : r.memoriesUsed.map(memoryLabel).join(", ")) + leftOutSummary(r.metadata.memoriesLeftOut);
  const chunks = r.sources.flatMap((s, i) => (s.kind === "chunk" ? [r.metadata.kbMode === "kv" ? `kv ${sourceLabel(s)}` : `[${i + 1}] ${sourceLabel(s)}`] : []));
  const kb = chunks.length === 0 ? "" : ` | chunks: ${chunks.join("; ")}`;
  const cited = r.citations.citations.length === 0 ? "" : ` | cited: ${r.citations.citations.map((c) => `[${c.marker}]`).join(" ")}`;
  const fallback = r.metadata.forcedFallback ? " | FORCED FALLBACK: bare query" : "";
  const p = r.metadata.pipeline;
  const fell = p === null ? [] : p.steps.filter((s) => s.fellBack).map((s) => s.step);
  const searched = p === null ? "" : ` | searched: ${p.hops.map((h) => JSON.stringify(h.query)).join(", ")}${fell.length > 0 ? ` (fell back: ${fell.join(", ")})` : ""}`;
  const q = r.metadata.citationQuality;
  const quality = q === null ? "" : ` | confidence: ${q.confidence.length === 0 ? "no citations" : q.confidence.map((c) => `[${c.marker}] ${c.confidence.toFixed(2)}`).join(" ")}, ${q.unsupported.length} unsupported sentence(s)`;
  return `[memories: ${mems}${kb}${searched}${cited}${quality} | prompt ${r.inputTokens} tokens (context ${r.metadata.contextTokens}) | ttft ${r.latency.ttftMs.toFixed(0)} ms, ${r.outputTokens} tokens${fallback}${abortedSummary(r)} | session ${r.metadata.sessionId}]`;
}

function checkFlags(flags: RagFlags): void {
  const kbOnly: [keyof RagFlags, string][] = [["kbMode", "--kb-mode"], ["filter", "--filter"], ["topK", "--top-k"], ["multiQuery", "--multi-query"], ["hyde", "--hyde"], ["rewrite", "--rewrite"], ["decompose", "--decompose"], ["stepBack", "--step-back"], ["rerank", "--rerank"], ["selfRag", "--self-rag"], ["adaptive", "--adaptive"], ["emptyRetrieval", "--empty-retrieval"]];
  for (const [k, name] of kbOnly) if (flags[k] !== undefined && flags.collection === undefined) throw new Error(`${name} needs --collection`);
  // commander sets iterative to true by default (--no-iterative): only false is the user's.
  if (flags.iterative === false && flags.decompose === undefined) throw new Error("--no-iterative needs --decompose");
  if (flags.rerankDepth !== undefined && flags.rerank === undefined) throw new Error("--rerank-depth needs --rerank");
  // The model and the method go together: a model without the method would be loaded for nothing.
  if (flags.rerankModel !== undefined && flags.rerank !== "cross-encoder") throw new Error("--rerank-model needs --rerank cross-encoder");
  if (flags.rerank === "cross-encoder" && flags.rerankModel === undefined) throw new Error("--rerank cross-encoder needs --rerank-model DIR (a cross-encoder ONNX folder)");
}

/** The query transformations the flags ask for; undefined when none (the turn is the baseline's). */
function queryTransform(flags: RagFlags): RAGChatOptions["queryTransform"] {
  if (flags.rewrite !== true && flags.decompose === undefined && flags.stepBack !== true) return undefined;
  return { rewrite: flags.rewrite, decompose: flags.decompose, iterative: flags.iterative, stepBack: flags.stepBack };
}

export async function ragCommand(flags: RagFlags): Promise<void> {
  checkFlags(flags);
  const session = await prepareTurns(flags, "rag");
  const config = await turnConfig(flags);
  const filter = flags.filter === undefined ? undefined : (jsonObjectOption("--filter", flags.filter) as Filter);
  await checkModelPath(flags.model, "--model");
  if (flags.stepModel !== undefined) await checkModelPath(flags.stepModel, "--step-model");
  // The collection is checked before the model loads; searching it needs only its embedder.
  const embedder = await embedderOption(flags.embedder);
  const kb: KnowledgeBase | null = flags.collection === undefined ? null : await openKnowledgeBase(flags.data, { embedder, mustExist: true });
  let system: RAGSystem | null = null;
  let reranker: OnnxCrossEncoder | null = null;
  let memoryRerank: MemoryRerank | undefined;
  try {
    // As the turns will search it: as --user (another tenant's collection is not found).
    if (kb !== null && flags.collection !== undefined) kb.forUser(flags.user).getCollection(flags.collection);
    if (flags.rerankModel !== undefined) reranker = await OnnxCrossEncoder.load(flags.rerankModel);
    memoryRerank = await memoryRerankOption(flags.memoryRerank?.model, flags.memoryRerank?.depth);
    system = await RAGSystem.open({ memoryRerank, model: flags.model, loadOptions: loadOptions(flags), dataDir: flags.data, cacheDir: flags.cache, embedder, config, knowledgeBase: kb ?? undefined, rag: { ...(flags.layout ? { layout: flags.layout } : {}), ...(flags.truncateFirstContext ? { truncateFirstContext: true } : {}) }, steps: { model: flags.stepModel, timeoutMs: flags.stepTimeout }, reranker: reranker ?? undefined });
    const sys = system;
    const turnOptions = (c: TurnControl): RAGChatOptions => ({
      ...baseTurnOptions(flags, session, c),
      useMemories: flags.memory,
      ...(flags.collection !== undefined ? { collection: flags.collection, kbMode: flags.kbMode, kbFilter: filter, kbTopK: flags.topK, kbMultiQuery: flags.multiQuery, kbHyde: flags.hyde, queryTransform: queryTransform(flags), rerank: flags.rerank, rerankDepth: flags.rerankDepth, selfRag: flags.selfRag, adaptive: flags.adaptive, emptyRetrieval: flags.emptyRetrieval } : {}),
      ...(flags.citations !== undefined ? { citations: { format: flags.citations } } : {}),
      promptMode: flags.promptMode,
    });
    if (flags.query !== undefined) {
      const query = flags.query;
      await answerOnce(flags.format, (c) => sys.chat(query, turnOptions(c)), (r) => [ragSummary(r), ...r.metadata.warnings.map((w) => `warning: ${w}`)]);
      return;
    }
    await chatLoop({
      prompt: "rag> ",
      greeting: `RAG baseline as ${flags.user} in session ${session}${flags.collection ? `, collection ${flags.collection}` : ""}; /exit to leave`,
      ask: async (line, c) => ragSummary(await sys.chat(line, turnOptions(c))),
    });
  } finally {
    try {
      await system?.close();
    } finally {
      // Each closed whatever another one throws; the first failure is then thrown.
      const closed = await Promise.allSettled([reranker?.close(), memoryRerank?.reranker.close(), kb?.close()]);
      const failed = closed.find((r): r is PromiseRejectedResult => r.status === "rejected");
      if (failed) throw failed.reason;
    }
  }
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
    .option("--rewrite", "rewrite a follow-up into a standalone query from the session's history before searching (an LLM step)")
    .option("--decompose <n>", "split a multi-hop question into at most N sub-queries (2-5), retrieved one after the other (an LLM step)", intOption("--decompose", 2, 5))
    .option("--no-iterative", "with --decompose: search each sub-query as written, not refined with what the earlier ones found")
    .option("--step-back", "also search a more general (step-back) question written by the model")
    .option("--rerank <method>", "rerank the collection's results: lexical (cosine + query-term coverage, no model call), llm (the step model judges each passage yes/no) or cross-encoder (the --rerank-model scores each query-passage pair)", choiceOption("--rerank", RERANK_METHODS))
    .option("--rerank-model <dir>", "with --rerank cross-encoder: a cross-encoder ONNX folder (model.onnx or onnx/model.onnx, tokenizer.json, config.json), e.g. an export of cross-encoder/ms-marco-MiniLM-L-6-v2")
    .option("--rerank-depth <n>", "results searched and reranked before the best --top-k are kept (default max(20, 4 × top-k))", intOption("--rerank-depth", 1, 100))
    .option("--prompt-mode <mode>", "simple, advanced (combine and cite blocks) or precise (only what the context states, every sentence cited)", choiceOption("--prompt-mode", PROMPT_MODES))
    .option("--self-rag", "Self-RAG: the model decides whether to search, grades the passages and its answer, and reformulates (at most 3 rounds); the answer is printed once accepted")
    .option("--adaptive", "Adaptive RAG: classify the query (none / simple / complex) and search accordingly (none / one search / decomposed)")
    .option("--citations <format>", "score the answer's citations (0.4 similarity + 0.4 position + 0.2 coverage), flag unsupported sentences, and render it as markdown, html, plain or inline (in the JSON's metadata.citation_quality)", choiceOption("--citations", CITATION_FORMATS))
    .option("--empty-retrieval <what>", "when the collection search finds nothing and no memory is used: generate (default) or answer \"no relevant information\" without the model", choiceOption("--empty-retrieval", ["generate", "answer"] as const))
    .option("--truncate-first-context", "cut a first context block too long for the budget to fit, instead of dropping it")
    .option("--step-model <path>", "the model the LLM steps run on (default: --model)")
    .option("--step-timeout <ms>", "milliseconds an LLM step may take before its fallback is used (default 30000)", intOption("--step-timeout", 1, 3_600_000))
    .option("--layout <layout>", "auto (chat template when the model has one), seed (seed 000's plain layout) or chat", choiceOption("--layout", ["auto", "seed", "chat"] as const));
}

export function registerRagCommand(program: Command): void {
  ragOptions(
    outputOptions(
      turnCommandOptions(
        program.command("rag").description("chat through the RAG baseline: memories (and knowledge-base chunks) as prompt text, seed 000's budget"),
        "the K/V cache's folder for --kb-mode kv (default <data>.kv-cache)",
      ).option("--no-memory", "no memory search (knowledge base and history stay)"),
    ),
  ).action((flags: RagFlags) => ragCommand(flags));
}
