// `dki eval`: research evaluations. `dki eval memory` runs the memory-QA harness (src/eval/): a
// LoCoMo / LongMemEval / synthetic file answered by one model in each mode, one JSONL row per
// (question, mode) in --out (resumable), and the report (Markdown, JSON, plots). Prints the
// report's per-mode table as JSON on stdout.
import { join } from "node:path";
import type { Command } from "commander";
import { MODES, runMemoryQA, type Mode } from "../eval/memory-qa.js";
import { reportName, writeMemoryQAReport } from "../eval/report.js";
import { snakeKeys, stderrBar } from "./output.js";
import { choiceOption, EMBEDDER_HELP, embedderOption, intOption, numberOption, rerankDepthOption, withMemoryRerank } from "./options.js";
import type { MemoryRerank } from "../dki/routing.js";
import type { Embedder } from "../memory/types.js";
import type { DKIConfigInput } from "../dki/config.js";
import { readConfigFile } from "./config-file.js";

interface MemoryFlags {
  model: string;
  data: string;
  out: string;
  report?: string;
  modes: Mode[];
  limit?: number;
  seed?: number;
  conversations?: string[];
  topK: number;
  alpha?: number;
  maxAnswerTokens: number;
  memoryMaxTokens?: number;
  device: "cpu" | "cuda";
  threads?: number;
  ctx?: number;
  judge?: string;
  embedder?: string;
  rerankModel?: string;
  rerankDepth?: number;
  config?: string;
}

function modesOption(v: string): Mode[] {
  const modes = v.split(",").map((s) => s.trim());
  return modes.map((m) => choiceOption("--modes", MODES)(m));
}

const listOption = (v: string): string[] => v.split(",").map((s) => s.trim()).filter((s) => s !== "");

/** Creates the `eval` command group with its `memory` subcommand; returns the group for more subcommands. */
export function registerEval(program: Command): Command {
  const group = program.command("eval").description("research evaluations: memory QA on LoCoMo, LongMemEval and synthetic data");
  group
    .command("memory")
    .description("answer a memory-QA file's questions in each mode (none, full, rag, dki, dki-joint), score them, write per-question JSONL and a report")
    .requiredOption("--model <path>", "the model: a Hugging Face folder or a GGUF file")
    .requiredOption("--data <file>", "a LoCoMo, LongMemEval or synthetic (LoCoMo-form) JSON file")
    .requiredOption("--out <dir>", "work folder: results.jsonl, run.json, the memory store and K/V cache; a rerun skips finished rows")
    .option("--report <path>", "the report's path without extension (default <out>/memory-qa-<model>-<data>), e.g. bench/results/memory-qa-plain-heldout")
    .option("--modes <list>", `comma-separated modes (${MODES.join(", ")})`, modesOption, [...MODES])
    .option("--limit <n>", "answer at most n questions", intOption("--limit", 1))
    .option("--seed <n>", "shuffle the question order with this seed (default: the file's order)", intOption("--seed", 0, 2 ** 32 - 1))
    .option("--conversations <ids>", "only these conversations (comma-separated store user ids: sample_id / conv-<i> / question_id)", listOption)
    .option("--top-k <n>", "memories routed per question for rag and dki*", intOption("--top-k", 1, 1000), 3)
    .option("--alpha <a>", "force dki's α for every routed memory (bypasses the relevance gate); default: gated", numberOption("--alpha", { min: 0, max: 1 }))
    .option("--max-answer-tokens <n>", "answer tokens at most", intOption("--max-answer-tokens", 1, 4096), 24)
    .option("--memory-max-tokens <n>", "memory tokens dki* inject per question at most (default 1024)", intOption("--memory-max-tokens", 1))
    .option("--device <d>", "cpu or cuda", choiceOption("--device", ["cpu", "cuda"] as const), "cpu")
    .option("--threads <n>", "engine threads (default: the CPUs this process may use)", intOption("--threads", 1, 1024))
    .option("--ctx <n>", "the model's own-token window (full drops the oldest turns to fit it)", intOption("--ctx", 1))
    .option("--judge <path>", "a judge model (HF folder or GGUF) for LongMemEval's yes/no verdicts")
    .option("--embedder <dir>", EMBEDDER_HELP)
    .option("--config <file>", "DKIConfig settings for the dki modes (JSON or YAML: positions, encodingPrefix, memoryOrder, blockFix, alphaScaling, ...); the harness's own (top-k, instruction, memory encoding) must agree with its flags")
    .option("--rerank-model <dir>", "a cross-encoder ONNX folder (e.g. models/memory-qa-reranker) that reorders the memory search's candidates before rag and dki* keep the top-k")
    .option(...rerankDepthOption("top-k"))
    .action(async (f: MemoryFlags) => {
      const dkiConfig = f.config === undefined ? undefined : await readConfigFile(f.config);
      const embedder = await embedderOption(f.embedder);
      // Loaded before the model, so a bad folder fails fast; closed however the run ends.
      await withMemoryRerank(f.rerankModel, f.rerankDepth, (memoryRerank) => evalMemory(f, dkiConfig, embedder, memoryRerank));
    });
  return group;
}

async function evalMemory(f: MemoryFlags, dkiConfig: DKIConfigInput | undefined, embedder: Embedder | undefined, memoryRerank: MemoryRerank | undefined): Promise<void> {
  const bar = stderrBar("answering [{bar}] {value}/{total} {mode} | {duration_formatted} elapsed, ETA {eta_formatted}");
  let started = false;
  const result = await runMemoryQA({
    model: f.model,
    data: f.data,
    out: f.out,
    modes: f.modes,
    limit: f.limit,
    seed: f.seed,
    conversations: f.conversations,
    topK: f.topK,
    alpha: f.alpha,
    maxAnswerTokens: f.maxAnswerTokens,
    memoryMaxTokens: f.memoryMaxTokens,
    device: f.device,
    threads: f.threads,
    contextSize: f.ctx,
    judge: f.judge,
    dkiConfig,
    embedder,
    memoryRerank,
    onProgress: (done, total, mode) => {
      if (!started) {
        started = true;
        bar?.start(total, 0, { mode });
      }
      bar?.update(done, { mode });
    },
  });
  bar?.stop();
  const base = (f.report ?? join(f.out, reportName(f.model, f.data))).replace(/\.(md|json)$/, "");
  const report = await writeMemoryQAReport(result, base);
  process.stderr.write(`dki: ${result.answered} rows answered, ${result.rows.length} in ${result.resultsFile}; report ${base}.md\n`);
  process.stdout.write(JSON.stringify(snakeKeys({ report: `${base}.md`, results: result.resultsFile, modes: report.modes })) + "\n");
}
