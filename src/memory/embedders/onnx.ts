// Sentence embeddings from a BERT-style ONNX model (the layout of sentence-transformers exports
// such as all-MiniLM-L6-v2: `model.onnx` or `onnx/model.onnx`, `tokenizer.json`, optionally
// `config.json`), run by onnxruntime on the CPU.
//
// Per batch: tokenise with the model's own tokenizer (special tokens included, truncated to
// maxLength), pad to the batch's longest text, run, then mean-pool the last hidden state over
// the real tokens (attention mask 1) and L2-normalise — what sentence-transformers does for
// these models. A model that outputs `sentence_embedding` itself is used as it is (normalised).
// Padding never changes a text's vector: padded keys are masked out of attention and out of the
// mean, so a text embeds the same alone as in any batch.
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { stat } from "node:fs/promises";
import { availableParallelism } from "node:os";
import { basename, join, resolve } from "node:path";
import type { InferenceSession, Tensor } from "onnxruntime-node";
import { DkiArgumentError, FormatError } from "../../errors.js";
import { readJsonObject } from "../../formats/json-file.js";
import { Tokenizer } from "../../tokenizer/tokenizer.js";
import type { Embedder } from "../types.js";
import { checkTexts, unitVector } from "./common.js";

export interface OnnxEmbedderOptions {
  /** Tokens per text, special tokens included; longer texts are cut. Default min(256, the model's max positions). */
  maxLength?: number;
  /** Texts per onnxruntime run. Default 32. */
  batchSize?: number;
  /** onnxruntime's intra-op threads. Default min(4, available cores). */
  threads?: number;
  /**
   * DKI gating's τ for this model's vectors (Embedder.relevanceThreshold), in [0, 1]. A sentence
   * model scores relevant memories much higher than the hashing embedder does, so its τ differs,
   * but it is not known here: no model ships with this package, so none could be calibrated.
   * Measure it with calibrateRelevance (or `node bench/calibrate-relevance.js --onnx DIR`) on
   * labelled queries like the user's and pass it; left out, gating uses its fallback default.
   */
  relevanceThreshold?: number;
}

/** How the model's output becomes one vector per text. */
type Pooling = "mean" | "model";

type IdType = "int64" | "int32";

const DEFAULT_MAX_LENGTH = 256;
const DEFAULT_BATCH_SIZE = 32;
/** The tokenizer sees at most this many characters of a text per token it may keep (see tokenise). */
const CHARS_PER_TOKEN_CAP = 64;
/** Texts tokenised between event-loop yields. */
const TOKENISE_CHUNK = 32;
const TOKEN_INPUTS = new Set(["input_ids", "attention_mask", "token_type_ids"]);

/** The special tokens the tokenizer's post-processor puts around a text, e.g. [CLS] … [SEP]. */
interface Template {
  prefix: number[];
  suffix: number[];
}

interface ModelPlan {
  modelPath: string;
  /** Token inputs the model declares, with their element type; others are refused at load. */
  inputs: Map<string, IdType>;
  output: string;
  pooling: Pooling;
}

/** Sentence-embedding model run by onnxruntime; `load` it from a model folder. */
export class OnnxEmbedder implements Embedder {
  readonly id: string;
  readonly dim: number;
  private closed = false;

  private constructor(
    id: string,
    dim: number,
    /** The caller's calibrated τ (OnnxEmbedderOptions.relevanceThreshold); undefined by default. */
    readonly relevanceThreshold: number | undefined,
    /** Tokens per text, special tokens included. */
    readonly maxLength: number,
    readonly batchSize: number,
    private readonly session: InferenceSession,
    private readonly tokenizer: Tokenizer,
    private readonly template: Template,
    private readonly plan: ModelPlan,
    private readonly ort: typeof import("onnxruntime-node"),
  ) {
    this.id = id;
    this.dim = dim;
  }

