// `dki kb`: the knowledge base from the command line: ingest files into a collection, search it
// with metadata filters, list collections and documents, remove a document. The knowledge base
// lives in `<data>.kb`, beside the memory store's folder (the store refuses a folder holding
// anything but its own files), as the K/V cache lives in `<data>.kv-cache`. Chunks are counted with a model's tokenizer
// (--tokenizer: a model or tokenizer folder; default the bundled SmolLM2 tokenizer).
import { existsSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type { Command } from "commander";
import { HashingEmbedder } from "../memory/embedders/hashing.js";
import type { Embedder, Filter } from "../memory/types.js";
import { KnowledgeBase, type DocumentMetadata } from "../rag/kb/knowledge-base.js";
import type { KbSearchMode } from "../rag/kb/search.js";
import { sourceLabel } from "../rag/citations.js";
import { Tokenizer } from "../tokenizer/tokenizer.js";
import { snakeKeys, stderrBar } from "./output.js";
import { choiceOption, EMBEDDER_HELP, embedderOption, intOption, jsonObjectOption, numberOption } from "./options.js";

/** The bundled SmolLM2 tokenizer's folder, found by walking up to the package root. */
export function bundledTokenizerDir(): string {
  for (let dir = dirname(fileURLToPath(import.meta.url)); ; dir = dirname(dir)) {
    const candidate = join(dir, "models", "tokenizers", "smollm2");
    if (existsSync(join(dir, "package.json")) && existsSync(join(candidate, "tokenizer.json"))) return candidate;
    if (dirname(dir) === dir) throw new Error("cannot find the bundled tokenizer (models/tokenizers/smollm2); pass --tokenizer");
  }
}

/** The knowledge base's folder for a data folder: beside it. */
export function knowledgeBaseDir(data: string): string {
  return `${resolve(data)}.kb`;
}

/**
 * Opens the data folder's knowledge base with the given embedder (default: the hashing embedder)
 * and tokenizer (a folder, or default: the bundled SmolLM2 tokenizer).
 */
export async function openKnowledgeBase(data: string, o: { tokenizer?: string | Tokenizer; embedder?: Embedder } = {}): Promise<KnowledgeBase> {
  const tok = o.tokenizer instanceof Tokenizer ? o.tokenizer : await Tokenizer.fromFolder(o.tokenizer ?? bundledTokenizerDir());
  return KnowledgeBase.open({ dir: knowledgeBaseDir(data), embedder: o.embedder ?? new HashingEmbedder(), tokenizer: tok });
}

interface CommonFlags {
  data: string;
  tokenizer?: string;
  embedder?: string;
}

async function withKb<T>(flags: CommonFlags, fn: (kb: KnowledgeBase) => Promise<T>): Promise<T> {
  const kb = await openKnowledgeBase(flags.data, { tokenizer: flags.tokenizer, embedder: await embedderOption(flags.embedder) });
  try {
    return await fn(kb);
  } finally {
    await kb.close();
  }
}

async function ingest(paths: string[], flags: CommonFlags & { collection: string; metadata?: string; chunkTokens?: number; overlap?: number; format: "text" | "json" }): Promise<void> {
  const metadata = flags.metadata === undefined ? undefined : (jsonObjectOption("--metadata", flags.metadata) as DocumentMetadata);
  await withKb(flags, async (kb) => {
    const bar = stderrBar("ingesting [{bar}] {value}/{total} | {file}");
    bar?.start(paths.length, 0, { file: "" });
    const results = [];
    let failed = 0;
    for (const [i, p] of paths.entries()) {
      bar?.update(i, { file: p });
      try {
        const r = await kb.ingestFile(p, { collection: flags.collection, metadata, chunk: { chunkTokens: flags.chunkTokens, overlapTokens: flags.overlap } });
        results.push({ path: p, ...r });
        if (flags.format === "text") process.stdout.write(`${r.status} ${r.docId}: ${r.chunks} chunks${r.duplicatesSkipped > 0 ? `, ${r.duplicatesSkipped} duplicates skipped` : ""}\n`);
      } catch (e) {
        // One bad file does not stop the others; each failed file leaves the collection as it was.
        failed++;
        const message = e instanceof Error ? e.message : String(e);
        results.push({ path: p, error: message });
        process.stderr.write(`dki: ${message}\n`);
      }
    }
    bar?.update(paths.length, { file: "done" });
    bar?.stop();
    if (flags.format === "json") process.stdout.write(JSON.stringify(snakeKeys({ collection: flags.collection, results })) + "\n");
    if (failed > 0) throw new Error(`${failed} of ${paths.length} files not ingested`);
  });
}

async function search(query: string, flags: CommonFlags & { collection: string; filter?: string; limit: number; minScore?: number; mode: KbSearchMode; format: "text" | "json" }): Promise<void> {
  const filter = flags.filter === undefined ? undefined : (jsonObjectOption("--filter", flags.filter) as Filter);
  await withKb(flags, async (kb) => {
    const results = await kb.search(query, { collection: flags.collection, limit: flags.limit, filter, minScore: flags.minScore, mode: flags.mode });
    if (flags.format === "json") {
      process.stdout.write(JSON.stringify(snakeKeys({ query, results: results.map((r) => ({ score: r.score, signals: r.signals, source: r.source, text: r.chunk.text })) })) + "\n");
      return;
    }
    if (results.length === 0) process.stdout.write("(no results)\n");
    results.forEach((r, i) => {
      const text = r.chunk.text.replace(/\s+/g, " ");
      process.stdout.write(`[${i + 1}] ${r.score.toFixed(3)} ${sourceLabel(r.source)} (chars ${r.source.start}-${r.source.end})\n    ${text.length > 200 ? text.slice(0, 200) + "…" : text}\n`);
    });
  });
}

async function list(flags: CommonFlags & { collection?: string; format: "text" | "json" }): Promise<void> {
  await withKb(flags, async (kb) => {
    if (flags.collection === undefined) {
      const cols = kb.listCollections();
      if (flags.format === "json") process.stdout.write(JSON.stringify(snakeKeys({ collections: cols })) + "\n");
      else process.stdout.write(cols.length === 0 ? "(no collections)\n" : cols.map((c) => `${c.name}\t${c.documents} documents\t${c.chunks} chunks`).join("\n") + "\n");
      return;
    }
    const docs = kb.listDocuments(flags.collection);
    if (flags.format === "json") process.stdout.write(JSON.stringify(snakeKeys({ collection: flags.collection, documents: docs.map((d) => ({ docId: d.docId, title: d.title ?? null, docType: d.docType, chunks: d.chunkIds.length, bytes: d.bytes, fields: d.fields })) })) + "\n");
    else process.stdout.write(docs.length === 0 ? "(no documents)\n" : docs.map((d) => `${d.docId}\t${d.docType}\t${d.chunkIds.length} chunks${d.title ? `\t${d.title}` : ""}`).join("\n") + "\n");
  });
}

async function rm(docId: string, flags: CommonFlags & { collection: string }): Promise<void> {
  await withKb(flags, async (kb) => {
    if (!(await kb.removeDocument(flags.collection, docId))) throw new Error(`no document ${JSON.stringify(docId)} in collection ${JSON.stringify(flags.collection)}`);
    process.stdout.write(`removed ${docId}\n`);
  });
}

export function registerKbCommand(program: Command): void {
  const kb = program.command("kb").description("knowledge base: ingest documents into collections, search them");
  const common = (c: Command) =>
    c.requiredOption("--data <dir>", "data folder (the knowledge base is the folder <data>.kb beside it)").option("--tokenizer <dir>", "tokenizer for chunk sizes: a model or tokenizer folder (default: the bundled SmolLM2 tokenizer)").option("--embedder <dir>", EMBEDDER_HELP);
  common(
    kb
      .command("ingest <paths...>")
      .description("ingest .txt, .md, .html and .pdf files (a changed file replaces its chunks; an unchanged one is skipped)")
      .requiredOption("-c, --collection <name>", "collection")
      .option("--metadata <json>", 'fields of every file: {"category", "source", "chapter", "sessionId", "createdAt", custom keys}')
      .option("--chunk-tokens <n>", "tokens per chunk (default 512)", intOption("--chunk-tokens", 8, 65536))
      .option("--overlap <n>", "tokens shared by consecutive chunks (default 64)", intOption("--overlap", 0, 65535))
      .option("--format <format>", "text or json", choiceOption("--format", ["text", "json"] as const), "text"),
  ).action((paths: string[], flags) => ingest(paths, flags));
  common(
    kb
      .command("search <query>")
      .description("hybrid search (dense + BM25, RRF) of a collection")
      .requiredOption("-c, --collection <name>", "collection")
      .option("--filter <json>", 'metadata filter: {"eq": {...}}, {"in": {...}}, {"and": [...]}, {"or": [...]}')
      .option("-k, --limit <n>", "results", intOption("--limit", 1, 1000), 5)
      .option("--min-score <s>", "similarity threshold in [0, 1]", numberOption("--min-score", { min: 0, max: 1 }))
      .option("--mode <mode>", "hybrid, dense or bm25", choiceOption("--mode", ["hybrid", "dense", "bm25"] as const), "hybrid")
      .option("--format <format>", "text or json", choiceOption("--format", ["text", "json"] as const), "text"),
  ).action((query: string, flags) => search(query, flags));
  common(
    kb
      .command("list")
      .description("collections, or the documents of one")
      .option("-c, --collection <name>", "list this collection's documents")
      .option("--format <format>", "text or json", choiceOption("--format", ["text", "json"] as const), "text"),
  ).action((flags) => list(flags));
  common(kb.command("rm <doc>").description("remove a document and its chunks").requiredOption("-c, --collection <name>", "collection")).action((doc: string, flags) => rm(doc, flags));
}
