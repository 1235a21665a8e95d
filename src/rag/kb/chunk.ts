// Token-based chunking with overlap, inside sections (a chunk never spans two headings or pages).
// Windows of `chunkTokens` tokens advance by `chunkTokens - overlapTokens`; a last window that
// would add fewer than `minTailTokens` new tokens is merged into the one before it instead of
// becoming a scrap chunk. Chunk text is a slice of the document text, so a chunk's character
// offsets point exactly at its source (citations rely on it).
import { DkiArgumentError } from "../../errors.js";
import type { Tokenizer } from "../../tokenizer/tokenizer.js";
import type { ParsedDocument } from "./parse.js";

export type ChunkTokenizer = Pick<Tokenizer, "encode" | "createStreamDecoder">;

export interface ChunkOptions {
  /** Tokens per chunk. Default 512. */
  chunkTokens?: number;
  /** Tokens shared by consecutive chunks of a section. Default 64. */
  overlapTokens?: number;
  /** A tail adding fewer new tokens than this joins the chunk before it. Default chunkTokens / 4. */
  minTailTokens?: number;
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
  const chunkTokens = o.chunkTokens ?? 512;
  const overlapTokens = o.overlapTokens ?? 64;
  if (!Number.isInteger(chunkTokens) || chunkTokens < 8 || chunkTokens > 65536) throw new DkiArgumentError(`chunkTokens must be an integer from 8 to 65536, got ${chunkTokens}`);
  if (!Number.isInteger(overlapTokens) || overlapTokens < 0 || overlapTokens >= chunkTokens) throw new DkiArgumentError(`overlapTokens must be an integer from 0 to chunkTokens - 1 (${chunkTokens - 1}), got ${overlapTokens}`);
  const minTailTokens = o.minTailTokens ?? Math.floor(chunkTokens / 4);
  if (!Number.isInteger(minTailTokens) || minTailTokens < 0 || minTailTokens > chunkTokens) throw new DkiArgumentError(`minTailTokens must be an integer from 0 to chunkTokens, got ${minTailTokens}`);
  return { chunkTokens, overlapTokens, minTailTokens };
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

/** Chunks every section of a parsed document. */
export function chunkDocument(tok: ChunkTokenizer, doc: ParsedDocument, options: ChunkOptions = {}): TextChunk[] {
  const { chunkTokens, overlapTokens, minTailTokens } = resolveChunkOptions(options);
  const step = chunkTokens - overlapTokens;
  const chunks: TextChunk[] = [];
  for (const s of doc.sections) {
    const text = doc.text.slice(s.start, s.end);
    if (text.trim() === "") continue;
    const ids = tok.encode(text, { addSpecialTokens: false });
    const at = tokenBoundaries(tok, text, ids);
    const windows: [number, number][] = [];
    for (let from = 0; from < ids.length; from += step) {
      const to = Math.min(from + chunkTokens, ids.length);
      const prevEnd = windows.length > 0 ? windows[windows.length - 1][1] : 0;
      if (windows.length > 0 && to - prevEnd < minTailTokens) {
        windows[windows.length - 1][1] = to;
      } else {
        windows.push([from, to]);
      }
      if (to === ids.length) break;
    }
    for (const [from, to] of windows) {
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