  static async load(dir: string, options: OnnxEmbedderOptions = {}): Promise<OnnxEmbedder> {
    const batchSize = checkInt("batchSize", options.batchSize ?? DEFAULT_BATCH_SIZE, 1, 4096);
    const threads = checkInt("threads", options.threads ?? Math.min(4, availableParallelism()), 1, 1024);
    if (options.maxLength !== undefined) checkInt("maxLength", options.maxLength, 3, 1 << 16);
    const tau = options.relevanceThreshold;
    if (tau !== undefined && (typeof tau !== "number" || !(tau >= 0 && tau <= 1))) {
      throw new DkiArgumentError(`OnnxEmbedder.load: relevanceThreshold must be a number in [0, 1], got ${String(tau)}`);
    }

    const folder = resolve(dir);
    if (!(await isKind(folder, "dir"))) throw new DkiArgumentError(`OnnxEmbedder.load: ${folder} is not a folder`);
    const modelPath = await findModel(folder);
    const tokenizerPath = join(folder, "tokenizer.json");
    if (!(await isKind(tokenizerPath, "file"))) throw new FormatError(tokenizerPath, "missing: the model folder needs the tokenizer the model was trained with");
    const tokenizer = await Tokenizer.fromFolder(folder);
    const template = specialTokenTemplate(tokenizer, tokenizerPath);

    const config = await readJsonObject(join(folder, "config.json"), { optional: true });
    const maxPositions = typeof config?.max_position_embeddings === "number" ? config.max_position_embeddings : null;
    if (options.maxLength !== undefined && maxPositions !== null && options.maxLength > maxPositions) {
      throw new DkiArgumentError(`OnnxEmbedder.load: maxLength ${options.maxLength} is more than the model's ${maxPositions} positions (config.json max_position_embeddings)`);
    }
    const maxLength = options.maxLength ?? Math.min(DEFAULT_MAX_LENGTH, maxPositions ?? DEFAULT_MAX_LENGTH);
    if (maxLength <= template.prefix.length + template.suffix.length) {
      throw new DkiArgumentError(`OnnxEmbedder.load: maxLength ${maxLength} leaves no room for text next to the tokenizer's ${template.prefix.length + template.suffix.length} special tokens`);
    }

    // Loaded here rather than at the top: importing dki-engine must not load onnxruntime's native library.
    const ort = await import("onnxruntime-node");
    let session: InferenceSession;
    try {
      session = await ort.InferenceSession.create(modelPath, { executionProviders: ["cpu"], intraOpNumThreads: threads, interOpNumThreads: 1 });
    } catch (e) {
      throw new FormatError(modelPath, `onnxruntime cannot load it: ${(e as Error).message}`);
    }
    try {
      const plan = planModel(session, modelPath);
      const hash = await sha256File(modelPath);
      const id = `onnx:${basename(folder)}:${hash.slice(0, 12)}:${plan.pooling}`;
      // A probe run finds the dimension (symbolic in most exports) and proves the model runs.
      const embedder = new OnnxEmbedder(id, 0, tau, maxLength, batchSize, session, tokenizer, template, plan, ort);
      const [probe] = await embedder.runBatch([[...template.prefix, ...tokenizer.encode("probe", { addSpecialTokens: false }), ...template.suffix]]);
      return new OnnxEmbedder(id, probe.length, tau, maxLength, batchSize, session, tokenizer, template, plan, ort);
    } catch (e) {
      await session.release();
      throw e;
    }
  }

