// Sweeps of how a memory reaches a memory-QA model through DKI, on the first answer token's
// distribution. Per question (its conversation imported by the memory layer's importer, one store
// user per conversation) the same routed memories (top-k, oldest first, α forced) are injected
// under each setting, and the next-token distribution p after the prompt (DKISystem.logits) is
// compared with
//   p_none       the same prompt, nothing injected;
//   p_full-text  the routed memories as prompt text before the question (one `Speaker: text` line
//                each, a blank line, the question: the form the memory-QA models were trained on),
//                nothing injected: what the model would see without injection;
// as KL(p‖p_none), KL(p‖p_full-text) and top-1 agreement with p_full-text, averaged over the
// questions. Settings: α with value and logit scaling; positions (negative, prefix); the encoding
// prefix (none, bos, bos+system); the training-free fixes of DKIConfig.blockFix (EPIC k = 4, 16;
// CacheBlend 0.15; APE) against the separate and the joint encoding (EPIC with k past every block:
// exactly the joint encoding, test/dki-block-fixes.test.ts).
// --harness: also the harness's dki-mode exact match per setting (src/eval/memory-qa.ts, with the
// setting as its DKI config), answers decoded greedily.
//
// Usage: node bench/memory-sweeps.js --data FILE.json [--model DIR] [--limit 40] [--seed 1] [--top-k 3]
//                                    [--name NAME] [--note TEXT] [--harness] [--quick]
//   --data   LoCoMo- or LongMemEval-form questions with their conversations (e.g. the held-out
//            synthetic set: dki eval synth --split heldout)
//   --model  HF folder or GGUF (default models/memory-qa-plain)
//   --note   a line said first in the table's notes (where the model and the data came from)
//   --quick  fewer α values; results to memory-sweeps-NAME-quick
// Results: bench/results/memory-sweeps-NAME.{md,json} and the plots memory-sweeps-NAME-{alpha,settings}.png.
// Uses the memory-QA answer instruction and full-text form (src/eval/instruction.ts,
// full-context.ts) and the plot renderer (src/util/plot.ts) of the harness: build (npx tsc) first.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import { Model, native } from "../dist/src/index.js";
import { DKISystem } from "../dist/src/dki/index.js";
import { MemoryStore } from "../dist/src/memory/memory-store.js";
import { importConversations, parseConversations } from "../dist/src/memory/import.js";
import { ANSWER_INSTRUCTION } from "../dist/src/eval/instruction.js";
import { fullContextQuery } from "../dist/src/eval/full-context.js";
import { renderVegaLite } from "../dist/src/util/plot.js";
import { machine } from "./lib/machine.js";
import { resultsDir, writeResults } from "./lib/results.js";

const arg = (name) => process.argv.find((a, i) => process.argv[i - 1] === name) ?? process.argv.find((a) => a.startsWith(`${name}=`))?.slice(name.length + 1);
const quick = process.argv.includes("--quick");
const dataFile = arg("--data");
if (!dataFile) {
  console.error("usage: node bench/memory-sweeps.js --data FILE.json [--model DIR] [--limit N] [--seed N] [--top-k N] [--name NAME] [--harness] [--quick]");
  process.exit(2);
}
const modelDir = resolve(arg("--model") ?? "models/memory-qa-plain");
const limit = Number(arg("--limit") ?? 40);
const seed = Number(arg("--seed") ?? 1);
const topK = Number(arg("--top-k") ?? 3);
const name = arg("--name") ?? basename(modelDir).replace(/\.gguf$/i, "");
const withHarness = process.argv.includes("--harness");
/** Said first among the table's notes: where the model and the data came from. */
const provenance = arg("--note");
const loadAtStart = loadavg()[0];

// ---------------------------------------------------------------------------------------------
// The settings. Every one injects the same routed memories with α forced; `config` is the
// DKIConfig the setting changes, over COMMON.

