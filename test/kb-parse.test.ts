// Knowledge-base parsing and chunking: the parsers on real files of each type (a PDF built here
// byte by byte with a correct xref table), and chunking's invariants on the real SmolLM2 tokenizer.
import { beforeAll, describe, expect, test } from "vitest";
import { chunkDocument } from "../src/rag/kb/chunk.js";
import { docTypeOf, htmlToText, markdownSections, parseDocument } from "../src/rag/kb/parse.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { smollm2Tokenizer } from "./support/paths.js";
import { makePdf } from "./support/pdf.js";
import { makeDocx } from "./support/docx.js";

let tok: Tokenizer;
beforeAll(async () => {
  tok = await Tokenizer.fromFolder(smollm2Tokenizer);
});

const enc = (s: string) => new Uint8Array(Buffer.from(s, "utf8"));

describe("parsers", () => {
  test("file types by extension; an unsupported one is named with the supported list", () => {
    expect(docTypeOf("a/b/Notes.MD")).toBe("markdown");
    expect(docTypeOf("x.htm")).toBe("html");
    expect(docTypeOf("x.pdf")).toBe("pdf");
    expect(docTypeOf("x.txt")).toBe("text");
    expect(docTypeOf("report.docx")).toBe("docx");
    expect(docTypeOf("a.csv")).toBe("csv");
    expect(docTypeOf("a.py")).toBe("code");
    expect(() => docTypeOf("report.odt")).toThrow(/report\.odt: unsupported document type "\.odt"; supported: .*\.md/);
    expect(() => docTypeOf("Makefile")).toThrow(/\(no extension\)/);
  });

  test("PDF: text of each page, in order, with page sections and the title", async () => {
    const pdf = makePdf([["Chapter one (intro)", "The quick brown fox."], ["Second page: jumps over", "the lazy dog."]], "Fox Report");
    const d = await parseDocument(pdf, "pdf", "fox.pdf");
    expect(d.title).toBe("Fox Report");
    expect(d.sections.map((s) => s.page)).toEqual([1, 2]);
    const p1 = d.text.slice(d.sections[0].start, d.sections[0].end);
    const p2 = d.text.slice(d.sections[1].start, d.sections[1].end);
    expect(p1.replace(/\s+/g, " ")).toBe("Chapter one (intro) The quick brown fox.");
    expect(p2.replace(/\s+/g, " ")).toBe("Second page: jumps over the lazy dog.");
  });

  test("PDF that fails to parse, and one with no text, are errors naming the file", async () => {
    const good = makePdf([["hello"]]);
    const corrupt = good.slice(0, 40);
    await expect(parseDocument(corrupt, "pdf", "broken.pdf")).rejects.toThrow(/broken\.pdf: is not a readable PDF/);
    await expect(parseDocument(enc("this is not a pdf at all"), "pdf", "fake.pdf")).rejects.toThrow(/fake\.pdf: is not a readable PDF/);
    await expect(parseDocument(makePdf([[]]), "pdf", "blank.pdf")).rejects.toThrow(/blank\.pdf: has no extractable text/);
  });

  test("text: empty, whitespace-only and binary files are refused by name", async () => {
    await expect(parseDocument(new Uint8Array(0), "text", "e.txt")).rejects.toThrow(/e\.txt: is empty/);
    await expect(parseDocument(enc(" \n\t\n"), "markdown", "w.md")).rejects.toThrow(/w\.md: has no text/);
    await expect(parseDocument(new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0xff, 0xfe]), "text", "img.txt")).rejects.toThrow(/img\.txt: is not UTF-8 text/);
    await expect(parseDocument(enc("abc\u0000def"), "text", "nul.txt")).rejects.toThrow(/nul\.txt: holds NUL bytes/);
    const d = await parseDocument(enc("\uFEFFhello"), "text", "bom.txt");
    expect(d.text).toBe("hello");
  });

  test("Markdown: heading paths (ATX and setext), none from inside code fences", () => {
    const md = "intro line\n\n# Guide\ntext a\n## Install\nrun it\n```\n# not a heading\n```\n### Linux\napt\n## Use\nUsage\n-----\nmore\n# Other\nend\n";
    const s = markdownSections(md);
    const view = s.map((x) => [x.headingPath.join(" > "), md.slice(x.start, x.end).split("\n")[0]]);
    expect(view).toEqual([
      ["", "intro line"],
      ["Guide", "# Guide"],
      ["Guide > Install", "## Install"],
      ["Guide > Install > Linux", "### Linux"],
      ["Guide > Use", "## Use"],
      ["Guide > Usage", "Usage"], // a setext "---" heading is level 2: it closes "Use",
      ["Other", "# Other"],
    ]);
    expect(s[s.length - 1].end).toBe(md.length);
  });

  test("HTML: scripts and styles dropped, blocks as paragraphs, headings as sections", () => {
    const html = `<html><head><title>Cafe guide</title><style>p{color:red}</style></head><body>
      <script>var secret = 1;</script>
      <h1>Beijing</h1><p>Vegetarian   places in <b>Chaoyang</b>.</p>
      <h2>Budget</h2><ul><li>100 yuan</li><li>200 yuan</li></ul>
      <p>line one<br>line two</p></body></html>`;
    const r = htmlToText(html);
    expect(r.title).toBe("Cafe guide");
    expect(r.text).not.toMatch(/secret|color/);
    expect(r.text).toBe("Beijing\n\nVegetarian places in Chaoyang.\n\nBudget\n\n100 yuan\n\n200 yuan\n\nline one\nline two");
    expect(r.sections.map((x) => x.headingPath)).toEqual([["Beijing"], ["Beijing", "Budget"]]);
    expect(r.text.slice(r.sections[1].start, r.sections[1].start + 6)).toBe("Budget");
  });
});

