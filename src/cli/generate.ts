// `dki generate` and `dki logits`.
import type { Command } from "commander";
import { Model, type Device, type InjectionOptions } from "../engine/model.js";
import { intOption, numberOption, tokenListOption, choiceOption } from "./options.js";

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
  device: Device;
  quantize: "none" | "q8_0";
  stop?: string[];
  format: "text" | "json";
}

interface LogitsFlags {
  model: string;
  tokens: number[];
  threads?: number;
  device: Device;
  format: "json";
}

interface MemoryFlags {
  memory?: string;
  memoryTokens?: number[];
  alpha: number;
  scaling: "value" | "logit";
  positions: "negative" | "prefix";
  alphaThreshold: number;
}

/** Computes the memory's K/V block (placed where the position strategy wants it) and the injection options. */
async function memoryInjection(model: Model, flags: MemoryFlags): Promise<InjectionOptions> {
  if (flags.memory !== undefined && flags.memoryTokens !== undefined) throw new Error("give at most one of --memory and --memory-tokens");
  const tokens = flags.memoryTokens ?? (flags.memory !== undefined ? model.tokenizer.encode(flags.memory, { addSpecialTokens: false }) : null);
  if (!tokens) return {};
  const kv = await model.computeBlock(tokens, { startPos: flags.positions === "negative" ? -tokens.length : 0 });
  return { segments: [{ kv, alpha: flags.alpha, scaling: flags.scaling }], positions: flags.positions, alphaThreshold: flags.alphaThreshold };
}

const round = (x: number, digits = 3) => Number(x.toFixed(digits));

async function generate(flags: GenerateFlags & MemoryFlags): Promise<void> {
  if ((flags.prompt === undefined) === (flags.promptTokens === undefined)) throw new Error("give exactly one of --prompt and --prompt-tokens");
  const model = await Model.load(flags.model, { threads: flags.threads, quantize: flags.quantize, device: flags.device });
  try {
    const input = flags.promptTokens
      ? { tokens: flags.promptTokens }
      : flags.chat
        ? { messages: [...(flags.system ? [{ role: "system" as const, content: flags.system }] : []), { role: "user" as const, content: flags.prompt! }] }
        : flags.prompt!;
    const json = flags.format === "json";
    const injection = await memoryInjection(model, flags);
    const abort = new AbortController();
    process.once("SIGINT", () => abort.abort());
    const r = await model.generate(input, {
      ...injection,
      maxNewTokens: flags.maxTokens,
      sampling: { temperature: flags.temperature, topK: flags.topK, topP: flags.topP, repetitionPenalty: flags.repetitionPenalty, seed: flags.seed },
      stop: flags.stop,
      signal: abort.signal,
      onToken: json ? undefined : (text) => process.stdout.write(text),
    });
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
          },
        }) + "\n",
      );
    } else {
      process.stdout.write("\n");
      process.stderr.write(
        `[${s.promptTokens} prompt tokens: prefill ${s.prefillTokPerS.toFixed(1)} tok/s | ${s.generatedTokens} generated: ` +
          `decode ${s.decodeTokPerS.toFixed(1)} tok/s | first token ${s.timeToFirstTokenMs.toFixed(1)} ms | ${r.finishReason}]\n`,
      );
    }
  } finally {
    model.dispose();
  }
}

async function logits(flags: LogitsFlags & MemoryFlags): Promise<void> {
  const model = await Model.load(flags.model, {
    threads: flags.threads,
    device: flags.device,
    contextSize: Math.max(flags.tokens.length, flags.memoryTokens?.length ?? 0, 1),
  });
  try {
    const rows = await model.logits(flags.tokens, await memoryInjection(model, flags));
    process.stdout.write(JSON.stringify({ logits: rows.map((r) => Array.from(r)) }) + "\n");
  } finally {
    model.dispose();
  }
}

const deviceOption = [
  "--device <device>",
  "cpu, cuda (needs npm run build:cuda and a GPU) or auto",
  choiceOption("--device", ["cpu", "cuda", "auto"] as const),
  "cpu",
] as const;

function memoryOptions(cmd: Command): Command {
  return cmd
    .option("--memory <text>", "memory text injected as K/V (not as prompt text)")
    .option("--memory-tokens <ids>", "memory as comma-separated token ids", tokenListOption("--memory-tokens"))
    .option("--alpha <a>", "memory influence α", numberOption("--alpha", 0), 1)
    .option("--scaling <mode>", "value (V·α) or logit (+ln α on scores)", choiceOption("--scaling", ["value", "logit"] as const), "value")
    .option("--positions <strategy>", "negative (memory at [-M,-1]) or prefix (memory at [0,M-1])", choiceOption("--positions", ["negative", "prefix"] as const), "negative")
    .option("--alpha-threshold <a>", "inject nothing when α is below this", numberOption("--alpha-threshold", 0), 0.1);
}

export function registerGenerateCommands(program: Command): void {
  const gen = program
    .command("generate")
    .description("generate text with a model, streaming it to stdout")
    .requiredOption("-m, --model <dir>", "Hugging Face model folder")
    .option("-p, --prompt <text>", "prompt text")
    .option("--prompt-tokens <ids>", "prompt as comma-separated token ids", tokenListOption("--prompt-tokens"))
    .option("--chat", "wrap the prompt as a user message with the model's chat template")
    .option("--system <text>", "system message (with --chat)")
    .option("-n, --max-tokens <n>", "maximum new tokens", intOption("--max-tokens"), 128)
    .option("-t, --temperature <t>", "sampling temperature (0 = greedy)", numberOption("--temperature", 0), 0)
    .option("--top-k <k>", "keep the k most likely tokens (0 = all)", intOption("--top-k"), 0)
    .option("--top-p <p>", "nucleus sampling mass", numberOption("--top-p", 0, 1), 1)
    .option("--repetition-penalty <r>", "penalty for recent tokens (1 = none)", numberOption("--repetition-penalty", 0), 1)
    .option("--seed <s>", "random seed", intOption("--seed"), 0)
    .option("--stop <text...>", "stop strings")
    .option("--threads <n>", "worker threads (default: all cores)", intOption("--threads", 1))
    .option(...deviceOption)
    .option("--quantize <type>", "quantise weights at load time: none or q8_0", choiceOption("--quantize", ["none", "q8_0"] as const), "none")
    .option("--format <format>", "text or json", choiceOption("--format", ["text", "json"] as const), "text");
  memoryOptions(gen).action((flags: GenerateFlags & MemoryFlags) => generate(flags));

  const logitsCmd = program
    .command("logits")
    .description("print the logits of every position as JSON")
    .requiredOption("-m, --model <dir>", "Hugging Face model folder")
    .requiredOption("--tokens <ids>", "comma-separated token ids", tokenListOption("--tokens"))
    .option("--threads <n>", "worker threads (default: all cores)", intOption("--threads", 1))
    .option(...deviceOption)
    .option("--format <format>", "json", choiceOption("--format", ["json"] as const), "json");
  memoryOptions(logitsCmd).action((flags: LogitsFlags & MemoryFlags) => logits(flags));
}