const COMMON = { maxMemories: topK, systemPrompt: ANSWER_INSTRUCTION, historyEnabled: false, preferenceEnabled: false, memoryOrder: "time" };
const ALPHAS = quick ? [0.25, 0.5, 1] : [0.1, 0.25, 0.5, 0.75, 1];
const SETTINGS = [
  ...ALPHAS.map((alpha) => ({ sweep: "alpha", label: `value α=${alpha}`, scaling: "value", alpha, config: {} })),
  ...ALPHAS.map((alpha) => ({ sweep: "alpha", label: `logit α=${alpha}`, scaling: "logit", alpha, config: { alphaScaling: "logit" } })),
  { sweep: "positions", label: "negative", alpha: 1, config: { positions: "negative" } },
  { sweep: "positions", label: "prefix", alpha: 1, config: { positions: "prefix" } },
  ...["none", "bos", "bos+system"].map((p) => ({ sweep: "encoding prefix", label: p, alpha: 1, config: { encodingPrefix: p } })),
  { sweep: "block fix", label: "separate (none)", alpha: 1, config: { blockFix: { kind: "none" } } },
  { sweep: "block fix", label: "EPIC k=4", alpha: 1, config: { blockFix: { kind: "epic", recomputeTokens: 4 } } },
  { sweep: "block fix", label: "EPIC k=16", alpha: 1, config: { blockFix: { kind: "epic", recomputeTokens: 16 } } },
  { sweep: "block fix", label: "CacheBlend r=0.15", alpha: 1, config: { blockFix: { kind: "cacheblend", ratio: 0.15 } } },
  { sweep: "block fix", label: "APE T=0.8 s=1", alpha: 1, config: { blockFix: { kind: "ape", temperature: 0.8, scale: 1 } } },
  { sweep: "block fix", label: "APE T=1 s=2", alpha: 1, config: { blockFix: { kind: "ape", temperature: 1, scale: 2 } } },
  { sweep: "block fix", label: "joint (EPIC k=∞)", alpha: 1, config: { blockFix: { kind: "epic", recomputeTokens: 1_000_000 } } },
];

// ---------------------------------------------------------------------------------------------
// Questions: each with the store user of its conversation (the importer's ids, in file order).

async function loadQuestions(file) {
  const { format, conversations } = await parseConversations(file);
  const raw = JSON.parse(readFileSync(file, "utf8"));
  const qs =
    format === "locomo"
      ? raw.flatMap((sample, i) => sample.qa.map((q, j) => ({ id: `${conversations[i].userId}:${j}`, userId: conversations[i].userId, question: q.question, answer: String(q.answer ?? q.adversarial_answer ?? ""), category: String(q.category) })))
      : raw.map((e, i) => ({ id: e.question_id, userId: conversations[i].userId, question: e.question, answer: String(e.answer), category: e.question_type }));
  // A seeded shuffle, then the first `limit`: the same questions for every setting and run.
  let s = seed >>> 0 || 1;
  const rand = () => ((s = (Math.imul(s, 1103515245) + 12345) >>> 0) / 2 ** 32);
  for (let i = qs.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [qs[i], qs[j]] = [qs[j], qs[i]];
  }
  return { format, questions: qs.slice(0, limit) };
}

// ---------------------------------------------------------------------------------------------
// Distributions.

/** Softmax of a logits row, in float64. */
function softmax(row) {
  let max = -Infinity;
  for (const x of row) max = Math.max(max, x);
  const p = new Float64Array(row.length);
  let sum = 0;
  for (let i = 0; i < row.length; i++) sum += p[i] = Math.exp(row[i] - max);
  for (let i = 0; i < p.length; i++) p[i] /= sum;
  return p;
}
/** KL(p‖q) in nats. */
function kl(p, q) {
  let d = 0;
  for (let i = 0; i < p.length; i++) if (p[i] > 0) d += p[i] * Math.log(p[i] / Math.max(q[i], 1e-300));
  return d;
}
const argmax = (p) => p.reduce((best, x, i) => (x > p[best] ? i : best), 0);
const mean = (xs) => (xs.length === 0 ? NaN : xs.reduce((a, b) => a + b, 0) / xs.length);

// ---------------------------------------------------------------------------------------------

const tmp = mkdtempSync(join(tmpdir(), "dki-sweeps-"));
const storeDir = join(tmp, "store");
const { format, questions } = await loadQuestions(dataFile);
const users = new Set(questions.map((q) => q.userId));
const store = await MemoryStore.open({ dir: storeDir });
await importConversations({ maxTextChars: store.maxTextChars, listUsers: () => [], insertTurns: (u, turns) => (users.has(u) ? store.insertTurns(u, turns) : Promise.resolve(0)) }, dataFile);
await store.close();

