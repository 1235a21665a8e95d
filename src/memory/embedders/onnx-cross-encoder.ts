// Relevance of passages to a query from a BERT-style cross-encoder ONNX model (the layout of
// Hugging Face / sentence-transformers cross-encoder exports such as
// cross-encoder/ms-marco-MiniLM-L-6-v2: `model.onnx` or `onnx/model.onnx`, `tokenizer.json`,
// optionally `config.json`), run by onnxruntime on the CPU.
//
// A cross-encoder reads the query and the passage as one input, so every query token attends to
// every passage token: a finer judge than the cosine of two vectors embedded apart, at the cost
// of one model run per pair. Per pair: the tokenizer's pair template around the two texts
// ([CLS] query [SEP] passage [SEP] for BERT; token type 0 up to the middle, 1 after), cut to
// maxLength the way Hugging Face cuts a pair ("longest first"). The model's `logits` become a
// score in [0, 1]: the sigmoid of a single logit, or the softmax probability of class 1 of two.
// Padding never changes a pair's score: padded keys are masked out of attention and the score is
// read from the first token, so a pair scores the same alone as in any batch.
import { basename } from "node:path";
import type { InferenceSession } from "onnxruntime-node";
import { DkiArgumentError, FormatError } from "../../errors.js";
import type { Tokenizer } from "../../tokenizer/tokenizer.js";
import type { Reranker } from "../types.js";
import {
  capChars,
  checkLoadOptions,
  createSession,
  describeOutputs,
  inLengthOrder,
  openModelFolder,
  pairTemplate,
  planTokenInputs,
  resolveMaxLength,
  runTokenBatch,
  sha256File,
  tokeniseAll,
  type IdType,
  type OnnxLoadOptions,
  type Ort,
  type PairTemplate,
} from "./onnx-common.js";

export interface OnnxCrossEncoderOptions extends OnnxLoadOptions {
  /** Tokens per query-passage pair, special tokens included; longer pairs are cut. Default min(512, the model's max positions). */
  maxLength?: number;
}

const DEFAULT_MAX_LENGTH = 512;
const WHO = "OnnxCrossEncoder.load";
const OUTPUT = "logits";

/** One pair as the model reads it: token ids and their token types (segment ids). */
interface PairRow {
  ids: number[];
  types: number[];
}

/** Cross-encoder run by onnxruntime; `load` it from a model folder. */
export class OnnxCrossEncoder implements Reranker {
  private closed = false;

  private constructor(
    readonly id: string,
    /** Tokens per pair, special tokens included. */
    readonly maxLength: number,
    readonly batchSize: number,
    private readonly modelPath: string,
    private readonly inputs: ReadonlyMap<string, IdType>,
    private readonly session: InferenceSession,
    private readonly tokenizer: Tokenizer,
    private readonly template: PairTemplate,
    private readonly ort: Ort,
  ) {}

  static async load(dir: string, options: OnnxCrossEncoderOptions = {}): Promise<OnnxCrossEncoder> {
    const { batchSize, threads } = checkLoadOptions(WHO, options);
    const { folder, modelPath, tokenizerPath, tokenizer, maxPositions } = await openModelFolder(WHO, dir);
    const template = pairTemplate(tokenizer, tokenizerPath);
    const specials = template.prefix.length + template.middle.length + template.suffix.length;
    // A pair needs room for at least one token of each text.
    const maxLength = resolveMaxLength(WHO, options.maxLength, maxPositions, DEFAULT_MAX_LENGTH, specials, 2);

    const { ort, session } = await createSession(modelPath, threads);
    try {
      const inputs = planTokenInputs(session, modelPath, "a BERT-style cross-encoder");
      if (!session.outputNames.includes(OUTPUT)) {
        throw new FormatError(modelPath, `no ${OUTPUT} output: a cross-encoder gives logits [batch, 1] or [batch, 2]; found ${describeOutputs(session)}`);
      }
      const hash = await sha256File(modelPath);
      const encoder = new OnnxCrossEncoder(`onnx-cross-encoder:${basename(folder)}:${hash.slice(0, 12)}`, maxLength, batchSize, modelPath, inputs, session, tokenizer, template, ort);
      // A probe run proves the model runs and its logits have a shape this class reads.
      await encoder.score("probe", ["probe"]);
      return encoder;
    } catch (e) {
      await session.release();
      throw e;
    }
  }

