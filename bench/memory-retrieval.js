// Retrieval quality of the memory store on a LoCoMo-format file (issue 28, must-show 3): every
// conversation is imported (one user each, one memory per turn), and every question with evidence
// is searched in its conversation's scope. Reported: recall@1/5/10/25 of the evidence turns (the
// share of a question's evidence dia_ids among the top k, averaged), per question category and
// overall, for BM25 only, dense only and hybrid (RRF).
// Usage: node bench/memory-retrieval.js FILE [--embedder ONNX_MODEL_DIR] [--name NAME]
//   results: bench/results/<NAME>.{json,md}, NAME defaulting to memory-retrieval-<file name>
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { OnnxEmbedder } from "../dist/src/memory/embedders/onnx.js";
import { MemoryStore } from "../dist/src/memory/memory-store.js";
import { machine } from "./lib/machine.js";
import { writeResults } from "./lib/results.js";

const args = process.argv.slice(2);
const flag = (name) => {
  const i = args.indexOf(name);
  if (i < 0) return undefined;
  if (i + 1 >= args.length) throw new Error(`${name} needs a value`);
  return args.splice(i, 2)[1];
};
const embedderDir = flag("--embedder");
const nameArg = flag("--name");
const [file] = args.filter((a) => !a.startsWith("--"));
if (file === undefined) {
  console.error("usage: node bench/memory-retrieval.js FILE [--embedder ONNX_MODEL_DIR] [--name NAME]");
  process.exit(1);
}

const KS = [1, 5, 10, 25];
const MODES = {
  bm25: { method: "rrf", weights: { dense: 0, bm25: 1 } },
  dense: { method: "rrf", weights: { dense: 1, bm25: 0 } },
  hybrid: { method: "rrf" },
};
// LoCoMo's categories as its paper numbers them.
const CATEGORY = { 1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial" };

const embedder = embedderDir === undefined ? undefined : await OnnxEmbedder.load(embedderDir);
const scratch = mkdtempSync(join(tmpdir(), "dki-bench-retrieval-"));
const store = await MemoryStore.open({ dir: join(scratch, "store"), embedder, durability: "commit" });
try {
  const t0 = performance.now();
  const imported = await store.importConversations(file, { format: "locomo" });
  const importMs = performance.now() - t0;

  // The questions, read from the same file in the same order as the import's users.
  const raw = JSON.parse(readFileSync(file, "utf8"));
  const samples = Array.isArray(raw) ? raw : [raw];
  const sums = new Map(); // category → mode → k → summed recall; plus question counts
  let skipped = 0;
  let questions = 0;
  const searchMs = [];
  for (const [i, sample] of samples.entries()) {
    const userId = imported.users[i].userId;
    // dia_id → memory id, from the memories' metadata.
    const byTurn = new Map((await store.memories.getAll({ userId })).map((m) => [m.metadata.turnId, m.id]));
    for (const qa of sample.qa ?? []) {
      const evidence = (Array.isArray(qa.evidence) ? qa.evidence : []).filter((d) => byTurn.has(d));
      if (typeof qa.question !== "string" || qa.question.trim() === "" || evidence.length === 0) {
        skipped++;
        continue;
      }
      questions++;
      const wanted = new Set(evidence.map((d) => byTurn.get(d)));
      const category = CATEGORY[qa.category] ?? String(qa.category ?? "none");
      for (const cat of [category, "all"]) if (!sums.has(cat)) sums.set(cat, { n: 0, modes: {} });
      for (const cat of [category, "all"]) sums.get(cat).n++;
      for (const [mode, fusion] of Object.entries(MODES)) {
        const s0 = performance.now();
        const found = (await store.memories.search(qa.question, { userId, limit: Math.max(...KS), fusion })).map((r) => r.memory.id);
        if (mode === "hybrid") searchMs.push(performance.now() - s0);
        for (const cat of [category, "all"]) {
          const m = (sums.get(cat).modes[mode] ??= Object.fromEntries(KS.map((k) => [k, 0])));
          for (const k of KS) m[k] += found.slice(0, k).filter((id) => wanted.has(id)).length / wanted.size;
        }
      }
    }
  }

  const rows = [];
  const order = ["all", ...Object.values(CATEGORY), ...[...sums.keys()].filter((c) => c !== "all" && !Object.values(CATEGORY).includes(c))];
  for (const cat of order.filter((c) => sums.has(c))) {
    const { n, modes } = sums.get(cat);
    for (const mode of Object.keys(MODES)) {
      rows.push({ category: cat, questions: n, retrieval: mode, ...Object.fromEntries(KS.map((k) => [`recall@${k}`, modes[mode][k] / n])) });
    }
  }
  searchMs.sort((a, b) => a - b);
  writeResults(nameArg ?? `memory-retrieval-${basename(file).replace(/\.json$/i, "")}`, {
    machine: machine(),
    rows,
    columns: ["category", "questions", "retrieval", ...KS.map((k) => `recall@${k}`)],
    notes: [
      `${basename(file)}: ${imported.users.length} conversations, ${imported.memories} turns imported in ${(importMs / 1000).toFixed(1)} s; ${questions} questions with evidence, ${skipped} without (left out)`,
      `embedder ${store.embedder.id}; hybrid = RRF (k 60) of dense and BM25; recall@k = share of a question's evidence turns among its top k, averaged`,
      `hybrid search p50 ${searchMs[Math.floor(searchMs.length / 2)]?.toFixed(2)} ms, p95 ${searchMs[Math.floor(searchMs.length * 0.95)]?.toFixed(2)} ms`,
    ],
  });
} finally {
  await store.close();
  rmSync(scratch, { recursive: true, force: true });
}
