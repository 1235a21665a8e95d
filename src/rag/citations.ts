// Answers with citations: the prompt numbers its context blocks [1]..[n] (prompt-builder.ts's
// contextLine), each block names its source, and the answer's markers are mapped back to the
// chunk, document and character offsets they refer to.

/** Where a context block came from. */
export interface CitationSource {
  chunkId: string;
  docId: string;
  collection: string;
  /** Character offsets of the chunk in its document's text, end exclusive. */
  start: number;
  end: number;
  headingPath: string[];
  page?: number;
  title?: string;
}

export interface Citation<S = CitationSource> {
  /** The number in the answer, 1-based, as in the prompt. */
  marker: number;
  source: S;
  /** Character offsets of every occurrence of the marker in the answer. */
  occurrences: { start: number; end: number }[];
}

export interface CitationMap<S = CitationSource> {
  /** Each cited block once, in order of first appearance in the answer. */
  citations: Citation<S>[];
  /** Marker numbers in the answer that name no block (a model inventing sources shows here). */
  unknownMarkers: number[];
}

/** "doc › Heading › Sub, p. 3": what a reader needs to find the passage. */
export function sourceLabel(s: CitationSource): string {
  const where = [s.title ?? s.docId, ...s.headingPath].join(" › ");
  return s.page !== undefined ? `${where}, p. ${s.page}` : where;
}

/** A context block's text for the prompt: its source, then the passage. */
export function contextBlock(text: string, s: CitationSource): string {
  return `(source: ${sourceLabel(s)}) ${text}`;
}

// "[1]", "[2, 3]", "[1-3]", "[1–3]" (a range). Numbers only: "[a]" or "[see 1]" are not markers.
const MARKER = /\[(\d{1,4}(?:\s*(?:,|-|–)\s*\d{1,4})*)\]/g;

/** Maps the markers of an answer to the sources of the context blocks that were in the prompt. */
export function extractCitations<S>(answer: string, sources: readonly S[]): CitationMap<S> {
  const byMarker = new Map<number, Citation<S>>();
  const unknown = new Set<number>();
  for (const m of answer.matchAll(MARKER)) {
    const numbers: number[] = [];
    for (const part of m[1].split(/\s*,\s*/)) {
      const range = /^(\d+)\s*[-–]\s*(\d+)$/.exec(part);
      if (range) {
        const [a, b] = [Number(range[1]), Number(range[2])];
        // A range wider than the sources is not a citation range (e.g. "[1990-2020]").
        if (b < a || b - a > sources.length) continue;
        for (let k = a; k <= b; k++) numbers.push(k);
      } else numbers.push(Number(part));
    }
    const at = { start: m.index, end: m.index + m[0].length };
    for (const k of numbers) {
      const source = sources[k - 1];
      if (k < 1 || source === undefined) {
        unknown.add(k);
        continue;
      }
      const c = byMarker.get(k);
      if (c) c.occurrences.push(at);
      else byMarker.set(k, { marker: k, source, occurrences: [at] });
    }
  }
  return { citations: [...byMarker.values()], unknownMarkers: [...unknown].sort((a, b) => a - b) };
}
