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

/** nDCG@k of a ranking against binary labels. */
export function ndcgAt(k: number, ranked: readonly string[], relevant: readonly string[]): number {
  const rel = new Set(relevant);
  let dcg = 0;
  ranked.slice(0, k).forEach((id, i) => {
    if (rel.has(id)) dcg += 1 / Math.log2(i + 2);
  });
  let ideal = 0;
  for (let i = 0; i < Math.min(k, rel.size); i++) ideal += 1 / Math.log2(i + 2);
  return ideal === 0 ? 0 : dcg / ideal;
}