describe("documents converted to Markdown, structure kept", () => {
  const sectionsOf = (d: { text: string; sections: { start: number; end: number; headingPath: string[] }[] }) => d.sections.map((s) => s.headingPath.join(" > "));

  test("DOCX: Word's heading styles become headings and sections, paragraphs stay, a table becomes a pipe table", async () => {
    const docx = await makeDocx([
      { heading: 1, text: "Handbook" },
      { text: "Intro text." },
      { heading: 2, text: "Leave" },
      { text: "Twenty days a year." },
      { table: [["Kind", "Days"], ["Sick", "10"], ["Parental | paid", "90"]] },
    ]);
    const d = await parseDocument(docx, "docx", "handbook.docx");
    expect(d.text).toBe("# Handbook\n\nIntro text.\n\n## Leave\n\nTwenty days a year.\n\n| Kind | Days |\n| --- | --- |\n| Sick | 10 |\n| Parental \\| paid | 90 |");
    expect(sectionsOf(d)).toEqual(["Handbook", "Handbook > Leave"]);
    await expect(parseDocument(enc("PK not a zip"), "docx", "bad.docx")).rejects.toThrow(/bad\.docx: is not a readable DOCX/);
  });

  test("CSV and TSV: RFC 4180 fields (quoted delimiters, newlines, doubled quotes) in pipe tables of 50 rows, each under its own heading with the header repeated", async () => {
    const d = await parseDocument(enc('name,city,note\r\nAda,London,"likes ""tea"", biscuits"\nBo,"New\nYork",\n'), "csv", "people.csv");
    expect(d.text).toBe('## Rows 1–2\n\n| name | city | note |\n| --- | --- | --- |\n| Ada | London | likes "tea", biscuits |\n| Bo | New York |  |');
    const rows = Array.from({ length: 120 }, (_, i) => `${i}\tv${i}`).join("\n");
    const t = await parseDocument(enc(`id\tvalue\n${rows}\n`), "tsv", "big.tsv");
    expect(sectionsOf(t)).toEqual(["Rows 1–50", "Rows 51–100", "Rows 101–120"]);
    for (const s of t.sections) expect(t.text.slice(s.start, s.end)).toContain("| id | value |");
    await expect(parseDocument(enc('a,b\n1,"open\n2,3\n'), "csv", "x.csv")).rejects.toThrow(/x\.csv: line 2: a quoted field is never closed/);
  });

  test("JSON: a heading per nested key path, scalars as key: value, scalar arrays as items; invalid JSON named", async () => {
    const d = await parseDocument(enc(JSON.stringify({ title: "Cabin", wifi: { ssid: "lake", password: "maple-42" }, rooms: ["kitchen", "loft"], owners: [{ name: "Ana" }] })), "json", "cabin.json");
    expect(d.text).toBe("title: Cabin\n\n# wifi\n\nssid: lake\npassword: maple-42\n\n# rooms\n\nrooms:\n\n- kitchen\n\n- loft\n\n# owners\n\n## owners › [0]\n\nname: Ana");
    expect(sectionsOf(d)).toEqual(["", "wifi", "rooms", "owners", "owners > owners › [0]"]);
    await expect(parseDocument(enc('{"a": 1,}'), "json", "bad.json")).rejects.toThrow(/bad\.json: is not valid JSON: /);
  });

  test("XML: elements with children as headings, leaves as name: text with attributes; a malformed file is refused", async () => {
    const d = await parseDocument(enc('<?xml version="1.0"?><config version="2"><server><host>127.0.0.1</host><port unit="tcp">8080</port></server><owner>Ana</owner></config>'), "xml", "config.xml");
    expect(d.text).toBe("# config\n\n@version: 2\n\n## server\n\nhost: 127.0.0.1\n\nport: 8080 (@unit: tcp)\n\nowner: Ana");
    expect(sectionsOf(d)).toEqual(["config", "config > server"]);
    await expect(parseDocument(enc("<a><b></a>"), "xml", "bad.xml")).rejects.toThrow(/bad\.xml: is not well-formed XML: line 1, column \d+: /);
  });

  test("source code: a section per top-level definition, fenced with its language; a fence longer than any backtick run in the code", async () => {
    const py = 'import os\n\ndef load(path):\n    return open(path).read()\n\nclass Cache:\n    ## not a heading\n    pass\n';
    const d = await parseDocument(enc(py), "code", "cache.py");
    expect(d.text).toBe("## (top of file)\n\n```python\nimport os\n```\n\n## load\n\n```python\ndef load(path):\n    return open(path).read()\n```\n\n## Cache\n\n```python\nclass Cache:\n    ## not a heading\n    pass\n```");
    expect(sectionsOf(d)).toEqual(["(top of file)", "load", "Cache"]);
    const ts = "export async function f() {\n  return `a ``` b`;\n}\n";
    expect((await parseDocument(enc(ts), "code", "f.ts")).text).toBe("## f\n\n````typescript\nexport async function f() {\n  return `a ``` b`;\n}\n````");
  });
});

