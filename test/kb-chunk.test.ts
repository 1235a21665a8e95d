// Sentence-aware chunking (the default strategy) on the real SmolLM2 tokenizer: chunks end at
// paragraph, then sentence ends (CJK ones too), overlap by whole sentences, merge a short tail,
// never cross a section; and, over random documents, the invariants every chunking keeps.
import { beforeAll, describe, expect, test } from "vitest";
import { chunkDocument, textBreaks, type ChunkOptions } from "../src/rag/kb/chunk.js";
import { parseDocument, type ParsedDocument } from "../src/rag/kb/parse.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { prng } from "./support/prng.js";
import { smollm2Tokenizer } from "./support/paths.js";

let tok: Tokenizer;
beforeAll(async () => {
  tok = await Tokenizer.fromFolder(smollm2Tokenizer);
});

const enc = (s: string) => new Uint8Array(Buffer.from(s, "utf8"));
const count = (s: string) => tok.encode(s, { addSpecialTokens: false }).length;
const TOPICS = ["the harbour", "winter trains", "a vegetarian cafe", "the city library", "mountain weather", "the night market"];
const sentence = (r: () => number, i: number) => `Sentence ${i} is about ${TOPICS[Math.floor(r() * TOPICS.length)]} and ${Math.floor(r() * 900) + 100} other things.`;

/** Every invariant a chunking of any text keeps. */
function checkInvariants(doc: ParsedDocument, chunks: ReturnType<typeof chunkDocument>, o: Required<Pick<ChunkOptions, "chunkTokens" | "minTailTokens">>): void {
  const covered = new Uint8Array(doc.text.length);
  chunks.forEach((c, i) => {
    expect(c.index).toBe(i);
    expect(doc.text.slice(c.start, c.end)).toBe(c.text);
    expect(c.text).toBe(c.text.trim());
    // Inside one section, with its heading path.
    const sec = doc.sections.find((s) => c.start >= s.start && c.end <= s.end);
    expect(sec, `chunk ${i} crosses a section`).toBeDefined();
    expect(c.headingPath).toEqual(sec!.headingPath);
    expect(c.tokenCount).toBeLessThanOrEqual(o.chunkTokens + Math.max(0, o.minTailTokens - 1));
    covered.fill(1, c.start, c.end);
    // Each chunk moves on: it starts no earlier and ends no earlier than the one before, and is
    // not the same span. Ending at the same character happens only when a cut at the token limit
    // adds nothing but a white-space token (with an overlap of nearly a whole chunk): never at a
    // paragraph or sentence end.
    const prev = chunks[i - 1];
    if (prev !== undefined && prev.headingPath.join(">") === c.headingPath.join(">") && prev.page === c.page) {
      expect(c.start, `chunk ${i} starts before chunk ${i - 1}`).toBeGreaterThanOrEqual(prev.start);
      expect(c.end, `chunk ${i} ends before chunk ${i - 1}`).toBeGreaterThanOrEqual(prev.end);
      expect(c.start > prev.start || c.end > prev.end, `chunk ${i} repeats chunk ${i - 1}`).toBe(true);
      if (c.end === prev.end) expect(c.tokenCount, `chunk ${i} adds nothing to chunk ${i - 1}, yet is no cut at the limit`).toBe(o.chunkTokens);
    }
  });
  // Every character outside the chunks is white space: nothing is lost between chunks.
  for (let p = 0; p < doc.text.length; p++) if (!covered[p]) expect(/\s/.test(doc.text[p]), `character ${p} ${JSON.stringify(doc.text[p])} in no chunk`).toBe(true);
}