  async score(query: string, passages: string[]): Promise<number[]> {
    if (this.closed) throw new DkiArgumentError(`OnnxCrossEncoder.score: ${this.id} is closed`);
    if (typeof query !== "string") throw new DkiArgumentError(`OnnxCrossEncoder.score: the query is a ${typeof query}, not a string`);
    if (!Array.isArray(passages)) throw new DkiArgumentError("OnnxCrossEncoder.score: passages must be an array of strings");
    passages.forEach((p, i) => {
      if (typeof p !== "string") throw new DkiArgumentError(`OnnxCrossEncoder.score: passages[${i}] is a ${typeof p}, not a string`);
    });
    if (passages.length === 0) return [];
    const queryIds = this.tokenizer.encode(capChars(query, this.maxLength), { addSpecialTokens: false });
    const rows = await tokeniseAll(passages, (p) => this.pair(queryIds, p));
    return inLengthOrder(rows, this.batchSize, (batch) => this.runBatch(batch));
  }

  /** Frees onnxruntime's session; the cross-encoder cannot be used afterwards. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.session.release();
  }

  /**
   * The pair as the model reads it: prefix query middle passage suffix, types 0 up to the middle
   * and 1 after it (as BERT's pair template sets them), cut to maxLength.
   */
  private pair(queryIds: readonly number[], passage: string): PairRow {
    const { prefix, middle, suffix } = this.template;
    const passageIds = this.tokenizer.encode(capChars(passage, this.maxLength), { addSpecialTokens: false });
    const [q, p] = longestFirst(queryIds.length, passageIds.length, this.maxLength - prefix.length - middle.length - suffix.length);
    const first = [...prefix, ...queryIds.slice(0, q), ...middle];
    const second = [...passageIds.slice(0, p), ...suffix];
    return { ids: [...first, ...second], types: [...first.map(() => 0), ...second.map(() => 1)] };
  }

  /** One onnxruntime run over pairs (padded there), logits to scores. */
  private async runBatch(batch: PairRow[]): Promise<number[]> {
    const rows = batch.length;
    const { data, dims } = await runTokenBatch(this.ort, this.session, this.modelPath, this.inputs, { ids: batch.map((r) => r.ids), types: batch.map((r) => r.types) }, OUTPUT);
    if (dims.length !== 2 || dims[0] !== rows || (dims[1] !== 1 && dims[1] !== 2)) {
      throw new FormatError(this.modelPath, `output ${OUTPUT} has shape [${dims.join(", ")}] for ${rows} pair(s); expected [${rows}, 1] (one relevance logit) or [${rows}, 2] (two classes, the second relevant)`);
    }
    const scores: number[] = [];
    for (let r = 0; r < rows; r++) {
      // Two classes: softmax's probability of class 1, which is the sigmoid of the logits' difference.
      const logit = dims[1] === 1 ? data[r] : data[r * 2 + 1] - data[r * 2];
      if (!Number.isFinite(logit)) throw new FormatError(this.modelPath, `output ${OUTPUT} is not finite for pair ${r} of a batch (${logit}); the model's weights or export are broken`);
      scores.push(1 / (1 + Math.exp(-logit)));
    }
    return scores;
  }
}

/**
 * How many tokens of each text a pair keeps within `room`, Hugging Face's "longest first": one
 * token at a time is cut from the longer text (from the passage when they are as long, as
 * transformers' truncate_sequences does) until the pair fits. A short query thus stays whole and
 * a long passage gives way.
 */
export function longestFirst(query: number, passage: number, room: number): [number, number] {
  let q = query;
  let p = passage;
  while (q + p > room) {
    if (q > p) q--;
    else p--;
  }
  return [q, p];
}
