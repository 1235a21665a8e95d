// A dependency-free embedder: signed feature hashing of lexical features, for when no ONNX
// sentence model is at hand (and as a fast baseline). It matches words and their spelling
// variants, not meanings: "car" and "automobile" share nothing.
//
// Features of a text (all from the same normalisation as BM25, see text-terms.ts):
//   u:  each term (Latin words, Chinese words, single Han characters, kana/Hangul bigrams)
//   b:  word bigrams: consecutive terms, leaving out the single Han characters
//   c:  CJK character bigrams inside each run of Han characters
//   g:  character 3- to 5-grams of each non-CJK word wrapped as "<word>" (fastText style), so
//       "embedding" and "embeddings" share most of their features
//   s:  only when a text has no terms at all: its non-space characters (so "🙂" still embeds)
// Each feature's value is (1 + ln tf) × a fixed weight per feature type (below), hashed into
// `dim` buckets with a sign, and the vector is L2-normalised.
//
// Why fixed weights instead of an idf fitted on the stored memories: a stored vector must stay
// comparable with every later query vector. An idf that learns from each new memory would change
// the weighting of queries but not of the vectors already in the index (recomputing them all on
// every insert is not an option), so old and new vectors would drift apart silently. The fixed
// weights play idf's part coarsely: stop words and single characters count less, rarer
// combinations (bigrams) count more than a lone n-gram. Anything that changes the vectors must
// change `id` (its "v1"), so a store can tell that its vectors need re-embedding.
import { DkiArgumentError } from "../../errors.js";
import type { Embedder } from "../types.js";
import { STOP_WORDS, terms } from "../text-terms.js";
import { checkTexts, unitVector } from "./common.js";

export interface HashingEmbedderOptions {
  /** Number of hash buckets = vector length. Default 512. */
  dim?: number;
}

const DEFAULT_DIM = 512;
const MIN_DIM = 16;
const MAX_DIM = 1 << 20;

/** Weight of one feature of each type before sublinear tf; fixed forever for "v1". */
const WEIGHT = {
  term: 1.0,
  stopWord: 0.25,
  hanChar: 0.5, // the words of a Chinese run are terms too; its characters back them up
  wordBigram: 0.8,
  cjkBigram: 0.7,
  charNgram: 0.3, // a word has many of them
  symbol: 1.0,
} as const;

/**
 * Gating's τ for "hashing-v1" vectors of the default 512 dimensions: calibrateRelevance
 * (src/memory/calibrate.ts) on the calibration half of test/support/memory-corpus.json (55
 * memories; 29 questions a memory answers, 25 off-topic queries, English and Chinese) puts the
 * cut at 0.1622, the midpoint of the gap between the highest off-topic score let out (0.158) and
 * the lowest relevant one let in (0.166); kept to three decimals so τ stays mid-gap. Lexical
 * hashing scores a paraphrase far lower than a sentence model does (a relevant question's best
 * memory has a median cosine near 0.31 here, an off-topic query's near 0.12), hence a τ well below
 * a sentence model's. test/relevance-calibration.test.ts recomputes it: changing the features or
 * their weights changes the scores, so it means recalibrating (bench/calibrate-relevance.js) and
 * a new `id` version. Other dimensions collide differently (the same corpus gives 0.31 at 128 and
 * 0.17 at 1024), so they are left uncalibrated.
 */
export const HASHING_RELEVANCE_THRESHOLD = 0.162;

/** Texts embedded between event-loop yields, so a large batch does not stall other work. */
const YIELD_EVERY = 64;

const HAN_RUN = /\p{Script=Han}+/gu;
const HAN_CHAR = /^\p{Script=Han}$/u;
const CJK_CHAR = /[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}]/u;

/** 32-bit FNV-1a of the UTF-8 bytes of `s` (offset basis 0x811c9dc5, prime 0x01000193). */
export function fnv1a32(s: string): number {
  let h = 0x811c9dc5;
  const byte = (b: number) => {
    h ^= b;
    h = Math.imul(h, 0x01000193);
  };
  // UTF-8 encoded inline: hashing is the hot loop, and TextEncoder allocates per call.
  // A lone surrogate (only possible in the "s:" fallback) is encoded like any BMP code point.
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    if (c < 0x80) byte(c);
    else if (c < 0x800) {
      byte(0xc0 | (c >> 6));
      byte(0x80 | (c & 63));
    } else if (c < 0x10000) {
      byte(0xe0 | (c >> 12));
      byte(0x80 | ((c >> 6) & 63));
      byte(0x80 | (c & 63));
    } else {
      byte(0xf0 | (c >> 18));
      byte(0x80 | ((c >> 12) & 63));
      byte(0x80 | ((c >> 6) & 63));
      byte(0x80 | (c & 63));
    }
  }
  return h >>> 0;
}

