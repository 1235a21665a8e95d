// A BERT encoder with random weights as an ONNX graph, in the layout of the sentence-transformers
// exports (inputs input_ids / attention_mask / token_type_ids, output last_hidden_state), small
// enough to generate in every test run; and the same encoder as a cross-encoder (BERT's pooler
// and a classifier head, output logits), as Hugging Face exports sequence-classification models.
// The weights come back too, so a test can recompute the same network independently.
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { DataType, writeOnnxModel, type OnnxNode, type OnnxTensor, type OnnxValueInfo } from "./onnx-writer.js";
import { fixtures } from "./paths.js";
import { prng } from "./prng.js";

export interface TinyBertConfig {
  vocab: number;
  hidden: number;
  heads: number;
  intermediate: number;
  layers: number;
  maxPositions: number;
  typeVocab: number;
  eps: number;
}

export interface TinyBertLayer {
  wq: Float32Array; bq: Float32Array; // [hidden, hidden] (input-major: y = x·W + b), [hidden]
  wk: Float32Array; bk: Float32Array;
  wv: Float32Array; bv: Float32Array;
  wo: Float32Array; bo: Float32Array;
  ln1g: Float32Array; ln1b: Float32Array;
  w1: Float32Array; b1: Float32Array; // [hidden, intermediate]
  w2: Float32Array; b2: Float32Array; // [intermediate, hidden]
  ln2g: Float32Array; ln2b: Float32Array;
}

export interface TinyBertWeights {
  config: TinyBertConfig;
  wordEmb: Float32Array; // [vocab, hidden]
  posEmb: Float32Array; // [maxPositions, hidden]
  typeEmb: Float32Array; // [typeVocab, hidden]
  embLnG: Float32Array;
  embLnB: Float32Array;
  layers: TinyBertLayer[];
}

export interface TinyBertOptions {
  seed?: number;
  /** Declare the token_type_ids input (default true); real exports differ here. */
  tokenTypeIds?: boolean;
  config?: Partial<TinyBertConfig>;
}

export const TINY_BERT_DEFAULTS: TinyBertConfig = {
  vocab: 30522, // the real MiniLM / bert-base-uncased vocabulary, so real token ids are valid
  hidden: 32,
  heads: 2,
  intermediate: 64,
  layers: 2,
  maxPositions: 64,
  typeVocab: 2,
  eps: 1e-12,
};

export function tinyBertWeights(seed: number, config: TinyBertConfig): TinyBertWeights {
  const rand = prng(seed);
  const uniform = (n: number, scale: number) => Float32Array.from({ length: n }, () => (rand() * 2 - 1) * scale);
  const around = (n: number, centre: number, spread: number) => Float32Array.from({ length: n }, () => centre + (rand() * 2 - 1) * spread);
  const { hidden: h, intermediate: inter } = config;
  // Scales keep pre-activations of order 1, so softmax and GELU work away from saturation.
  const wScale = 1.5 / Math.sqrt(h);
  const layer = (): TinyBertLayer => ({
    wq: uniform(h * h, wScale), bq: uniform(h, 0.1),
    wk: uniform(h * h, wScale), bk: uniform(h, 0.1),
    wv: uniform(h * h, wScale), bv: uniform(h, 0.1),
    wo: uniform(h * h, wScale), bo: uniform(h, 0.1),
    ln1g: around(h, 1, 0.2), ln1b: uniform(h, 0.1),
    w1: uniform(h * inter, wScale), b1: uniform(inter, 0.1),
    w2: uniform(inter * h, 1.5 / Math.sqrt(inter)), b2: uniform(h, 0.1),
    ln2g: around(h, 1, 0.2), ln2b: uniform(h, 0.1),
  });
  return {
    config,
    wordEmb: uniform(config.vocab * h, 1),
    posEmb: uniform(config.maxPositions * h, 0.5),
    typeEmb: uniform(config.typeVocab * h, 0.5),
    embLnG: around(h, 1, 0.2),
    embLnB: uniform(h, 0.1),
    layers: Array.from({ length: config.layers }, layer),
  };
}

/** A graph under construction: its nodes and initialisers, and helpers that append to them. */
class GraphBuilder {
  readonly nodes: OnnxNode[] = [];
  readonly inits: OnnxTensor[] = [];

  f32(name: string, dims: number[], data: ArrayLike<number>): void {
    this.inits.push({ name, dims, type: DataType.FLOAT, data });
  }

