// The labelled corpus of the RAG query pipeline (bench/data/rag-pipeline-corpus.json, shared with
// bench/rag-pipeline.js): a company handbook whose passages share vocabulary, with questions that
// each need the passage answering all their parts. Distractors match one part of a question
// strongly (the same word several times, or the topic) and miss the rest.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { repoRoot } from "./paths.js";

interface Corpus {
  docs: { id: string; text: string }[];
  /** Each question and the passages that answer it (relevance 1; all others 0). */
  queries: { query: string; relevant: string[] }[];
}

const corpus = JSON.parse(readFileSync(join(repoRoot, "bench", "data", "rag-pipeline-corpus.json"), "utf8")) as Corpus;
export const RERANK_DOCS = corpus.docs;
export const RERANK_QUERIES = corpus.queries;

export { ndcgAt } from "../../src/eval/ranking.js";
