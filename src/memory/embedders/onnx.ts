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
import { basename } from "node:path";
import type { InferenceSession } from "onnxruntime-node";
import { DkiArgumentError, FormatError } from "../../errors.js";
import type { Tokenizer } from "../../tokenizer/tokenizer.js";
import type { Embedder } from "../types.js";
import { checkTexts, unitVector } from "./common.js";
import {
  capChars,
  checkLoadOptions,
  createSession,
  describeOutputs,
  openModelFolder,
  planTokenInputs,
  resolveMaxLength,
  runTokenBatch,
  sha256File,
  specialTokenTemplate,
  inLengthOrder,
  tokeniseAll,
  type IdType,
  type OnnxLoadOptions,
  type Ort,
  type Template,
} from "./onnx-common.js";

export interface OnnxEmbedderOptions extends OnnxLoadOptions {
  /** Tokens per text, special tokens included; longer texts are cut. Default min(256, the model's max positions). */
  maxLength?: number;
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

const DEFAULT_MAX_LENGTH = 256;
const WHO = "OnnxEmbedder.load";

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
    private readonly ort: Ort,
  ) {
    this.id = id;
    this.dim = dim;
  }

  static async load(dir: string, options: OnnxEmbedderOptions = {}): Promise<OnnxEmbedder> {
    const { batchSize, threads } = checkLoadOptions(WHO, options);
    const tau = options.relevanceThreshold;
    if (tau !== undefined && (typeof tau !== "number" || !(tau >= 0 && tau <= 1))) {
      throw new DkiArgumentError(`${WHO}: relevanceThreshold must be a number in [0, 1], got ${String(tau)}`);
    }

    const { folder, modelPath, tokenizerPath, tokenizer, maxPositions } = await openModelFolder(WHO, dir);
    const template = specialTokenTemplate(tokenizer, tokenizerPath);
    const maxLength = resolveMaxLength(WHO, options.maxLength, maxPositions, DEFAULT_MAX_LENGTH, template.prefix.length + template.suffix.length);

    const { ort, session } = await createSession(modelPath, threads);
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
    const rows = await tokeniseAll(texts, (text) => ({ ids: this.tokenise(text) }));
    return inLengthOrder(rows, this.batchSize, (batch) => this.runBatch(batch.map((r) => r.ids)));
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
    const content = this.tokenizer.encode(capChars(text, this.maxLength), { addSpecialTokens: false });
    const room = this.maxLength - this.template.prefix.length - this.template.suffix.length;
    return [...this.template.prefix, ...content.slice(0, room), ...this.template.suffix];
  }

  /** One onnxruntime run over texts' token ids (padded here), pooled and normalised. */
  private async runBatch(batchIds: number[][]): Promise<Float32Array[]> {
    const { plan } = this;
    const rows = batchIds.length;
    const seq = Math.max(...batchIds.map((x) => x.length));
    // Single texts are segment 0 throughout (no types given).
    const { data, dims } = await runTokenBatch(this.ort, this.session, plan.modelPath, plan.inputs, { ids: batchIds }, plan.output);

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

/** Which inputs to feed and which output to read, from the session's metadata. */
function planModel(session: InferenceSession, modelPath: string): ModelPlan {
  const inputs = planTokenInputs(session, modelPath, "a BERT-style embedding model");

  const outputs = new Map(session.outputMetadata.map((m) => [m.name, m]));
  const rank = (name: string) => {
    const m = outputs.get(name);
    return m?.isTensor && m.shape.length > 0 ? m.shape.length : null; // null: not declared
  };
  if (outputs.has("sentence_embedding") && (rank("sentence_embedding") ?? 2) === 2) return { modelPath, inputs, output: "sentence_embedding", pooling: "model" };
  if (outputs.has("last_hidden_state") && (rank("last_hidden_state") ?? 3) === 3) return { modelPath, inputs, output: "last_hidden_state", pooling: "mean" };
  const rank3 = session.outputNames.filter((n) => rank(n) === 3);
  if (rank3.length === 1) return { modelPath, inputs, output: rank3[0], pooling: "mean" };
  throw new FormatError(modelPath, `no token embeddings to pool: expected an output last_hidden_state [batch, sequence, hidden] or sentence_embedding [batch, dim], found ${describeOutputs(session)}`);
}

function shapeError(plan: ModelPlan, dims: readonly number[], expected: string): FormatError {
  return new FormatError(plan.modelPath, `output ${plan.output} has shape [${dims.join(", ")}], expected ${expected}`);
}

