// Recall v4's cost per turn (issue 37, must-show 4): one user with 100 / 1,000 / 10,000 messages
// (synthetic chatter, recorded through the store), then the median time of a turn's recall and
// suffix (the index warm: it follows the store incrementally, so a turn embeds only the messages
// new since the last one) for queries about old messages. The first recall, which indexes every
// message, is reported beside it. Counts tokens with the generated tiny model's tokenizer.
// Usage: node bench/recall.js [--quick]   (--quick: 100 and 1,000 messages only)
//   results: bench/results/recall.{json,md}
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir, loadavg } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { MemoryStore } from "../dist/src/memory/memory-store.js";
import { makeTinyModel } from "../dist/src/models/make-tiny.js";
import { Tokenizer } from "../dist/src/tokenizer/tokenizer.js";
import { tokenCounter } from "../dist/src/dki/prompt.js";
import { RecallHistoryProvider, resolveRecallConfig } from "../dist/src/recall/index.js";
import { machine } from "./lib/machine.js";
import { writeResults } from "./lib/results.js";

const quick = process.argv.includes("--quick");
const SIZES = quick ? [100, 1000] : [100, 1000, 10000];
const TOPICS = ["weather", "pasta", "meeting", "movie", "violin", "novel", "garden", "traffic", "pottery", "cat", "paint", "quiz", "bakery", "canal", "laptop", "picnic"];
const QUERIES = ["What did I say about the pottery class?", "When was the quiz?", "Which movie did we watch?", "What happened with the laptop battery?", "Tell me about the garden tomatoes."];

const work = mkdtempSync(join(tmpdir(), "dki-bench-recall-"));
const rows = [];
try {
  const modelDir = join(work, "model");
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: modelDir, seed: 1 });
  const counter = tokenCounter(await Tokenizer.fromFolder(modelDir));
  for (const n of SIZES) {
    const store = await MemoryStore.open({ dir: join(work, `store-${n}`) });
    try {
      for (let i = 0; i < n / 2; i++) {
        const topic = TOPICS[i % TOPICS.length];
        await store.conversations.recordTurn({ userId: "u", sessionId: "s", query: `Message ${i}: something about the ${topic} and item ${i * 7}.`, response: `Okay, noted about the ${topic}.`, injectionMode: "none", memoryIds: [], latencyMs: 1, auditAction: "bench" });
      }
      const p = new RecallHistoryProvider(store, store.embedder, resolveRecallConfig({ enabled: true }));
      const turn = (q) => p.run({ query: q, userId: "u", sessionId: "s", language: "en", counter, contextWindow: 2048 });
      let t = performance.now();
      await turn(QUERIES[0]);
      const firstMs = performance.now() - t;
      const times = [];
      for (let r = 0; r < 25; r++) {
        t = performance.now();
        await turn(QUERIES[r % QUERIES.length]);
        times.push(performance.now() - t);
      }
      times.sort((a, b) => a - b);
      rows.push({ messages: n, "median ms": times[Math.floor(times.length / 2)], "p90 ms": times[Math.floor(times.length * 0.9)], "first (indexing) ms": firstMs, "load avg (1 min)": loadavg()[0] });
    } finally {
      await store.close();
    }
  }
} finally {
  rmSync(work, { recursive: true, force: true });
}
writeResults("recall", {
  machine: machine(),
  rows,
  columns: ["messages", "median ms", "p90 ms", "first (indexing) ms", "load avg (1 min)"],
  notes: ["A turn: list the user's turns from the store, sync the message index, the four signals, fusion, and the suffix (the tiny model's tokenizer counts every message line).", "Timings on a shared machine: the load average says how busy it was."],
});
