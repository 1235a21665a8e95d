// `dki generate` and `dki logits`.
import type { Command } from "commander";
import { Model, type Device, type InjectionOptions } from "../engine/model.js";
import type { GenerateResult } from "../engine/generate.js";
import { native } from "../engine/native.js";
import { formatThreads } from "../engine/threads.js";
import { DkiArgumentError } from "../errors.js";
import { choiceOption, deviceOption, intOption, numberOption, threadsOption, tokenListOption } from "./options.js";
import { checkModelPath } from "./paths.js";

interface GenerateFlags {
  model: string;
  prompt?: string;
  promptTokens?: number[];
  chat?: boolean;
  system?: string;
  maxTokens: number;
  temperature: number;
  topK: number;
  topP: number;
  repetitionPenalty: number;
  seed: number;
  threads?: number;
  contextSize?: number;
  device: Device;
  quantize: "none" | "q8_0";
  stop?: string[];
  format: "text" | "json";
  checkTensors?: boolean;
}

interface LogitsFlags {
  model: string;
  tokens: number[];
  threads?: number;
  device: Device;
  format: "json";
  checkTensors?: boolean;
}

interface MemoryFlags {
  memory?: string;
  memoryTokens?: number[];
  alpha: number;
  scaling: "value" | "logit";
  positions: "negative" | "prefix";
  alphaThreshold: number;
}

/** The options that only shape an injected memory, by flag key and name. */
const MEMORY_SETTINGS = [
  ["alpha", "--alpha"],
  ["scaling", "--scaling"],
  ["positions", "--positions"],
  ["alphaThreshold", "--alpha-threshold"],
] as const;

/** Refuses memory settings without a memory: they would be ignored, and a user who passes one expects it to act. */
function checkMemoryFlags(flags: MemoryFlags, cmd: Command): void {
  if (flags.memory !== undefined && flags.memoryTokens !== undefined) throw new Error("give at most one of --memory and --memory-tokens");
  if (flags.memory !== undefined || flags.memoryTokens !== undefined) return;
  for (const [key, name] of MEMORY_SETTINGS) {
    if (cmd.getOptionValueSource(key) === "cli") throw new Error(`${name} sets how the memory is injected; give --memory or --memory-tokens with it`);
  }
}

/** Computes the memory's K/V block (placed where the position strategy wants it) and the injection options. */
async function memoryInjection(model: Model, flags: MemoryFlags): Promise<InjectionOptions> {
  // The engine's id check, under the option's name so the user knows which list is wrong.
  if (flags.memoryTokens) model.checkTokenIds(flags.memoryTokens, "--memory-tokens");
  const tokens = flags.memoryTokens ?? (flags.memory !== undefined ? model.tokenizer.encode(flags.memory, { addSpecialTokens: false }) : null);
  if (!tokens) return {};
  const kv = await model.computeBlock(tokens, { startPos: flags.positions === "negative" ? -tokens.length : 0 });
  return { segments: [{ kv, alpha: flags.alpha, scaling: flags.scaling }], positions: flags.positions, alphaThreshold: flags.alphaThreshold };
}

const round = (x: number, digits = 3) => Number(x.toFixed(digits));

/** Loads the model and says once, on stderr, what its load warned about (a window beyond the trained positions). */
async function loadModel(path: string, opts: Parameters<typeof Model.load>[1]): Promise<Model> {
  let model: Model;
  try {
    model = await Model.load(path, opts);
  } catch (e) {
    // The library names its option; the user gave the flag.
    if (e instanceof DkiArgumentError && e.message.startsWith("contextSize ")) throw new DkiArgumentError(`--context-size ${e.message.slice("contextSize ".length)}`);
    throw e;
  }
  for (const w of model.info.warnings) process.stderr.write(`dki: warning: ${w}\n`);
  return model;
}

/** The stats line's account of the memory: what was injected and how, or why nothing was. */
function memorySummary(flags: MemoryFlags, segmentTokens: number): string {
  if (flags.memory === undefined && flags.memoryTokens === undefined) return "";
  if (segmentTokens === 0) return ` | memory not injected: α ${flags.alpha} < threshold ${flags.alphaThreshold}`;
  return ` | memory: ${segmentTokens} token${segmentTokens === 1 ? "" : "s"} injected as K/V, α ${flags.alpha} (${flags.scaling} scaling, ${flags.positions} positions)`;
}