  i64(name: string, dims: number[], data: number[]): void {
    this.inits.push({ name, dims, type: DataType.INT64, data });
  }

  /** Appends a node with one output; returns the output's name. */
  node(op: string, inputs: string[], output: string, attributes?: OnnxNode["attributes"]): string {
    this.nodes.push({ op, inputs, outputs: [output], attributes });
    return output;
  }

  /** x·W + b. */
  linear(x: string, w: string, b: string, out: string): string {
    return this.node("Add", [this.node("MatMul", [x, w], `${out}_mm`), b], out);
  }
}

const tokenInput = (name: string): OnnxValueInfo => ({ name, type: DataType.INT64, shape: ["batch", "sequence"] });
const tokenInputs = (withTypes: boolean) => [tokenInput("input_ids"), tokenInput("attention_mask"), ...(withTypes ? [tokenInput("token_type_ids")] : [])];

/** The ONNX model of `weights` (opset 17: LayerNormalization, Erf-based GELU). */
export function tinyBertOnnx(weights: TinyBertWeights, opts: { tokenTypeIds?: boolean } = {}): Uint8Array {
  const withTypes = opts.tokenTypeIds ?? true;
  const g = new GraphBuilder();
  const hidden = encoderNodes(g, weights, withTypes);
  g.nodes.push({ op: "Identity", inputs: [hidden], outputs: ["last_hidden_state"] });
  return writeOnnxModel({
    name: "tiny_bert",
    nodes: g.nodes,
    initializers: g.inits,
    inputs: tokenInputs(withTypes),
    outputs: [{ name: "last_hidden_state", type: DataType.FLOAT, shape: ["batch", "sequence", weights.config.hidden] }],
  });
}

