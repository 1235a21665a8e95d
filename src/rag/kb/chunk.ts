// Chunking inside sections (a chunk never spans two headings or pages: the sections are parse.ts's).
//
// Strategy "sentence" (the default): a chunk of at most `chunkTokens` tokens ends where the text
// does, preferring, in order, the end of a paragraph (a blank line) once the chunk is half full,
// then the end of a sentence (`.`, `!`, `?` before white space; `。`, `！`, `？`, `…` anywhere, so
// Chinese and Japanese text without spaces splits too), then the end of a line, once the chunk is
// a quarter full; only a passage with none of these in reach is cut mid-sentence, at the token
// limit. The next chunk repeats whole sentences from the end of the one before, at most
// `overlapTokens` of them (none when the last sentence alone is longer; after a cut mid-sentence
// with no sentence start within reach, the last `overlapTokens` tokens, as the token strategy does). Strategy "tokens": plain windows of
// `chunkTokens` advancing by `chunkTokens - overlapTokens`, wherever they fall.
//
// Either way, a last piece adding fewer than `minTailTokens` new tokens joins the chunk before it
// instead of becoming a scrap chunk (so a chunk holds at most chunkTokens + minTailTokens - 1
// tokens). Every count is of the section's own tokens, so sizes are the model's; chunk text is a
// slice of the document text, so a chunk's character offsets point exactly at its source
// (citations rely on it).
import { DkiArgumentError } from "../../errors.js";
import type { Tokenizer } from "../../tokenizer/tokenizer.js";
import type { ParsedDocument } from "./parse.js";

export type ChunkTokenizer = Pick<Tokenizer, "encode" | "createStreamDecoder">;

export type ChunkStrategy = "sentence" | "tokens";
export const CHUNK_STRATEGIES: readonly ChunkStrategy[] = ["sentence", "tokens"];

export interface ChunkOptions {
  /** Tokens per chunk. Default 512. */
  chunkTokens?: number;
  /** Tokens shared by consecutive chunks of a section (at most; whole sentences where the text has them). Default 64. */
  overlapTokens?: number;
  /** A tail adding fewer new tokens than this joins the chunk before it. Default chunkTokens / 4. */
  minTailTokens?: number;
  /** Where chunks end: "sentence" (paragraph, then sentence, then line ends; the default) or "tokens" (plain windows). */
  strategy?: ChunkStrategy;
}

export interface TextChunk {
  /** Order in the document. */
  index: number;
  text: string;
  /** Character offsets in the document text, end exclusive. */
  start: number;
  end: number;
  tokenCount: number;
  headingPath: string[];
  page?: number;
}

export function resolveChunkOptions(o: ChunkOptions = {}): Required<ChunkOptions> {
  if (o === null || typeof o !== "object") throw new DkiArgumentError("chunk options must be an object");
  const chunkTokens = o.chunkTokens ?? 512;
  const overlapTokens = o.overlapTokens ?? 64;
  if (!Number.isInteger(chunkTokens) || chunkTokens < 8 || chunkTokens > 65536) throw new DkiArgumentError(`chunkTokens must be an integer from 8 to 65536, got ${chunkTokens}`);
  if (!Number.isInteger(overlapTokens) || overlapTokens < 0 || overlapTokens >= chunkTokens) throw new DkiArgumentError(`overlapTokens must be an integer from 0 to chunkTokens - 1 (${chunkTokens - 1}), got ${overlapTokens}`);
  const minTailTokens = o.minTailTokens ?? Math.floor(chunkTokens / 4);
  if (!Number.isInteger(minTailTokens) || minTailTokens < 0 || minTailTokens > chunkTokens) throw new DkiArgumentError(`minTailTokens must be an integer from 0 to chunkTokens, got ${minTailTokens}`);
  const strategy = o.strategy ?? "sentence";
  if (!CHUNK_STRATEGIES.includes(strategy)) throw new DkiArgumentError(`chunk strategy must be ${CHUNK_STRATEGIES.join(" or ")}, got ${JSON.stringify(strategy)}`);
  return { chunkTokens, overlapTokens, minTailTokens, strategy };
}

/**
 * Character offset of every token boundary of `text` (length ids + 1). The streaming decoder emits
 * each token's text as soon as its characters are complete, so a boundary inside a multi-byte
 * character lands before that character. If the tokenizer does not reproduce the text exactly (a
 * normalising one), offsets are spread proportionally: approximate, but still inside the text.
 */
function tokenBoundaries(tok: ChunkTokenizer, text: string, ids: number[]): number[] {
  const dec = tok.createStreamDecoder();
  const at = [0];
  let pos = 0;
  let decoded = "";
  for (const id of ids) {
    const piece = dec.push(id);
    decoded += piece;
    pos += piece.length;
    at.push(pos);
  }
  decoded += dec.flush();
  if (decoded === text) {
    at[at.length - 1] = text.length;
    return at;
  }
  return at.map((_, k) => Math.round((k / ids.length) * text.length));
}

/** How good a place to end a chunk is: the end of a paragraph, of a sentence, of a line. */
const PARAGRAPH = 3;
const SENTENCE = 2;
const LINE = 1;