const model = await Model.load(modelDir);
const open = (config) => DKISystem.open({ model, dataDir: storeDir, cacheDir: join(tmp, "kv-cache"), config: { ...COMMON, ...config } });
const lastRow = (r) => softmax(r.logits[r.logits.length - 1]);

// The references, once per question: the routed memories (from the plain setting), p_none, p_full-text.
const refs = new Map();
{
  const sys = await open({});
  try {
    for (const q of questions) {
      const opts = { userId: q.userId, sessionId: `ref:${q.id}` };
      const injected = await sys.logits(q.question, { ...opts, forceAlpha: 1 });
      const texts = injected.memoriesUsed.map((m) => m.text);
      const none = lastRow(await sys.logits(q.question, { ...opts, allowInjection: false }));
      const full = lastRow(await sys.logits(fullContextQuery(texts.join("\n"), q.question), { ...opts, allowInjection: false }));
      refs.set(q.id, { ids: injected.memoriesUsed.map((m) => m.id).join(","), none, full, memoryTokens: injected.memoriesUsed.reduce((n, m) => n + m.tokens, 0) });
    }
  } finally {
    await sys.close();
  }
}

/** The harness's dki-mode exact match over the same questions, with `setting`'s DKI config (--harness). */
async function harnessEM(setting) {
  const { runMemoryQA } = await import("../dist/src/eval/memory-qa.js");
  const dkiConfig = { ...COMMON, ...setting.config };
  const r = await runMemoryQA({ model: modelDir, data: dataFile, out: join(tmp, `harness-${SETTINGS.indexOf(setting)}`), modes: ["dki"], topK, alpha: setting.alpha, limit, seed, dkiConfig });
  // A harness that does not pass the config on would score every setting alike.
  if (JSON.stringify(r.settings.dkiConfig) !== JSON.stringify(dkiConfig))
    throw new Error("--harness: runMemoryQA does not report the dkiConfig it ran with; it needs MemoryQAOptions.dkiConfig (spread into its DKISystem config)");
  return mean(r.rows.map((row) => row.em));
}

const rows = [];
rows.push({ sweep: "reference", setting: "nothing injected", "KL(p‖p_none)": 0, "KL(p‖p_full)": mean(questions.map((q) => kl(refs.get(q.id).none, refs.get(q.id).full))), "top-1 = full": mean(questions.map((q) => Number(argmax(refs.get(q.id).none) === argmax(refs.get(q.id).full)))) });
rows.push({ sweep: "reference", setting: "full text", "KL(p‖p_none)": mean(questions.map((q) => kl(refs.get(q.id).full, refs.get(q.id).none))), "KL(p‖p_full)": 0, "top-1 = full": 1 });
let mismatched = 0;
for (const s of SETTINGS) {
  const t0 = performance.now();
  const sys = await open(s.config);
  const klNone = [], klFull = [], agree = [];
  try {
    for (const q of questions) {
      const ref = refs.get(q.id);
      const r = await sys.logits(q.question, { userId: q.userId, sessionId: `sweep:${q.id}`, forceAlpha: s.alpha });
      if (r.memoriesUsed.map((m) => m.id).join(",") !== ref.ids) mismatched++;
      const p = lastRow(r);
      klNone.push(kl(p, ref.none));
      klFull.push(kl(p, ref.full));
      agree.push(Number(argmax(p) === argmax(ref.full)));
    }
  } finally {
    await sys.close();
  }
  const row = { sweep: s.sweep, setting: s.label, alpha: s.alpha, "KL(p‖p_none)": mean(klNone), "KL(p‖p_full)": mean(klFull), "top-1 = full": mean(agree), ms: (performance.now() - t0) / questions.length };
  if (withHarness) row["harness EM"] = await harnessEM(s);
  rows.push(row);
  process.stderr.write(`${s.sweep} / ${s.label}: KL to full ${row["KL(p‖p_full)"].toFixed(3)}, top-1 ${row["top-1 = full"].toFixed(2)}\n`);
}
model.dispose();
rmSync(tmp, { recursive: true, force: true });