/** The encoder's nodes in `g`; returns the name of its last hidden state [batch, sequence, hidden]. */
function encoderNodes(g: GraphBuilder, weights: TinyBertWeights, withTypes: boolean): string {
  const { config: c } = weights;
  const headDim = c.hidden / c.heads;
  const f32 = g.f32.bind(g);
  const i64 = g.i64.bind(g);
  const node = g.node.bind(g);
  const layerNorm = (x: string, g: string, b: string, out: string) =>
    node("LayerNormalization", [x, g, b], out, { axis: { kind: "int", value: -1 }, epsilon: { kind: "float", value: c.eps } });
  const linear = g.linear.bind(g);

  // Embeddings: word + position + token type, then LayerNorm.
  f32("word_emb", [c.vocab, c.hidden], weights.wordEmb);
  f32("pos_emb", [c.maxPositions, c.hidden], weights.posEmb);
  f32("type_emb", [c.typeVocab, c.hidden], weights.typeEmb);
  f32("emb_ln_g", [c.hidden], weights.embLnG);
  f32("emb_ln_b", [c.hidden], weights.embLnB);
  i64("zero", [], [0]);
  i64("one", [], [1]);
  const shape = node("Shape", ["input_ids"], "ids_shape");
  const seqLen = node("Gather", [shape, "one"], "seq_len", { axis: { kind: "int", value: 0 } });
  const positions = node("Range", ["zero", seqLen, "one"], "positions");
  const word = node("Gather", ["word_emb", "input_ids"], "word_e", { axis: { kind: "int", value: 0 } });
  const pos = node("Gather", ["pos_emb", positions], "pos_e", { axis: { kind: "int", value: 0 } });
  let emb = node("Add", [word, pos], "wp_e");
  if (withTypes) emb = node("Add", [emb, node("Gather", ["type_emb", "token_type_ids"], "type_e", { axis: { kind: "int", value: 0 } })], "wpt_e");
  else {
    // Models without the input use token type 0 throughout, as BertModel does by default.
    f32("type0", [c.hidden], weights.typeEmb.subarray(0, c.hidden));
    emb = node("Add", [emb, "type0"], "wpt_e");
  }
  let x = layerNorm(emb, "emb_ln_g", "emb_ln_b", "emb_out");

  // Attention mask → additive bias [batch, 1, 1, seq]: 0 where attended, -10000 where padded.
  f32("neg_big", [], [-10000]);
  f32("f_one", [], [1]);
  i64("bias_axes", [2], [1, 2]);
  const maskF = node("Cast", ["attention_mask"], "mask_f", { to: { kind: "int", value: DataType.FLOAT } });
  const bias2 = node("Mul", [node("Sub", ["f_one", maskF], "mask_inv"), "neg_big"], "mask_bias2");
  const bias = node("Unsqueeze", [bias2, "bias_axes"], "mask_bias");

  i64("heads_shape", [4], [0, 0, c.heads, headDim]);
  i64("merge_shape", [3], [0, 0, c.hidden]);
  f32("scale", [], [1 / Math.sqrt(headDim)]);
  f32("half", [], [0.5]);
  f32("inv_sqrt2", [], [Math.SQRT1_2]);
  weights.layers.forEach((L, l) => {
    const p = `l${l}_`;
    const params: [string, number[], Float32Array][] = [
      ["wq", [c.hidden, c.hidden], L.wq], ["bq", [c.hidden], L.bq],
      ["wk", [c.hidden, c.hidden], L.wk], ["bk", [c.hidden], L.bk],
      ["wv", [c.hidden, c.hidden], L.wv], ["bv", [c.hidden], L.bv],
      ["wo", [c.hidden, c.hidden], L.wo], ["bo", [c.hidden], L.bo],
      ["ln1g", [c.hidden], L.ln1g], ["ln1b", [c.hidden], L.ln1b],
      ["w1", [c.hidden, c.intermediate], L.w1], ["b1", [c.intermediate], L.b1],
      ["w2", [c.intermediate, c.hidden], L.w2], ["b2", [c.hidden], L.b2],
      ["ln2g", [c.hidden], L.ln2g], ["ln2b", [c.hidden], L.ln2b],
    ];
    for (const [n, dims, data] of params) f32(p + n, dims, data);
    // [batch, seq, hidden] → [batch, heads, seq, headDim] (K: [batch, heads, headDim, seq]).
    const split = (t: string, perm: number[], out: string) =>
      node("Transpose", [node("Reshape", [t, "heads_shape"], `${out}_r`)], out, { perm: { kind: "ints", value: perm } });
    const q = split(linear(x, p + "wq", p + "bq", p + "q"), [0, 2, 1, 3], p + "qh");
    const k = split(linear(x, p + "wk", p + "bk", p + "k"), [0, 2, 3, 1], p + "kh");
    const v = split(linear(x, p + "wv", p + "bv", p + "v"), [0, 2, 1, 3], p + "vh");
    const scores = node("Add", [node("Mul", [node("MatMul", [q, k], p + "qk"), "scale"], p + "qk_s"), bias], p + "scores");
    const probs = node("Softmax", [scores], p + "probs", { axis: { kind: "int", value: -1 } });
    const ctx = node("Transpose", [node("MatMul", [probs, v], p + "ctx_h")], p + "ctx_t", { perm: { kind: "ints", value: [0, 2, 1, 3] } });
    const merged = node("Reshape", [ctx, "merge_shape"], p + "ctx");
    const attnOut = linear(merged, p + "wo", p + "bo", p + "attn");
    const x1 = layerNorm(node("Add", [attnOut, x], p + "res1"), p + "ln1g", p + "ln1b", p + "x1");
    // GELU, exact form: 0.5·h·(1 + erf(h/√2)).
    const hid = linear(x1, p + "w1", p + "b1", p + "ffn_h");
    const erf = node("Erf", [node("Mul", [hid, "inv_sqrt2"], p + "h_s")], p + "erf");
    const gelu = node("Mul", [node("Mul", [hid, "half"], p + "h_half"), node("Add", [erf, "f_one"], p + "erf1")], p + "gelu");
    const ffnOut = linear(gelu, p + "w2", p + "b2", p + "ffn_o");
    x = layerNorm(node("Add", [ffnOut, x1], p + "res2"), p + "ln2g", p + "ln2b", p + "x2");
  });
  return x;
}

/** A cross-encoder: the encoder, BERT's pooler and a classifier of `labels` logits. */
export interface TinyCrossEncoderWeights extends TinyBertWeights {
  poolW: Float32Array; // [hidden, hidden]
  poolB: Float32Array; // [hidden]
  clsW: Float32Array; // [hidden, labels]
  clsB: Float32Array; // [labels]
  labels: number;
}

