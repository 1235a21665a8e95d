// `dki models ...`: make random-weight test models, download registry models, inspect folders.
import { existsSync } from "node:fs";
import { join } from "node:path";
import cliProgress from "cli-progress";
import type { Command } from "commander";
import { formatBytes, formatModelInfo, modelInfo } from "../models/info.js";
import { threadsInfo } from "../engine/threads.js";
import { convertHfToGguf, GGUF_OUT_TYPES, type GgufOutType } from "../models/convert.js";
import { makeTinyModel, TINY_ARCHES, TINY_DTYPES, TINY_PRESETS, type TinyArch, type TinyDType, type TinyPreset } from "../models/make-tiny.js";
import { pullModel, type PullProgress } from "../models/pull.js";
import { loadRegistry } from "../models/registry.js";
import { choiceOption, intOption } from "./options.js";
import { checkModelFolder, checkModelPath, checkOutFile, checkOutFolder } from "./paths.js";

interface MakeTinyFlags {
  arch: TinyArch;
  preset: TinyPreset;
  dtype: TinyDType;
  out: string;
  seed: number;
  shards: number;
  force?: boolean;
}

interface PullFlags {
  dir?: string;
  hubUrl?: string;
}

interface ConvertFlags {
  to: "gguf";
  type: GgufOutType;
  out: string;
  name?: string;
}

interface FormatFlags {
  format: "text" | "json";
}

/** Where `pull` puts a model and where `list` looks for it. */
const defaultModelDir = (name: string) => join("models", name);

async function makeTiny(flags: MakeTinyFlags): Promise<void> {
  await checkOutFolder(flags.out, "--out", { flag: "--force", given: flags.force === true });
  const t0 = performance.now();
  const r = await makeTinyModel({ arch: flags.arch, preset: flags.preset, dtype: flags.dtype, out: flags.out, seed: flags.seed, shards: flags.shards });
  const secs = ((performance.now() - t0) / 1000).toFixed(1);
  process.stdout.write(
    `wrote ${r.dir}: ${flags.arch} ${flags.preset} ${flags.dtype}, ${r.paramCount.toLocaleString("en-US")} parameters, ` +
      `${formatBytes(r.bytes)} in ${flags.shards} file${flags.shards === 1 ? "" : "s"} (${secs} s)\n`,
  );
}

/** Progress for one file at a time: a bar when stderr is a terminal, a line per file otherwise. */
function progressReporter(): (e: PullProgress) => void {
  const tty = process.stderr.isTTY === true;
  let bar: cliProgress.SingleBar | null = null;
  return (e) => {
    switch (e.type) {
      case "skip":
        process.stderr.write(`${e.file}: already present (${formatBytes(e.bytes)})\n`);
        break;
      case "start": {
        const size = e.total === null ? "size unknown" : formatBytes(e.total);
        const resume = e.resumeFrom > 0 ? `, resuming at ${formatBytes(e.resumeFrom)}` : "";
        if (tty && e.total !== null && e.total > 0) {
          bar = new cliProgress.SingleBar(
            { stream: process.stderr, format: `${e.file} [{bar}] {percentage}% | {got} / ${size} | {eta_formatted}`, hideCursor: true, clearOnComplete: true },
            cliProgress.Presets.shades_classic,
          );
          bar.start(e.total, e.resumeFrom, { got: formatBytes(e.resumeFrom) });
        } else {
          process.stderr.write(`${e.file}: downloading (${size}${resume}) from ${e.url}\n`);
        }
        break;
      }
      case "data":
        bar?.update(e.received, { got: formatBytes(e.received) });
        break;
      case "verify":
        bar?.stop();
        bar = null;
        break;
      case "done":
        process.stderr.write(`${e.file}: ${formatBytes(e.bytes)}, sha256 ${e.sha256}\n`);
        break;
    }
  };
}

async function pull(name: string, flags: PullFlags): Promise<void> {
  const dir = flags.dir ?? defaultModelDir(name);
  const report = progressReporter();
  const r = await pullModel(name, { dir, baseUrl: flags.hubUrl, onProgress: report });
  const total = r.files.reduce((a, f) => a + f.bytes, 0);
  process.stdout.write(`${name}: ${r.files.length} files, ${formatBytes(total)} in ${r.dir}\n`);
}

async function info(path: string, flags: FormatFlags): Promise<void> {
  await checkModelPath(path, "<path>");
  // The threads a generate would run here, beside what the file holds.
  const i = { ...(await modelInfo(path)), threads: threadsInfo() };
  process.stdout.write(flags.format === "json" ? JSON.stringify(i, null, 2) + "\n" : formatModelInfo(i));
}

