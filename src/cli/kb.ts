// `dki kb`: the knowledge base from the command line: ingest files into a collection, search it
// with metadata filters, list collections and documents, remove a document. The knowledge base
// lives in `<data>.kb`, beside the memory store's folder (the store refuses a folder holding
// anything but its own files), as the K/V cache lives in `<data>.kv-cache`. Chunks are counted with a model's tokenizer
// (--tokenizer: a model or tokenizer folder; default the bundled SmolLM2 tokenizer).
import { readdir, stat } from "node:fs/promises";
import { extname, join } from "node:path";
import type { Command } from "commander";
import type { Filter } from "../memory/types.js";
import { KnowledgeBase, type CollectionSettings, type DocumentMetadata } from "../rag/kb/knowledge-base.js";
import type { CollectionOwner } from "../rag/kb/tenancy.js";
import type { KbSearchMode } from "../rag/kb/search.js";
import { sourceLabel } from "../rag/citations.js";
import { isSupportedFile } from "../rag/kb/parse.js";
import { CHUNK_STRATEGIES, type ChunkStrategy } from "../rag/kb/chunk.js";
import { snakeKeys } from "./output.js";
import { choiceOption, EMBEDDER_HELP, embedderOption, intOption, jsonObjectOption, numberOption } from "./options.js";

import { bundledTokenizerDir, knowledgeBaseDir, openKnowledgeBase } from "../rag/kb/open.js";

export { bundledTokenizerDir, knowledgeBaseDir, openKnowledgeBase };

const SUPPORTED_HELP = ".txt, .md, .html and .pdf files";

interface CommonFlags {
  data: string;
  tokenizer?: string;
  embedder?: string;
}

/** Opens the knowledge base for `fn`; only ingest may create it. */
async function withKb<T>(flags: CommonFlags, mode: "may create" | "must exist", fn: (kb: KnowledgeBase) => Promise<T>): Promise<T> {
  const kb = await openKnowledgeBase(flags.data, { tokenizer: flags.tokenizer, embedder: await embedderOption(flags.embedder), mustExist: mode === "must exist" });
  try {
    return await fn(kb);
  } finally {
    await kb.close();
  }
}

/** A file a folder's walk passed over, and why. */
interface Skipped {
  path: string;
  reason: string;
}

/**
 * The files to ingest: each file given, and the supported files under each folder given,
 * recursively, in name order. Hidden entries (.git…) and files of other types are passed over and
 * listed; a link to a folder is not followed (a loop would never end).
 */
async function filesToIngest(paths: string[]): Promise<{ files: string[]; skipped: Skipped[] }> {
  const files: string[] = [];
  const skipped: Skipped[] = [];
  const walk = async (dir: string): Promise<void> => {
    const entries = (await readdir(dir, { withFileTypes: true })).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    for (const e of entries) {
      const path = join(dir, e.name);
      if (e.name.startsWith(".")) skipped.push({ path, reason: "hidden" });
      else if (e.isDirectory()) await walk(path);
      else if (e.isSymbolicLink() && (await stat(path).catch(() => null))?.isDirectory()) skipped.push({ path, reason: "a link to a folder, not followed" });
      else if (isSupportedFile(e.name)) files.push(path);
      else skipped.push({ path, reason: `unsupported type${extname(e.name) === "" ? " (no extension)" : ` ${extname(e.name)}`}` });
    }
  };
  for (const p of paths) {
    if ((await stat(p).catch(() => null))?.isDirectory()) await walk(p);
    else files.push(p); // a file named on the command line is ingested or refused by name
  }
  return { files, skipped };
}

/**
 * Ingests the files, one result line per file as it is done ("[3/10] added ID: N chunks"): the
 * progress is those lines, never a bar redrawn over them. With --format json the lines go to
 * stderr on a terminal only, and stdout gets one JSON object at the end.
 */
