// What an answer's citations are worth (seed 001): a confidence per citation, the sentences that
// no context block supports (unsupported claims, the visible part of a hallucination), and the
// answer rendered with its citations as markdown, html, plain text or inline source names.
//
// Confidence of citation [n] = 0.4 · similarity + 0.4 · position + 0.2 · coverage, each in [0, 1]:
//   similarity  the block's retrieval score (a chunk's fused hybrid score, a memory's routing score)
//   position    1 − (n − 1) / blocks: the retrieval ranked earlier blocks higher, so they are trusted more
//   coverage    the share of the citing sentences' content terms found in the block (the best
//               sentence when the marker appears in several)
// Lexical on purpose: it needs no model call, and a reader can check every part of it.
//
// Unsupported claims: sentences of at least MIN_CLAIM_TERMS content terms whose best coverage by
// any block is below the threshold (default 0.5). Short sentences ("Yes.", "I hope this helps.")
// claim nothing checkable and are skipped.
import { DkiArgumentError } from "../../errors.js";
import { STOP_WORDS, terms } from "../../memory/text-terms.js";
import type { CitationMap } from "../citations.js";
import { termCoverage } from "./rerank.js";

export const CONFIDENCE_WEIGHTS = Object.freeze({ similarity: 0.4, position: 0.4, coverage: 0.2 });
const MIN_CLAIM_TERMS = 3;

export interface ScoredCitation {
  marker: number;
  confidence: number;
  similarity: number;
  position: number;
  coverage: number;
}

export interface UnsupportedClaim {
  sentence: string;
  start: number;
  end: number;
  /** The best coverage of its terms by any block, and which block (1-based; 0: none). */
  bestCoverage: number;
  bestBlock: number;
}

/** A context block as the scorer reads it: its text and retrieval score. */
export interface ScoredBlock {
  text: string;
  score: number;
}

/** Sentences with their offsets: split after . ! ? 。！？ followed by space or the end. */
export function sentences(text: string): { sentence: string; start: number; end: number }[] {
  const out: { sentence: string; start: number; end: number }[] = [];
  const re = /[^.!?。！？]+(?:[.!?。！？]+(?:\s*\[[\d\s,–-]+\])?|$)/g;
  for (const m of text.matchAll(re)) {
    const raw = m[0];
    const lead = raw.length - raw.trimStart().length;
    const s = raw.trim();
    if (s !== "") out.push({ sentence: s, start: m.index + lead, end: m.index + lead + s.length });
  }
  return out;
}

const withoutMarkers = (s: string) => s.replace(/\[[\d\s,–-]+\]/g, " ");

export function citationConfidence<S>(answer: string, map: CitationMap<S>, blocks: readonly ScoredBlock[]): ScoredCitation[] {
  const sents = sentences(answer);
  return map.citations.map((c) => {
    const block = blocks[c.marker - 1];
    if (block === undefined) throw new DkiArgumentError(`citation [${c.marker}] names no block of the ${blocks.length} given`);
    const citing = sents.filter((s) => c.occurrences.some((o) => o.start >= s.start && o.start < s.end));
    const coverage = Math.max(0, ...citing.map((s) => termCoverage(withoutMarkers(s.sentence), block.text)));
    const similarity = Math.min(1, Math.max(0, block.score));
    const position = blocks.length <= 1 ? 1 : 1 - (c.marker - 1) / blocks.length;
    const confidence = CONFIDENCE_WEIGHTS.similarity * similarity + CONFIDENCE_WEIGHTS.position * position + CONFIDENCE_WEIGHTS.coverage * coverage;
    return { marker: c.marker, confidence, similarity, position, coverage };
  });
}

export function unsupportedClaims(answer: string, blocks: readonly ScoredBlock[], threshold = 0.5): UnsupportedClaim[] {
  if (!(threshold >= 0 && threshold <= 1)) throw new DkiArgumentError(`the unsupported-claim threshold must be in [0, 1], got ${String(threshold)}`);
  const out: UnsupportedClaim[] = [];
  for (const s of sentences(answer)) {
    const text = withoutMarkers(s.sentence);
    if (new Set(terms(text).filter((t) => !STOP_WORDS.has(t))).size < MIN_CLAIM_TERMS) continue;
    let best = 0;
    let bestBlock = 0;
    blocks.forEach((b, i) => {
      const c = termCoverage(text, b.text);
      if (c > best) [best, bestBlock] = [c, i + 1];
    });
    if (best < threshold) out.push({ ...s, bestCoverage: best, bestBlock });
  }
  return out;
}

export type CitationFormat = "markdown" | "html" | "plain" | "inline";
export const CITATION_FORMATS: readonly CitationFormat[] = ["markdown", "html", "plain", "inline"];

const escapeHtml = (s: string) => s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!);

/**
 * The answer with its citations in a format: markdown (markers link to a numbered source list),
 * html (escaped text, markers as superscript links, an ordered list of sources), plain (markers kept,
 * a "Sources:" list) or inline (each marker replaced by its source's name in parentheses). Only
 * the cited blocks are listed; markers that name no block are left as they are.
 */
export function formatCitations<S>(answer: string, map: CitationMap<S>, label: (s: S) => string, format: CitationFormat): string {
  if (!CITATION_FORMATS.includes(format)) throw new DkiArgumentError(`citation format must be one of ${CITATION_FORMATS.join(", ")}, got ${JSON.stringify(format)}`);
  // Every marker occurrence once, rewritten from the end so earlier offsets stay valid.
  const spans = new Map<number, { end: number; markers: number[] }>();
  for (const c of map.citations) {
    for (const o of c.occurrences) {
      const e = spans.get(o.start) ?? { end: o.end, markers: [] };
      e.markers.push(c.marker);
      spans.set(o.start, e);
    }
  }
  const byMarker = new Map(map.citations.map((c) => [c.marker, c]));
  const render = (markers: number[]): string => {
    const ms = [...markers].sort((a, b) => a - b);
    switch (format) {
      case "markdown":
        return ms.map((m) => `[[${m}]](#source-${m})`).join("");
      case "html":
        return ms.map((m) => `<sup><a href="#source-${m}">[${m}]</a></sup>`).join("");
      case "plain":
        return `[${ms.join(", ")}]`;
      case "inline":
        return `(${ms.map((m) => label(byMarker.get(m)!.source)).join("; ")})`;
    }
  };
  let out = "";
  let at = 0;
  for (const [start, { end, markers }] of [...spans].sort((a, b) => a[0] - b[0])) {
    const between = answer.slice(at, start);
    out += (format === "html" ? escapeHtml(between) : between) + render(markers);
    at = end;
  }
  const tail = answer.slice(at);
  out += format === "html" ? escapeHtml(tail) : tail;
  const cited = [...map.citations].sort((a, b) => a.marker - b.marker);
  if (format === "inline" || cited.length === 0) return out;
  if (format === "markdown") return `${out}\n\n${cited.map((c) => `<a id="source-${c.marker}"></a>${c.marker}. ${label(c.source)}`).join("\n")}`;
  if (format === "html") return `<p>${out}</p>\n<ol>${cited.map((c) => `<li id="source-${c.marker}" value="${c.marker}">${escapeHtml(label(c.source))}</li>`).join("")}</ol>`;
  return `${out}\n\nSources:\n${cited.map((c) => `[${c.marker}] ${label(c.source)}`).join("\n")}`;
}