  async embed(texts: string[]): Promise<Float32Array[]> {
    if (this.closed) throw new DkiArgumentError(`OnnxEmbedder.embed: ${this.id} is closed`);
    checkTexts("OnnxEmbedder", texts);
    const ids: number[][] = [];
    for (let i = 0; i < texts.length; i++) {
      if (i > 0 && i % TOKENISE_CHUNK === 0) await yieldToEventLoop();
      ids.push(this.tokenise(texts[i]));
    }
    // Texts of similar length share a batch, so little compute goes into padding.
    const order = ids.map((_, i) => i).sort((a, b) => ids[b].length - ids[a].length);
    const out = new Array<Float32Array>(texts.length);
    for (let start = 0; start < order.length; start += this.batchSize) {
      const batch = order.slice(start, start + this.batchSize);
      const vectors = await this.runBatch(batch.map((i) => ids[i]));
      batch.forEach((textIndex, j) => (out[textIndex] = vectors[j]));
    }
    return out;
  }

  /** Frees onnxruntime's session; the embedder cannot be used afterwards. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.session.release();
  }

  /**
   * Token ids of one text with the special tokens, truncated the way Hugging Face truncates a
   * single sequence: the text's own tokens are cut, the special tokens around them stay.
   */
  private tokenise(text: string): number[] {
    // A token spans at least one character; capping the characters keeps one huge text from
    // stalling the event loop in the tokenizer for tokens that would be cut anyway.
    const capped = text.length > this.maxLength * CHARS_PER_TOKEN_CAP ? text.slice(0, this.maxLength * CHARS_PER_TOKEN_CAP) : text;
    const content = this.tokenizer.encode(capped, { addSpecialTokens: false });
    const room = this.maxLength - this.template.prefix.length - this.template.suffix.length;
    return [...this.template.prefix, ...content.slice(0, room), ...this.template.suffix];
  }

  /** One onnxruntime run over texts' token ids (padded here), pooled and normalised. */
  private async runBatch(batchIds: number[][]): Promise<Float32Array[]> {
    const { ort, plan } = this;
    const rows = batchIds.length;
    const seq = Math.max(...batchIds.map((x) => x.length));
    const ids = new Array<number>(rows * seq).fill(0);
    const mask = new Array<number>(rows * seq).fill(0);
    batchIds.forEach((row, r) => row.forEach((id, t) => {
      ids[r * seq + t] = id;
      mask[r * seq + t] = 1;
    }));
    const tensor = (values: number[], type: IdType): Tensor =>
      type === "int64"
        ? new ort.Tensor("int64", BigInt64Array.from(values, (v) => BigInt(v)), [rows, seq])
        : new ort.Tensor("int32", Int32Array.from(values), [rows, seq]);
    const feeds: Record<string, Tensor> = {};
    for (const [name, type] of plan.inputs) {
      // Single texts are segment 0 throughout; padding's id is 0 as in BERT's [PAD] (it is masked anyway).
      feeds[name] = tensor(name === "input_ids" ? ids : name === "attention_mask" ? mask : new Array<number>(rows * seq).fill(0), type);
    }
    let result: InferenceSession.ReturnType;
    try {
      result = await this.session.run(feeds, [plan.output]);
    } catch (e) {
      throw new FormatError(plan.modelPath, `onnxruntime failed to run it on a batch of ${rows}×${seq} tokens: ${(e as Error).message}`);
    }
    const output = result[plan.output];
    if (output.type !== "float32") throw new FormatError(plan.modelPath, `output ${plan.output} is ${output.type}; only float32 outputs are supported`);
    const data = output.data as Float32Array;
    const dims = output.dims;

    const vectors: Float32Array[] = [];
    if (plan.pooling === "model") {
      if (dims.length !== 2 || dims[0] !== rows) throw shapeError(plan, dims, `[${rows}, dim]`);
      const dim = dims[1];
      for (let r = 0; r < rows; r++) vectors.push(unitVector(Float64Array.from(data.subarray(r * dim, (r + 1) * dim))));
      return vectors;
    }
    if (dims.length !== 3 || dims[0] !== rows || dims[1] !== seq) throw shapeError(plan, dims, `[${rows}, ${seq}, hidden]`);
    const dim = dims[2];
    for (let r = 0; r < rows; r++) {
      const sum = new Float64Array(dim);
      const n = batchIds[r].length; // the real tokens are the first n of the row
      for (let t = 0; t < n; t++) {
        const at = (r * seq + t) * dim;
        for (let d = 0; d < dim; d++) sum[d] += data[at + d];
      }
      for (let d = 0; d < dim; d++) sum[d] /= n;
      vectors.push(unitVector(sum));
    }
    return vectors;
  }
}