// A sentence ends at Western punctuation followed by white space (so "3.5" and "e.g.x" do not end
// one), or at CJK punctuation wherever it stands (CJK text has no spaces); closing quotes and
// brackets after the punctuation stay with the sentence they close.
const SENTENCE_END = /(?:[.!?]+["'”’)\]]*(?=\s))|(?:[。！？…]+[”’」』）》"']*)/g;
// Paragraph and line ends are placed right after the last character of text, never inside a run of
// blank lines: a break there would let a chunk end past the one before with nothing new but
// white space.
const PARAGRAPH_END = /(?<=\S)[ \t]*\n[ \t]*\n/g;
const LINE_END = /(?<=\S)[ \t]*\n/g;

/**
 * The places in a text where a chunk may end, as character offsets with their kind (the best kind
 * where two coincide). Exported for tests.
 */
export function textBreaks(text: string): Map<number, number> {
  const out = new Map<number, number>();
  const mark = (re: RegExp, kind: number, atEnd: boolean) => {
    for (const m of text.matchAll(re)) {
      const p = atEnd ? m.index + m[0].length : m.index;
      if (p > 0 && p < text.length && (out.get(p) ?? 0) < kind) out.set(p, kind);
    }
  };
  mark(LINE_END, LINE, false);
  mark(SENTENCE_END, SENTENCE, true);
  mark(PARAGRAPH_END, PARAGRAPH, false);
  return out;
}

/** The first index k with at[k] >= p (at is non-decreasing). */
function lowerBound(at: number[], p: number): number {
  let lo = 0;
  let hi = at.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (at[mid] < p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Breaks as token indexes (each character break at the token boundary at or after it), sorted. */
function tokenBreaks(text: string, at: number[], n: number): { k: number; kind: number }[] {
  const byToken = new Map<number, number>();
  for (const [p, kind] of textBreaks(text)) {
    const k = lowerBound(at, p);
    if (k > 0 && k < n && (byToken.get(k) ?? 0) < kind) byToken.set(k, kind);
  }
  return [...byToken].map(([k, kind]) => ({ k, kind })).sort((a, b) => a.k - b.k);
}

/** Token windows [from, to) over a section of n tokens, by the options and the section's breaks. */
function windowsOf(tokens: number, breaks: { k: number; kind: number }[], o: Required<ChunkOptions>, blank: (k: number) => boolean): [number, number][] {
  const { chunkTokens, overlapTokens, minTailTokens } = o;
  // White space at the end of a section is no tail: it must not make a chunk of its own.
  let n = tokens;
  while (n > 1 && blank(n - 1)) n--;
  const windows: [number, number][] = [];
  // Index of the first break at or after token k (breaks are sorted): a search per chunk, so a
  // long document costs O(chunks · log breaks), not O(chunks · breaks).
  const firstAtOrAfter = (k: number): number => {
    let lo = 0;
    let hi = breaks.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (breaks[mid].k < k) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
  // The latest break of at least `kind` in [from + minFill, limit] and past `after` (the end of
  // the chunk before: a chunk that started in its overlap must still bring new text).
  const best = (from: number, limit: number, after: number, kind: number, minFill: number): number | undefined => {
    for (let i = firstAtOrAfter(limit + 1) - 1; i >= 0 && breaks[i].k - from >= minFill && breaks[i].k > after; i--) if (breaks[i].kind >= kind) return breaks[i].k;
    return undefined;
  };
  let prevEnd = 0;
  for (let from = 0; ; ) {
    // A chunk starts at its first word: the white space between paragraphs would only take room.
    while (from < n - 1 && blank(from)) from++;
    if (n - from <= chunkTokens) {
      windows.push([from, n]);
      break;
    }
    const limit = from + chunkTokens;
    const atBreak = best(from, limit, prevEnd, PARAGRAPH, Math.ceil(chunkTokens / 2)) ?? best(from, limit, prevEnd, SENTENCE, Math.ceil(chunkTokens / 4)) ?? best(from, limit, prevEnd, LINE, Math.ceil(chunkTokens / 4));
    const end = atBreak ?? limit;
    if (n - end < minTailTokens) {
      // The short tail joins this chunk: n - from < chunkTokens + minTailTokens.
      windows.push([from, n]);
      break;
    }
    windows.push([from, end]);
    prevEnd = end;
    // The overlap: from the first break in its reach (whole sentences); else, after a cut
    // mid-sentence, the last overlapTokens tokens; after a clean end with no break in reach, none.
    const reach = end - overlapTokens;
    const first = breaks[firstAtOrAfter(Math.max(reach, from + 1))];
    const start = overlapTokens === 0 || first === undefined || first.k >= end ? undefined : first.k;
    from = start ?? (atBreak === undefined ? Math.max(from + 1, reach) : end);
  }
  return windows;
}

/** Chunks every section of a parsed document. */
export function chunkDocument(tok: ChunkTokenizer, doc: ParsedDocument, options: ChunkOptions = {}): TextChunk[] {
  const o = resolveChunkOptions(options);
  const chunks: TextChunk[] = [];
  for (const s of doc.sections) {
    const text = doc.text.slice(s.start, s.end);
    if (text.trim() === "") continue;
    const ids = tok.encode(text, { addSpecialTokens: false });
    const at = tokenBoundaries(tok, text, ids);
    const breaks = o.strategy === "sentence" ? tokenBreaks(text, at, ids.length) : [];
    // The token strategy keeps its plain windows, white space and all.
    const blank = o.strategy === "sentence" ? (k: number) => text.slice(at[k], at[k + 1]).trim() === "" : () => false;
    for (const [from, to] of windowsOf(ids.length, breaks, o, blank)) {
      // Trim the whitespace a token boundary left at either end; offsets follow.
      let a = s.start + at[from];
      let b = s.start + at[to];
      while (a < b && /\s/.test(doc.text[a])) a++;
      while (b > a && /\s/.test(doc.text[b - 1])) b--;
      if (a === b) continue;
      chunks.push({ index: chunks.length, text: doc.text.slice(a, b), start: a, end: b, tokenCount: to - from, headingPath: s.headingPath, ...(s.page !== undefined ? { page: s.page } : {}) });
    }
  }
  return chunks;
}