async function generate(flags: GenerateFlags & MemoryFlags, cmd: Command): Promise<void> {
  if ((flags.prompt === undefined) === (flags.promptTokens === undefined)) throw new Error("give exactly one of --prompt and --prompt-tokens");
  if (flags.chat && flags.promptTokens) throw new Error("--chat puts --prompt text into the chat template; it cannot be used with --prompt-tokens");
  if (flags.system !== undefined && !flags.chat) throw new Error("--system is a chat message; give --chat with it");
  checkMemoryFlags(flags, cmd);
  if (flags.stop?.some((s) => s === "")) throw new Error("--stop: an empty stop string would match before any text; give non-empty strings");
  // Checked here, not by the option parser, so that --help works without the native addon.
  const maxContext = native().limits.contextTokens;
  if (flags.contextSize !== undefined && flags.contextSize > maxContext) throw new Error(`--context-size must be an integer in [1, ${maxContext}], got "${flags.contextSize}"`);
  await checkModelPath(flags.model, "--model");
  const model = await loadModel(flags.model, {
    threads: flags.threads,
    quantize: flags.quantize,
    device: flags.device,
    contextSize: flags.contextSize,
    checkTensors: flags.checkTensors === true,
  });
  try {
    if (flags.promptTokens) model.checkTokenIds(flags.promptTokens, "--prompt-tokens");
    const input = flags.promptTokens
      ? { tokens: flags.promptTokens }
      : flags.chat
        ? { messages: [...(flags.system ? [{ role: "system" as const, content: flags.system }] : []), { role: "user" as const, content: flags.prompt! }] }
        : flags.prompt!;
    const json = flags.format === "json";
    const injection = await memoryInjection(model, flags);
    // Ctrl-C stops the generation, not the process: the result so far is printed (finish reason
    // "aborted"), and the exit status is the shell's 130 for SIGINT. A second Ctrl-C gets Node's
    // default and kills at once.
    const abort = new AbortController();
    const onSigint = () => abort.abort();
    process.once("SIGINT", onSigint);
    let r: GenerateResult;
    try {
      r = await model.generate(input, {
        ...injection,
        maxNewTokens: flags.maxTokens,
        sampling: { temperature: flags.temperature, topK: flags.topK, topP: flags.topP, repetitionPenalty: flags.repetitionPenalty, seed: flags.seed },
        stop: flags.stop,
        signal: abort.signal,
        stopOnAbortSignal: true,
        onToken: json ? undefined : (text) => process.stdout.write(text),
      });
    } catch (e) {
      if (!abort.signal.aborted) throw e;
      // Interrupted before the first token (during the prefill): there is no result.
      process.stderr.write("dki: interrupted before the first token\n");
      process.exitCode = 130;
      return;
    } finally {
      process.off("SIGINT", onSigint);
    }
    if (r.finishReason === "aborted") process.exitCode = 130;
    const s = r.stats;
    if (json) {
      process.stdout.write(
        JSON.stringify({
          text: r.text,
          tokens: r.tokens,
          finish_reason: r.finishReason,
          stats: {
            prompt_tokens: s.promptTokens,
            segment_tokens: s.segmentTokens,
            prefill_ms: round(s.prefillMs),
            prefill_tok_s: round(s.prefillTokPerS, 2),
            decode_tokens: s.generatedTokens,
            decode_tok_s: round(s.decodeTokPerS, 2),
            ttft_ms: round(s.timeToFirstTokenMs),
            first_token_entropy: round(s.firstTokenEntropy, 4),
            threads: model.info.threads.count,
          },
        }) + "\n",
      );
    } else {
      process.stdout.write("\n");
      const promptTokens = `${s.promptTokens} prompt token${s.promptTokens === 1 ? "" : "s"}`;
      // With -n 0 no token is sampled: there is no first-token time to report.
      const firstToken = flags.maxTokens === 0 ? "none" : `${s.timeToFirstTokenMs.toFixed(1)} ms`;
      process.stderr.write(
        `[${promptTokens}: prefill ${s.prefillTokPerS.toFixed(1)} tok/s | ${s.generatedTokens} generated: ` +
          `decode ${s.decodeTokPerS.toFixed(1)} tok/s | threads ${formatThreads(model.info.threads)} | ` +
          `first token ${firstToken}${memorySummary(flags, s.segmentTokens)} | ${r.finishReason}]\n`,
      );
    }
  } finally {
    model.dispose();
  }
}

