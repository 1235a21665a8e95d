// The routing reranker's top score for answerable and unanswerable questions: whether its score can
// tell the gate that a user has no relevant memory. Reads a `dki eval memory` output folder (its
// results.jsonl and the store it imported) and prints a Markdown table of quantiles.
//   node bench/reranker-scores.mjs OUT_DIR [RERANKER_DIR]   (default models/memory-qa-reranker)
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { MemoryStore, routeMemories } from "../dist/src/index.js";
import { OnnxCrossEncoder } from "../dist/src/memory/embedders/onnx-cross-encoder.js";

const [dir, rerankerDir = "models/memory-qa-reranker"] = process.argv.slice(2);
if (!dir) {
  console.error("usage: node bench/reranker-scores.mjs OUT_DIR [RERANKER_DIR]");
  process.exit(2);
}
const rows = readFileSync(resolve(dir, "results.jsonl"), "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
const store = await MemoryStore.open({ dir: resolve(dir, "store") });
const reranker = await OnnxCrossEncoder.load(resolve(rerankerDir), { threads: 2 });
const top = { answerable: [], unanswerable: [] };
try {
  for (const r of rows) {
    // The same candidates as the harness's routing (all of the user's memories, up to 100), the best one only.
    const [best] = await routeMemories(store, r.question, { userId: r.conversation, limit: 1, rerank: { reranker, depth: 100 } });
    top[r.answerable ? "answerable" : "unanswerable"].push(best?.rerank ?? 0);
  }
} finally {
  await store.close();
  await reranker.close();
}
const ps = [0.1, 0.25, 0.5, 0.75, 0.9];
const quantile = (xs, p) => [...xs].sort((a, b) => a - b)[Math.floor(p * (xs.length - 1))];
console.log(`| questions | n | ${ps.map((p) => `top score, ${p * 100}th percentile`).join(" | ")} |`);
console.log(`| --- | ---: | ${ps.map(() => "---:").join(" | ")} |`);
for (const [k, xs] of Object.entries(top)) console.log(`| ${k} | ${xs.length} | ${ps.map((p) => quantile(xs, p).toPrecision(2)).join(" | ")} |`);
