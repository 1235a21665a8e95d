// Documents that are not prose → Markdown with their structure kept (seed 004), so that the
// knowledge base chunks them by the same heading sections as any Markdown file and a chunk says
// where it came from:
//   DOCX    mammoth's HTML (Word's heading styles as h1–h6, lists, tables) → headings, paragraphs,
//           "-" / "1." items, pipe tables
//   CSV/TSV RFC 4180 records → a pipe table per 50 rows, each under a "Rows a–b" heading with the
//           header row repeated, so every chunk of the table carries its column names
//   JSON    objects → a heading per key path (to depth 6, deeper as "key: value" lines), arrays of
//           scalars → items, scalars → "key: value"
//   XML     elements with child elements → headings (to depth 6), leaves → "name: text", attributes
//           → "@name: value"; checked for well-formedness (fast-xml-parser's validator), then read
//           with @xmldom/xmldom: a malformed file is refused with its line
//   code    a section per top-level definition (function, class, def, fn, …), its code fenced with
//           the language, the lines before the first one as "(top of file)"
// Every failure is a FormatError naming the document and where in it.
import { load } from "cheerio";
import { FormatError } from "../../errors.js";

/** Rows of a table under one heading: a chunk of a table keeps its header within reach. */
const ROWS_PER_SECTION = 50;
const MAX_HEADING_DEPTH = 6;

// --- DOCX ---------------------------------------------------------------------------------------

export async function docxToMarkdown(bytes: Uint8Array, name: string): Promise<string> {
  const mammoth = (await import("mammoth")).default;
  let html: string;
  try {
    html = (await mammoth.convertToHtml({ buffer: Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength) }, { externalFileAccess: false })).value;
  } catch (e) {
    throw new FormatError(name, `is not a readable DOCX (a Word document is a zip of XML parts): ${e instanceof Error ? e.message : String(e)}`);
  }
  return htmlToMarkdown(html);
}

/** The structure Word documents have, as mammoth renders it, in Markdown. */
export function htmlToMarkdown(html: string): string {
  const $ = load(html);
  const blocks: string[] = [];
  const text = (el: Parameters<typeof $>[0]) => $(el).text().replace(/\s+/g, " ").trim();
  const list = (el: Parameters<typeof $>[0], depth: number) => {
    const ordered = (el as { tagName?: string }).tagName === "ol";
    $(el)
      .children("li")
      .each((i, li) => {
        const own = $(li).clone().children("ul, ol").remove().end().text().replace(/\s+/g, " ").trim();
        blocks.push(`${"  ".repeat(depth)}${ordered ? `${i + 1}.` : "-"} ${own}`);
        $(li)
          .children("ul, ol")
          .each((_, sub) => list(sub, depth + 1));
      });
  };
  $("body")
    .children()
    .each((_, el) => {
      const tag = (el as { tagName?: string }).tagName ?? "";
      const h = /^h([1-6])$/.exec(tag);
      if (h) blocks.push(`${"#".repeat(Number(h[1]))} ${text(el)}`);
      else if (tag === "ul" || tag === "ol") list(el, 0);
      else if (tag === "table") {
        const rows = $(el)
          .find("tr")
          .toArray()
          .map((tr) => $(tr).children("td, th").toArray().map((c) => text(c)));
        if (rows.length > 0) blocks.push(pipeTable(rows[0], rows.slice(1)));
      } else if (text(el) !== "") blocks.push(text(el));
    });
  return blocks.join("\n\n");
}

// --- CSV / TSV ----------------------------------------------------------------------------------

/** RFC 4180 records: quoted fields may hold the delimiter, newlines and "" for a quote. */
export function parseDelimited(text: string, delimiter: "," | "\t", name: string): string[][] {
  const records: string[][] = [];
  let record: string[] = [];
  let field = "";
  let quoted = false;
  let line = 1;
  let quoteLine = 0;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (quoted) {
      if (ch === '"') {
        if (text[i + 1] === '"') (field += '"'), i++;
        else quoted = false;
      } else {
        if (ch === "\n") line++;
        field += ch;
      }
    } else if (ch === '"' && field === "") {
      quoted = true;
      quoteLine = line;
    } else if (ch === delimiter) {
      record.push(field);
      field = "";
    } else if (ch === "\n" || ch === "\r") {
      if (ch === "\r" && text[i + 1] === "\n") i++;
      record.push(field);
      if (record.length > 1 || record[0] !== "") records.push(record);
      record = [];
      field = "";
      line++;
    } else {
      field += ch;
    }
  }
  if (quoted) throw new FormatError(name, `line ${quoteLine}: a quoted field is never closed`);
  record.push(field);
  if (record.length > 1 || record[0] !== "") records.push(record);
  return records;
}