async function logits(flags: LogitsFlags & MemoryFlags, cmd: Command): Promise<void> {
  checkMemoryFlags(flags, cmd);
  await checkModelPath(flags.model, "--model");
  // The context is sized to the tokens, so logits needs no --context-size.
  const model = await loadModel(flags.model, {
    threads: flags.threads,
    device: flags.device,
    contextSize: Math.max(flags.tokens.length, flags.memoryTokens?.length ?? 0, 1),
    checkTensors: flags.checkTensors === true,
  });
  try {
    model.checkTokenIds(flags.tokens, "--tokens");
    const rows = await model.logits(flags.tokens, await memoryInjection(model, flags));
    process.stdout.write(JSON.stringify({ logits: rows.map((r) => Array.from(r)) }) + "\n");
  } finally {
    model.dispose();
  }
}

function memoryOptions(cmd: Command): Command {
  return cmd
    .option("--memory <text>", "memory text injected as K/V (not as prompt text)")
    .option("--memory-tokens <ids>", "memory as comma-separated token ids", tokenListOption("--memory-tokens"))
    .option("--alpha <a>", "memory influence α", numberOption("--alpha", { min: 0 }), 1)
    .option("--scaling <mode>", "value (V·α) or logit (+ln α on scores)", choiceOption("--scaling", ["value", "logit"] as const), "value")
    .option("--positions <strategy>", "negative (memory at [-M,-1]) or prefix (memory at [0,M-1])", choiceOption("--positions", ["negative", "prefix"] as const), "negative")
    .option("--alpha-threshold <a>", "inject nothing when α is below this", numberOption("--alpha-threshold", { min: 0 }), 0.1);
}

const modelOption = ["-m, --model <path>", "model: a Hugging Face model folder or a .gguf file"] as const;
const checkTensorsOption = ["--check-tensors", "read every weight at load and refuse the model at the first NaN/inf (costs a pass over the files)"] as const;

export function registerGenerateCommands(program: Command): void {
  const gen = program
    .command("generate")
    .description("generate text with a model, streaming it to stdout")
    .requiredOption(...modelOption)
    .option("-p, --prompt <text>", "prompt text")
    .option("--prompt-tokens <ids>", "prompt as comma-separated token ids", tokenListOption("--prompt-tokens"))
    .option("--chat", "wrap the prompt as a user message with the model's chat template")
    .option("--system <text>", "system message (with --chat)")
    .option("-n, --max-tokens <n>", "maximum new tokens", intOption("--max-tokens"), 128)
    .option("-t, --temperature <t>", "sampling temperature (0 = greedy)", numberOption("--temperature", { min: 0 }), 0)
    // The sampler takes k as a 32-bit int.
    .option("--top-k <k>", "keep the k most likely tokens (0 = all)", intOption("--top-k", 0, 2 ** 31 - 1), 0)
    .option("--top-p <p>", "nucleus sampling mass, in (0, 1]", numberOption("--top-p", { above: 0, max: 1 }), 1)
    .option("--repetition-penalty <r>", "penalty for recent tokens, > 0 (1 = none)", numberOption("--repetition-penalty", { above: 0 }), 1)
    .option("--seed <s>", "random seed", intOption("--seed"), 0)
    .option("--stop <text...>", "stop strings")
    .option(
      "--context-size <n>",
      "context window in tokens: the prompt plus the generated tokens, injected memory not counted (default: the model's maximum positions, at most 4096; " +
        "more works, with a warning; its memory is checked first and taken as tokens fill it)",
      intOption("--context-size", 1),
    )
    .option(...threadsOption)
    .option(...deviceOption)
    .option("--quantize <type>", "quantise weights at load time: none or q8_0", choiceOption("--quantize", ["none", "q8_0"] as const), "none")
    .option(...checkTensorsOption)
    .option("--format <format>", "text or json", choiceOption("--format", ["text", "json"] as const), "text");
  memoryOptions(gen).action((flags: GenerateFlags & MemoryFlags, cmd: Command) => generate(flags, cmd));

  const logitsCmd = program
    .command("logits")
    .description("print the logits of every position as JSON")
    .requiredOption(...modelOption)
    .requiredOption("--tokens <ids>", "comma-separated token ids", tokenListOption("--tokens"))
    .option(...threadsOption)
    .option(...deviceOption)
    .option(...checkTensorsOption)
    .option("--format <format>", "json", choiceOption("--format", ["json"] as const), "json");
  memoryOptions(logitsCmd).action((flags: LogitsFlags & MemoryFlags, cmd: Command) => logits(flags, cmd));
}