async function ingest(paths: string[], flags: CommonFlags & { collection: string; metadata?: string; chunkTokens?: number; overlap?: number; chunkStrategy?: ChunkStrategy; replaceInvalidUtf8?: boolean; format: "text" | "json" }): Promise<void> {
  const metadata = flags.metadata === undefined ? undefined : (jsonObjectOption("--metadata", flags.metadata) as DocumentMetadata);
  const { files, skipped } = await filesToIngest(paths);
  const progress = (line: string) => {
    if (flags.format === "text") process.stdout.write(line + "\n");
    else if (process.stderr.isTTY) process.stderr.write(line + "\n");
  };
  for (const s of skipped) progress(`skipped ${s.path}: ${s.reason}`);
  if (files.length === 0) throw new Error(`no files to ingest in ${paths.join(", ")} (supported: ${SUPPORTED_HELP})`);
  await withKb(flags, "may create", async (kb) => {
    const results = [];
    let failed = 0;
    for (const [i, p] of files.entries()) {
      const at = `[${i + 1}/${files.length}]`;
      try {
        const r = await kb.ingestFile(p, { collection: flags.collection, metadata, chunk: { chunkTokens: flags.chunkTokens, overlapTokens: flags.overlap, strategy: flags.chunkStrategy }, replaceInvalidUtf8: flags.replaceInvalidUtf8 });
        results.push({ path: p, ...r });
        if (r.invalidUtf8 > 0) process.stderr.write(`dki: warning: ${p}: ${r.invalidUtf8} byte sequence${r.invalidUtf8 === 1 ? " was" : "s were"} not UTF-8, read as U+FFFD\n`);
        progress(`${at} ${r.status} ${r.docId}: ${r.chunks} chunks${r.duplicatesSkipped > 0 ? `, ${r.duplicatesSkipped} duplicates skipped` : ""}`);
      } catch (e) {
        // One bad file does not stop the others; each failed file leaves the collection as it was.
        failed++;
        const message = e instanceof Error ? e.message : String(e);
        results.push({ path: p, error: message });
        process.stderr.write(`dki: ${at} ${message}\n`);
      }
    }
    if (flags.format === "json") process.stdout.write(JSON.stringify(snakeKeys({ collection: flags.collection, results, skipped })) + "\n");
    if (failed > 0) throw new Error(`${failed} of ${files.length} files not ingested`);
  });
}

