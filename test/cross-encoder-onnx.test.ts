// OnnxCrossEncoder against an independent float64 recomputation: a random-weight BERT cross-encoder
// (the encoder, BERT's pooler and a classifier, generated as ONNX by test/support/tiny-bert.ts)
// with the real all-MiniLM-L6-v2 tokenizer and its BERT pair template is run by onnxruntime
// through the cross-encoder, and the same network is computed plainly
// (test/support/tiny-bert-reference.ts) for each pair alone. Agreement proves the pair encoding
// ([CLS] query [SEP] passage [SEP]), the token types, truncation, padding across a batch and the
// logits-to-score step together.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OnnxCrossEncoder, longestFirst } from "../src/memory/embedders/onnx-cross-encoder.js";
import { pairTemplate } from "../src/memory/embedders/onnx-common.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { DkiArgumentError, FormatError } from "../src/errors.js";
import { fixtures, tempDir } from "./support/paths.js";
import { TINY_BERT_DEFAULTS, tinyBertOnnx, tinyBertWeights, tinyCrossEncoderOnnx, tinyCrossEncoderWeights, writeModelFolder } from "./support/tiny-bert.js";
import { referenceCrossScore } from "./support/tiny-bert-reference.js";

const tokenizerDir = join(fixtures, "minilm-tokenizer");
const CLS = 101; // bert-base-uncased's [CLS] and [SEP], fixed by its vocabulary
const SEP = 102;
const tokenizerJson = JSON.parse(readFileSync(join(tokenizerDir, "tokenizer.json"), "utf8")) as Record<string, unknown>;
const hf = new HfTokenizer(tokenizerJson, JSON.parse(readFileSync(join(tokenizerDir, "tokenizer_config.json"), "utf8")) as Record<string, unknown>);
const wordPieces = (text: string) => hf.encode(text, { add_special_tokens: false }).ids;

/** The reference pair, uncut: [CLS] query [SEP] passage [SEP], types 0 through the first [SEP], 1 after. */
function referencePair(query: string, passage: string): { ids: number[]; types: number[] } {
  const first = [CLS, ...wordPieces(query), SEP];
  const second = [...wordPieces(passage), SEP];
  return { ids: [...first, ...second], types: [...first.map(() => 0), ...second.map(() => 1)] };
}

const modelFolder = (name: string, model: Uint8Array | null, opts: { tokenizer?: boolean } = {}) => writeModelFolder(join(tempDir("dki-xenc-"), name), model, opts);

// float32 onnxruntime against the float64 reference: the embedder's tests measure ≈ 4e-8 per
// component; 1e-6 on a score is far below what a wrong token, type or mask gives.
const TOLERANCE = 1e-6;

const PAIRS: [string, string][] = [
  ["what does the user drink in the morning?", "The user prefers green tea in the morning."],
  ["what does the user drink in the morning?", "Dynamic KV injection puts memory into attention without spending prompt tokens on it."],
  ["cat's name", "My cat's name is Mochi, and she's 3 years old!"],
  ["北京", "我喜欢在北京吃烤鸭"],
  ["hi", "Hi"],
];

