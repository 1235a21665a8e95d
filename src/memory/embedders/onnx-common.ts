// What the ONNX text models (OnnxEmbedder, OnnxCrossEncoder) share: opening a Hugging Face model
// folder (`model.onnx` or `onnx/model.onnx`, `tokenizer.json`, optionally `config.json`), loading
// onnxruntime lazily, learning which token inputs the model takes, finding the special tokens the
// tokenizer puts around texts (so truncation can cut the texts and keep them), and running a
// padded batch of token ids.
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { stat } from "node:fs/promises";
import { availableParallelism } from "node:os";
import { join, resolve } from "node:path";
import type { InferenceSession, Tensor } from "onnxruntime-node";
import { DkiArgumentError, FormatError } from "../../errors.js";
import { readJsonObject } from "../../formats/json-file.js";
import { Tokenizer } from "../../tokenizer/tokenizer.js";

export type Ort = typeof import("onnxruntime-node");
export type IdType = "int64" | "int32";

/** Inputs tokenised between event-loop yields. */
const TOKENISE_CHUNK = 32;
/** The tokenizer sees at most this many characters of a text per token it may keep (see capChars). */
const CHARS_PER_TOKEN_CAP = 64;
const TOKEN_INPUTS = new Set(["input_ids", "attention_mask", "token_type_ids"]);

export interface OnnxLoadOptions {
  /** Tokens per input, special tokens included; longer inputs are cut. */
  maxLength?: number;
  /** Inputs per onnxruntime run. Default 32. */
  batchSize?: number;
  /** onnxruntime's intra-op threads. Default min(4, available cores). */
  threads?: number;
}

/** A model folder opened for loading: its files, its tokenizer and its position limit. */
export interface ModelFolder {
  folder: string;
  modelPath: string;
  tokenizerPath: string;
  tokenizer: Tokenizer;
  /** config.json's max_position_embeddings, or null without one. */
  maxPositions: number | null;
}

/** The special tokens the tokenizer's post-processor puts around a text, e.g. [CLS] … [SEP]. */
export interface Template {
  prefix: number[];
  suffix: number[];
}

/** The special tokens around a pair of texts: prefix A middle B suffix, e.g. [CLS] A [SEP] B [SEP]. */
export interface PairTemplate {
  prefix: number[];
  middle: number[];
  suffix: number[];
}

export function checkInt(who: string, name: string, value: number, min: number, max: number): number {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new DkiArgumentError(`${who}: ${name} must be an integer from ${min} to ${max}, got ${value}`);
  }
  return value;
}

/** batchSize and threads with their defaults; maxLength checked for range only (the model decides its default). */
export function checkLoadOptions(who: string, options: OnnxLoadOptions): { batchSize: number; threads: number } {
  const batchSize = checkInt(who, "batchSize", options.batchSize ?? 32, 1, 4096);
  const threads = checkInt(who, "threads", options.threads ?? Math.min(4, availableParallelism()), 1, 1024);
  if (options.maxLength !== undefined) checkInt(who, "maxLength", options.maxLength, 3, 1 << 16);
  return { batchSize, threads };
}

/** Finds the model and loads the tokenizer of a folder, or says which of them is missing. */
export async function openModelFolder(who: string, dir: string): Promise<ModelFolder> {
  const folder = resolve(dir);
  if (!(await isKind(folder, "dir"))) throw new DkiArgumentError(`${who}: ${folder} is not a folder`);
  const modelPath = await findModel(folder);
  const tokenizerPath = join(folder, "tokenizer.json");
  if (!(await isKind(tokenizerPath, "file"))) throw new FormatError(tokenizerPath, "missing: the model folder needs the tokenizer the model was trained with");
  const tokenizer = await Tokenizer.fromFolder(folder);
  const config = await readJsonObject(join(folder, "config.json"), { optional: true });
  const maxPositions = typeof config?.max_position_embeddings === "number" ? config.max_position_embeddings : null;
  return { folder, modelPath, tokenizerPath, tokenizer, maxPositions };
}

/**
 * The tokens per input: the caller's (at most the model's positions), else min(fallback, the
 * model's positions); it must leave room for `minText` text tokens beside the `specials` special tokens.
 */
export function resolveMaxLength(who: string, requested: number | undefined, maxPositions: number | null, fallback: number, specials: number, minText = 1): number {
  if (requested !== undefined && maxPositions !== null && requested > maxPositions) {
    throw new DkiArgumentError(`${who}: maxLength ${requested} is more than the model's ${maxPositions} positions (config.json max_position_embeddings)`);
  }
  const maxLength = requested ?? Math.min(fallback, maxPositions ?? fallback);
  if (maxLength < specials + minText) {
    throw new DkiArgumentError(`${who}: maxLength ${maxLength} leaves no room for text next to the tokenizer's ${specials} special tokens`);
  }
  return maxLength;
}

