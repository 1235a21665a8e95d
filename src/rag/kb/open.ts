// Where a data folder's knowledge base lives (`<data>.kb`, beside the memory store's folder, which
// refuses anything but its own files) and how the CLI and the server open it: the same embedder as
// the store, chunks counted with the bundled SmolLM2 tokenizer unless another is given, so that
// `dki kb ingest` and `dki serve` read and write one knowledge base alike.
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { HashingEmbedder } from "../../memory/embedders/hashing.js";
import type { Embedder } from "../../memory/types.js";
import { Tokenizer } from "../../tokenizer/tokenizer.js";
import { KnowledgeBase } from "./knowledge-base.js";

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
export async function openKnowledgeBase(data: string, o: { tokenizer?: string | Tokenizer; embedder?: Embedder; mustExist?: boolean } = {}): Promise<KnowledgeBase> {
  // A command that only reads must not create an empty knowledge base beside a mistyped --data.
  if (o.mustExist === true && !KnowledgeBase.exists(knowledgeBaseDir(data))) {
    throw new Error(`--data ${data}: no knowledge base there (${knowledgeBaseDir(data)}); check the path (dki kb ingest creates one)`);
  }
  const tok = o.tokenizer instanceof Tokenizer ? o.tokenizer : await Tokenizer.fromFolder(o.tokenizer ?? bundledTokenizerDir());
  return KnowledgeBase.open({ dir: knowledgeBaseDir(data), embedder: o.embedder ?? new HashingEmbedder(), tokenizer: tok });
}