export function delimitedToMarkdown(text: string, delimiter: "," | "\t", name: string): string {
  const records = parseDelimited(text, delimiter, name);
  if (records.length === 0) return "";
  const [header, ...rows] = records;
  if (rows.length === 0) return pipeTable(header, []);
  const parts: string[] = [];
  for (let i = 0; i < rows.length; i += ROWS_PER_SECTION) {
    const slice = rows.slice(i, i + ROWS_PER_SECTION);
    parts.push(`## Rows ${i + 1}–${i + slice.length}\n\n${pipeTable(header, slice)}`);
  }
  return parts.join("\n\n");
}

function pipeTable(header: string[], rows: string[][]): string {
  const cell = (s: string | undefined) => (s ?? "").replace(/\r?\n/g, " ").replace(/\|/g, "\\|").trim();
  const width = Math.max(header.length, ...rows.map((r) => r.length));
  const line = (r: string[]) => `| ${Array.from({ length: width }, (_, i) => cell(r[i])).join(" | ")} |`;
  return [line(header), `| ${Array.from({ length: width }, () => "---").join(" | ")} |`, ...rows.map(line)].join("\n");
}

// --- JSON ---------------------------------------------------------------------------------------

export function jsonToMarkdown(text: string, name: string): string {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new FormatError(name, `is not valid JSON: ${(e as Error).message}`);
  }
  const out: string[] = [];
  const scalar = (v: unknown) => (typeof v === "string" ? v : JSON.stringify(v));
  const isScalar = (v: unknown) => v === null || typeof v !== "object";
  const walk = (v: unknown, path: string[]) => {
    if (isScalar(v)) {
      out.push(path.length === 0 ? scalar(v) : `${path[path.length - 1]}: ${scalar(v)}`);
      return;
    }
    const entries: [string, unknown][] = Array.isArray(v) ? v.map((x, i) => [`[${i}]`, x]) : Object.entries(v as object);
    if (Array.isArray(v) && v.every(isScalar)) {
      if (path.length > 0) out.push(`${path[path.length - 1]}:`);
      for (const x of v) out.push(`- ${scalar(x)}`);
      return;
    }
    // Scalars of this level first, under the level's own heading; then each nested value under its own.
    const lines = entries.filter(([, x]) => isScalar(x)).map(([k, x]) => `${k}: ${scalar(x)}`);
    if (lines.length > 0) out.push(lines.join("\n"));
    for (const [k, x] of entries) {
      if (isScalar(x)) continue;
      const sub = [...path, k];
      if (sub.length <= MAX_HEADING_DEPTH) {
        out.push(`${"#".repeat(sub.length)} ${sub.join(" › ")}`);
        walk(x, sub);
      } else {
        out.push(`${sub.join(" › ")}: ${JSON.stringify(x)}`);
      }
    }
  };
  walk(value, []);
  return out.join("\n\n");
}

// --- XML ----------------------------------------------------------------------------------------

interface XmlNode {
  nodeType: number;
  nodeName: string;
  nodeValue: string | null;
  childNodes: ArrayLike<XmlNode>;
  attributes?: ArrayLike<{ name: string; value: string }>;
}