/** onnxruntime and a CPU session of the model; a file it cannot load is a FormatError naming it. */
export async function createSession(modelPath: string, threads: number): Promise<{ ort: Ort; session: InferenceSession }> {
  // Loaded here rather than at the top: importing dki-engine must not load onnxruntime's native library.
  const ort = await import("onnxruntime-node");
  try {
    const session = await ort.InferenceSession.create(modelPath, { executionProviders: ["cpu"], intraOpNumThreads: threads, interOpNumThreads: 1 });
    return { ort, session };
  } catch (e) {
    throw new FormatError(modelPath, `onnxruntime cannot load it: ${(e as Error).message}`);
  }
}

/**
 * The token inputs the model declares, with their element type; an input a BERT-style text model
 * is not fed (`kind` names the model in the error) or one that is not an integer tensor is refused.
 */
export function planTokenInputs(session: InferenceSession, modelPath: string, kind: string): Map<string, IdType> {
  const inputs = new Map<string, IdType>();
  for (const meta of session.inputMetadata) {
    if (!TOKEN_INPUTS.has(meta.name)) {
      throw new FormatError(modelPath, `input ${JSON.stringify(meta.name)} is not one ${kind} takes (input_ids, attention_mask, token_type_ids)`);
    }
    if (!meta.isTensor || (meta.type !== "int64" && meta.type !== "int32")) {
      throw new FormatError(modelPath, `input ${meta.name} must be an int64 or int32 tensor, not ${meta.isTensor ? meta.type : "a non-tensor"}`);
    }
    inputs.set(meta.name, meta.type);
  }
  if (!inputs.has("input_ids")) throw new FormatError(modelPath, `no input_ids input (it has ${describeNames(session.inputNames)})`);
  return inputs;
}

/** A batch of token rows ready to run: each row's ids and token types, padded to the longest here. */
export interface TokenBatch {
  ids: number[][];
  /** Each row's token types (segment ids); omitted: 0 throughout. */
  types?: number[][];
}

/**
 * Runs one padded batch and returns the output as float32 with its dims. Padding's id is 0 as in
 * BERT's [PAD], and it is masked out of attention, so it never changes a row's result.
 */
export async function runTokenBatch(ort: Ort, session: InferenceSession, modelPath: string, inputs: ReadonlyMap<string, IdType>, batch: TokenBatch, output: string): Promise<{ data: Float32Array; dims: readonly number[] }> {
  const rows = batch.ids.length;
  const seq = Math.max(...batch.ids.map((x) => x.length));
  const ids = new Array<number>(rows * seq).fill(0);
  const mask = new Array<number>(rows * seq).fill(0);
  const types = new Array<number>(rows * seq).fill(0);
  batch.ids.forEach((row, r) => row.forEach((id, t) => {
    ids[r * seq + t] = id;
    mask[r * seq + t] = 1;
    types[r * seq + t] = batch.types?.[r]?.[t] ?? 0;
  }));
  const tensor = (values: number[], type: IdType): Tensor =>
    type === "int64"
      ? new ort.Tensor("int64", BigInt64Array.from(values, (v) => BigInt(v)), [rows, seq])
      : new ort.Tensor("int32", Int32Array.from(values), [rows, seq]);
  const feeds: Record<string, Tensor> = {};
  for (const [name, type] of inputs) feeds[name] = tensor(name === "input_ids" ? ids : name === "attention_mask" ? mask : types, type);
  let result: InferenceSession.ReturnType;
  try {
    result = await session.run(feeds, [output]);
  } catch (e) {
    throw new FormatError(modelPath, `onnxruntime failed to run it on a batch of ${rows}×${seq} tokens: ${(e as Error).message}`);
  }
  const out = result[output];
  if (out.type !== "float32") throw new FormatError(modelPath, `output ${output} is ${out.type}; only float32 outputs are supported`);
  return { data: out.data as Float32Array, dims: out.dims };
}

/** `tokenise` over every input, yielding to the event loop between chunks so a large call does not block it. */
export async function tokeniseAll<I, R>(inputs: readonly I[], tokenise: (input: I) => R): Promise<R[]> {
  const out: R[] = [];
  for (let i = 0; i < inputs.length; i++) {
    if (i > 0 && i % TOKENISE_CHUNK === 0) await yieldToEventLoop();
    out.push(tokenise(inputs[i]));
  }
  return out;
}

/**
 * Runs rows in batches of `batchSize`, longest first, so rows of similar length share a batch and
 * little compute goes into padding; the results come back in the rows' own order.
 */