async function convert(dir: string, flags: ConvertFlags): Promise<void> {
  await checkModelFolder(dir, "<dir>");
  await checkOutFile(flags.out, "--out");
  const t0 = performance.now();
  const tty = process.stderr.isTTY === true;
  let bar: cliProgress.SingleBar | null = null;
  const r = await convertHfToGguf({
    dir,
    out: flags.out,
    type: flags.type,
    name: flags.name,
    onProgress: tty
      ? (done, total) => {
          if (!bar) {
            bar = new cliProgress.SingleBar({ stream: process.stderr, format: `converting [{bar}] {percentage}% | {eta_formatted}`, hideCursor: true, clearOnComplete: true }, cliProgress.Presets.shades_classic);
            bar.start(total, 0);
          }
          bar.update(done);
          if (done >= total) bar.stop();
        }
      : undefined,
  });
  const secs = ((performance.now() - t0) / 1000).toFixed(1);
  process.stdout.write(`wrote ${r.file}: ${r.config.arch} ${flags.type}, ${r.tensorCount} tensors, ${formatBytes(r.bytes)} (${secs} s)\n`);
}

async function list(flags: FormatFlags): Promise<void> {
  const registry = await loadRegistry();
  const rows = [...registry.values()].map((m) => ({
    name: m.name,
    repo: m.repo,
    revision: m.revision,
    description: m.description,
    downloaded: existsSync(join(defaultModelDir(m.name), "config.json")),
  }));
  if (flags.format === "json") {
    process.stdout.write(JSON.stringify(rows, null, 2) + "\n");
    return;
  }
  const width = Math.max(...rows.map((r) => r.name.length));
  for (const r of rows) {
    process.stdout.write(`${r.name.padEnd(width)}  ${r.repo}${r.downloaded ? `  [in ${defaultModelDir(r.name)}]` : ""}\n${" ".repeat(width + 2)}${r.description}\n`);
  }
}

/** Errors become one `dki: message` line and exit status 1, never a stack trace. */
function run<A extends unknown[]>(fn: (...args: A) => Promise<void>): (...args: A) => Promise<void> {
  return async (...args) => {
    try {
      await fn(...args);
    } catch (e) {
      process.stderr.write(`dki: ${e instanceof Error ? e.message : String(e)}\n`);
      process.exitCode = 1;
    }
  };
}

export function registerModelsCommand(program: Command): void {
  const models = program.command("models").description("make, download and inspect model folders");
  const formatOption = choiceOption("--format", ["text", "json"] as const);

  models
    .command("make-tiny")
    .description("write a random-weight Hugging Face model folder (vocab 49152, SmolLM2 tokenizer) for tests and benchmarks")
    .requiredOption("--out <dir>", "output folder: created, or empty unless --force")
    .option("--arch <arch>", `architecture: ${TINY_ARCHES.join(", ")}`, choiceOption("--arch", TINY_ARCHES), "llama")
    .option("--preset <name>", `shapes: ${TINY_PRESETS.join(", ")}`, choiceOption("--preset", TINY_PRESETS), "tiny")
    .option("--dtype <dtype>", `weight type: ${TINY_DTYPES.join(", ")}`, choiceOption("--dtype", TINY_DTYPES), "f32")
    .option("--seed <n>", "random seed (same seed, same bytes)", intOption("--seed"), 0)
    .option("--shards <n>", "number of safetensors files (> 1 writes an index)", intOption("--shards", 1), 1)
    .option("--force", "write into a folder that is not empty, replacing the files make-tiny writes")
    .action(run((flags: MakeTinyFlags) => makeTiny(flags)));

  models
    .command("pull")
    .description("download a model from the registry (resumes interrupted downloads)")
    .argument("<name>", "registry name (see `dki models list`)")
    .option("--dir <dir>", "destination folder (default: models/<name>)")
    .option("--hub-url <url>", "hub to download from instead of https://huggingface.co (default: $DKI_HUB_URL)")
    .action(run((name: string, flags: PullFlags) => pull(name, flags)));

  models
    .command("convert")
    .description("convert a Hugging Face model folder to a GGUF file that llama.cpp and this engine load")
    .argument("<dir>", "Hugging Face model folder (config.json, safetensors, byte-level BPE tokenizer.json)")
    .option("--to <format>", "output format: gguf", choiceOption("--to", ["gguf"] as const), "gguf")
    .option("--type <type>", `weight type of the matrices: ${GGUF_OUT_TYPES.join(", ")} (norms and biases stay f32)`, choiceOption("--type", GGUF_OUT_TYPES), "f16")
    .requiredOption("--out <file>", "output .gguf file (replaced)")
    .option("--name <name>", "general.name (default: the folder's name)")
    .action(run((dir: string, flags: ConvertFlags) => convert(dir, flags)));

  models
    .command("info")
    .description("describe a Hugging Face model folder or GGUF file: architecture, shapes, dtypes, parameter count")
    .argument("<path>", "model folder or .gguf file")
    .option("--format <format>", "text or json", formatOption, "text")
    .action(run((path: string, flags: FormatFlags) => info(path, flags)));

  models
    .command("list")
    .description("list the models `dki models pull` knows")
    .option("--format <format>", "text or json", formatOption, "text")
    .action(run((flags: FormatFlags) => list(flags)));
}
