// The `dki` command line, run as a user runs it (node bin/dki.js, built by `npm test`'s tsc step).
import { execFile } from "node:child_process";
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

  test("--memory injects a memory block", async () => {
    const base = ["generate", "--model", dir, "--prompt", "What do I like?", "--max-tokens", "12", "--format", "json"];
    const plain = JSON.parse((await dki(base)).stdout);
    const withMem = JSON.parse((await dki([...base, "--memory", "I love hiking in the mountains every weekend.", "--alpha", "1"])).stdout);
    expect(withMem.stats.segment_tokens).toBeGreaterThan(5);
    expect(withMem.stats.prompt_tokens).toBe(plain.stats.prompt_tokens);
    const cut = JSON.parse((await dki([...base, "--memory", "I love hiking.", "--alpha", "0.05"])).stdout);
    expect(cut.tokens).toEqual(plain.tokens);
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

describe("errors are one clear line, exit code 1", () => {
  test.each([
    [["generate", "--model", "/nonexistent/model", "--prompt", "x"], /config\.json/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--temperature", "hot"], /--temperature must be a number/],
    [["logits", "--model", "MODEL", "--tokens", "1,x"], /--tokens must be a comma-separated list/],
    [["logits", "--model", "MODEL", "--tokens", "1,99999999"], /outside the vocabulary/],
    [["generate", "--model", "MODEL"], /exactly one of --prompt and --prompt-tokens/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--memory", "y", "--alpha", "-1"], /--alpha must be a number/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--device", "tpu"], /--device must be one of cpu, cuda, auto/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--bogus"], /^dki: unknown option '--bogus' \(see --help\)\n$/],
    [["generate", "--model", "MODEL", "--prompt"], /^dki: option '-p, --prompt <text>' argument missing \(see --help\)\n$/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--max-tokens", ""], /--max-tokens must be an integer >= 0, got ""/],
    [["generate", "--model", "MODEL", "--prompt", "x", "--max-tokens", "0x5"], /--max-tokens must be an integer >= 0, got "0x5"/],
    ...(native().cuda().devices === 0 ? [[["logits", "--model", "MODEL", "--tokens", "1", "--device", "cuda"], /"cuda" was asked for but no GPU is usable/]] : []),
  ] as [string[], RegExp][])("%j", async (args, message) => {
    const { code, stderr } = await dkiFails(args.map((a) => (a === "MODEL" ? dir : a)));
    expect(code).toBe(1);
    expect(stderr).toMatch(message);
    expect(stderr).not.toMatch(/\n\s+at /); // no stack trace
    expect(stderr.trimEnd().split("\n"), stderr).toHaveLength(1);
    expect(stderr).toMatch(/^dki: /);
  });
});
