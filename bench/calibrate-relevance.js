// Calibrates DKI gating's relevance threshold τ per embedder on the labelled corpus of
// test/support/memory-corpus.json (memories, questions a memory answers, off-topic queries; English
// and Chinese): τ is chosen on the calibration half (calibrateRelevance, src/memory/calibrate.ts)
// and its rates are reported on the held-out half. The hashing embedder's row is where
// HASHING_RELEVANCE_THRESHOLD comes from; an ONNX sentence model's τ, measured with --onnx, is what
// to pass as OnnxEmbedder's relevanceThreshold option.
// Usage: node bench/calibrate-relevance.js [--onnx MODEL_DIR]   (needs dist/: npm run build:ts)
//   results: bench/results/relevance-calibration.{json,md}
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { calibrateRelevance, summarizeScores, thresholdRates, topDenseScores } from "../dist/src/memory/calibrate.js";
import { HashingEmbedder } from "../dist/src/memory/embedders/hashing.js";
import { machine } from "./lib/machine.js";
import { writeResults } from "./lib/results.js";

const onnxArg = process.argv.indexOf("--onnx");
const onnxDir = onnxArg < 0 ? undefined : process.argv[onnxArg + 1];
if (onnxArg >= 0 && (onnxDir === undefined || onnxDir.startsWith("--"))) {
  console.error("usage: node bench/calibrate-relevance.js [--onnx MODEL_DIR]");
  process.exit(1);
}

const corpusFile = join(dirname(fileURLToPath(import.meta.url)), "..", "test", "support", "memory-corpus.json");
const corpus = JSON.parse(readFileSync(corpusFile, "utf8"));
// The split of test/support/memory-corpus.ts (GATE_SPLIT): questions by the memory that answers
// them (even index: calibration), off-topic queries alternating.
const half = (keep) => ({
  relevant: corpus.questions.filter(([, m]) => keep(m)).map(([q]) => q),
  offTopic: corpus.offTopic.filter((_, i) => keep(i)),
});
const calibration = half((i) => i % 2 === 0);
const heldOut = half((i) => i % 2 === 1);

const embedders = [new HashingEmbedder()];
if (onnxDir !== undefined) {
  // Loaded only when asked for: onnxruntime's native library is not needed otherwise.
  const { OnnxEmbedder } = await import("../dist/src/memory/embedders/onnx.js");
  embedders.push(await OnnxEmbedder.load(onnxDir));
}

const rows = [];
const notes = [
  `Corpus: ${corpus.memories.length} memories of one user; calibration half ${calibration.relevant.length} questions a memory answers and ${calibration.offTopic.length} off-topic queries, held-out half ${heldOut.relevant.length} and ${heldOut.offTopic.length} (questions split by the memory that answers them, so none is on both sides).`,
  "s₁ is a query's best cosine over the memories, negative as 0: the dense signal gating reads. τ maximises balanced accuracy ½·(TPR + 1 − FPR) on the calibration half, at the midpoint of the widest best gap; the held-out columns apply that τ to queries it never saw.",
  "Routing hands the gate the top dense score among the routed memories, which is below the best dense score when fusion with BM25 passes over that memory; with the hashing embedder on this corpus that happens only to queries already below τ, so no query changes side (test/relevance-calibration.test.ts).",
];
for (const embedder of embedders) {
  const c = await calibrateRelevance(embedder, { memories: corpus.memories, ...calibration });
  const [r, o] = await Promise.all([topDenseScores(embedder, corpus.memories, heldOut.relevant), topDenseScores(embedder, corpus.memories, heldOut.offTopic)]);
  const held = thresholdRates(c.threshold, r, o);
  const spread = (s) => `${s.median.toFixed(3)} (${s.p10.toFixed(3)}–${s.p90.toFixed(3)})`;
  rows.push({
    embedder: embedder.id,
    "τ": c.threshold,
    "gap (highest left out – lowest let in)": `${c.gap.below?.toFixed(4) ?? "-"} – ${c.gap.above.toFixed(4)}`,
    "calibration TPR": c.truePositiveRate,
    "calibration FPR": c.falsePositiveRate,
    "calibration balanced accuracy": c.balancedAccuracy,
    "held-out TPR": held.truePositiveRate,
    "held-out FPR": held.falsePositiveRate,
    "held-out balanced accuracy": held.balancedAccuracy,
    "s₁ relevant, median (p10–p90), calibration / held-out": `${spread(c.relevant)} / ${spread(summarizeScores(r))}`,
    "s₁ off-topic, median (p10–p90), calibration / held-out": `${spread(c.offTopic)} / ${spread(summarizeScores(o))}`,
    "embedder's own τ": embedder.relevanceThreshold ?? "none",
  });
  if (embedder.relevanceThreshold !== undefined) {
    const own = thresholdRates(embedder.relevanceThreshold, r, o);
    notes.push(`${embedder.id}: at its own relevanceThreshold ${embedder.relevanceThreshold} the held-out half gives TPR ${own.truePositiveRate.toFixed(3)}, FPR ${own.falsePositiveRate.toFixed(3)}, balanced accuracy ${own.balancedAccuracy.toFixed(3)}.`);
  }
  await embedder.close?.();
}

writeResults("relevance-calibration", { machine: machine(), rows, columns: Object.keys(rows[0]), notes });
