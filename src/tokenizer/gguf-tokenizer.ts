// The tokenizer embedded in a GGUF file (tokenizer.ggml.*) rebuilt as a Hugging Face
// tokenizer.json object, so the same @huggingface/tokenizers code runs it:
//  - "gpt2": byte-level BPE (tokens, merges), with the pre-tokenizer that tokenizer.ggml.pre
//    names (llama.cpp's names for the HF pre-tokenizers it has hard-coded);
//  - "llama": SentencePiece-style BPE over scores (merges derived as transformers' converter
//    does), "▁" for spaces, <0xNN> byte fallback.
// Token types: 3 (control) become special added tokens, 4 (user-defined) plain added tokens.
import { FormatError } from "../errors.js";
import type { GgufMeta } from "../formats/gguf.js";
import { Tokenizer } from "./tokenizer.js";

type Json = Record<string, unknown>;

export const TokenType = { NORMAL: 1, UNKNOWN: 2, CONTROL: 3, USER_DEFINED: 4, UNUSED: 5, BYTE: 6 } as const;

// Pre-tokenizer regexes as the HF tokenizer.json files of these families spell them.
const GPT2_REGEX = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const LLAMA3_REGEX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_REGEX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const byteLevel = (useRegex: boolean, trimOffsets = true): Json => ({ type: "ByteLevel", add_prefix_space: false, trim_offsets: trimOffsets, use_regex: useRegex });
const split = (regex: string): Json => ({ type: "Split", pattern: { Regex: regex }, behavior: "Isolated", invert: false });

interface PreTokenizerSpec {
  pre_tokenizer: Json | null;
  normalizer: Json | null;
  /** llama.cpp merges a word that is itself a token without running BPE on it (HF's ignore_merges). */
  ignoreMerges: boolean;
  /** llama.cpp's default for add_bos_token with this pre-tokenizer. */
  addBos: boolean;
}

/** tokenizer.ggml.pre values (llama.cpp's names) and the HF pre-tokenizers they stand for. */
const PRE_TOKENIZERS: Record<string, PreTokenizerSpec> = {
  // StarCoder / SmolLM: every digit alone, then the GPT-2 split.
  smollm: { pre_tokenizer: { type: "Sequence", pretokenizers: [{ type: "Digits", individual_digits: true }, byteLevel(true)] }, normalizer: null, ignoreMerges: false, addBos: false },
  starcoder: { pre_tokenizer: { type: "Sequence", pretokenizers: [{ type: "Digits", individual_digits: true }, byteLevel(true)] }, normalizer: null, ignoreMerges: false, addBos: false },
  "gpt-2": { pre_tokenizer: byteLevel(true), normalizer: null, ignoreMerges: false, addBos: false },
  default: { pre_tokenizer: byteLevel(true), normalizer: null, ignoreMerges: false, addBos: false },
  qwen2: { pre_tokenizer: { type: "Sequence", pretokenizers: [split(QWEN2_REGEX), byteLevel(false, false)] }, normalizer: { type: "NFC" }, ignoreMerges: false, addBos: false },
  "llama-bpe": { pre_tokenizer: { type: "Sequence", pretokenizers: [split(LLAMA3_REGEX), byteLevel(false)] }, normalizer: null, ignoreMerges: true, addBos: true },
};
PRE_TOKENIZERS.llama3 = PRE_TOKENIZERS["llama-v3"] = PRE_TOKENIZERS["llama-bpe"];

/** The tokenizer.ggml.pre names this module knows. */
export const GGUF_PRE_TOKENIZERS = Object.keys(PRE_TOKENIZERS);

/**
 * The tokenizer.ggml.pre name for a HF tokenizer.json's pre-tokenizer, or null when it is none
 * of the ones llama.cpp and this module share (the converter's choice).
 */
export function ggufPreForTokenizerJson(json: Json): string | null {
  const same = (a: unknown, b: unknown) => JSON.stringify(normalise(a)) === JSON.stringify(normalise(b));
  for (const name of ["smollm", "gpt-2", "qwen2", "llama-bpe"]) {
    if (same(json.pre_tokenizer, PRE_TOKENIZERS[name].pre_tokenizer)) return name;
  }
  return null;
}