describe("sentence-aware chunking", () => {
  test("chunks end at sentence ends, start at sentence starts, and overlap by whole sentences within overlapTokens", async () => {
    const r = prng(7);
    const text = Array.from({ length: 12 }, (_, p) => Array.from({ length: 4 }, (_, s) => sentence(r, p * 4 + s)).join(" ")).join("\n\n");
    const doc = await parseDocument(enc(text), "text", "prose.txt");
    const o = { chunkTokens: 64, overlapTokens: 20, minTailTokens: 16 };
    const chunks = chunkDocument(tok, doc, o);
    expect(chunks.length).toBeGreaterThan(5);
    checkInvariants(doc, chunks, o);
    let overlapping = 0;
    for (const [i, c] of chunks.entries()) {
      expect(c.text, `chunk ${i}`).toMatch(/^Sentence \d+ .*things\.$/s);
      if (i === 0) continue;
      const prev = chunks[i - 1];
      if (c.start < prev.end) {
        overlapping++;
        const shared = doc.text.slice(c.start, prev.end);
        // Whole sentences of the chunk before, no more than the overlap allows.
        expect(shared).toMatch(/^Sentence \d+ .*things\.$/s);
        expect(count(shared)).toBeLessThanOrEqual(o.overlapTokens + 2);
      } else {
        expect(doc.text.slice(prev.end, c.start).trim()).toBe("");
      }
    }
    expect(overlapping).toBeGreaterThan(0);
  });

  test("a paragraph end is preferred to a later sentence end once the chunk is half full", async () => {
    const r = prng(3);
    const para = (from: number) => Array.from({ length: 3 }, (_, s) => sentence(r, from + s)).join(" ");
    const a = para(0);
    const b = para(3);
    const doc = await parseDocument(enc(`${a}\n\n${b}\n\n${para(6)}`), "text", "p.txt");
    const n = count(a);
    const o = { chunkTokens: n + 25, overlapTokens: 0, minTailTokens: 0 };
    expect(n).toBeGreaterThan(o.chunkTokens / 2);
    const chunks = chunkDocument(tok, doc, o);
    // The first paragraph alone, though a sentence of the second would fit too.
    expect(chunks[0].text).toBe(a);
    expect(chunks[1].text).toBe(b);
  });

  test("CJK text without spaces splits at 。！？; no chunk cuts a character", async () => {
    const zh = ["北京是中国的首都，有很多素食餐厅。", "上海的地铁很方便吗？", "今天的天气真好！", "图书馆晚上九点关门……"];
    const text = Array.from({ length: 40 }, (_, i) => zh[i % zh.length]).join("");
    const doc = await parseDocument(enc(text), "text", "zh.txt");
    const o = { chunkTokens: 48, overlapTokens: 0, minTailTokens: 0 };
    const chunks = chunkDocument(tok, doc, o);
    expect(chunks.length).toBeGreaterThan(3);
    checkInvariants(doc, chunks, o);
    for (const c of chunks) {
      expect(c.text).not.toContain("\uFFFD");
      expect(c.text).toMatch(/[。？！…]$/);
      expect(zh.some((s) => c.text.startsWith(s))).toBe(true);
    }
    expect([...textBreaks("他来了。好！真的？是的…… 3.5 euros. Next")].map(([p]) => p)).toEqual([4, 6, 9, 13, 24]);
  });

  test("a short last sentence joins the chunk before it; a sentence longer than a chunk is cut at the limit", async () => {
    const r = prng(11);
    const body = Array.from({ length: 8 }, (_, i) => sentence(r, i)).join(" ");
    const doc = await parseDocument(enc(`${body} Ok.`), "text", "tail.txt");
    const o = { chunkTokens: 40, overlapTokens: 0, minTailTokens: 10 };
    const chunks = chunkDocument(tok, doc, o);
    checkInvariants(doc, chunks, o);
    expect(chunks[chunks.length - 1].text.endsWith("things. Ok.")).toBe(true);
    expect(chunks.some((c) => c.text === "Ok.")).toBe(false);
    // No sentence end in reach: the token limit, and a token overlap (the sentence goes on).
    const long = Array.from({ length: 120 }, (_, i) => `word${i}`).join(" ");
    const cut = chunkDocument(tok, await parseDocument(enc(long), "text", "long.txt"), { chunkTokens: 50, overlapTokens: 10 });
    expect(cut[0].tokenCount).toBe(50);
    expect(cut[1].start).toBeLessThan(cut[0].end);
  });

  test("the token strategy keeps plain windows; a bad strategy is refused by name", async () => {
    const r = prng(5);
    const text = Array.from({ length: 20 }, (_, i) => sentence(r, i)).join(" ");
    const doc = await parseDocument(enc(text), "text", "t.txt");
    const windows = chunkDocument(tok, doc, { chunkTokens: 50, overlapTokens: 10, strategy: "tokens" });
    expect(windows.slice(0, -1).every((c) => c.tokenCount === 50)).toBe(true);
    expect(windows.slice(0, -1).some((c) => !c.text.endsWith("."))).toBe(true);
    expect(() => chunkDocument(tok, doc, { strategy: "words" as never })).toThrow(/chunk strategy must be sentence or tokens, got "words"/);
  });

  test("random documents (Markdown with headings, paragraphs, lists, CJK, long runs): every invariant holds", async () => {
    for (let seed = 1; seed <= 150; seed++) {
      const r = prng(seed);
      const parts: string[] = [];
      for (let s = 0; s < 1 + Math.floor(r() * 4); s++) {
        parts.push(`${"#".repeat(1 + Math.floor(r() * 3))} Heading ${s}`);
        for (let p = 0; p < 1 + Math.floor(r() * 4); p++) {
          const kind = r();
          if (kind < 0.5) parts.push(Array.from({ length: 1 + Math.floor(r() * 6) }, (_, i) => sentence(r, i)).join(r() < 0.8 ? " " : "\n"));
          else if (kind < 0.7) parts.push(Array.from({ length: 1 + Math.floor(r() * 8) }, (_, i) => `- item ${i} ${TOPICS[i % TOPICS.length]}`).join("\n"));
          else if (kind < 0.85) parts.push("素食餐厅在朝阳区。地铁很方便！".repeat(1 + Math.floor(r() * 10)));
          else parts.push(Array.from({ length: 20 + Math.floor(r() * 200) }, (_, i) => `run${i}`).join(" "));
        }
      }
      const doc = await parseDocument(enc(parts.join("\n\n")), "markdown", `r${seed}.md`);
      const chunkTokens = 8 + Math.floor(r() * 120);
      const o = { chunkTokens, overlapTokens: Math.floor(r() * chunkTokens), minTailTokens: Math.floor(r() * chunkTokens) };
      checkInvariants(doc, chunkDocument(tok, doc, o), o);
    }
  });
});
