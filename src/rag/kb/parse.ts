// Documents → text with sections. Plain text and Markdown are read as they are (offsets point into
// the file itself); HTML goes through cheerio (block elements become paragraphs, scripts and styles
// are dropped); PDF through pdfjs-dist (text items per page); DOCX, CSV/TSV, JSON, XML and source
// code are converted to Markdown with their structure kept (to-markdown.ts) and read as Markdown.
// A section is a span of the text with its heading path (Markdown and HTML headings) or page
// number (PDF): chunks never cross one.
import { extname } from "node:path";
import { load } from "cheerio";
import { DkiArgumentError, FormatError } from "../../errors.js";
import { decodeUtf8 } from "../../util/utf8.js";
import { CODE_LANGUAGES, codeToMarkdown, delimitedToMarkdown, docxToMarkdown, jsonToMarkdown, xmlToMarkdown } from "./to-markdown.js";

export type DocType = "text" | "markdown" | "html" | "pdf" | "docx" | "csv" | "tsv" | "json" | "xml" | "code";
export const DOC_TYPES: readonly DocType[] = ["text", "markdown", "html", "pdf", "docx", "csv", "tsv", "json", "xml", "code"];

export interface Section {
  start: number;
  end: number;
  headingPath: string[];
  /** 1-based page number (PDF). */
  page?: number;
}

export interface ParsedDocument {
  docType: DocType;
  text: string;
  title?: string;
  sections: Section[];
  /** Characters read as U+FFFD because the bytes there were not UTF-8 (only with replaceInvalidUtf8). */
  invalidUtf8?: number;
}

const EXTENSIONS: Readonly<Record<string, DocType>> = {
  ".txt": "text",
  ".text": "text",
  ".md": "markdown",
  ".markdown": "markdown",
  ".html": "html",
  ".htm": "html",
  ".xhtml": "html",
  ".pdf": "pdf",
  ".docx": "docx",
  ".csv": "csv",
  ".tsv": "tsv",
  ".json": "json",
  ".xml": "xml",
  ...Object.fromEntries(Object.keys(CODE_LANGUAGES).map((ext) => [ext, "code" as const])),
};

/** Whether a file name has an extension ingestion reads (what a folder's walk takes). */
export function isSupportedFile(name: string): boolean {
  return EXTENSIONS[extname(name).toLowerCase()] !== undefined;
}

/** The document type of a file name, or an error naming the extension and the supported ones. */
export function docTypeOf(name: string): DocType {
  const ext = extname(name).toLowerCase();
  const t = EXTENSIONS[ext];
  if (t === undefined) {
    throw new DkiArgumentError(`${name}: unsupported document type ${ext === "" ? "(no extension)" : JSON.stringify(ext)}; supported: ${Object.keys(EXTENSIONS).join(", ")}`);
  }
  return t;
}

/**
 * UTF-8 text of a file (a leading BOM kept out), refusing binary content: NUL bytes, and bytes
 * that are not UTF-8 unless `replace` reads them as U+FFFD (counted, so the caller can say so).
 */
function decodeText(bytes: Uint8Array, name: string, replace: boolean): { text: string; replaced: number } {
  const { text, replaced } = decodeUtf8(bytes);
  if (replaced > 0 && !replace) {
    throw new FormatError(name, `is not UTF-8 text: ${replaced} byte sequence${replaced === 1 ? " is" : "s are"} not UTF-8 (a binary file? replaceInvalidUtf8, CLI --replace-invalid-utf8, reads them as U+FFFD)`);
  }
  if (text.includes("\u0000")) throw new FormatError(name, "holds NUL bytes: a binary file, not text");
  return { text, replaced };
}

function whole(text: string): Section[] {
  return [{ start: 0, end: text.length, headingPath: [] }];
}

/**
 * Markdown sections by ATX (`## Title`) and setext (`Title` over `===`/`---`) headings, outside
 * fenced code blocks. Each section starts at its heading line, so the heading is in its chunks.
 */