/** Drops the fields that do not change token ids (trim_offsets) and sorts keys, for comparison. */
function normalise(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(normalise);
  if (typeof v !== "object" || v === null) return v;
  const out: Json = {};
  for (const k of Object.keys(v).sort()) if (k !== "trim_offsets") out[k] = normalise((v as Json)[k]);
  return out;
}

/** Builds a tokenizer.json object and the matching tokenizer_config-like object from GGUF metadata. */
export function ggufTokenizerJson(meta: GgufMeta): { json: Json; config: Json } {
  const fail = (msg: string): never => { throw new FormatError(meta.file, msg); };
  const model = meta.str("tokenizer.ggml.model") ?? fail("no tokenizer in this file (tokenizer.ggml.model is missing)");
  if (model !== "gpt2" && model !== "llama") fail(`tokenizer.ggml.model "${model}" is not supported (gpt2, llama)`);
  const tokens = meta.arr("tokenizer.ggml.tokens", "string") ?? fail("tokenizer.ggml.tokens is missing");
  const types = meta.arr("tokenizer.ggml.token_type", "number");
  if (types && types.length !== tokens.length) fail(`tokenizer.ggml.token_type has ${types.length} entries for ${tokens.length} tokens`);
  const typeOf = (i: number) => (types ? types[i] : TokenType.NORMAL);

  const id = (key: string): number | null => {
    if (!meta.has(key)) return null;
    const v = meta.int(key);
    if (v >= tokens.length) fail(`${key} ${v} is outside the vocabulary (0..${tokens.length - 1})`);
    return v;
  };
  const bos = id("tokenizer.ggml.bos_token_id");
  const eos = id("tokenizer.ggml.eos_token_id");
  const unk = id("tokenizer.ggml.unknown_token_id");
  const pad = id("tokenizer.ggml.padding_token_id");

  // Null prototype: a token spelled "__proto__" must be an ordinary key.
  const vocab: Record<string, number> = Object.create(null) as Record<string, number>;
  tokens.forEach((t, i) => {
    if (!(t in vocab)) vocab[t] = i;
  });
  const addedTokens: Json[] = [];
  tokens.forEach((t, i) => {
    const ty = typeOf(i);
    if (ty === TokenType.CONTROL || ty === TokenType.USER_DEFINED) {
      addedTokens.push({ id: i, content: t, single_word: false, lstrip: false, rstrip: false, normalized: false, special: ty === TokenType.CONTROL });
    }
  });

  let pre: PreTokenizerSpec;
  let modelJson: Json;
  let decoder: Json;
  let normalizer: Json | null;
  let addBosDefault: boolean;
  if (model === "gpt2") {
    const preName = meta.str("tokenizer.ggml.pre") ?? "default";
    pre = PRE_TOKENIZERS[preName] ?? fail(`tokenizer.ggml.pre "${preName}" is not supported (${GGUF_PRE_TOKENIZERS.join(", ")})`);
    const merges = meta.arr("tokenizer.ggml.merges", "string") ?? fail("tokenizer.ggml.merges is missing (needed by a gpt2 tokenizer)");
    modelJson = {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: pre.ignoreMerges, vocab, merges,
    };
    decoder = { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true };
    normalizer = pre.normalizer;
    addBosDefault = pre.addBos;
  } else if (model === "llama") {
    const scores = meta.arr("tokenizer.ggml.scores", "number") ?? fail("tokenizer.ggml.scores is missing (needed by a llama tokenizer)");
    if (scores.length !== tokens.length) fail(`tokenizer.ggml.scores has ${scores.length} entries for ${tokens.length} tokens`);
    const unkToken = unk !== null ? tokens[unk] : null;
    modelJson = {
      type: "BPE", dropout: null, unk_token: unkToken, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab, merges: spmMerges(tokens, scores, vocab, meta.file),
    };
    const addSpacePrefix = meta.bool("tokenizer.ggml.add_space_prefix") ?? true;
    normalizer = {
      type: "Sequence",
      normalizers: [...(addSpacePrefix ? [{ type: "Prepend", prepend: "▁" }] : []), { type: "Replace", pattern: { String: " " }, content: "▁" }],
    };
    decoder = {
      type: "Sequence",
      decoders: [
        { type: "Replace", pattern: { String: "▁" }, content: " " },
        { type: "ByteFallback" },
        { type: "Fuse" },
        ...(addSpacePrefix ? [{ type: "Strip", content: " ", start: 1, stop: 0 }] : []),
      ],
    };
    pre = { pre_tokenizer: null, normalizer, ignoreMerges: false, addBos: true };
    addBosDefault = true;
  } else {
    return fail(`tokenizer.ggml.model "${model}" is not supported (gpt2, llama)`);
  }

  const addBos = meta.bool("tokenizer.ggml.add_bos_token") ?? addBosDefault;
  const addEos = meta.bool("tokenizer.ggml.add_eos_token") ?? false;
  if (addBos && bos === null) fail("tokenizer.ggml.add_bos_token is set but there is no tokenizer.ggml.bos_token_id");
  if (addEos && eos === null) fail("tokenizer.ggml.add_eos_token is set but there is no tokenizer.ggml.eos_token_id");
  let postProcessor: Json | null = null;
  if (addBos || addEos) {
    const special = (i: number) => ({ SpecialToken: { id: tokens[i], type_id: 0 } });
    const seq = (s: string) => ({ Sequence: { id: s, type_id: 0 } });
    const around = (inner: Json[]) => [...(addBos ? [special(bos!)] : []), ...inner, ...(addEos ? [special(eos!)] : [])];
    const specialTokens: Json = {};
    for (const i of [...(addBos ? [bos!] : []), ...(addEos ? [eos!] : [])]) specialTokens[tokens[i]] = { id: tokens[i], ids: [i], tokens: [tokens[i]] };
    postProcessor = { type: "TemplateProcessing", single: around([seq("A")]), pair: [...around([seq("A")]), ...around([seq("B")])], special_tokens: specialTokens };
  }

  const json: Json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer,
    pre_tokenizer: pre.pre_tokenizer,
    post_processor: postProcessor,
    decoder,
    model: modelJson,
  };
  const config: Json = {
    bos_token: bos !== null ? tokens[bos] : undefined,
    eos_token: eos !== null ? tokens[eos] : undefined,
    unk_token: unk !== null ? tokens[unk] : undefined,
    pad_token: pad !== null ? tokens[pad] : undefined,
    add_bos_token: addBos,
    add_eos_token: addEos,
    chat_template: meta.str("tokenizer.chat_template") ?? undefined,
    clean_up_tokenization_spaces: false,
  };
  return { json, config };
}

