// The DKI system's own cost per turn and its time to first token by cache tier.
//
// (1) Layer cost: what DKISystem.chat adds beyond the engine's prefill and decode (routing,
//     gating logic, cache lookups, prompt assembly, the turn's record), at 10 / 100 / 1,000
//     memories per user, blocks warm in L1, with the entropy probe (a prefill of the bare query)
//     reported beside it. Target: ≤ 5 ms plus the probe.
// (2) TTFT of a turn whose memory blocks come from L1 / L2 / L3 / recompute (L4). Target: an
//     L3-warm turn within 1.3× of an L1-warm one.
// Usage: node bench/dki-chat.js [--quick] [--presets smollm2-135m,llama-1b]
//   (--quick: 5 turns a row instead of 20, and 1,000 memories left out)
import os from "node:os";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Model, native } from "../dist/src/index.js";
import { DKISystem, layerCostMs } from "../dist/src/dki/index.js";
import { machine } from "./lib/machine.js";
import { benchModel } from "./lib/models.js";
import { writeResults } from "./lib/results.js";

const quick = process.argv.includes("--quick");
const loadAtStart = os.loadavg()[0];
const presetArg = process.argv.find((a, i) => process.argv[i - 1] === "--presets");
const presets = presetArg ? presetArg.split(",") : ["smollm2-135m", "llama-1b"];
const TURNS = quick ? 5 : 20;
const counts = quick ? [10, 100] : [10, 100, 1000];

const WORDS = ("alps hiking peanuts allergy lyon vegetarian cello jazz marathon sushi kyoto tennis garden roses " +
  "python rust chess painting violin sailing tea coffee museum berlin lisbon cycling yoga ramen opera kayak " +
  "mountains desert beach camping pottery knitting climbing surfing baking salsa tango drums novels poetry").split(" ");
const rand = (() => {
  let a = 12345;
  return () => ((a = (a * 1103515245 + 12345) >>> 0) / 2 ** 32);
})();
const pick = () => WORDS[Math.floor(rand() * WORDS.length)];
/** A memory of about `words` words, mostly random topics, so routing has real work to do. */
const memoryText = (i, words) => `Memory ${i}: the user ` + Array.from({ length: words }, pick).join(" ") + ".";
const QUERY = "What do you remember about my hiking in the alps and my peanuts allergy?";

const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
};

async function openSystem(model, dataDir, budgets, extra = {}) {
  return DKISystem.open({
    model,
    dataDir,
    budgets,
    // Relevance threshold 0: the top memories are injected on every turn of the bench.
    config: { maxMemories: 3, gating: { relevanceThreshold: 0 }, historyEnabled: false, ...extra },
  });
}