export function markdownSections(text: string): Section[] {
  const lines: { start: number; text: string }[] = [];
  for (let pos = 0; pos <= text.length; ) {
    const nl = text.indexOf("\n", pos);
    const end = nl === -1 ? text.length : nl;
    lines.push({ start: pos, text: text.slice(pos, end).replace(/\r$/, "") });
    if (nl === -1) break;
    pos = nl + 1;
  }
  const heads: { start: number; level: number; title: string }[] = [];
  let fence: string | null = null;
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i].text;
    const f = /^ {0,3}(`{3,}|~{3,})/.exec(l);
    if (f) {
      if (fence === null) fence = f[1][0];
      else if (f[1][0] === fence) fence = null;
      continue;
    }
    if (fence !== null) continue;
    const atx = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/.exec(l);
    if (atx) {
      heads.push({ start: lines[i].start, level: atx[1].length, title: (atx[2] ?? "").trim() });
      continue;
    }
    const next = lines[i + 1]?.text;
    if (next !== undefined && l.trim() !== "" && /^ {0,3}(=+|-+)[ \t]*$/.test(next) && !/^ {0,3}([-*+]|\d+[.)])[ \t]/.test(l)) {
      heads.push({ start: lines[i].start, level: next.trim()[0] === "=" ? 1 : 2, title: l.trim() });
      i++;
    }
  }
  const sections: Section[] = [];
  const path: { level: number; title: string }[] = [];
  if (heads.length === 0 || heads[0].start > 0) sections.push({ start: 0, end: heads[0]?.start ?? text.length, headingPath: [] });
  heads.forEach((h, k) => {
    while (path.length > 0 && path[path.length - 1].level >= h.level) path.pop();
    path.push(h);
    sections.push({ start: h.start, end: heads[k + 1]?.start ?? text.length, headingPath: path.map((p) => p.title) });
  });
  return sections.filter((s) => text.slice(s.start, s.end).trim() !== "");
}

/** The parts of a DOM node that the walk reads (cheerio's nodes, typed structurally). */
interface DomNode {
  type: string;
  name?: string;
  data?: string;
  children?: DomNode[];
}

const BLOCK = new Set([
  "address", "article", "aside", "blockquote", "dd", "details", "dialog", "div", "dl", "dt", "fieldset", "figcaption", "figure",
  "footer", "form", "header", "hr", "li", "main", "nav", "ol", "p", "pre", "section", "summary", "table", "tr", "ul", "caption",
]);
const SKIP = new Set(["script", "style", "noscript", "template", "svg", "head", "iframe", "object", "canvas"]);

/** HTML → paragraphs of text; h1-h6 open sections with their heading path. */
export function htmlToText(html: string): { text: string; title?: string; sections: Section[] } {
  const $ = load(html);
  const title = $("title").first().text().trim() || undefined;
  let text = "";
  let pendingBreak = "";
  const heads: { start: number; level: number; title: string }[] = [];
  const emit = (s: string, pre: boolean): void => {
    let t = pre ? s : s.replace(/\s+/g, " ");
    // Collapsed whitespace: no space to open a paragraph or to follow another.
    if (!pre && (pendingBreak !== "" || text === "" || /[ \n]$/.test(text))) t = t.replace(/^ /, "");
    if (t === "") return;
    if (pendingBreak !== "" && text !== "") text += pendingBreak;
    pendingBreak = "";
    text += t;
  };
  const walk = (n: DomNode, pre: boolean): void => {
    if (n.type === "text") return emit(n.data ?? "", pre);
    if (n.type !== "tag" && n.type !== "root" && n.type !== "script" && n.type !== "style") return;
    const name = (n.name ?? "").toLowerCase();
    if (SKIP.has(name) || n.type === "script" || n.type === "style") return;
    if (name === "br") {
      pendingBreak = pendingBreak === "" ? "\n" : pendingBreak;
      return;
    }
    const h = /^h([1-6])$/.exec(name);
    const block = h !== null || BLOCK.has(name);
    if (block) {
      text = text.replace(/ +$/, "");
      pendingBreak = "\n\n";
    }
    if (h) heads.push({ start: -1, level: Number(h[1]), title: "" });
    const head = h ? heads[heads.length - 1] : null;
    const before = text.length + (text === "" ? 0 : pendingBreak.length);
    for (const c of n.children ?? []) walk(c, pre || name === "pre");
    if (head) {
      head.start = before;
      head.title = text.slice(Math.min(before, text.length)).trim();
    }
    if (block) {
      text = text.replace(/ +$/, "");
      pendingBreak = "\n\n";
    }
  };
  for (const root of $.root().get() as unknown as DomNode[]) walk(root, false);
  text = text.trim();
  const valid = heads.filter((h) => h.title !== "" && h.start >= 0 && h.start < text.length);
  const sections: Section[] = [];
  const path: { level: number; title: string }[] = [];
  if (valid.length === 0 || valid[0].start > 0) sections.push({ start: 0, end: valid[0]?.start ?? text.length, headingPath: [] });
  valid.forEach((h, k) => {
    while (path.length > 0 && path[path.length - 1].level >= h.level) path.pop();
    path.push(h);
    sections.push({ start: h.start, end: valid[k + 1]?.start ?? text.length, headingPath: path.map((p) => p.title) });
  });
  return { text, title, sections: sections.filter((s) => text.slice(s.start, s.end).trim() !== "") };
}

/** Text of every page of a PDF (pdfjs-dist), pages as sections. */
async function pdfToText(bytes: Uint8Array, name: string): Promise<{ text: string; title?: string; sections: Section[] }> {
  const pdfjs = await import("pdfjs-dist/legacy/build/pdf.mjs");
  // pdfjs takes ownership of (and detaches) the buffer it is given: hand it a copy.
  const task = pdfjs.getDocument({ data: new Uint8Array(bytes), isEvalSupported: false, useSystemFonts: false, disableFontFace: true, verbosity: 0, stopAtErrors: true });
  let doc: Awaited<typeof task.promise>;
  try {
    doc = await task.promise;
  } catch (e) {
    await task.destroy();
    throw new FormatError(name, `is not a readable PDF: ${e instanceof Error ? e.message : String(e)}`);
  }
  try {
    let text = "";
    const sections: Section[] = [];
    for (let p = 1; p <= doc.numPages; p++) {
      let pageText = "";
      try {
        const content = await (await doc.getPage(p)).getTextContent();
        for (const item of content.items) {
          if (!("str" in item)) continue;
          pageText += item.str + (item.hasEOL ? "\n" : "");
        }
      } catch (e) {
        throw new FormatError(name, `page ${p} of ${doc.numPages} cannot be read: ${e instanceof Error ? e.message : String(e)}`);
      }
      pageText = pageText.replace(/[ \t]+\n/g, "\n").trim();
      if (pageText === "") continue;
      if (text !== "") text += "\n\n";
      sections.push({ start: text.length, end: text.length + pageText.length, headingPath: [], page: p });
      text += pageText;
    }
    let title: string | undefined;
    try {
      const meta = await doc.getMetadata();
      const info = meta.info as { Title?: unknown } | undefined;
      if (typeof info?.Title === "string" && info.Title.trim() !== "") title = info.Title.trim();
    } catch {
      // A PDF without readable metadata still has its text.
    }
    return { text, title, sections };
  } finally {
    await doc.destroy();
  }
}

/** Parses a document's bytes. Every failure names the document. */
export async function parseDocument(bytes: Uint8Array, docType: DocType, name: string, o: { replaceInvalidUtf8?: boolean } = {}): Promise<ParsedDocument> {
  if (!DOC_TYPES.includes(docType)) throw new DkiArgumentError(`${name}: unsupported document type ${JSON.stringify(docType)}; supported: ${DOC_TYPES.join(", ")}`);
  if (bytes.length === 0) throw new FormatError(name, "is empty");
  let parsed: { text: string; title?: string; sections: Section[] };
  let invalidUtf8 = 0;
  const asMarkdown = (md: string) => ({ text: md, sections: markdownSections(md) });
  if (docType === "pdf") {
    parsed = await pdfToText(bytes, name);
  } else if (docType === "docx") {
    parsed = asMarkdown(await docxToMarkdown(bytes, name));
  } else {
    const decoded = decodeText(bytes, name, o.replaceInvalidUtf8 === true);
    invalidUtf8 = decoded.replaced;
    const raw = decoded.text.replace(/^\uFEFF/, "");
    if (docType === "html") parsed = htmlToText(raw);
    else if (docType === "markdown") parsed = asMarkdown(raw);
    else if (docType === "csv" || docType === "tsv") parsed = asMarkdown(delimitedToMarkdown(raw, docType === "csv" ? "," : "\t", name));
    else if (docType === "json") parsed = asMarkdown(jsonToMarkdown(raw, name));
    else if (docType === "xml") parsed = asMarkdown(await xmlToMarkdown(raw, name));
    else if (docType === "code") parsed = asMarkdown(codeToMarkdown(raw, CODE_LANGUAGES[extname(name).toLowerCase()] ?? ""));
    else parsed = { text: raw, sections: whole(raw) };
  }
  if (parsed.text.trim() === "") {
    throw new FormatError(name, docType === "pdf" ? "has no extractable text (a scanned PDF would need OCR, which is not supported)" : "has no text");
  }
  return { docType, ...parsed, ...(invalidUtf8 > 0 ? { invalidUtf8 } : {}) };
}