export function tinyCrossEncoderWeights(seed: number, config: TinyBertConfig, labels: number): TinyCrossEncoderWeights {
  const encoder = tinyBertWeights(seed, config);
  const rand = prng(seed + 1000);
  const uniform = (n: number, scale: number) => Float32Array.from({ length: n }, () => (rand() * 2 - 1) * scale);
  const h = config.hidden;
  // The pooler's tanh stays away from saturation; the classifier gives logits of order 1, so the
  // scores spread over (0, 1) instead of all sitting at 0 or 1.
  return { ...encoder, poolW: uniform(h * h, 1.5 / Math.sqrt(h)), poolB: uniform(h, 0.1), clsW: uniform(h * labels, 3 / Math.sqrt(h)), clsB: uniform(labels, 0.1), labels };
}

/**
 * The ONNX model of a cross-encoder, as BertForSequenceClassification exports: the encoder, then
 * the pooler (dense + tanh on the first token, [CLS]) and a linear classifier to `logits`
 * [batch, labels].
 */
export function tinyCrossEncoderOnnx(weights: TinyCrossEncoderWeights, opts: { tokenTypeIds?: boolean } = {}): Uint8Array {
  const withTypes = opts.tokenTypeIds ?? true;
  const h = weights.config.hidden;
  const g = new GraphBuilder();
  const hidden = encoderNodes(g, weights, withTypes);
  g.f32("pool_w", [h, h], weights.poolW);
  g.f32("pool_b", [h], weights.poolB);
  g.f32("cls_w", [h, weights.labels], weights.clsW);
  g.f32("cls_b", [weights.labels], weights.clsB);
  // The first token of every row: a scalar index on the sequence axis drops it, [batch, hidden].
  const first = g.node("Gather", [hidden, "zero"], "first_token", { axis: { kind: "int", value: 1 } });
  const pooled = g.node("Tanh", [g.linear(first, "pool_w", "pool_b", "pooled_lin")], "pooled");
  g.linear(pooled, "cls_w", "cls_b", "logits");
  return writeOnnxModel({
    name: "tiny_cross_encoder",
    nodes: g.nodes,
    initializers: g.inits,
    inputs: tokenInputs(withTypes),
    outputs: [{ name: "logits", type: DataType.FLOAT, shape: ["batch", weights.labels] }],
  });
}

export interface ModelFolderOptions {
  /** config.json's max_position_embeddings: default the generated model's positions; null leaves it out. */
  maxPositions?: number | null;
  /** Write the tokenizer files (default true). */
  tokenizer?: boolean;
  /** The model as onnx/model.onnx instead of model.onnx. */
  subdir?: boolean;
}

/**
 * A model folder in the layout of Hugging Face exports: the real all-MiniLM-L6-v2 tokenizer files
 * of test/fixtures (bert-base-uncased's WordPiece, with a BERT pair template), its config.json
 * with the generated model's positions, and `model` as model.onnx (null: no model file).
 */
export function writeModelFolder(dir: string, model: Uint8Array | null, opts: ModelFolderOptions = {}): string {
  const tokenizerDir = join(fixtures, "minilm-tokenizer");
  mkdirSync(join(dir, "onnx"), { recursive: true });
  if (opts.tokenizer ?? true) for (const f of ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]) copyFileSync(join(tokenizerDir, f), join(dir, f));
  const config = JSON.parse(readFileSync(join(tokenizerDir, "config.json"), "utf8")) as Record<string, unknown>;
  if (opts.maxPositions === null) delete config.max_position_embeddings;
  else config.max_position_embeddings = opts.maxPositions ?? TINY_BERT_DEFAULTS.maxPositions;
  writeFileSync(join(dir, "config.json"), JSON.stringify(config));
  if (model) writeFileSync(opts.subdir ? join(dir, "onnx", "model.onnx") : join(dir, "model.onnx"), model);
  return dir;
}

/**
 * A model folder as OnnxEmbedder.load reads it: a generated BERT (seed, default shape) as
 * model.onnx beside the real all-MiniLM-L6-v2 tokenizer files of test/fixtures. Returns `dir`.
 */
export function writeTinyBertFolder(dir: string, seed: number): string {
  return writeModelFolder(dir, tinyBertOnnx(tinyBertWeights(seed, TINY_BERT_DEFAULTS)));
}

/** A cross-encoder folder as OnnxCrossEncoder.load reads it: a generated cross-encoder (seed, default shape, one logit). Returns `dir`. */
export function writeTinyCrossEncoderFolder(dir: string, seed: number): string {
  return writeModelFolder(dir, tinyCrossEncoderOnnx(tinyCrossEncoderWeights(seed, TINY_BERT_DEFAULTS, 1)));
}