const big = { l1Bytes: 2 ** 30, l2Bytes: 2 ** 30, l3Bytes: 4 * 2 ** 30 };
const layerRows = [];
const tierRows = [];
for (const preset of presets) {
  const dir = await benchModel(preset, "f16");
  const model = await Model.load(dir, { contextSize: 1024 });

  // (1) layer cost at N memories.
  for (const n of counts) {
    const data = mkdtempSync(join(tmpdir(), "dki-bench-"));
    const sys = await openSystem(model, data, big);
    const t0 = performance.now();
    for (let i = 0; i < n; i++) await sys.memories.add(memoryText(i, 12), { userId: "u" });
    await sys.memories.add("The user loves hiking in the Alps and is allergic to peanuts.", { userId: "u" });
    const addMs = (performance.now() - t0) / (n + 1);
    await sys.chat(QUERY, { userId: "u", sessionId: "warm", maxNewTokens: 1 }); // blocks computed, caches warm
    const lat = [];
    for (let t = 0; t < TURNS; t++) lat.push((await sys.chat(QUERY, { userId: "u", sessionId: `s${t}`, maxNewTokens: 1 })).latency);
    await sys.close();
    rmSync(data, { recursive: true, force: true });
    layerRows.push({
      model: preset,
      "memories/user": n,
      "layer ms (mean)": mean(lat.map(layerCostMs)),
      "layer ms (median)": median(lat.map(layerCostMs)),
      // The list (routing, gating, cache lookups, assembly): the layer less the turn's durable record.
      "layer ms excl. record (median)": median(lat.map((l) => layerCostMs(l) - l.recordMs)),
      // The DKI layer's own share: the layer cost less the memory store's search and write.
      "own ms (mean)": mean(lat.map((l) => layerCostMs(l) - l.routingMs - l.recordMs)),
      "routing ms": mean(lat.map((l) => l.routingMs)),
      "prompt ms": mean(lat.map((l) => l.promptMs)),
      "gating ms (excl. probe)": mean(lat.map((l) => l.gatingMs - l.entropyProbeMs)),
      "L1 lookups ms": mean(lat.map((l) => l.kvLoadMs.L1)),
      "record ms": mean(lat.map((l) => l.recordMs)),
      "entropy probe ms": mean(lat.map((l) => l.entropyProbeMs)),
      "prefill ms": mean(lat.map((l) => l.prefillMs)),
      "add ms/memory": addMs,
    });
    process.stderr.write(`${preset} ${n} memories: layer ${layerRows.at(-1)["layer ms (mean)"].toFixed(2)} ms\n`);
  }

  // (2) TTFT by the tier the memory blocks come from: three memories of ~100 tokens each. One
  // system per tier, each with its own copy of the data, and the tiers interleaved turn by turn,
  // so the load of a shared machine weighs on every tier alike.
  const N3 = 3;
  const dirs = { L1: null, L2: null, L3: null, L4: null, probeOff: null };
  const systems = {};
  const budgetsOf = { L1: big, L2: { ...big, l1Bytes: 1 }, L3: big, L4: big, probeOff: big };
  for (const k of Object.keys(dirs)) {
    dirs[k] = mkdtempSync(join(tmpdir(), "dki-bench-"));
    const s = await openSystem(model, dirs[k], budgetsOf[k], k === "probeOff" ? { gating: { relevanceThreshold: 0, entropyProbe: false } } : {});
    for (let i = 0; i < N3; i++) await s.memories.add(`The user loves hiking in the alps and peanuts allergy notes ${i}: ` + memoryText(i, 60), { userId: "u" });
    await s.chat(QUERY, { userId: "u", sessionId: "t", maxNewTokens: 1 }); // computes the blocks, registers them for session t
    systems[k] = s;
  }
  const ttft = { L1: [], L2: [], L3: [], L4: [], probeOff: [] };
  const probe = [];
  const prefill = [];
  const seen = { L1: new Set(), L2: new Set(), L3: new Set(), L4: new Set(), probeOff: new Set() };
  const turn = async (k) => {
    const r = await systems[k].chat(QUERY, { userId: "u", sessionId: "t", maxNewTokens: 1 });
    ttft[k].push(r.latency.ttftMs);
    if (k === "L1") probe.push(r.latency.entropyProbeMs), prefill.push(r.latency.prefillMs);
    for (const b of r.cache.tiers) seen[k].add(b.tier);
  };
  for (let t = 0; t < TURNS; t++) {
    await turn("L1"); // blocks stay in L1 between turns
    await turn("L2"); // a 1-byte L1: each turn's blocks went down to L2 and come back from there
    // L3: a fresh process's view (the system reopened: only the int8 files are there).
    await systems.L3.close();
    systems.L3 = await openSystem(model, dirs.L3, big);
    await turn("L3");
    await systems.L4.clearSessionCache("t"); // L4: the blocks dropped from every tier
    await turn("L4");
    await turn("probeOff");
  }
  for (const k of Object.keys(dirs)) {
    await systems[k].close();
    rmSync(dirs[k], { recursive: true, force: true });
  }
  const l1 = median(ttft.L1);
  tierRows.push({
    model: preset,
    "L1 ttft ms": l1,
    "L2 ttft ms": median(ttft.L2),
    "L3 ttft ms": median(ttft.L3),
    "L4 (recompute) ttft ms": median(ttft.L4),
    "L3/L1": median(ttft.L3) / l1,
    "L4/L1": median(ttft.L4) / l1,
    "L1, probe off ttft ms": median(ttft.probeOff),
    "entropy probe ms": median(probe),
    "prompt prefill ms": median(prefill),
    "tiers seen (L1/L2/L3/L4/probe off)": ["L1", "L2", "L3", "L4", "probeOff"].map((k) => [...seen[k]].join("+")).join(" / "),
  });
  process.stderr.write(`${preset}: ttft L1 ${l1.toFixed(1)} L3 ${median(ttft.L3).toFixed(1)} ms\n`);
  model.dispose();
}

const m = machine(native());
const notes = [
  `${TURNS} turns a row, 1 new token each; blocks of the layer-cost rows warm in L1; history off, 3 memories routed a turn (relevance threshold 0: every turn injects).`,
  "layer ms = total − prefill − decode − K/V computes − queue wait − entropy probe: routing (hashing embedder, exact scan below 1,000 memories a user and HNSW from 1,000, BM25, in the memory store), gating logic, cache lookups, prompt rendering and tokenising, the turn's record (one durable store transaction, fsync included). The chat template renders in its sandbox process while the turn routes: prompt ms is the plan's time less routing. own ms = layer ms less routing and record (the memory store's search and write): what src/dki itself costs. 'excl. record' leaves out the record, written after the answer has streamed: routing, prompt, gating, cache lookups and assembly, the list the ≤ 5 ms target names.",
  "The entropy probe is a prefill of the bare query (n_u tokens, no template, no memory), not of the prompt: reported in its own column.",
  "TTFT (median) is from the chat() call to the first token, 3 memories of ~100 tokens injected. One system per tier, turns interleaved across tiers: L3 reopens its system before each turn (a new process's view: int8 files only); L2 runs with a 1-byte L1 so every block comes back from L2; L4 drops the blocks before each turn; 'probe off' is L1 with gating.entropyProbe false.",
  `Load average (1 min) ${loadAtStart.toFixed(1)} at the start and ${os.loadavg()[0].toFixed(1)} at the end, on ${os.cpus().length} cores (the benchmark keeps 2 threads busy; more than that means other work shared the machine and single rows are noisier: compare within a row).`,
];
writeResults("dki-chat-layer-cpu", { machine: m, rows: layerRows, columns: Object.keys(layerRows[0]), notes });
writeResults("dki-chat-ttft-cpu", { machine: m, rows: tierRows, columns: Object.keys(tierRows[0]), notes });