const MAX_SPM_PIECE = 1024;

/**
 * BPE merges for a SentencePiece vocabulary from its scores, as transformers'
 * SentencePieceExtractor derives them: every split of a piece into two pieces of the vocabulary,
 * ordered by the score of the merged piece (highest first), ties by the pieces' ids.
 */
function spmMerges(tokens: string[], scores: number[], vocab: Record<string, number>, file: string): [string, string][] {
  // Splits are looked up only at lengths some piece has, and pieces are bounded, so a hostile
  // vocabulary cannot make this quadratic in a piece's length (a 30 KB file took minutes).
  const lengths = new Set<number>();
  tokens.forEach((piece, i) => {
    const n = [...piece].length;
    if (n > MAX_SPM_PIECE) throw new FormatError(file, `tokenizer.ggml.tokens[${i}] is ${n} characters long; SentencePiece pieces of more than ${MAX_SPM_PIECE} are not supported`);
    lengths.add(n);
  });
  const merges: { l: string; r: string; score: number }[] = [];
  tokens.forEach((piece, i) => {
    const chars = [...piece];
    const local: { l: string; r: string; score: number; il: number; ir: number }[] = [];
    for (let k = 1; k < chars.length; k++) {
      if (!lengths.has(k) || !lengths.has(chars.length - k)) continue;
      const l = chars.slice(0, k).join("");
      const r = chars.slice(k).join("");
      const il = vocab[l];
      const ir = vocab[r];
      if (il !== undefined && ir !== undefined) local.push({ l, r, score: scores[i], il, ir });
    }
    local.sort((a, b) => a.il - b.il || a.ir - b.ir);
    merges.push(...local);
  });
  merges.sort((a, b) => b.score - a.score);
  return merges.map((m) => [m.l, m.r]);
}

/** The GGUF file's tokenizer as a Tokenizer (BOS/EOS ids and chat template included). */
export function ggufTokenizer(meta: GgufMeta, extra: { bosTokenId?: number | null; eosTokenIds?: number[] } = {}): Tokenizer {
  const { json, config } = ggufTokenizerJson(meta);
  return Tokenizer.fromJson(json, meta.file, config, extra);
}