export async function inLengthOrder<R extends { ids: number[] }, T>(rows: readonly R[], batchSize: number, run: (batch: R[]) => Promise<T[]>): Promise<T[]> {
  const order = rows.map((_, i) => i).sort((a, b) => rows[b].ids.length - rows[a].ids.length);
  const out = new Array<T>(rows.length);
  for (let start = 0; start < order.length; start += batchSize) {
    const batch = order.slice(start, start + batchSize);
    const results = await run(batch.map((i) => rows[i]));
    batch.forEach((rowIndex, j) => (out[rowIndex] = results[j]));
  }
  return out;
}

/** The output names with their declared shapes, for errors: "logits [batch, 2]; pooled". */
export function describeOutputs(session: InferenceSession): string {
  return session.outputMetadata.map((m) => `${m.name}${m.isTensor ? ` [${m.shape.join(", ")}]` : ""}`).join("; ") || "none";
}

export function describeNames(names: readonly string[]): string {
  return names.length ? names.join(", ") : "none";
}

/**
 * The start of a text long enough for `maxLength` tokens: a token spans at least one character,
 * and capping the characters keeps one huge text from stalling the event loop in the tokenizer
 * for tokens that would be cut anyway.
 */
export function capChars(text: string, maxLength: number): string {
  return text.length > maxLength * CHARS_PER_TOKEN_CAP ? text.slice(0, maxLength * CHARS_PER_TOKEN_CAP) : text;
}

export function yieldToEventLoop(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

export async function sha256File(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return hash.digest("hex");
}

async function isKind(path: string, kind: "file" | "dir"): Promise<boolean> {
  try {
    const s = await stat(path);
    return kind === "file" ? s.isFile() : s.isDirectory();
  } catch {
    return false;
  }
}

async function findModel(folder: string): Promise<string> {
  const candidates = [join(folder, "model.onnx"), join(folder, "onnx", "model.onnx")];
  for (const c of candidates) if (await isKind(c, "file")) return c;
  throw new FormatError(folder, "no ONNX model: looked for model.onnx and onnx/model.onnx");
}

/** Where `part` first occurs in `whole` at or after `from`, or -1. */
function indexOfRun(whole: readonly number[], part: readonly number[], from: number): number {
  for (let at = from; at + part.length <= whole.length; at++) {
    if (part.every((id, i) => whole[at + i] === id)) return at;
  }
  return -1;
}

const PROBE_A = "hello";
const PROBE_B = "world";

/**
 * Finds the special tokens the tokenizer adds around a text by encoding a probe with and without
 * them, so truncation can cut the text and keep them (BERT: [CLS] … [SEP]; RoBERTa: <s> … </s>).
 */
export function specialTokenTemplate(tokenizer: Tokenizer, tokenizerPath: string): Template {
  const bare = tokenizer.encode(PROBE_A, { addSpecialTokens: false });
  const full = tokenizer.encode(PROBE_A, { addSpecialTokens: true });
  const at = indexOfRun(full, bare, 0);
  if (at < 0) throw new FormatError(tokenizerPath, "its post-processor changes a text's own tokens, not only adding special tokens around them; cannot truncate it safely");
  return { prefix: full.slice(0, at), suffix: full.slice(at + bare.length) };
}

/**
 * The special tokens around a pair of texts, found the same way from a probe pair: the
 * post-processor's pair template (BERT: [CLS] A [SEP] B [SEP]; RoBERTa: <s> A </s></s> B </s>).
 * A tokenizer without one (its pair encoding fails, or puts nothing between the two texts) gets
 * the single-text template twice: prefix A suffix B suffix, so the texts are still separated.
 */
export function pairTemplate(tokenizer: Tokenizer, tokenizerPath: string): PairTemplate {
  const single = specialTokenTemplate(tokenizer, tokenizerPath);
  const fallback = { prefix: single.prefix, middle: single.suffix, suffix: single.suffix };
  const a = tokenizer.encode(PROBE_A, { addSpecialTokens: false });
  const b = tokenizer.encode(PROBE_B, { addSpecialTokens: false });
  let full: number[];
  try {
    full = tokenizer.encodePair(PROBE_A, PROBE_B).ids;
  } catch {
    return fallback; // no pair template to encode with
  }
  const atA = indexOfRun(full, a, 0);
  const atB = atA < 0 ? -1 : indexOfRun(full, b, atA + a.length);
  if (atB < 0) throw new FormatError(tokenizerPath, "its post-processor changes a pair's own tokens, not only adding special tokens around them; cannot truncate it safely");
  const middle = full.slice(atA + a.length, atB);
  if (middle.length === 0) return fallback;
  return { prefix: full.slice(0, atA), middle, suffix: full.slice(atB + b.length) };
}