const m = machine(native());
const base = `memory-sweeps-${name}${quick ? "-quick" : ""}`;
const columns = ["sweep", "setting", "KL(p‖p_none)", "KL(p‖p_full)", "top-1 = full", ...(withHarness ? ["harness EM"] : []), "ms"];
writeResults(`memory-sweeps-${name}`, {
  machine: m,
  rows,
  columns,
  notes: [
    ...(provenance ? [provenance] : []),
    `Model ${modelDir}; data ${resolve(dataFile)} (${format}), ${questions.length} questions (seed ${seed}), top-${topK} routed memories a question, injected oldest first with α forced; mean ${mean(questions.map((q) => refs.get(q.id).memoryTokens)).toFixed(1)} memory tokens a question.`,
    "p: the next-token distribution after the prompt (the first answer token). p_none: the same prompt, nothing injected. p_full: the routed memories as prompt text before the question, nothing injected. KL in nats, averaged over the questions; top-1 = full: share of questions whose most likely first token is p_full's.",
    "Unless the row says otherwise: α = 1, value scaling, negative positions, encoding prefix bos, no block fix. 'joint (EPIC k=∞)' recomputes every block behind the ones before it: exactly the joint encoding of the memories behind the prefix.",
    mismatched === 0 ? "Every setting injected the same memories for a question as the reference." : `${mismatched} (setting, question) pairs injected other memories than the reference (token budget); their rows still count.`,
    withHarness ? "harness EM: the harness's dki mode (greedy answers, its scorer) with the setting's DKI config." : "harness EM: not run (--harness runs the harness's dki mode per setting).",
    `ms: mean time per question of the setting's logits call, on ${m.threads} threads; load average (1 min) ${loadAtStart.toFixed(1)} at the start and ${loadavg()[0].toFixed(1)} at the end (other work shared the machine when above the thread count).`,
  ],
});

// Plots: the α sweep as lines, every setting as bars; one panel a metric, agreement on [0, 1].
const METRICS = [
  { key: "KL(p‖p_full)", title: "KL(p‖p_full-text), nats" },
  { key: "KL(p‖p_none)", title: "KL(p‖p_none), nats" },
  { key: "top-1 = full", title: "top-1 agreement with full text", unit: true },
  ...(withHarness ? [{ key: "harness EM", title: "harness exact match", unit: true }] : []),
];
const scaleOf = (metric) => (metric.unit ? { domain: [0, 1] } : {});
const alphaRows = rows.filter((r) => r.sweep === "alpha").map((r) => ({ ...r, scaling: r.setting.split(" ")[0] }));
await renderVegaLite({
  $schema: "https://vega.github.io/schema/vega-lite/v6.json",
  title: `α sweep, ${name}: the first answer token against full text and against nothing injected (${questions.length} questions)`,
  background: "white",
  data: { values: alphaRows },
  hconcat: METRICS.map((metric) => ({
    width: 220,
    height: 200,
    title: metric.title,
    mark: { type: "line", point: true, strokeWidth: 2 },
    encoding: {
      x: { field: "alpha", type: "quantitative", title: "α" },
      y: { field: metric.key, type: "quantitative", title: null, scale: scaleOf(metric) },
      color: { field: "scaling", type: "nominal", title: "α scaling" },
    },
  })),
}, join(resultsDir, `${base}-alpha`));
const barRows = rows.filter((r) => r.sweep !== "alpha").map((r) => ({ ...r, label: `${r.sweep}: ${r.setting}` }));
await renderVegaLite({
  $schema: "https://vega.github.io/schema/vega-lite/v6.json",
  title: `Positions, encoding prefix and block fixes, ${name} (α = 1, ${questions.length} questions)`,
  background: "white",
  data: { values: barRows },
  // One row per setting in every panel (a metric a setting lacks, such as the references' harness EM, is an empty row).
  resolve: { scale: { y: "shared" } },
  hconcat: METRICS.filter((metric) => metric.key !== "KL(p‖p_none)").map((metric, i) => ({
    width: 220,
    height: { step: 16 },
    title: metric.title,
    mark: "bar",
    encoding: {
      y: { field: "label", type: "nominal", sort: null, title: null, axis: i === 0 ? { labelLimit: 300 } : null },
      x: { field: metric.key, type: "quantitative", title: null, scale: scaleOf(metric) },
      color: { field: "sweep", type: "nominal", title: null },
    },
  })),
}, join(resultsDir, `${base}-settings`));
