// OnnxEmbedder against an independent float64 recomputation: a random-weight BERT (generated as
// ONNX here, see test/support/tiny-bert.ts) with the real all-MiniLM-L6-v2 tokenizer is run by
// onnxruntime through the embedder, and the same network is computed plainly
// (test/support/tiny-bert-reference.ts), token by token, for each text alone. Agreement proves tokenisation, truncation, the model inputs,
// padding and masking across a batch, mean pooling and normalisation together.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OnnxEmbedder } from "../src/memory/embedders/onnx.js";
import { DkiArgumentError, FormatError } from "../src/errors.js";
import { DataType, writeOnnxModel, type OnnxGraph } from "./support/onnx-writer.js";
import { fixtures, maxAbsDiff, tempDir } from "./support/paths.js";
import { TINY_BERT_DEFAULTS, tinyBertOnnx, tinyBertWeights, writeModelFolder, type ModelFolderOptions } from "./support/tiny-bert.js";
import { erf, referenceEmbedding } from "./support/tiny-bert-reference.js";

const tokenizerDir = join(fixtures, "minilm-tokenizer");
const CLS = 101; // bert-base-uncased's [CLS] and [SEP], fixed by its vocabulary
const SEP = 102;

// ---- fixtures ----

const hf = new HfTokenizer(
  JSON.parse(readFileSync(join(tokenizerDir, "tokenizer.json"), "utf8")) as Record<string, unknown>,
  JSON.parse(readFileSync(join(tokenizerDir, "tokenizer_config.json"), "utf8")) as Record<string, unknown>,
);
/** Reference token ids: the text's WordPiece ids cut to fit, between [CLS] and [SEP]. */
const referenceIds = (text: string, maxLength: number) => [CLS, ...hf.encode(text, { add_special_tokens: false }).ids.slice(0, maxLength - 2), SEP];

/** A model folder: the MiniLM tokenizer files, config.json with the model's positions, and model bytes. */
const modelFolder = (name: string, model: Uint8Array | null, opts: ModelFolderOptions = {}): string => writeModelFolder(join(tempDir("dki-onnx-"), name), model, opts);

const ENGLISH = [
  "The user prefers green tea in the morning.",
  "Dynamic KV injection puts memory into attention without spending prompt tokens on it.",
  "Hi",
  "My cat's name is Mochi, and she's 3 years old!",
];
const CHINESE = ["我喜欢在北京吃烤鸭", "用户的生日是五月三日，她喜欢绿茶。"];