async function search(query: string, flags: CommonFlags & { collection: string; filter?: string; limit: number; minScore?: number; mode: KbSearchMode; user?: string; format: "text" | "json" }): Promise<void> {
  const filter = flags.filter === undefined ? undefined : (jsonObjectOption("--filter", flags.filter) as Filter);
  await withKb(flags, "must exist", async (kb) => {
    // --user: the search as that user's (another tenant's collection is not found); else everything, as the knowledge base's owner.
    const results = await (flags.user === undefined ? kb : kb.forUser(flags.user)).search(query, { collection: flags.collection, limit: flags.limit, filter, minScore: flags.minScore, mode: flags.mode });
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
  await withKb(flags, "must exist", async (kb) => {
    if (flags.collection === undefined) {
      const cols = kb.listCollections();
      if (flags.format === "json") process.stdout.write(JSON.stringify(snakeKeys({ collections: cols })) + "\n");
      else process.stdout.write(cols.length === 0 ? "(no collections)\n" : cols.map((c) => `${c.name}\t${c.documents} documents\t${c.chunks} chunks${ownerText(c.owner)}`).join("\n") + "\n");
      return;
    }
    const docs = kb.listDocuments(flags.collection);
    if (flags.format === "json") process.stdout.write(JSON.stringify(snakeKeys({ collection: flags.collection, documents: docs.map((d) => ({ docId: d.docId, title: d.title ?? null, docType: d.docType, chunks: d.chunkIds.length, bytes: d.bytes, fields: d.fields })) })) + "\n");
    else process.stdout.write(docs.length === 0 ? "(no documents)\n" : docs.map((d) => `${d.docId}\t${d.docType}\t${d.chunkIds.length} chunks${d.title ? `\t${d.title}` : ""}`).join("\n") + "\n");
  });
}

const ownerText = (o: CollectionOwner | undefined) => (o === undefined ? "" : o.userId !== undefined ? `\towner ${o.userId}` : `\towner ${o.userPrefix}*`);

/** Get-or-create: "created C" or "exists C"; an existing collection with other settings is refused, naming them. */
async function create(name: string, flags: CommonFlags & { chunkTokens?: number; overlap?: number; minTail?: number; chunkStrategy?: ChunkStrategy; ownerUser?: string; ownerPrefix?: string; format: "text" | "json" }): Promise<void> {
  if (flags.ownerUser !== undefined && flags.ownerPrefix !== undefined) throw new Error("give --owner-user or --owner-prefix, not both");
  const settings: CollectionSettings = { chunk: { chunkTokens: flags.chunkTokens, overlapTokens: flags.overlap, minTailTokens: flags.minTail, strategy: flags.chunkStrategy } };
  if (flags.ownerUser !== undefined) settings.owner = { userId: flags.ownerUser };
  if (flags.ownerPrefix !== undefined) settings.owner = { userPrefix: flags.ownerPrefix };
  await withKb(flags, "may create", async (kb) => {
    const r = await kb.getOrCreateCollection(name, settings);
    if (flags.format === "json") process.stdout.write(JSON.stringify(snakeKeys({ created: r.created, collection: r.collection })) + "\n");
    else process.stdout.write(`${r.created ? "created" : "exists"} ${name}\tchunks of ${r.collection.chunk.chunkTokens} tokens, overlap ${r.collection.chunk.overlapTokens}, ${r.collection.chunk.strategy}${ownerText(r.collection.owner)}\n`);
  });
}

/** Delete by metadata filter: every matching document and its chunks, in one transaction. */
async function deleteWhere(flags: CommonFlags & { collection: string; filter: string; format: "text" | "json" }): Promise<void> {
  const filter = jsonObjectOption("--filter", flags.filter) as Filter;
  await withKb(flags, "must exist", async (kb) => {
    const r = await kb.deleteWhere(flags.collection, filter);
    if (flags.format === "json") process.stdout.write(JSON.stringify(snakeKeys({ collection: flags.collection, deleted: r.documents, chunks: r.chunks })) + "\n");
    else process.stdout.write(`deleted ${r.documents.length} documents (${r.chunks} chunks)${r.documents.map((d) => `\n  ${d}`).join("")}\n`);
  });
}

async function rm(docId: string, flags: CommonFlags & { collection: string }): Promise<void> {
  await withKb(flags, "must exist", async (kb) => {
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
      .description(`ingest files and folders (recursively: ${SUPPORTED_HELP}); a changed file replaces its chunks, an unchanged one is skipped`)
      .requiredOption("-c, --collection <name>", "collection")
      .option("--metadata <json>", 'fields of every file: {"category", "source", "chapter", "sessionId", "createdAt", custom keys}; a re-ingested file keeps its own unless given ({} clears them)')
      .option("--chunk-tokens <n>", "tokens per chunk (default 512)", intOption("--chunk-tokens", 8, 65536))
      .option("--overlap <n>", "tokens shared by consecutive chunks, at most (default 64; whole sentences with the sentence strategy)", intOption("--overlap", 0, 65535))
      .option("--chunk-strategy <s>", "sentence (chunks end at paragraph, then sentence ends; default) or tokens (plain windows)", choiceOption("--chunk-strategy", CHUNK_STRATEGIES))
      .option("--replace-invalid-utf8", "read bytes that are not UTF-8 as U+FFFD, with a warning counting them (default: such a file is refused)")
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
      .option("--user <id>", "search as this user: a collection owned by another tenant is not found (default: every collection)")
      .option("--format <format>", "text or json", choiceOption("--format", ["text", "json"] as const), "text"),
  ).action((query: string, flags) => search(query, flags));
  common(
    kb
      .command("create <collection>")
      .description("create a collection with its settings, or take the existing one if its settings are these (others are refused, naming them)")
      .option("--chunk-tokens <n>", "tokens per chunk (default 512)", intOption("--chunk-tokens", 8, 65536))
      .option("--overlap <n>", "tokens shared by consecutive chunks, at most (default 64)", intOption("--overlap", 0, 65535))
      .option("--min-tail <n>", "a last piece with fewer new tokens joins the chunk before it (default: a quarter of a chunk)", intOption("--min-tail", 0, 65536))
      .option("--chunk-strategy <s>", "sentence or tokens (default sentence)", choiceOption("--chunk-strategy", CHUNK_STRATEGIES))
      .option("--owner-user <id>", "only this user's searches and RAG turns see it")
      .option("--owner-prefix <prefix>", "only users whose id starts with this prefix see it")
      .option("--format <format>", "text or json", choiceOption("--format", ["text", "json"] as const), "text"),
  ).action((name: string, flags) => create(name, flags));
  common(
    kb
      .command("delete")
      .description("remove every document (and its chunks) whose metadata matches a filter, e.g. one session's history")
      .requiredOption("-c, --collection <name>", "collection")
      .requiredOption("--filter <json>", 'metadata filter: {"eq": {"sessionId": "s1"}}, {"in": {...}}, {"and": [...]}, {"or": [...]}')
      .option("--format <format>", "text or json", choiceOption("--format", ["text", "json"] as const), "text"),
  ).action((flags) => deleteWhere(flags));
  common(
    kb
      .command("list")
      .description("collections, or the documents of one")
      .option("-c, --collection <name>", "list this collection's documents")
      .option("--format <format>", "text or json", choiceOption("--format", ["text", "json"] as const), "text"),
  ).action((flags) => list(flags));
  common(kb.command("rm <doc>").description("remove a document and its chunks").requiredOption("-c, --collection <name>", "collection")).action((doc: string, flags) => rm(doc, flags));
}
