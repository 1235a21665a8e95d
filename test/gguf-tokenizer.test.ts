// The tokenizer rebuilt from GGUF metadata gives the same ids as the Hugging Face tokenizer.json
// the file was converted from (the real SmolLM2 tokenizer that make-tiny copies into folders).
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { FormatError } from "../src/errors.js";
import { GgufMeta, readGguf, writeGguf, type GgufEntry } from "../src/formats/gguf.js";
import { readGgufModel } from "../src/formats/gguf-model.js";
import { convertHfToGguf } from "../src/models/convert.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { ggufTokenizer, ggufTokenizerJson } from "../src/tokenizer/gguf-tokenizer.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { tempDir } from "./support/paths.js";
import { TOKENIZER_TEXTS } from "./support/tokenizer-texts.js";
import { prng } from "./support/prng.js";



let dir: string;
let gguf: string;
let hf: Tokenizer;
let gg: Tokenizer;

beforeAll(async () => {
  dir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: join(dir, "hf"), seed: 1 });
  gguf = join(dir, "tiny.gguf");
  await convertHfToGguf({ dir: join(dir, "hf"), out: gguf, type: "f16" });
  hf = await Tokenizer.fromFolder(join(dir, "hf"));
  const m = await readGgufModel(gguf);
  gg = ggufTokenizer(m.metadata, { bosTokenId: m.config.bosTokenId, eosTokenIds: m.config.eosTokenIds });
});

describe("GGUF tokenizer vs the HF tokenizer.json it came from", () => {
  test.each(TOKENIZER_TEXTS)("same ids: %j", (text) => {
    expect(gg.encode(text, { addSpecialTokens: false })).toEqual(hf.encode(text, { addSpecialTokens: false }));
    expect(gg.encode(text)).toEqual(hf.encode(text));
    expect(gg.decode(gg.encode(text))).toBe(hf.decode(hf.encode(text)));
  });

  test("500 random strings over a mixed alphabet give the same ids", () => {
    const alphabet = [..."abcxyzABC XYZ0123456789 .,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`\t\n\r", "é", "ß", "中", "文", "😀", "👍🏽", "\u00a0", "’", "«", "»", "ё", "ğ", "<|im_end|>", "<|im_start|>", "  ", "'s", "'ll"];
    const r = prng(7);
    for (let i = 0; i < 500; i++) {
      const n = 1 + Math.floor(r() * 40);
      let s = "";
      for (let k = 0; k < n; k++) s += alphabet[Math.floor(r() * alphabet.length)];
      expect(gg.encode(s, { addSpecialTokens: false }), JSON.stringify(s)).toEqual(hf.encode(s, { addSpecialTokens: false }));
    }
  });

  test("every vocabulary entry decodes the same", () => {
    for (let id = 0; id < 49152; id += 7) expect(gg.decode([id])).toBe(hf.decode([id]));
  });

  test("special tokens, BOS/EOS, chat template", () => {
    expect(gg.vocabSize).toBe(hf.vocabSize);
    expect(gg.specialIds).toEqual(hf.specialIds);
    expect(gg.bosId).toBe(hf.bosId);
    expect(gg.eosIds).toEqual(hf.eosIds);
    expect(gg.bosToken).toBe(hf.bosToken);
    expect(gg.eosToken).toBe(hf.eosToken);
    expect(gg.chatTemplate).toBe(hf.chatTemplate);
    const messages = [{ role: "user" as const, content: "Hi" }];
    expect(gg.applyChatTemplate(messages, { addGenerationPrompt: true })).toBe(hf.applyChatTemplate(messages, { addGenerationPrompt: true }));
  });

  test("the metadata the converter wrote", async () => {
    const g = await readGguf(gguf);
    const meta = new GgufMeta(gguf, g.metadata);
    expect(meta.str("tokenizer.ggml.model")).toBe("gpt2");
    expect(meta.str("tokenizer.ggml.pre")).toBe("smollm");
    const tokens = meta.arr("tokenizer.ggml.tokens", "string")!;
    const types = meta.arr("tokenizer.ggml.token_type", "number")!;
    expect(tokens).toHaveLength(49152);
    expect(tokens.slice(0, 3)).toEqual(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]);
    expect(types.slice(0, 17)).toEqual(new Array(17).fill(3));
    expect(types[17]).toBe(1);
    expect(meta.arr("tokenizer.ggml.merges", "string")!.slice(0, 2)).toEqual(["Ġ t", "Ġ a"]);
    expect(meta.int("tokenizer.ggml.bos_token_id")).toBe(1);
    expect(meta.int("tokenizer.ggml.eos_token_id")).toBe(2);
    expect(meta.int("tokenizer.ggml.padding_token_id")).toBe(2);
    expect(meta.bool("tokenizer.ggml.add_bos_token")).toBe(false);
  });
});