export async function xmlToMarkdown(text: string, name: string): Promise<string> {
  // xmldom reads unclosed and mismatched tags as warnings; the validator holds the file to XML's
  // well-formedness rules first, naming the line of the first problem.
  const { XMLValidator } = await import("fast-xml-parser");
  const valid = XMLValidator.validate(text);
  if (valid !== true) throw new FormatError(name, `is not well-formed XML: line ${valid.err.line}, column ${valid.err.col}: ${valid.err.msg}`);
  const { DOMParser } = await import("@xmldom/xmldom");
  const problems: string[] = [];
  // Warnings (e.g. an unused namespace) pass; errors and fatal errors refuse the file.
  const refuse = (msg: string) => problems.push(msg.replace(/\s+/g, " ").replace(/^\[xmldom [a-z]+\]\s*/i, "").trim());
  let doc: { documentElement: XmlNode | null } | undefined;
  try {
    doc = new DOMParser({ errorHandler: { warning: () => {}, error: refuse, fatalError: refuse } }).parseFromString(text, "text/xml") as unknown as { documentElement: XmlNode | null };
  } catch (e) {
    refuse((e as Error).message);
  }
  if (problems.length > 0 || !doc?.documentElement) throw new FormatError(name, `is not well-formed XML: ${problems[0] ?? "no root element"}`);
  const out: string[] = [];
  const elements = (n: XmlNode) => Array.from(n.childNodes).filter((c) => c.nodeType === 1);
  const ownText = (n: XmlNode) =>
    Array.from(n.childNodes)
      .filter((c) => c.nodeType === 3 || c.nodeType === 4)
      .map((c) => c.nodeValue ?? "")
      .join("")
      .replace(/\s+/g, " ")
      .trim();
  const attrs = (n: XmlNode) => Array.from(n.attributes ?? []).map((a) => `@${a.name}: ${a.value}`);
  const walk = (n: XmlNode, depth: number) => {
    const kids = elements(n);
    if (kids.length === 0) {
      const a = attrs(n);
      out.push(`${n.nodeName}: ${ownText(n)}${a.length > 0 ? ` (${a.join(", ")})` : ""}`);
      return;
    }
    const head = depth <= MAX_HEADING_DEPTH ? `${"#".repeat(depth)} ${n.nodeName}` : n.nodeName;
    const lines = [...attrs(n), ...(ownText(n) ? [ownText(n)] : [])];
    out.push(lines.length > 0 ? `${head}\n\n${lines.join("\n")}` : head);
    for (const k of kids) walk(k, depth + 1);
  };
  walk(doc.documentElement, 1);
  return out.join("\n\n");
}

// --- source code --------------------------------------------------------------------------------

export const CODE_LANGUAGES: Readonly<Record<string, string>> = {
  ".ts": "typescript", ".tsx": "tsx", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "jsx",
  ".py": "python", ".go": "go", ".rs": "rust", ".java": "java", ".kt": "kotlin", ".c": "c", ".h": "c", ".cc": "cpp",
  ".cpp": "cpp", ".hpp": "cpp", ".cu": "cuda", ".cs": "csharp", ".rb": "ruby", ".php": "php", ".swift": "swift",
  ".sh": "bash", ".sql": "sql", ".scala": "scala",
};

// A top-level definition starts at column 0 with one of these words (after export/pub/async…),
// followed by its name.
const DEFINITION =
  /^(?:export\s+(?:default\s+)?|pub(?:\([^)]*\))?\s+|public\s+|private\s+|protected\s+|static\s+|async\s+|abstract\s+|final\s+|inline\s+)*(?:function\*?|class|interface|type|enum|struct|trait|impl|def|fn|func|module|namespace|object)\s+([A-Za-z_$][\w$]*)/;

export function codeToMarkdown(text: string, language: string): string {
  const lines = text.split(/\r?\n/);
  const sections: { title: string; lines: string[] }[] = [{ title: "(top of file)", lines: [] }];
  for (const l of lines) {
    const m = DEFINITION.exec(l);
    if (m) sections.push({ title: m[1], lines: [] });
    sections[sections.length - 1].lines.push(l);
  }
  // A fence longer than any run of backticks in the code, so the code cannot close it.
  const longest = Math.max(2, ...[...text.matchAll(/`+/g)].map((m) => m[0].length));
  const fence = "`".repeat(longest + 1);
  return sections
    .filter((s) => s.lines.join("").trim() !== "")
    .map((s) => `## ${s.title}\n\n${fence}${language}\n${s.lines.join("\n").replace(/\n+$/, "")}\n${fence}`)
    .join("\n\n");
}