describe("OnnxCrossEncoder on a generated BERT cross-encoder", () => {
  const weights = tinyCrossEncoderWeights(11, TINY_BERT_DEFAULTS, 1);
  const model = tinyCrossEncoderOnnx(weights);
  let dir: string;
  let encoder: OnnxCrossEncoder;

  beforeAll(async () => {
    dir = modelFolder("tiny-ms-marco", model);
    encoder = await OnnxCrossEncoder.load(dir, { threads: 1 });
  });
  afterAll(async () => encoder?.close());

  it("names the model by folder and content hash; maxLength is min(512, max_position_embeddings)", () => {
    const sha = createHash("sha256").update(model).digest("hex");
    expect(encoder.id).toBe(`onnx-cross-encoder:tiny-ms-marco:${sha.slice(0, 12)}`);
    expect(encoder.maxLength).toBe(TINY_BERT_DEFAULTS.maxPositions);
  });

  it("finds the BERT pair template from the tokenizer's post-processor", async () => {
    const tokenizer = await Tokenizer.fromFolder(dir);
    expect(pairTemplate(tokenizer, "tokenizer.json")).toEqual({ prefix: [CLS], middle: [SEP], suffix: [SEP] });
  });

  it("matches the float64 reference for pairs of unlike lengths scored in one batch", async () => {
    const byQuery = new Map<string, string[]>();
    for (const [q, p] of PAIRS) byQuery.set(q, [...(byQuery.get(q) ?? []), p]);
    for (const [query, passages] of byQuery) {
      const scores = await encoder.score(query, passages);
      expect(scores).toHaveLength(passages.length);
      passages.forEach((p, i) => {
        const { ids, types } = referencePair(query, p);
        expect(ids.length).toBeLessThanOrEqual(encoder.maxLength); // no truncation here
        expect(scores[i]).toBeGreaterThan(0);
        expect(scores[i]).toBeLessThan(1);
        expect(Math.abs(scores[i] - referenceCrossScore(weights, ids, types))).toBeLessThan(TOLERANCE);
      });
    }
  });

  it("feeds token types: the passage's tokens are type 1, and the score differs from an all-0 one", async () => {
    const [query, passage] = PAIRS[0];
    const [score] = await encoder.score(query, [passage]);
    const { ids, types } = referencePair(query, passage);
    expect(Math.abs(score - referenceCrossScore(weights, ids, types))).toBeLessThan(TOLERANCE);
    expect(Math.abs(score - referenceCrossScore(weights, ids, ids.map(() => 0)))).toBeGreaterThan(1e-3);
    // A model without the token_type_ids input uses type 0 throughout, as BertModel does.
    const noTypes = await OnnxCrossEncoder.load(modelFolder("no-types", tinyCrossEncoderOnnx(weights, { tokenTypeIds: false })), { threads: 1 });
    const [untyped] = await noTypes.score(query, [passage]);
    await noTypes.close();
    expect(Math.abs(untyped - referenceCrossScore(weights, ids, ids.map(() => 0)))).toBeLessThan(TOLERANCE);
  });

  it("scores a pair the same alone as in a batch of unlike lengths, in any batch size", async () => {
    const query = PAIRS[0][0];
    const passages = [...PAIRS.map(([, p]) => p), "short", "a much longer passage ".repeat(8)];
    const together = await encoder.score(query, passages);
    const alone = await Promise.all(passages.map(async (p) => (await encoder.score(query, [p]))[0]));
    const small = await OnnxCrossEncoder.load(dir, { threads: 1, batchSize: 2 });
    const inTwos = await small.score(query, passages);
    await small.close();
    passages.forEach((_, i) => {
      expect(Math.abs(together[i] - alone[i])).toBeLessThan(TOLERANCE);
      expect(Math.abs(inTwos[i] - alone[i])).toBeLessThan(TOLERANCE);
    });
  });

  it("cuts a pair longest first, keeping [CLS] and both [SEP]s (hand-worked at maxLength 12: 9 text tokens)", async () => {
    const short = await OnnxCrossEncoder.load(dir, { threads: 1, maxLength: 12 });
    const ten = "one two three four five six seven eight nine ten"; // ten WordPiece tokens 2028…2702
    const days = "monday tuesday wednesday thursday friday saturday sunday january"; // eight tokens
    // A 3-token query stays whole; the 10-token passage gives 4 tokens way: 3 + 6 = 9.
    const [s1, s1Tail] = await short.score("red green blue", [ten, ten.replace("ten", "eleven")]);
    const cut1 = [CLS, 2417, 2665, 2630, SEP, 2028, 2048, 2093, 2176, 2274, 2416, SEP];
    expect(Math.abs(s1 - referenceCrossScore(weights, cut1, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]))).toBeLessThan(TOLERANCE);
    expect(s1Tail).toBe(s1); // the passage's tail was cut off
    // Both long (8 and 10): the longer loses one at a time, the passage on ties: 10→8, then
    // (8,8)→(8,7)→(7,7)→(7,6)→(6,6)→(6,5)→(5,5)→(5,4): query monday…friday, passage one…four.
    expect(longestFirst(8, 10, 9)).toEqual([5, 4]);
    const [s2] = await short.score(days, [ten]);
    const cut2 = [CLS, 6928, 9857, 9317, 9432, 5958, SEP, 2028, 2048, 2093, 2176, SEP];
    expect(Math.abs(s2 - referenceCrossScore(weights, cut2, [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]))).toBeLessThan(TOLERANCE);
    // A 5 MB passage costs no more than its first tokens.
    const started = performance.now();
    const [huge] = await short.score("red green blue", [`${ten} `.repeat(100_000)]);
    expect(performance.now() - started).toBeLessThan(500);
    expect(huge).toBe(s1);
    await short.close();
  });

  it("a two-class model's score is the softmax probability of class 1", async () => {
    const w2 = tinyCrossEncoderWeights(12, TINY_BERT_DEFAULTS, 2);
    const two = await OnnxCrossEncoder.load(modelFolder("two-class", tinyCrossEncoderOnnx(w2)), { threads: 1 });
    const [query] = PAIRS[0];
    const passages = PAIRS.slice(0, 3).map(([, p]) => p);
    const scores = await two.score(query, passages);
    await two.close();
    passages.forEach((p, i) => {
      const { ids, types } = referencePair(query, p);
      expect(Math.abs(scores[i] - referenceCrossScore(w2, ids, types))).toBeLessThan(TOLERANCE);
    });
  });

  it("refuses what it cannot score with errors naming it; no passages is no scores", async () => {
    expect(await encoder.score("q", [])).toEqual([]);
    await expect(encoder.score(3 as unknown as string, ["p"])).rejects.toThrow(DkiArgumentError);
    await expect(encoder.score("q", ["fine", null as unknown as string])).rejects.toThrow(/passages\[1\] is a object, not a string/);
    await expect(encoder.score("q", "p" as unknown as string[])).rejects.toThrow(/passages must be an array/);
    await expect(OnnxCrossEncoder.load(dir, { maxLength: 65 })).rejects.toThrow(/maxLength 65 is more than the model's 64 positions/);
    await expect(OnnxCrossEncoder.load(dir, { batchSize: 0 })).rejects.toThrow(/OnnxCrossEncoder\.load: batchSize must be an integer/);
    // [CLS] [SEP] [SEP] and one token of each text: 5 at the least.
    await expect(OnnxCrossEncoder.load(dir, { maxLength: 4 })).rejects.toThrow(/maxLength 4 leaves no room for text next to the tokenizer's 3 special tokens/);
    const tight = await OnnxCrossEncoder.load(dir, { maxLength: 5, threads: 1 });
    const [s] = await tight.score("red green blue", ["one two"]); // cut to [CLS] red [SEP] one [SEP]
    await tight.close();
    expect(Math.abs(s - referenceCrossScore(weights, [CLS, 2417, SEP, 2028, SEP], [0, 0, 0, 1, 1]))).toBeLessThan(TOLERANCE);
  });
});

describe("OnnxCrossEncoder errors", () => {
  const small = tinyCrossEncoderWeights(5, { ...TINY_BERT_DEFAULTS, layers: 1 }, 1);

  it("a missing folder, model or tokenizer is named", async () => {
    await expect(OnnxCrossEncoder.load(join(tempDir(), "nowhere"))).rejects.toThrow(/OnnxCrossEncoder\.load: .* is not a folder/);
    await expect(OnnxCrossEncoder.load(modelFolder("empty", null))).rejects.toThrow(/no ONNX model: looked for model\.onnx and onnx\/model\.onnx/);
    const noTokenizer = await OnnxCrossEncoder.load(modelFolder("no-tok", tinyCrossEncoderOnnx(small), { tokenizer: false })).catch((e: unknown) => e);
    expect(noTokenizer).toBeInstanceOf(FormatError);
    expect((noTokenizer as Error).message).toMatch(/tokenizer\.json: missing/);
  });

  it("logits of a shape it cannot read, or no logits at all, are FormatErrors naming what was found", async () => {
    const three = tinyCrossEncoderWeights(5, { ...TINY_BERT_DEFAULTS, layers: 1 }, 3);
    const err = await OnnxCrossEncoder.load(modelFolder("three-class", tinyCrossEncoderOnnx(three))).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FormatError);
    expect((err as Error).message).toMatch(/model\.onnx: output logits has shape \[1, 3\] for 1 pair\(s\); expected \[1, 1\] .* or \[1, 2\]/);
    const embedderModel = tinyBertOnnx(tinyBertWeights(5, { ...TINY_BERT_DEFAULTS, layers: 1 }));
    await expect(OnnxCrossEncoder.load(modelFolder("embedder", embedderModel))).rejects.toThrow(/no logits output: .* found last_hidden_state \[batch, sequence, 32\]/);
  });

  it("is an error to use after close; closing twice is harmless", async () => {
    const e = await OnnxCrossEncoder.load(modelFolder("closing", tinyCrossEncoderOnnx(small)), { threads: 1 });
    await e.close();
    await e.close();
    await expect(e.score("q", ["p"])).rejects.toThrow(/onnx-cross-encoder:closing:[0-9a-f]{12} is closed/);
  });

  it("a tokenizer whose pair template puts nothing between the texts gets the single template twice: prefix A suffix B suffix", () => {
    const post = tokenizerJson.post_processor as Record<string, unknown>;
    const special = (id: string) => ({ SpecialToken: { id, type_id: 0 } });
    const seq = (id: string) => ({ Sequence: { id, type_id: 0 } });
    const withPair = (pair: unknown[]) => Tokenizer.fromJson({ ...tokenizerJson, post_processor: { ...post, pair } }, "tokenizer.json");
    expect(pairTemplate(withPair([special("[CLS]"), seq("A"), seq("B"), special("[SEP]")]), "tokenizer.json")).toEqual({ prefix: [CLS], middle: [SEP], suffix: [SEP] });
    // RoBERTa's layout, <s> A </s></s> B </s>, with BERT's tokens: the middle is two tokens.
    expect(pairTemplate(withPair([special("[CLS]"), seq("A"), special("[SEP]"), special("[SEP]"), seq("B"), special("[SEP]")]), "tokenizer.json")).toEqual({ prefix: [CLS], middle: [SEP, SEP], suffix: [SEP] });
  });
});
