// Parsers for CLI option values: each rejects bad input with a message naming the option.
import { randomBytes } from "node:crypto";
import { InvalidArgumentError } from "commander";
import { OnnxEmbedder } from "../memory/embedders/onnx.js";
import { HashingEmbedder } from "../memory/embedders/hashing.js";
import { HttpEmbedder, firstWorkingEmbedder, type EmbedderCandidate } from "../memory/embedders/http.js";
import type { Embedder } from "../memory/types.js";
import { OnnxCrossEncoder } from "../memory/embedders/onnx-cross-encoder.js";
import { MAX_RERANK_DEPTH, type MemoryRerank } from "../dki/routing.js";

// Digits only: Number() would take "" as 0, "0x5" as 5 and "1e3" as 1000.
const INTEGER = /^\s*-?\d+\s*$/;
// Plain decimal notation, exponent allowed; Number() would also take "0x10", "0b1" and "Infinity".
const DECIMAL = /^\s*[+-]?(\d+(\.\d*)?|\.\d+)(e[+-]?\d+)?\s*$/i;

/** An integer in [min, max]; the message says only ">= min" when max is the default. */
export function intOption(name: string, min = 0, max = Number.MAX_SAFE_INTEGER) {
  const range = max === Number.MAX_SAFE_INTEGER ? `>= ${min}` : `in [${min}, ${max}]`;
  return (v: string): number => {
    const n = Number(v);
    if (!INTEGER.test(v) || !Number.isSafeInteger(n) || n < min || n > max) throw new InvalidArgumentError(`${name} must be an integer ${range}, got "${v}"`);
    return n;
  };
}

/** Bounds of a number option: `min` is inclusive, `above` exclusive, `max` inclusive. */
export interface NumberRange {
  min?: number;
  above?: number;
  max?: number;
}

function describeRange(r: NumberRange): string {
  const low = r.above !== undefined ? `(${r.above}` : r.min !== undefined ? `[${r.min}` : null;
  if (r.max !== undefined) return `in ${low ?? "(-∞"}, ${r.max}]`;
  if (r.above !== undefined) return `> ${r.above}`;
  return r.min !== undefined ? `>= ${r.min}` : "";
}

/**
 * A finite decimal number in the range. The engine takes these values as 32-bit floats, so the
 * value rounded to float32 must be in the range too: 1e308 would become infinity, a top-p of
 * 1e-50 would become 0, and the engine would reject them under its own names.
 */
export function numberOption(name: string, range: NumberRange = {}) {
  const inRange = (x: number) =>
    Number.isFinite(x) && (range.min === undefined || x >= range.min) && (range.above === undefined || x > range.above) && (range.max === undefined || x <= range.max);
  const expected = `${name} must be a number ${describeRange(range)}`.trimEnd();
  return (v: string): number => {
    const n = Number(v);
    if (!DECIMAL.test(v) || !inRange(n)) throw new InvalidArgumentError(`${expected}, got "${v}"`);
    const f = Math.fround(n);
    if (!inRange(f)) {
      const why = Number.isFinite(f) ? `it is ${f} as a 32-bit float` : "too large for a 32-bit float";
      throw new InvalidArgumentError(`${expected}, got "${v}" (${why})`);
    }
    return n;
  };
}

/** Comma-separated token ids: each item a non-negative decimal integer, none empty. */
export function tokenListOption(name: string) {
  const expected = `${name} must be a comma-separated list of token ids (non-negative integers)`;
  return (v: string): number[] => {
    const items = v.split(",").map((s) => s.trim());
    return items.map((s, i) => {
      if (s === "") throw new InvalidArgumentError(`${expected}; item ${i + 1} of "${v}" is empty`);
      const n = Number(s);
      if (!/^\d+$/.test(s) || !Number.isSafeInteger(n)) throw new InvalidArgumentError(`${expected}; "${s}" is not one`);
      return n;
    });
  };
}

export function choiceOption<T extends string>(name: string, choices: readonly T[]) {
  return (v: string): T => {
    if (!(choices as readonly string[]).includes(v)) throw new InvalidArgumentError(`${name} must be one of ${choices.join(", ")}, got "${v}"`);
    return v as T;
  };
}

/** A JSON value from an option, or an error naming the option. */
export function jsonOption(name: string, text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch (e) {
    throw new Error(`${name} is not valid JSON: ${(e as Error).message}`);
  }
}

/** A JSON object from an option, or an error naming the option. */
export function jsonObjectOption(name: string, text: string): Record<string, unknown> {
  const v = jsonOption(name, text);
  if (v === null || typeof v !== "object" || Array.isArray(v)) throw new Error(`${name} must be a JSON object`);
  return v as Record<string, unknown>;
}

