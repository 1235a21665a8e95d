// Text → index terms, shared by BM25 and the hashing embedder so a query and a stored memory are
// always cut the same way. Scripts written without spaces get special handling:
//   - Chinese (Han) runs are segmented into words by jieba (search mode: the words of a run, then
//     every Han character of it as a term of its own), so "北京" in a query still scores against
//     "北京市" in a memory, which jieba keeps as one word.
//   - Japanese kana and Korean Hangul runs become overlapping character bigrams (the standard
//     CJK-bigram approach of Lucene and Elasticsearch); a one-character run is kept as it is.
//     Japanese kanji are Han, so they go through jieba's Chinese dictionary: imperfect words, but
//     the single-character terms still match.
//   - Everything else that is a letter, digit or combining mark forms words split on anything that
//     is not, e.g. "e-mail" → "e", "mail".
// No stop words are dropped: BM25's idf already gives "the" almost no weight, and dropping words
// breaks queries made of them ("the who", "to be or not to be"). Consumers that want to down-weight
// them (the hashing embedder) can use STOP_WORDS.
import { createRequire } from "node:module";
import type { Jieba } from "@node-rs/jieba";

/** Common English function words, for consumers that weight them down; `terms` keeps them. */
export const STOP_WORDS: ReadonlySet<string> = new Set(
  ("a an and are as at be been but by can could did do does for from had has have he her his i if in into is it its " +
    "me my no not of on or our she so than that the their them then there these they this to was we were what when " +
    "where which who whom why will with would you your").split(" "),
);

const CJK = String.raw`\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}`;
// A word character that is not CJK (those have their own branches).
const W = String.raw`(?:(?![${CJK}])[\p{L}\p{N}\p{M}])`;
/**
 * One match per run. Branch order matters: a number with a decimal point ("3.14", "1,000") is one
 * term; a word may hold apostrophes between letters ("don't", "o'neill"); the prolonged-sound mark
 * ー (U+30FC, script Common) belongs to katakana words.
 */
const RUN = new RegExp(
  String.raw`(\p{Script=Han}+)|([\p{Script=Hiragana}\p{Script=Katakana}ー]+)|(\p{Script=Hangul}+)|(\p{N}+(?:[.,]\p{N}+)+)|(${W}+(?:'${W}+)*)`,
  "gu",
);

// NFKC leaves these curly and modifier apostrophes alone; folding them makes "don’t" equal "don't".
const APOSTROPHES = /[\u2018\u2019\u02BC\u2032]/g;

let jieba: Jieba | null = null;

/** jieba with its bundled dictionary, built on first Chinese text (≈150 ms, ≈5 MB dictionary). */
function segmenter(): Jieba {
  if (jieba === null) {
    // require: the dictionary module reads its files when imported, so it is loaded only when needed.
    const require = createRequire(import.meta.url);
    const { Jieba: JiebaClass } = require("@node-rs/jieba") as typeof import("@node-rs/jieba");
    const { dict } = require("@node-rs/jieba/dict") as { dict: Uint8Array };
    jieba = JiebaClass.withDict(dict);
  }
  return jieba;
}

/** Overlapping character bigrams of a run; a one-character run is returned as it is. */
function bigrams(chars: string[], out: string[]): void {
  if (chars.length === 1) out.push(chars[0]);
  for (let i = 0; i + 1 < chars.length; i++) out.push(chars[i] + chars[i + 1]);
}

/**
 * The terms of a text, in order and with repeats (BM25 counts term frequency): NFKC-normalised,
 * lower-cased, CJK-aware (see the head of this file). English possessives lose their "'s"
 * ("user's" → "user"). Returns [] for a text without letters or digits.
 */
export function terms(text: string): string[] {
  if (typeof text !== "string") throw new TypeError(`terms: expected a string, got ${typeof text}`);
  const normal = text.normalize("NFKC").toLowerCase().replace(APOSTROPHES, "'");
  const out: string[] = [];
  for (const m of normal.matchAll(RUN)) {
    const [, han, kana, hangul, number, word] = m;
    if (han !== undefined) {
      // Search mode also yields the shorter words inside a long one ("今天天气" → "今天", "天气",
      // "今天天气"). HMM on: jieba also joins unknown words (names) from character statistics;
      // it is deterministic, so a query and a memory are still cut the same way.
      for (const w of segmenter().cutForSearch(han, true)) if (Array.from(w).length > 1) out.push(w);
      out.push(...Array.from(han));
    } else if (kana !== undefined || hangul !== undefined) {
      bigrams(Array.from(kana ?? hangul), out);
    } else if (number !== undefined) {
      out.push(number);
    } else if (word !== undefined) {
      out.push(word.endsWith("'s") ? word.slice(0, -2) : word);
    }
  }
  return out;
}
