// The `dki` command line, run as a user runs it (node bin/dki.js, built by `npm test`'s tsc step).
import { execFile, spawn } from "node:child_process";
import { closeSync, existsSync, openSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { native } from "../src/engine/native.js";
import { repoRoot, tempDir, maxAbsDiff } from "./support/paths.js";

const run = promisify(execFile);
const dki = (args: string[]) => run(process.execPath, [join(repoRoot, "bin", "dki.js"), ...args], { maxBuffer: 256 * 1024 * 1024 });
async function dkiFails(args: string[]): Promise<{ code: number; stderr: string }> {
  try {
    await dki(args);
  } catch (e) {
    const err = e as { code: number; stderr: string };
    return { code: err.code, stderr: err.stderr };
  }
  throw new Error(`dki ${args.join(" ")} succeeded but should have failed`);
}

/** Runs dki with stdout going to `stdout` (a pipe, or a file descriptor such as /dev/full's). */
function dkiSpawn(args: string[], stdout: "pipe" | number, onStdout?: (chunk: string, child: ReturnType<typeof spawn>) => void) {
  const child = spawn(process.execPath, [join(repoRoot, "bin", "dki.js"), ...args], { stdio: ["ignore", stdout, "pipe"] });
  let out = "";
  let err = "";
  child.stdout?.on("data", (d: Buffer) => {
    out += d.toString();
    onStdout?.(d.toString(), child);
  });
  child.stderr?.on("data", (d: Buffer) => (err += d.toString()));
  const done = new Promise<{ code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }>((resolve) =>
    child.on("close", (code, signal) => resolve({ code, signal, stdout: out, stderr: err })),
  );
  return { child, done };
}

let dir: string;
beforeAll(async () => {
  dir = join(tempDir(), "tiny");
  await dki(["models", "make-tiny", "--arch", "llama", "--preset", "tiny", "--dtype", "f16", "--out", dir]);
});

describe("dki generate", () => {
  test("--format json prints one object with text, tokens and stats", async () => {
    const { stdout } = await dki(["generate", "--model", dir, "--prompt", "Hello there", "--max-tokens", "8", "--format", "json", "--threads", "1"]);
    const r = JSON.parse(stdout);
    expect(typeof r.text).toBe("string");
    expect(r.tokens.length).toBeGreaterThan(0);
    expect(r.tokens.length).toBeLessThanOrEqual(8);
    for (const k of ["prompt_tokens", "prefill_ms", "prefill_tok_s", "decode_tokens", "decode_tok_s", "ttft_ms"]) expect(typeof r.stats[k]).toBe("number");
  });

  test("text mode streams the text and prints stats on stderr; --prompt-tokens and --chat work", async () => {
    const { stdout, stderr } = await dki(["generate", "--model", dir, "--prompt-tokens", "1,2,3", "--max-tokens", "5"]);
    expect(stdout.length).toBeGreaterThan(0);
    expect(stderr).toMatch(/prefill .* tok\/s .* decode .* tok\/s .* first token/);
    const chat = JSON.parse((await dki(["generate", "--model", dir, "--prompt", "hi", "--chat", "--max-tokens", "3", "--format", "json"])).stdout);
    expect(chat.stats.prompt_tokens).toBeGreaterThan(5);
  });

  test("the stats line counts 1 prompt token in the singular and reports no first token for -n 0", async () => {
    const { stderr } = await dki(["generate", "--model", dir, "--prompt-tokens", "1", "-n", "0"]);
    expect(stderr).toMatch(/^\[1 prompt token: .*\| 0 generated: .*\| first token none \| length\]\n$/);
    const two = await dki(["generate", "--model", dir, "--prompt-tokens", "1,2", "-n", "1"]);
    expect(two.stderr).toMatch(/^\[2 prompt tokens: .*\| first token \d+\.\d ms \|/);
  });

  test("--context-size sets the context window; --threads 0 means the default", async () => {
    const args = ["generate", "--model", dir, "--prompt-tokens", "1,2,3", "-n", "10", "--format", "json"];
    const r = JSON.parse((await dki([...args, "--context-size", "5", "--threads", "0"])).stdout);
    expect(r.finish_reason).toBe("context");
    expect(r.tokens).toHaveLength(3);
    const { stderr } = await dkiFails([...args, "--context-size", "2"]);
    expect(stderr).toBe("dki: the prompt has 3 tokens, more than the 2 tokens of the context window\n");
  });

  test("a .gguf file loads as --model, and --help says so", async () => {
    const gguf = join(dir, "..", "tiny.gguf");
    await dki(["models", "convert", dir, "--out", gguf]);
    const r = JSON.parse((await dki(["generate", "--model", gguf, "--prompt", "hi", "-n", "2", "--format", "json"])).stdout);
    expect(r.tokens).toHaveLength(2);
    for (const cmd of ["generate", "logits"]) {
      const help = (await dki([cmd, "--help"])).stdout;
      expect(help).toMatch(/-m, --model <path> +model: a Hugging Face model folder or a \.gguf file/);
      if (cmd === "generate") expect(help).toContain("--context-size <n>");
    }
  });

  // The prompt keeps generating (a huge token limit and context) until the test interrupts it.
  const endless = ["generate", "--prompt", "hi", "-n", "100000", "--context-size", "4096"];

  test("Ctrl-C keeps the streamed text, ends with the stats line (aborted) and exits 130", async () => {
    let sent = false;
    const { done } = dkiSpawn([...endless, "--model", dir], "pipe", (_chunk, child) => {
      if (!sent) child.kill("SIGINT");
      sent = true;
    });
    const r = await done;
    expect(r.code).toBe(130);
    expect(r.stdout.length).toBeGreaterThan(0);
    expect(r.stdout.endsWith("\n")).toBe(true);
    expect(r.stderr).toMatch(/^\[\d+ prompt tokens?: .*\| \d+ generated: .*\| aborted\]\n$/);
  });

  test("Ctrl-C with --format json prints the result so far (finish_reason aborted) and exits 130", async () => {
    // No output shows when generation has begun. A SIGINT during the model load kills the
    // process (Node's default), and one before the first token leaves nothing to print: wait
    // longer and try again in those cases.
    for (const delayMs of [500, 1000, 2000, 4000, 8000]) {
      const { child, done } = dkiSpawn([...endless, "--model", dir, "--format", "json"], "pipe");
      setTimeout(() => child.kill("SIGINT"), delayMs);
      const r = await done;
      if (r.signal === "SIGINT") continue;
      expect(r.code).toBe(130);
      if (r.stderr === "dki: interrupted before the first token\n") {
        expect(r.stdout).toBe("");
        continue;
      }
      expect(r.stderr).toBe("");
      const result = JSON.parse(r.stdout);
      expect(result.finish_reason).toBe("aborted");
      expect(result.tokens.length).toBeGreaterThan(0);
      expect(result.stats.decode_tokens).toBe(result.tokens.length);
      return;
    }
    throw new Error("the generation never started within 8 s");
  });

  test("--memory injects a memory block", async () => {
    const base = ["generate", "--model", dir, "--prompt", "What do I like?", "--max-tokens", "12", "--format", "json"];
    const plain = JSON.parse((await dki(base)).stdout);
    const withMem = JSON.parse((await dki([...base, "--memory", "I love hiking in the mountains every weekend.", "--alpha", "1"])).stdout);
    expect(withMem.stats.segment_tokens).toBeGreaterThan(5);
    expect(withMem.stats.prompt_tokens).toBe(plain.stats.prompt_tokens);
    const cut = JSON.parse((await dki([...base, "--memory", "I love hiking.", "--alpha", "0.05"])).stdout);
    expect(cut.tokens).toEqual(plain.tokens);
  });

  test("the text stats line says what memory was injected, or why none was", async () => {
    const base = ["generate", "--model", dir, "--prompt", "What do I like?", "--max-tokens", "2", "--memory", "I love hiking."];
    const n = (await Model.load(dir, { contextSize: 8 }).then((m) => [m.tokenizer.encode("I love hiking.").length, m.dispose()]))[0];
    expect((await dki([...base, "--alpha", "0.8"])).stderr).toMatch(
      new RegExp(`\\| memory: ${n} tokens injected as K/V, α 0\\.8 \\(value scaling, negative positions\\) \\| length\\]\n$`),
    );
    expect((await dki([...base, "--alpha", "0.05"])).stderr).toMatch(/\| memory not injected: α 0\.05 < threshold 0\.1 \| length\]\n$/);
    expect((await dki(["generate", "--model", dir, "--prompt", "x", "-n", "1"])).stderr).not.toMatch(/memory/);
  });

  test("a --context-size the memory cannot hold is one line naming the bytes needed and available (a 1 GB machine, by DKI_HOST_MEMORY_BYTES)", async () => {
    const args = [join(repoRoot, "bin", "dki.js"), "generate", "--model", dir, "--prompt", "x", "--context-size", "4000000"];
    const r = await run(process.execPath, args, { env: { ...process.env, DKI_HOST_MEMORY_BYTES: "1000000000" } }).then(
      () => null,
      (e: { code: number; stderr: string }) => e,
    );
    expect(r?.code).toBe(1);
    // 4M tokens × 2 layers × 2 KV heads × 16 dims × K and V × 4 bytes.
    expect(r?.stderr).toBe(
      "dki: --context-size 4000000: a 4000000-token context's K/V cache needs 2.0 GB (2048000000 bytes) of memory; 1.0 GB (1000000000 bytes) is available\n",
    );
  });

  test("a window beyond the trained positions works and is warned about once; --check-tensors loads a sound model", async () => {
    const { stdout, stderr } = await dki(["generate", "--model", dir, "--prompt", "x", "-n", "2", "--context-size", "100000", "--check-tensors", "--format", "json"]);
    expect(JSON.parse(stdout).tokens).toHaveLength(2);
    expect(stderr).toBe(
      "dki: warning: the context window of 100000 tokens is beyond the 4096 positions the model was trained on (max_position_embeddings): " +
        "positions past them work, but how well the model does there is its own\n",
    );
  });
});

describe("dki logits", () => {
  test("prints every position's logits, equal to the API's", async () => {
    const { stdout } = await dki(["logits", "--model", dir, "--tokens", "1,20,300", "--format", "json"]);
    const { logits } = JSON.parse(stdout) as { logits: number[][] };
    expect(logits).toHaveLength(3);
    const model = await Model.load(dir);
    const api = await model.logits([1, 20, 300]);
    expect(Math.max(...logits.map((row, i) => maxAbsDiff(row, api[i])))).toBeLessThan(1e-6);
    model.dispose();
  });

  test("--memory-tokens with α and scaling options", async () => {
    const args = ["logits", "--model", dir, "--tokens", "1,20,300"];
    const plain = JSON.parse((await dki(args)).stdout).logits as number[][];
    const mem = ["--memory-tokens", "5,6,7,8,9"];
    const value = JSON.parse((await dki([...args, ...mem, "--alpha", "0.5"])).stdout).logits as number[][];
    const logit = JSON.parse((await dki([...args, ...mem, "--alpha", "0.5", "--scaling", "logit", "--positions", "prefix"])).stdout).logits as number[][];
    expect(maxAbsDiff(plain[2], value[2])).toBeGreaterThan(1e-4);
    expect(maxAbsDiff(value[2], logit[2])).toBeGreaterThan(1e-4);
  });
});

describe("dki --version", () => {
  test("prints package.json's version", async () => {
    const { version } = JSON.parse(readFileSync(join(repoRoot, "package.json"), "utf8")) as { version: string };
    expect((await dki(["--version"])).stdout).toBe(`${version}\n`);
  });
});

describe.skipIf(!existsSync("/dev/full"))("a stdout that cannot be written (a full disk)", () => {
  test.each([[["models", "info", "MODEL"]], [["generate", "--model", "MODEL", "--prompt", "hi", "-n", "5"]]])("%j is one line, exit code 1", async (args) => {
    const full = openSync("/dev/full", "w");
    try {
      const r = await dkiSpawn(args.map((a) => (a === "MODEL" ? dir : a)), full).done;
      expect(r.code).toBe(1);
      expect(r.stderr).toBe("dki: cannot write the output: ENOSPC: no space left on device, write\n");
    } finally {
      closeSync(full);
    }
  });
});

describe("errors are one clear line, exit code 1", () => {
  test.each([
    [["generate", "--model", "/nonexistent/model", "--prompt", "x"], /config\.json/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--temperature", "hot"], /--temperature must be a number/],
    [["logits", "--model", "MODEL", "--tokens", "1,x"], /--tokens must be a comma-separated list/],
    // Token lists are strict: decimal integers only, no empty items.
    [["logits", "--model", "MODEL", "--tokens", "0x10"], /--tokens must be a comma-separated list of token ids \(non-negative integers\); "0x10" is not one/],
    [["logits", "--model", "MODEL", "--tokens", "1e3"], /"1e3" is not one/],
    [["logits", "--model", "MODEL", "--tokens", "1,,2"], /--tokens must be .*; item 2 of "1,,2" is empty/],
    [["generate", "--model", "MODEL", "--prompt-tokens", "1,2,", "-n", "1"], /--prompt-tokens must be .*; item 3 of "1,2," is empty/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--memory-tokens", "-1"], /--memory-tokens must be .*; "-1" is not one/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--memory", "y", "--alpha", "0x10"], /--alpha must be a number >= 0, got "0x10"/],
    // Options that would be ignored are refused.
    [["generate", "--model", "MODEL", "--prompt", "x", "--system", "be brief"], /^dki: --system is a chat message; give --chat with it\n$/],
    [["generate", "--model", "MODEL", "--prompt-tokens", "1,2", "--chat"], /^dki: --chat puts --prompt text into the chat template; it cannot be used with --prompt-tokens\n$/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--alpha", "0.5"], /^dki: --alpha sets how the memory is injected; give --memory or --memory-tokens with it\n$/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--alpha", "1"], /^dki: --alpha sets how/],
    [["logits", "--model", "MODEL", "--tokens", "1", "--positions", "prefix"], /^dki: --positions sets how/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--memory", "y", "--memory-tokens", "1"], /at most one of --memory and --memory-tokens/],
    // The engine's ranges, under the option's name.
    [["generate", "--model", "MODEL", "--prompt", "x", "--top-p", "0"], /--top-p must be a number in \(0, 1\], got "0"/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--top-p", "1e-50"], /--top-p must be a number in \(0, 1\], got "1e-50" \(it is 0 as a 32-bit float\)/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--repetition-penalty", "0"], /--repetition-penalty must be a number > 0, got "0"/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--temperature", "1e308"], /--temperature must be a number >= 0, got "1e308" \(too large for a 32-bit float\)/],
    // The CLI's range is written out (for --help without the addon): it must be the engine's.
    [["generate", "--model", "MODEL", "--prompt", "x", "--threads", "5000"], new RegExp(`--threads must be an integer in \\[0, ${native().limits.threads}\\], got "5000"`)],
    [["generate", "--model", "MODEL", "--prompt", "x", "--top-k", "3000000000"], /--top-k must be an integer in \[0, 2147483647\]/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--context-size", "0"], /--context-size must be an integer >= 1, got "0"/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--context-size", "99999999"], /^dki: --context-size must be an integer in \[1, \d+\], got "99999999"\n$/],
    // What the user did wrong, not an errno from a file inside.
    [["generate", "--model", "NOT_A_MODEL", "--prompt", "x"], /^dki: --model must be a model folder or a \.gguf file; .*package\.json is neither\n$/],
    [["logits", "--model", "NOT_A_MODEL", "--tokens", "1"], /^dki: --model must be a model folder or a \.gguf file/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--memory-tokens", "60000"], /^dki: --memory-tokens: token id 60000 is outside the vocabulary \(0\.\.49151\)\n$/],
    [["generate", "--model", "MODEL", "--prompt-tokens", "60000"], /^dki: --prompt-tokens: token id 60000 is outside/],
    [["logits", "--model", "MODEL", "--tokens", "1,99999999"], /^dki: --tokens: token id 99999999 is outside the vocabulary/],
    [["generate", "--model", "MODEL"], /exactly one of --prompt and --prompt-tokens/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--memory", "y", "--alpha", "-1"], /--alpha must be a number/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--device", "tpu"], /--device must be one of cpu, cuda, auto/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--bogus"], /^dki: unknown option '--bogus' \(see --help\)\n$/],
    [["generate", "--model", "MODEL", "--prompt"], /^dki: option '-p, --prompt <text>' argument missing \(see --help\)\n$/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--max-tokens", ""], /--max-tokens must be an integer >= 0, got ""/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--max-tokens", "0x5"], /--max-tokens must be an integer >= 0, got "0x5"/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--stop", "a", ""], /^dki: --stop: an empty stop string would match before any text; give non-empty strings\n$/],
    // A NaN/inf met on the way is an error naming where, not a row of nulls with exit code 0.
    [["logits", "--model", "MODEL", "--tokens", "1,2", "--memory", "y", "--alpha", "3e38"], /^dki: logits: .*segments\[0\] \(1 tokens/],
    ...(native().cuda().devices === 0 ? [[["logits", "--model", "MODEL", "--tokens", "1", "--device", "cuda"], /"cuda" was asked for but no GPU is usable/]] : []),
  ] as [string[], RegExp][])("%j", async (args, message) => {
    const { code, stderr } = await dkiFails(args.map((a) => (a === "MODEL" ? dir : a === "NOT_A_MODEL" ? join(repoRoot, "package.json") : a)));
    expect(code).toBe(1);
    expect(stderr).toMatch(message);
    expect(stderr).not.toMatch(/\n\s+at /); // no stack trace
    expect(stderr.trimEnd().split("\n"), stderr).toHaveLength(1);
    expect(stderr).toMatch(/^dki: /);
  });
});
