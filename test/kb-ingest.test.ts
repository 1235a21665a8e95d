// Knowledge-base ingestion: every supported type end to end into LMDB, re-ingestion replacing a
// document's chunks atomically, de-duplication, and bad input leaving the collection as it was.
import { rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { KnowledgeBase } from "../src/rag/kb/knowledge-base.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import type { Embedder } from "../src/memory/types.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { smollm2Tokenizer, tempDir } from "./support/paths.js";
import { makePdf } from "./support/pdf.js";
import { makeDocx } from "./support/docx.js";

let tok: Tokenizer;
let dir: string;
let files: string;
let kb: KnowledgeBase;
const embedder = new HashingEmbedder();

beforeAll(async () => {
  tok = await Tokenizer.fromFolder(smollm2Tokenizer);
  dir = tempDir();
  files = tempDir();
  kb = await KnowledgeBase.open({ dir, embedder, tokenizer: tok });
});
afterAll(async () => {
  await kb.close();
});

const write = (name: string, content: string | Uint8Array): string => {
  const p = join(files, name);
  writeFileSync(p, content);
  return p;
};

/** Everything a collection holds, for before/after comparisons. */
function state(collection: string): string {
  const s = kb.snapshot(collection);
  return JSON.stringify({ docs: [...s.documents.values()], chunks: s.chunks, vectors: s.vectors.map((v) => Array.from(v.slice(0, 4))) });
}

describe("ingestion", () => {
  test("text, Markdown, HTML and PDF documents with their metadata; chunks carry heading paths and pages", async () => {
    const md = write("guide.md", "# Setup\nInstall the package with npm.\n## Linux\nUse apt for the compiler.\n# Usage\nRun dki generate.\n");
    const html = write("cafes.html", "<html><head><title>Cafes</title></head><body><h1>Beijing</h1><p>Green Bowl is a vegetarian cafe in Chaoyang.</p></body></html>");
    const pdf = write("report.pdf", makePdf([["Quarterly report", "Revenue grew 12 percent."], ["Outlook: stable."]], "Q3 Report"));
    const txt = write("notes.txt", "Plain notes about hiking in the Alps.");
    const r1 = await kb.ingestFile(md, { collection: "docs", metadata: { category: "manual", chapter: 1, source: "repo", tags: ["setup", "cli"] } });
    const r2 = await kb.ingestFile(html, { collection: "docs", docId: "cafes", metadata: { category: "food", createdAt: "2024-05-01T00:00:00Z" } });
    const r3 = await kb.ingestFile(pdf, { collection: "docs", metadata: { category: "finance", sessionId: "s1" } });
    const r4 = await kb.ingestFile(txt, { collection: "docs" });
    expect([r1.status, r2.status, r3.status, r4.status]).toEqual(["added", "added", "added", "added"]);
    const docs = kb.listDocuments("docs");
    // A file's id is its absolute path (symbolic links resolved), whatever the working directory.
    expect(docs).toHaveLength(4);
    for (const p of [md, pdf, txt]) expect(docs.some((d) => resolve(d.docId) === resolve(p))).toBe(true);
    expect(docs.some((d) => d.docId === "cafes")).toBe(true);
    const cafes = kb.getDocument("docs", "cafes")!;
    expect(cafes.title).toBe("Cafes");
    expect(cafes.fields).toMatchObject({ docId: "cafes", docType: "html", category: "food", createdAt: Date.parse("2024-05-01T00:00:00Z") });
    const snap = kb.snapshot("docs");
    const heads = snap.chunks.filter((c) => c.docId.endsWith("guide.md")).map((c) => c.headingPath.join(" > "));
    expect(heads.sort()).toEqual(["Setup", "Setup > Linux", "Usage"]);
    const pages = snap.chunks.filter((c) => c.docId.endsWith("report.pdf")).map((c) => c.page);
    expect(pages.sort()).toEqual([1, 2]);
    expect(kb.getDocument("docs", docs.find((d) => d.docId.endsWith("report.pdf"))!.docId)!.title).toBe("Q3 Report");
    expect(kb.getCollection("docs")).toMatchObject({ documents: 4, chunks: snap.chunks.length, customFields: ["tags"], embedderId: embedder.id });
  });

  test("DOCX, CSV, JSON, XML and source code go in converted to Markdown: each found by search in its own section", async () => {
    const paths = [
      write("handbook.docx", await makeDocx([{ heading: 1, text: "Handbook" }, { heading: 2, text: "Leave" }, { text: "Employees get twenty days of paid leave a year." }])),
      write("stations.csv", "station,line\nWaterloo,Jubilee\nKing's Cross,Victoria\n"),
      write("cabin.json", JSON.stringify({ wifi: { ssid: "lakeside", password: "maple-42-river" } })),
      write("server.xml", "<config><server><port>8080</port><host>localhost</host></server></config>"),
      write("cache.py", "import os\n\ndef evict_oldest(cache):\n    return cache.popitem(last=False)\n"),
    ];
    for (const p of paths) expect((await kb.ingestFile(p, { collection: "formats" })).status).toBe("added");
    const top = async (q: string) => (await kb.search(q, { collection: "formats", limit: 1 }))[0]!.chunk;
    expect((await top("paid leave days")).headingPath).toEqual(["Handbook", "Leave"]);
    expect((await top("wifi password")).headingPath).toEqual(["wifi"]);
    expect((await top("Waterloo station Jubilee line")).headingPath).toEqual(["Rows 1–2"]);
    expect((await top("server port")).headingPath).toEqual(["config", "server"]);
    expect((await top("evict oldest cache entry")).headingPath).toEqual(["evict_oldest"]);
    expect(kb.listDocuments("formats").map((d) => kb.getDocument("formats", d.docId)!.fields.docType).sort()).toEqual(["code", "csv", "docx", "json", "xml"]);
  });

  test("re-ingesting: unchanged is a no-op; changed replaces the chunks; repeated passages are stored once", async () => {
    const para = "The office is closed on public holidays and opens at nine on weekdays. ";
    const body = (extra: string) => `${para.repeat(1)}\n\nMeeting rooms are booked through the portal.\n\n${extra}`;
    const r1 = await kb.ingestText(body("Parking is free."), { collection: "policy", docId: "office", chunk: { chunkTokens: 16, overlapTokens: 0 } });
    const before = kb.getDocument("policy", "office")!;
    const again = await kb.ingestText(body("Parking is free."), { collection: "policy", docId: "office", chunk: { chunkTokens: 16, overlapTokens: 0 } });
    expect(again.status).toBe("unchanged");
    expect(kb.getDocument("policy", "office")).toEqual(before);
    const r2 = await kb.ingestText(body("Parking costs five euros a day."), { collection: "policy", docId: "office", chunk: { chunkTokens: 16, overlapTokens: 0 } });
    expect(r1.status).toBe("added");
    expect(r2.status).toBe("replaced");
    const after = kb.getDocument("policy", "office")!;
    const gone = before.chunkIds.filter((id) => !after.chunkIds.includes(id));
    expect(gone.length).toBeGreaterThan(0);
    for (const id of gone) expect(kb.getChunk("policy", id)).toBeUndefined();
    for (const id of after.chunkIds) expect(kb.getChunk("policy", id)!.docId).toBe("office");
    expect(kb.snapshot("policy").chunks.map((c) => c.id).sort()).toEqual([...after.chunkIds].sort());
    expect(kb.snapshot("policy").chunks.some((c) => c.text.includes("five euros"))).toBe(true);
    expect(kb.snapshot("policy").chunks.some((c) => c.text.includes("Parking is free"))).toBe(false);
    // The same passage twice in a document: one chunk.
    const dup = await kb.ingestText(`${"Repeat this exact sentence here now please ok. ".repeat(1)}\n\n${"Repeat this exact sentence here now please ok. "}\n\nAnd one more.`, { collection: "policy", docId: "dup", chunk: { chunkTokens: 10, overlapTokens: 0, minTailTokens: 0 } });
    expect(dup.duplicatesSkipped).toBeGreaterThan(0);
    expect(new Set(kb.snapshot("policy").chunks.filter((c) => c.docId === "dup").map((c) => c.text)).size).toBe(dup.chunks);
  });

  test("concurrent ingestions of one document leave one whole version and no orphan chunks", async () => {
    const versions = Array.from({ length: 6 }, (_, v) => `Version ${v} of the travel policy. ` + `Clause ${v}: trains under four hours. `.repeat(20 + v));
    const results = await Promise.all(versions.map((text) => kb.ingestText(text, { collection: "race", docId: "policy", chunk: { chunkTokens: 32, overlapTokens: 4 } })));
    expect(results.filter((r) => r.status === "added")).toHaveLength(1);
    const doc = kb.getDocument("race", "policy")!;
    const snap = kb.snapshot("race");
    expect(snap.chunks.map((c) => c.id).sort()).toEqual([...doc.chunkIds].sort());
    const winner = versions.find((v) => snap.chunks.some((c) => c.text.startsWith(v.slice(0, 12))))!;
    for (const c of snap.chunks) expect(winner.includes(c.text)).toBe(true);
    const hits = await kb.search("travel policy trains", { collection: "race", limit: 50 });
    for (const h of hits) expect(doc.chunkIds).toContain(h.chunk.id);
  });

  test("a failure while re-ingesting (here: the embedder) leaves the old version whole", async () => {
    const failing: Embedder = { id: embedder.id, dim: embedder.dim, embed: async () => { throw new Error("embedding service down"); } };
    const dir2 = tempDir();
    const kb2 = await KnowledgeBase.open({ dir: dir2, embedder, tokenizer: tok });
    await kb2.ingestText("Version one of the handbook.", { collection: "h", docId: "hb" });
    const before = JSON.stringify(kb2.snapshot("h").chunks);
    await kb2.close();
    // Same folder, an embedder that fails: the document's chunks stay as they were.
    const broken = await KnowledgeBase.open({ dir: dir2, embedder: failing, tokenizer: tok });
    await expect(broken.ingestText("Version two of the handbook.", { collection: "h", docId: "hb" })).rejects.toThrow(/embedding service down/);
    expect(JSON.stringify(broken.snapshot("h").chunks)).toBe(before);
    await broken.close();
  });

  test("bad input is a clear error and the collection stays as it was", async () => {
    const before = state("docs");
    const big = await KnowledgeBase.open({ dir: tempDir(), embedder, tokenizer: tok, maxDocumentBytes: 4096 });
    const cases: [() => Promise<unknown>, RegExp][] = [
      [() => kb.ingestFile(write("slides.pptx", "PK\u0003\u0004 fake"), { collection: "docs" }), /slides\.pptx: unsupported document type "\.pptx"/],
      [() => kb.ingestFile(write("empty.txt", ""), { collection: "docs" }), /empty\.txt: is empty/],
      [() => kb.ingestFile(write("blank.md", "\n\n   \n"), { collection: "docs" }), /blank\.md: has no text/],
      [() => kb.ingestFile(write("image.txt", new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0, 0, 0xff, 0xd8])), { collection: "docs" }), /image\.txt: (is not UTF-8 text|holds NUL bytes)/],
      [() => kb.ingestFile(write("broken.pdf", makePdf([["hello"]]).slice(0, 60)), { collection: "docs" }), /broken\.pdf: is not a readable PDF/],
      [() => kb.ingestFile(join(files, "missing.md"), { collection: "docs" }), /cannot read .*missing\.md: ENOENT/],
      [() => kb.ingestFile(files, { collection: "docs", docType: "text" }), /is not a file/],
      [() => kb.ingestText("x", { collection: "docs", docId: "m", metadata: { category: 5 as unknown as string } }), /metadata\.category must be a string/],
      [() => kb.ingestText("x", { collection: "docs", docId: "m", metadata: { createdAt: "yesterday" } }), /metadata\.createdAt must be/],
      [() => kb.ingestText("x", { collection: "docs", docId: "m", metadata: { nested: { a: 1 } as unknown as string } }), /metadata\.nested must be/],
      [() => kb.ingestText("x", { collection: "bad name!", docId: "m" }), /collection name "bad name!"/],
      [() => kb.ingestText("x", { collection: "docs", docId: "" }), /document id "" must be/],
    ];
    for (const [run, message] of cases) await expect(run()).rejects.toThrow(message);
    // A huge document: refused by its size before it is read.
    await expect(big.ingestFile(write("huge.txt", "a".repeat(5000)), { collection: "docs" })).rejects.toThrow(/huge\.txt: .* is over the .* limit of one document \(maxDocumentBytes\)/);
    await big.close();
    expect(() => kb.selectDocuments("docs", { eq: { colour: "red" } })).toThrow(/unknown field "colour"; this collection's fields are category, chapter, createdAt, docId, docType, sessionId, source, tags, title/);
    expect(() => kb.selectDocuments("docs", { like: { category: "x" } } as never)).toThrow(/unknown operator "like"/);
    expect(() => kb.selectDocuments("docs", { and: [] })).toThrow(/non-empty array/);
    expect(() => kb.listDocuments("nope")).toThrow(/no collection "nope"; collections: docs, formats, policy/);
    expect(state("docs")).toBe(before);
  });

  test("metadata filters select documents with eq, in, and, or (values compare as JSON, as the memory store's)", () => {
    const sel = (f: Parameters<KnowledgeBase["selectDocuments"]>[1]) => [...kb.selectDocuments("docs", f)!].map((d) => d.split("/").pop()).sort();
    expect(sel({ eq: { category: "food" } })).toEqual(["cafes"]);
    expect(sel({ in: { category: ["food", "finance"] } })).toEqual(["cafes", "report.pdf"]);
    expect(sel({ and: [{ eq: { docType: "markdown" } }, { eq: { tags: ["setup", "cli"] } }] })).toEqual(["guide.md"]);
    expect(sel({ eq: { tags: "cli" } })).toEqual([]);
    expect(sel({ or: [{ eq: { sessionId: "s1" } }, { eq: { chapter: 1 } }] })).toEqual(["guide.md", "report.pdf"]);
    expect(sel({ eq: { category: "nothing" } })).toEqual([]);
  });

  test("documents with long ids (keys past LMDB's short-string encoding) are listed, found and removed like short ones", async () => {
    // lmdb's ordered-binary escapes a NUL in short string keys but not in long ones: a range ending
    // at "<collection>\u0001" once missed every document whose key was 63 bytes or more.
    const ids = ["short.md", `long/${"x".repeat(120)}.md`, `中文/${"长".repeat(40)}.md`];
    for (const docId of ids) await kb.ingestText(`Notes about ${docId.length} things.`, { collection: "longids", docId });
    expect(kb.listDocuments("longids").map((d) => d.docId).sort()).toEqual([...ids].sort());
    for (const docId of ids) expect(kb.getDocument("longids", docId)?.docId).toBe(docId);
    expect((await kb.search("Notes about things", { collection: "longids", limit: 5 })).length).toBe(3);
    expect(await kb.removeDocument("longids", ids[1])).toBe(true);
    expect(kb.listDocuments("longids").map((d) => d.docId).sort()).toEqual([ids[0], ids[2]].sort());
  });

  test("removing a document removes its chunks; the knowledge base persists across reopening", async () => {
    const id = kb.listDocuments("docs").find((d) => d.docId.endsWith("notes.txt"))!.docId;
    const chunkIds = kb.getDocument("docs", id)!.chunkIds;
    expect(await kb.removeDocument("docs", id)).toBe(true);
    expect(await kb.removeDocument("docs", id)).toBe(false);
    for (const c of chunkIds) expect(kb.getChunk("docs", c)).toBeUndefined();
    const snapshot = state("docs");
    await kb.close();
    kb = await KnowledgeBase.open({ dir, embedder, tokenizer: tok });
    expect(state("docs")).toBe(snapshot);
    const before = (await kb.search("vegetarian cafe Chaoyang", { collection: "docs", limit: 3 })).map((r) => r.chunk.id);
    expect(kb.indexRebuilds).toEqual([]);
    // With HNSW from the first chunk (small collections are otherwise scanned, with no files), the
    // index is saved; its files gone, it is rebuilt from the chunks, reported, with the same results.
    await kb.close();
    kb = await KnowledgeBase.open({ dir, embedder, tokenizer: tok, hnswFrom: 0 });
    expect((await kb.search("vegetarian cafe Chaoyang", { collection: "docs", limit: 3 })).map((r) => r.chunk.id)).toEqual(before);
    await kb.close();
    rmSync(join(dir, "index"), { recursive: true, force: true });
    kb = await KnowledgeBase.open({ dir, embedder, tokenizer: tok, hnswFrom: 0 });
    expect((await kb.search("vegetarian cafe Chaoyang", { collection: "docs", limit: 3 })).map((r) => r.chunk.id)).toEqual(before);
    expect(kb.indexRebuilds.map((r) => r.scope)).toEqual(["docs"]);
    expect(["missing", "corrupt"]).toContain(kb.indexRebuilds[0].reason);
    await expect(KnowledgeBase.open({ dir: tempDir(), embedder, tokenizer: tok, maxDocumentBytes: 0 })).rejects.toThrow(/maxDocumentBytes/);
    // Another embedder: its vectors are never compared with the collection's, in search or ingestion.
    await kb.close();
    const other = await KnowledgeBase.open({ dir, embedder: new HashingEmbedder({ dim: 256 }), tokenizer: tok });
    await expect(other.search("cafe", { collection: "docs" })).rejects.toThrow(/holds vectors of embedder hashing-v1-d512; this knowledge base was opened with hashing-v1-d256/);
    await expect(other.ingestText("x", { collection: "docs", docId: "n" })).rejects.toThrow(/holds vectors of embedder hashing-v1-d512/);
    await other.close();
    kb = await KnowledgeBase.open({ dir, embedder, tokenizer: tok });
  });
});