describe("other tokenizer.ggml forms", () => {
  /** A GGUF with only tokenizer metadata, rebuilt through the HF library. */
  async function tokenizerFrom(entries: [string, GgufEntry][]): Promise<Tokenizer> {
    const file = join(tempDir(), "tok.gguf");
    await writeGguf(file, { metadata: new Map(entries), tensors: [] });
    const g = await readGguf(file);
    return ggufTokenizer(new GgufMeta(file, g.metadata));
  }

  test("qwen2 and llama-bpe pre-tokenizers split as their HF regexes do", async () => {
    // Byte-level vocabulary: the 256 byte symbols, no merges, so ids show the pre-token boundaries through ordering only;
    // compare against the HF JSON built by hand instead.
    const bytes: string[] = [];
    const printable = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    let n = 0;
    for (let b = 0; b < 256; b++) bytes.push(String.fromCodePoint(printable(b) ? b : 256 + n++));
    for (const pre of ["qwen2", "llama-bpe", "gpt-2", "smollm"]) {
      const tok = await tokenizerFrom([
        ["tokenizer.ggml.model", { type: "string", value: "gpt2" }],
        ["tokenizer.ggml.pre", { type: "string", value: pre }],
        ["tokenizer.ggml.tokens", { type: "array", itemType: "string", value: [...bytes, "<s>"] }],
        ["tokenizer.ggml.token_type", { type: "array", itemType: "i32", value: [...new Array(256).fill(1), 3] }],
        ["tokenizer.ggml.merges", { type: "array", itemType: "string", value: [] }],
        ["tokenizer.ggml.bos_token_id", { type: "u32", value: 256 }],
      ]);
      const ids = tok.encode("Hi 12345 ok", { addSpecialTokens: false });
      expect(tok.decode(ids)).toBe("Hi 12345 ok");
      expect(ids).toHaveLength(11); // no merges: one id per byte
      // llama-bpe adds BOS by default, as llama.cpp does; the others do not
      expect(tok.encode("x")[0] === 256).toBe(pre === "llama-bpe");
    }
  });

  test("a SentencePiece (llama) vocabulary with scores and byte fallback", async () => {
    const tokens = ["<unk>", "<s>", "</s>"];
    for (let b = 0; b < 256; b++) tokens.push(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
    const pieces = ["▁", "H", "e", "l", "o", "w", "r", "d", "▁H", "ll", "▁He", "▁Hell", "▁Hello", "▁w", "or", "▁wor", "ld", "▁world"];
    const scores = [0, 0, 0, ...new Array(256).fill(0), ...pieces.map((_, i) => -i)];
    const types = [2, 3, 3, ...new Array(256).fill(6), ...pieces.map(() => 1)];
    const tok = await tokenizerFrom([
      ["tokenizer.ggml.model", { type: "string", value: "llama" }],
      ["tokenizer.ggml.tokens", { type: "array", itemType: "string", value: [...tokens, ...pieces] }],
      ["tokenizer.ggml.scores", { type: "array", itemType: "f32", value: scores }],
      ["tokenizer.ggml.token_type", { type: "array", itemType: "i32", value: types }],
      ["tokenizer.ggml.bos_token_id", { type: "u32", value: 1 }],
      ["tokenizer.ggml.eos_token_id", { type: "u32", value: 2 }],
      ["tokenizer.ggml.unknown_token_id", { type: "u32", value: 0 }],
    ]);
    const ids = tok.encode("Hello world");
    const id = (p: string) => tokens.length + pieces.indexOf(p);
    expect(ids).toEqual([1, id("▁Hello"), id("▁world")]);
    expect(tok.decode(ids, { skipSpecialTokens: true })).toBe("Hello world");
    const z = tok.encode("z", { addSpecialTokens: false }); // not in the vocabulary: bytes
    expect(z).toEqual([id("▁"), 3 + 0x7a]);
    expect(tok.decode(z)).toBe("z");
  });

  test("a SentencePiece piece longer than 1024 characters is refused at once (deriving its merges took minutes at 30000)", async () => {
    const long = "a".repeat(30000);
    const t0 = performance.now();
    await expect(
      tokenizerFrom([
        ["tokenizer.ggml.model", { type: "string", value: "llama" }],
        ["tokenizer.ggml.tokens", { type: "array", itemType: "string", value: ["<unk>", "a", "aa", long] }],
        ["tokenizer.ggml.scores", { type: "array", itemType: "f32", value: [0, 0, 0, 0] }],
      ]),
    ).rejects.toThrow(/tokenizer\.ggml\.tokens\[3\] is 30000 characters long; SentencePiece pieces of more than 1024 are not supported/);
    expect(performance.now() - t0).toBeLessThan(2000);
  });

  test("missing or unsupported tokenizer metadata is a FormatError", async () => {
    const file = join(tempDir(), "t.gguf");
    await writeGguf(file, { metadata: { "tokenizer.ggml.model": { type: "string", value: "bert" } }, tensors: [] });
    const meta = new GgufMeta(file, (await readGguf(file)).metadata);
    expect(() => ggufTokenizerJson(meta)).toThrow(FormatError);
    expect(() => ggufTokenizerJson(meta)).toThrow(/"bert" is not supported/);
    await writeGguf(file, {
      metadata: { "tokenizer.ggml.model": { type: "string", value: "gpt2" }, "tokenizer.ggml.pre": { type: "string", value: "deepseek-llm" }, "tokenizer.ggml.tokens": { type: "array", itemType: "string", value: ["a"] }, "tokenizer.ggml.merges": { type: "array", itemType: "string", value: [] } },
      tensors: [],
    });
    const meta2 = new GgufMeta(file, (await readGguf(file)).metadata);
    expect(() => ggufTokenizerJson(meta2)).toThrow(/tokenizer.ggml.pre "deepseek-llm" is not supported/);
  });
});