/** Help for --embedder, shared by every command that opens a memory store or knowledge base. */
export const EMBEDDER_HELP =
  "the embedder the data was embedded with: an ONNX sentence-embedding model folder, http(s)://HOST/v1#MODEL (an OpenAI-compatible /embeddings API; key from DKI_EMBEDDER_API_KEY) or hashing; a comma-separated list takes the first that works (default: the offline hashing embedder)";

/** One --embedder item as a candidate: "hashing", an http(s) URL with #model, else an ONNX folder. */
function embedderCandidate(spec: string): EmbedderCandidate {
  if (spec === "hashing") return { name: spec, open: async () => new HashingEmbedder() };
  if (/^https?:\/\//i.test(spec)) {
    const hash = spec.lastIndexOf("#");
    if (hash < 0 || hash === spec.length - 1) throw new Error(`--embedder ${spec}: name the model after a #, e.g. http://127.0.0.1:11434/v1#nomic-embed-text`);
    return { name: spec, open: () => HttpEmbedder.connect({ url: spec.slice(0, hash), model: spec.slice(hash + 1), apiKey: process.env.DKI_EMBEDDER_API_KEY }) };
  }
  return { name: spec, open: () => OnnxEmbedder.load(spec) };
}

/**
 * --embedder's embedder, opened; undefined (the default embedder) when the option is absent. A
 * list is resolved once, here: the first that works, said on stderr with why the others were not.
 */
export async function embedderOption(spec: string | undefined): Promise<Embedder | undefined> {
  if (spec === undefined) return undefined;
  const items = spec.split(",").map((s) => s.trim()).filter((s) => s !== "");
  if (items.length === 0) throw new Error("--embedder is empty");
  if (items.length === 1) return embedderCandidate(items[0]).open();
  const r = await firstWorkingEmbedder(items.map(embedderCandidate));
  if (r.skipped.length > 0) process.stderr.write(`dki: embedder ${r.name} (${r.embedder.id}); skipped ${r.skipped.map((s) => `${s.name}: ${s.reason}`).join("; ")}\n`);
  return r.embedder;
}

/** The routing reranker's flags (dki chat, mcp, serve, eval memory): the turns' memories picked from a deeper search. */
export const rerankModelOption = ["--rerank-model <dir>", "a cross-encoder ONNX folder (e.g. models/memory-qa-reranker) that picks the turn's memories from a deeper search"] as const;
/** `limit`: what the command calls the memories a turn keeps ("max memories", "top-k"). */
export const rerankDepthOption = (limit: string) =>
  ["--rerank-depth <n>", `with --rerank-model: memory candidates searched and reranked (default max(20, 4 × ${limit}), at most ${MAX_RERANK_DEPTH})`, intOption("--rerank-depth", 1, MAX_RERANK_DEPTH)] as const;

/** --rerank-model and --rerank-depth: the routing reranker (loaded now, so a bad folder is a usage error; the caller closes it), or undefined. */
export async function memoryRerankOption(model: string | undefined, depth: number | undefined): Promise<MemoryRerank | undefined> {
  if (depth !== undefined && model === undefined) throw new Error("--rerank-depth needs --rerank-model");
  return model === undefined ? undefined : { reranker: await OnnxCrossEncoder.load(model), depth };
}

/** `fn` with the routing reranker of --rerank-model/--rerank-depth (or none), closed however `fn` ends. */
export async function withMemoryRerank<T>(model: string | undefined, depth: number | undefined, fn: (memoryRerank: MemoryRerank | undefined) => Promise<T>): Promise<T> {
  const memoryRerank = await memoryRerankOption(model, depth);
  try {
    return await fn(memoryRerank);
  } finally {
    await memoryRerank?.reranker.close();
  }
}

// The engine's thread pool takes 0 (the default) to native().limits.threads (1024); written out here
// so that --help works without the addon, and a test holds the two equal.
export const threadsOption = ["--threads <n>", "worker threads, 0 to 1024 (default and 0: the CPUs this process may use, see models info)", intOption("--threads", 0, 1024)] as const;

export const deviceOption = ["--device <device>", "cpu, cuda (needs npm run build:cuda and a GPU) or auto", choiceOption("--device", ["cpu", "cuda", "auto"] as const), "cpu"] as const;

/**
 * A session id for a turn given no --session: new for every run, so one-shot turns never read
 * each other's history, and prefixed by the command (chat-…, rag-…, mcp-…), so DKI and RAG turns never
 * share a session unless the user names one for both.
 */
export function newSessionId(command: "chat" | "rag" | "mcp"): string {
  const stamp = new Date().toISOString().replace(/[-:]/g, "").replace(/\.\d+Z$/, "Z");
  return `${command}-${stamp}-${randomBytes(3).toString("hex")}`;
}

/** One line of a memory's text, cut to `max` characters with an ellipsis: for summaries. */
export function snippet(text: string, max = 40): string {
  const line = text.replace(/\s+/g, " ").trim();
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}