describe("chunking (SmolLM2 tokenizer)", () => {
  const words = (n: number, tag: string) => Array.from({ length: n }, (_, i) => `${tag}${i}`).join(" ");

  test("token strategy: windows of 512 tokens overlapping by 64; offsets point at the chunk text; the whole text is covered", async () => {
    const text = words(1500, "w") + "\n\n" + "北京是中国的首都，有很多素食餐厅。".repeat(60);
    const doc = await parseDocument(enc(text), "text", "long.txt");
    // Plain windows, wherever they fall (the sentence strategy's own invariants: kb-chunk.test.ts).
    const chunks = chunkDocument(tok, doc, { strategy: "tokens" });
    expect(chunks.length).toBeGreaterThan(3);
    for (const c of chunks) {
      expect(doc.text.slice(c.start, c.end)).toBe(c.text);
      expect(c.tokenCount).toBeLessThanOrEqual(512 + 128);
      // The token count is the slice's own, within the few tokens that re-tokenising a cut can move.
      expect(Math.abs(tok.encode(c.text, { addSpecialTokens: false }).length - c.tokenCount)).toBeLessThanOrEqual(3);
    }
    for (let i = 1; i < chunks.length; i++) {
      expect(chunks[i].start).toBeLessThan(chunks[i - 1].end); // overlap
      const shared = tok.encode(doc.text.slice(chunks[i].start, chunks[i - 1].end), { addSpecialTokens: false }).length;
      expect(shared).toBeGreaterThanOrEqual(60);
      expect(shared).toBeLessThanOrEqual(68);
    }
    expect(chunks[0].start).toBe(0);
    expect(chunks[chunks.length - 1].end).toBe(doc.text.length);
    // No chunk cuts a Chinese character in half (a slice would hold U+FFFD otherwise).
    expect(chunks.some((c) => c.text.includes("\uFFFD"))).toBe(false);
  });

  test("a short tail merges into the chunk before it", async () => {
    const t = words(2000, "x");
    const n = tok.encode(t, { addSpecialTokens: false }).length;
    const doc = await parseDocument(enc(t), "text", "t.txt");
    const opts = { chunkTokens: 100, overlapTokens: 10 };
    const chunks = chunkDocument(tok, doc, opts);
    const last = chunks[chunks.length - 1];
    const prev = chunks[chunks.length - 2];
    const newInLast = n - (chunks.length - 1) * 90;
    // Either the tail was big enough to stand alone, or it was merged (the last chunk is longer than 100).
    if (newInLast < 25 + 10) expect(last.tokenCount).toBeGreaterThan(100);
    expect(last.tokenCount - 10).toBeGreaterThanOrEqual(25 - 10);
    expect(prev.tokenCount).toBe(100);
    // A text whose tail is 5 tokens: merged, so there is no 15-token chunk.
    const exact = tok.decode(tok.encode(t, { addSpecialTokens: false }).slice(0, 90 * 3 + 10 + 5));
    const c2 = chunkDocument(tok, await parseDocument(enc(exact), "text", "e.txt"), opts);
    expect(c2.map((c) => c.tokenCount)).toEqual([100, 100, 105]);
  });

  test("Markdown chunks carry their heading path and never span two sections", async () => {
    const md = `# Guide\n${words(300, "g")}\n## Install\n${words(30, "i")}\n## Use\n${words(200, "u")}\n`;
    const doc = await parseDocument(enc(md), "markdown", "g.md");
    const chunks = chunkDocument(tok, doc, { chunkTokens: 128, overlapTokens: 16 });
    for (const c of chunks) {
      const sec = doc.sections.find((s) => c.start >= s.start && c.end <= s.end);
      expect(sec).toBeDefined();
      expect(c.headingPath).toEqual(sec!.headingPath);
    }
    expect(new Set(chunks.map((c) => c.headingPath.join(">")))).toEqual(new Set(["Guide", "Guide>Install", "Guide>Use"]));
  });

  test("bad chunk settings are refused by name", async () => {
    const doc = await parseDocument(enc("hello"), "text", "h.txt");
    expect(() => chunkDocument(tok, doc, { chunkTokens: 4 })).toThrow(/chunkTokens must be/);
    expect(() => chunkDocument(tok, doc, { chunkTokens: 64, overlapTokens: 64 })).toThrow(/overlapTokens must be/);
  });
});