describe("OnnxEmbedder on a generated BERT", () => {
  const weights = tinyBertWeights(7, TINY_BERT_DEFAULTS);
  const model = tinyBertOnnx(weights);
  let dir: string;
  let embedder: OnnxEmbedder;

  beforeAll(async () => {
    dir = modelFolder("tiny-minilm", model);
    embedder = await OnnxEmbedder.load(dir, { threads: 1 });
  });
  afterAll(async () => embedder?.close());

  it("names the model by folder, content hash and pooling; reads dim and maxLength", () => {
    const sha = createHash("sha256").update(model).digest("hex");
    expect(embedder.id).toBe(`onnx:tiny-minilm:${sha.slice(0, 12)}:mean`);
    expect(embedder.dim).toBe(TINY_BERT_DEFAULTS.hidden);
    // Default min(256, max_position_embeddings of config.json).
    expect(embedder.maxLength).toBe(TINY_BERT_DEFAULTS.maxPositions);
  });

  it("the reference tokenisation is the real BERT one", () => {
    expect(referenceIds("Hello world", 512)).toEqual([101, 7592, 2088, 102]);
  });

  it("matches the float64 reference for English and Chinese texts padded together in one batch", async () => {
    const texts = [...ENGLISH, ...CHINESE];
    const vectors = await embedder.embed(texts);
    expect(vectors).toHaveLength(texts.length);
    const lengths = new Set(texts.map((t) => referenceIds(t, embedder.maxLength).length));
    expect(lengths.size).toBeGreaterThan(3); // the batch really pads
    // float32 onnxruntime vs the float64 reference: measured ≈ 4e-8 per component; 1e-6 leaves
    // room for other CPUs' kernels and is still far below what a masking or pooling error gives.
    texts.forEach((text, i) => {
      const expected = referenceEmbedding(weights, referenceIds(text, embedder.maxLength));
      expect(vectors[i]).toBeInstanceOf(Float32Array);
      expect(maxAbsDiff(vectors[i], expected)).toBeLessThan(1e-6);
    });
  });

  it("gives a text the same vector alone as in any batch, in any batch size", async () => {
    const texts = [...CHINESE, ...ENGLISH];
    const together = await embedder.embed(texts);
    const alone = await Promise.all(texts.map(async (t) => (await embedder.embed([t]))[0]));
    const small = await OnnxEmbedder.load(dir, { threads: 1, batchSize: 2 });
    const inTwos = await small.embed(texts);
    await small.close();
    texts.forEach((_, i) => {
      expect(maxAbsDiff(together[i], alone[i])).toBeLessThan(1e-6);
      expect(maxAbsDiff(inTwos[i], alone[i])).toBeLessThan(1e-6);
    });
  });

  it("truncates long texts to maxLength tokens, keeping [CLS] and [SEP]", async () => {
    const long = "memory injection ".repeat(40) + "the end differs here";
    const short = await OnnxEmbedder.load(dir, { threads: 1, maxLength: 12 });
    const [v, same] = await short.embed([long, long.replace("the end differs here", "something else entirely")]);
    // A 5 MB text costs no more than its first tokens: the tokenizer never sees most of it.
    const started = performance.now();
    const [huge] = await short.embed(["memory injection ".repeat(300_000)]);
    expect(performance.now() - started).toBeLessThan(500);
    expect(maxAbsDiff(huge, v)).toBe(0);
    await short.close();
    expect(maxAbsDiff(v, referenceEmbedding(weights, referenceIds(long, 12)))).toBeLessThan(1e-6);
    expect(maxAbsDiff(v, same)).toBe(0); // the tails were cut off
    // At the model's 64 positions, a 400-word text runs (it would overflow the position table uncut).
    const [full] = await embedder.embed([long]);
    expect(maxAbsDiff(full, referenceEmbedding(weights, referenceIds(long, 64)))).toBeLessThan(1e-6);
  });

  it("feeds only the inputs the model declares (no token_type_ids), from onnx/model.onnx", async () => {
    const noTypes = await OnnxEmbedder.load(modelFolder("no-types", tinyBertOnnx(weights, { tokenTypeIds: false }), { subdir: true }), { threads: 1 });
    const [v] = await noTypes.embed([ENGLISH[0]]);
    await noTypes.close();
    expect(maxAbsDiff(v, referenceEmbedding(weights, referenceIds(ENGLISH[0], 64)))).toBeLessThan(1e-6);
  });

  it("keeps the event loop free during a large batch", async () => {
    const texts = Array.from({ length: 200 }, (_, i) => `memory ${i}: ${ENGLISH[i % ENGLISH.length]}`);
    let ticks = 0;
    const timer = setInterval(() => ticks++, 0);
    const vectors = await embedder.embed(texts);
    clearInterval(timer);
    expect(vectors).toHaveLength(200);
    expect(ticks).toBeGreaterThan(2);
  });

  it("refuses bad texts and options with errors naming them", async () => {
    await expect(embedder.embed(["fine", " \n"])).rejects.toThrow(/texts\[1\] is empty/);
    await expect(embedder.embed([null as unknown as string])).rejects.toThrow(/texts\[0\] is a object/);
    await expect(embedder.embed("x" as unknown as string[])).rejects.toThrow(DkiArgumentError);
    expect(await embedder.embed([])).toEqual([]);
    await expect(OnnxEmbedder.load(dir, { maxLength: 65 })).rejects.toThrow(/maxLength 65 is more than the model's 64 positions/);
    await expect(OnnxEmbedder.load(dir, { batchSize: 0 })).rejects.toThrow(/batchSize must be an integer/);
    await expect(OnnxEmbedder.load(dir, { threads: 1.5 })).rejects.toThrow(/threads must be an integer/);
    await expect(OnnxEmbedder.load(dir, { maxLength: 2 })).rejects.toThrow(/maxLength must be an integer from 3/);
  });
});

describe("OnnxEmbedder model-folder errors", () => {
  const tinyWeights = tinyBertWeights(3, { ...TINY_BERT_DEFAULTS, layers: 1 });

  it("a missing folder, model or tokenizer is named", async () => {
    await expect(OnnxEmbedder.load(join(tempDir(), "nowhere"))).rejects.toThrow(/is not a folder/);
    await expect(OnnxEmbedder.load(modelFolder("empty", null))).rejects.toThrow(/no ONNX model: looked for model\.onnx and onnx\/model\.onnx/);
    const noTokenizer = modelFolder("no-tok", tinyBertOnnx(tinyWeights), { tokenizer: false });
    await expect(OnnxEmbedder.load(noTokenizer)).rejects.toThrow(/tokenizer\.json: missing/);
  });

  it("a file that is not an ONNX model is a FormatError naming it", async () => {
    const dir = modelFolder("garbage", new TextEncoder().encode("this is not a protobuf model at all"));
    const err = await OnnxEmbedder.load(dir).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FormatError);
    expect((err as FormatError).message).toMatch(/model\.onnx: onnxruntime cannot load it/);
  });

  /** A one-node graph over input_ids (and the given extra inputs) with one float output. */
  const oneOpModel = (op: "ReduceMean" | "Identity", outputName: string, outShape: (number | string)[], extraInputs: string[] = []): Uint8Array => {
    const graph: OnnxGraph = {
      name: "odd",
      nodes: [
        { op: "Gather", inputs: ["emb", "input_ids"], outputs: ["tok"], attributes: { axis: { kind: "int", value: 0 } } },
        op === "ReduceMean"
          ? { op, inputs: ["tok"], outputs: [outputName], attributes: { axes: { kind: "ints", value: [1] }, keepdims: { kind: "int", value: 0 } } }
          : { op, inputs: ["tok"], outputs: [outputName] },
      ],
      initializers: [{ name: "emb", dims: [30522, 4], type: DataType.FLOAT, data: Float32Array.from({ length: 30522 * 4 }, (_, i) => Math.sin(i)) }],
      inputs: ["input_ids", ...extraInputs].map((name) => ({ name, type: DataType.INT64, shape: ["batch", "sequence"] })),
      outputs: [{ name: outputName, type: DataType.FLOAT, shape: outShape }],
    };
    return writeOnnxModel(graph);
  };

  it("a model whose output is neither last_hidden_state nor sentence_embedding is refused", async () => {
    const dir = modelFolder("pooled-wrong", oneOpModel("ReduceMean", "logits", ["batch", 4]));
    await expect(OnnxEmbedder.load(dir)).rejects.toThrow(/no token embeddings to pool: expected an output last_hidden_state .* found logits \[batch, 4\]/);
  });

  it("a last_hidden_state of the wrong rank is refused", async () => {
    const dir = modelFolder("rank-wrong", oneOpModel("ReduceMean", "last_hidden_state", ["batch", 4]));
    await expect(OnnxEmbedder.load(dir)).rejects.toThrow(/no token embeddings to pool/);
  });

  it("an input a text model cannot be fed is refused", async () => {
    const dir = modelFolder("pixels", oneOpModel("Identity", "last_hidden_state", ["batch", "sequence", 4], ["pixel_values"]));
    await expect(OnnxEmbedder.load(dir)).rejects.toThrow(/input "pixel_values" is not one a BERT-style embedding model takes/);
  });

  it("uses a model's own sentence_embedding output, normalised", async () => {
    const dir = modelFolder("pooled", oneOpModel("ReduceMean", "sentence_embedding", ["batch", 4]));
    const e = await OnnxEmbedder.load(dir, { threads: 1 });
    expect(e.id).toMatch(/^onnx:pooled:[0-9a-f]{12}:model$/);
    expect(e.dim).toBe(4);
    const [v] = await e.embed(["hello world"]);
    await e.close();
    // ReduceMean over the token axis of the embedding rows (emb[i] = sin(i)), then L2 norm.
    const ids = referenceIds("hello world", 64);
    const mean = [0, 1, 2, 3].map((d) => ids.reduce((s, id) => s + Math.fround(Math.sin(id * 4 + d)), 0) / ids.length);
    const n = Math.hypot(...mean);
    expect(maxAbsDiff(v, mean.map((x) => x / n))).toBeLessThan(1e-6);
  });

  it("a model that fails at run time is a FormatError naming the model", async () => {
    // No max_position_embeddings in config.json, so maxLength defaults to 256: past the 64
    // positions the generated model has, so onnxruntime cannot run a 102-token batch.
    const dir = modelFolder("short-positions", tinyBertOnnx(tinyWeights), { maxPositions: null });
    const e = await OnnxEmbedder.load(dir, { threads: 1 });
    expect(e.maxLength).toBe(256);
    await expect(e.embed(["word ".repeat(100)])).rejects.toThrow(/model\.onnx: onnxruntime failed to run it on a batch of 1×102 tokens/);
    await e.close();
    await e.close(); // twice is harmless
    await expect(e.embed(["hello"])).rejects.toThrow(/onnx:short-positions:[0-9a-f]{12}:mean is closed/);
  });
});

it("erf of the reference matches known values", () => {
  // Values from Abramowitz & Stegun table 7.1 / high-precision evaluation.
  expect(erf(0.5)).toBeCloseTo(0.5204998778130465, 12);
  expect(erf(1)).toBeCloseTo(0.8427007929497149, 12);
  expect(erf(-2)).toBeCloseTo(-0.9953222650189527, 12);
  expect(erf(3.5)).toBeCloseTo(0.9999992569016276, 9);
});