/** murmur3's 32-bit finaliser: a bijection whose every output bit depends on every input bit. */
function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * Deterministic lexical embedder (see the head of this file). `embed` returns unit vectors; an
 * empty or whitespace-only text is a DkiArgumentError naming its index, since no vector could
 * stand for it honestly and a zero vector would poison cosine search. Batches yield to the
 * event loop every 64 texts; one text is hashed in one go (≈0.7 ms per 1000 characters here, so
 * a 5 MB text holds the loop for seconds: chunk documents first, as the knowledge base does).
 */
export class HashingEmbedder implements Embedder {
  readonly id: string;
  readonly dim: number;
  /** HASHING_RELEVANCE_THRESHOLD at the default 512 dimensions; undefined (not calibrated) at any other. */
  readonly relevanceThreshold: number | undefined;

  constructor(options: HashingEmbedderOptions = {}) {
    const dim = options.dim ?? DEFAULT_DIM;
    if (!Number.isInteger(dim) || dim < MIN_DIM || dim > MAX_DIM) {
      throw new DkiArgumentError(`HashingEmbedder: dim must be an integer from ${MIN_DIM} to ${MAX_DIM}, got ${dim}`);
    }
    this.dim = dim;
    this.id = `hashing-v1-d${dim}`;
    this.relevanceThreshold = dim === DEFAULT_DIM ? HASHING_RELEVANCE_THRESHOLD : undefined;
  }

  async embed(texts: string[]): Promise<Float32Array[]> {
    checkTexts("HashingEmbedder", texts);
    const out: Float32Array[] = [];
    for (let i = 0; i < texts.length; i++) {
      if (i > 0 && i % YIELD_EVERY === 0) await new Promise<void>((resolve) => setImmediate(resolve));
      out.push(this.embedOne(texts[i]));
    }
    return out;
  }

  private embedOne(text: string): Float32Array {
    const features = featureWeights(text);
    const acc = new Float64Array(this.dim);
    for (const [key, { tf, weight }] of features) {
      const h = fnv1a32(key);
      // Bucket from the low bits' residue, sign from a bit of the remixed hash: independent
      // enough that two colliding features cancel as often as they add up.
      const sign = fmix32(h) & 1 ? -1 : 1;
      acc[h % this.dim] += sign * (1 + Math.log(tf)) * weight;
    }
    // Every feature cancelling out exactly is possible in principle (opposite signs in one
    // bucket): the zero vector is then honest.
    return unitVector(acc);
  }
}

interface Feature {
  tf: number;
  weight: number;
}

/** The text's features, by key ("u:word", …), with their term frequency and type weight. */
function featureWeights(text: string): Map<string, Feature> {
  const features = new Map<string, Feature>();
  const add = (key: string, weight: number) => {
    const f = features.get(key);
    if (f) f.tf++;
    else features.set(key, { tf: 1, weight });
  };

  const ts = terms(text);
  const words: string[] = [];
  for (const t of ts) {
    const hanChar = HAN_CHAR.test(t);
    add(`u:${t}`, hanChar ? WEIGHT.hanChar : STOP_WORDS.has(t) ? WEIGHT.stopWord : WEIGHT.term);
    if (hanChar) continue;
    words.push(t);
    if (!CJK_CHAR.test(t)) {
      const chars = Array.from(`<${t}>`);
      for (let n = 3; n <= 5; n++) {
        for (let i = 0; i + n <= chars.length; i++) add(`g:${chars.slice(i, i + n).join("")}`, WEIGHT.charNgram);
      }
    }
  }
  for (let i = 0; i + 1 < words.length; i++) add(`b:${words[i]} ${words[i + 1]}`, WEIGHT.wordBigram);

  const normal = text.normalize("NFKC").toLowerCase();
  for (const [run] of normal.matchAll(HAN_RUN)) {
    const chars = Array.from(run);
    for (let i = 0; i + 1 < chars.length; i++) add(`c:${chars[i]}${chars[i + 1]}`, WEIGHT.cjkBigram);
  }

  if (ts.length === 0) for (const ch of normal) if (ch.trim() !== "") add(`s:${ch}`, WEIGHT.symbol);
  return features;
}
