// Citations: an answer's [n] markers mapped back to the numbered context blocks of its prompt.
import { describe, expect, test } from "vitest";
import { contextBlock, extractCitations, sourceLabel, type CitationSource } from "../src/rag/citations.js";

const src = (i: number, extra: Partial<CitationSource> = {}): CitationSource => ({ chunkId: `c${i}`, docId: `doc${i}.md`, collection: "kb", start: i * 100, end: i * 100 + 80, headingPath: [], ...extra });

describe("citations", () => {
  test("markers, lists and ranges map to their sources with every occurrence; unknown numbers are reported", () => {
    const sources = [src(1), src(2), src(3)];
    const answer = "Vacation is 25 days [1]. It carries over [1][3], see [2, 3] and [1-2]; not [7] nor [0] nor [1990-2020] nor [a].";
    const m = extractCitations(answer, sources);
    expect(m.citations.map((c) => c.marker)).toEqual([1, 3, 2]);
    const one = m.citations.find((c) => c.marker === 1)!;
    expect(one.source).toBe(sources[0]);
    expect(one.occurrences.map((o) => answer.slice(o.start, o.end))).toEqual(["[1]", "[1]", "[1-2]"]);
    expect(m.citations.find((c) => c.marker === 3)!.occurrences.map((o) => answer.slice(o.start, o.end))).toEqual(["[3]", "[2, 3]"]);
    expect(m.unknownMarkers).toEqual([0, 7]);
    expect(extractCitations("no markers here", sources)).toEqual({ citations: [], unknownMarkers: [] });
  });

  test("a block names its document, heading path and page", () => {
    expect(sourceLabel(src(1, { headingPath: ["Guide", "Install"] }))).toBe("doc1.md › Guide › Install");
    expect(sourceLabel(src(2, { title: "Q3 Report", page: 4 }))).toBe("Q3 Report, p. 4");
    expect(contextBlock("Revenue grew.", src(2, { title: "Q3 Report", page: 4 }))).toBe("(source: Q3 Report, p. 4) Revenue grew.");
  });
});