function checkInt(name: string, value: number, min: number, max: number): number {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new DkiArgumentError(`OnnxEmbedder.load: ${name} must be an integer from ${min} to ${max}, got ${value}`);
  }
  return value;
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

async function sha256File(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return hash.digest("hex");
}

function yieldToEventLoop(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/**
 * Finds the special tokens the tokenizer adds around a text by encoding a probe with and without
 * them, so truncation can cut the text and keep them (BERT: [CLS] … [SEP]; RoBERTa: <s> … </s>).
 */
function specialTokenTemplate(tokenizer: Tokenizer, tokenizerPath: string): Template {
  const probe = "hello";
  const bare = tokenizer.encode(probe, { addSpecialTokens: false });
  const full = tokenizer.encode(probe, { addSpecialTokens: true });
  for (let at = 0; at + bare.length <= full.length; at++) {
    if (bare.every((id, i) => full[at + i] === id)) return { prefix: full.slice(0, at), suffix: full.slice(at + bare.length) };
  }
  throw new FormatError(tokenizerPath, "its post-processor changes a text's own tokens, not only adding special tokens around them; cannot truncate it safely");
}

/** Which inputs to feed and which output to read, from the session's metadata. */
function planModel(session: InferenceSession, modelPath: string): ModelPlan {
  const inputs = new Map<string, IdType>();
  for (const meta of session.inputMetadata) {
    if (!TOKEN_INPUTS.has(meta.name)) {
      throw new FormatError(modelPath, `input ${JSON.stringify(meta.name)} is not one a BERT-style embedding model takes (input_ids, attention_mask, token_type_ids)`);
    }
    if (!meta.isTensor || (meta.type !== "int64" && meta.type !== "int32")) {
      throw new FormatError(modelPath, `input ${meta.name} must be an int64 or int32 tensor, not ${meta.isTensor ? meta.type : "a non-tensor"}`);
    }
    inputs.set(meta.name, meta.type);
  }
  if (!inputs.has("input_ids")) throw new FormatError(modelPath, `no input_ids input (it has ${describe(session.inputNames)})`);

  const outputs = new Map(session.outputMetadata.map((m) => [m.name, m]));
  const rank = (name: string) => {
    const m = outputs.get(name);
    return m?.isTensor && m.shape.length > 0 ? m.shape.length : null; // null: not declared
  };
  if (outputs.has("sentence_embedding") && (rank("sentence_embedding") ?? 2) === 2) return { modelPath, inputs, output: "sentence_embedding", pooling: "model" };
  if (outputs.has("last_hidden_state") && (rank("last_hidden_state") ?? 3) === 3) return { modelPath, inputs, output: "last_hidden_state", pooling: "mean" };
  const rank3 = session.outputNames.filter((n) => rank(n) === 3);
  if (rank3.length === 1) return { modelPath, inputs, output: rank3[0], pooling: "mean" };
  const shapes = session.outputMetadata.map((m) => `${m.name}${m.isTensor ? ` [${m.shape.join(", ")}]` : ""}`);
  throw new FormatError(modelPath, `no token embeddings to pool: expected an output last_hidden_state [batch, sequence, hidden] or sentence_embedding [batch, dim], found ${shapes.join("; ") || "none"}`);
}

function describe(names: readonly string[]): string {
  return names.length ? names.join(", ") : "none";
}

function shapeError(plan: ModelPlan, dims: readonly number[], expected: string): FormatError {
  return new FormatError(plan.modelPath, `output ${plan.output} has shape [${dims.join(", ")}], expected ${expected}`);
}

