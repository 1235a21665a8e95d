// The thread pool on a shared machine: prefill and decode with one competing busy process (a
// spinning child), the default thread count against --threads 1, for this engine and for
// llama.cpp (node-llama-cpp) on the same GGUF file (SmolLM2-135M shape, Q8_0); then, without the
// busy process, decode of this build against a baseline build of another commit (the pool before).
// Every measurement runs in its own process (bench/lib/threads-probe.js: load, one warm-up, then
// the median of --reps prefills and decodes), in rounds whose order alternates, so slow drift of
// the machine's load (other users) falls on every configuration alike; the spread is reported.
// Usage: node bench/threads-contention.js [--rounds N] [--reps N] [--baseline DIR] [--quick]
//   --baseline DIR: a package root built by `sh bench/threads-baseline.sh REF DIR`.
import { execFile, spawn } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { loadavg } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { native } from "../dist/src/engine/native.js";
import { threadsInfo, formatThreads } from "../dist/src/engine/threads.js";
import { machine } from "./lib/machine.js";
import { benchGguf } from "./lib/models.js";
import { resultsDir, writeResults } from "./lib/results.js";

const run = promisify(execFile);
const here = dirname(fileURLToPath(import.meta.url));
const flag = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`);
  return i < 0 ? fallback : process.argv[i + 1];
};
const quick = process.argv.includes("--quick");
const ROUNDS = Number(flag("rounds", quick ? 1 : 3));
const REPS = Number(flag("reps", 1));
const PREFILL = 128;
const DECODE = 32;
const PROBE_TIMEOUT_MS = 300_000;
const baseline = flag("baseline", undefined);
const LLAMA_DEFAULT = "llama.cpp default (8 decode steps, 1 run)";
if (baseline && !existsSync(join(baseline, "build", "Release", "dki_native.node"))) {
  console.error(`--baseline ${baseline}: no build/Release/dki_native.node there (make it with sh bench/threads-baseline.sh REF DIR)`);
  process.exit(1);
}
const baselineCommit = baseline && existsSync(join(baseline, "COMMIT")) ? readFileSync(join(baseline, "COMMIT"), "utf8").trim() : "unknown";

const model = await benchGguf("smollm2-135m", "q8_0");
const load = () => loadavg()[0];

/** One probe process: { engine, threads, ppTokS, tgTokS }. */
async function probe({ engine, threads, root, decode = DECODE, reps = REPS }) {
  const args = [join(here, "lib", "threads-probe.js"), "--engine", engine, "--model", model, "--threads", String(threads), "--prefill", String(PREFILL), "--decode", String(decode), "--reps", String(reps)];
  if (root) args.push("--root", root);
  try {
    const { stdout } = await run(process.execPath, args, { maxBuffer: 1 << 20, timeout: PROBE_TIMEOUT_MS });
    return JSON.parse(stdout.trim().split("\n").pop());
  } catch (e) {
    // A probe this slow is a result (a collapse), not a reason to lose the others: kept as such.
    if (e.killed) return { engine, threads, ppTokS: NaN, tgTokS: NaN, timedOut: true };
    throw e;
  }
}

/** Rounds of `configs`, forwards then backwards; every result keyed by the config's label. */
async function rounds(phase, configs, count = ROUNDS) {
  const out = new Map(configs.map((c) => [c.label, []]));
  for (let r = 0; r < count; r++) {
    for (const c of r % 2 === 0 ? configs : [...configs].reverse()) {
      const loadBefore = load();
      const m = await probe(c);
      const row = { round: r + 1, ...m, load1: loadBefore };
      out.get(c.label).push(row);
      console.log(phase, c.label, JSON.stringify(row));
    }
  }
  return out;
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const spread = (xs) => `${Math.min(...xs).toFixed(1)}–${Math.max(...xs).toFixed(1)}`;
// Over the probes that finished; the ones that timed out are counted beside.
const finished = (results, key) => results.map((r) => r[key]).filter(Number.isFinite);
const timedOut = (results) => results.filter((r) => r.timedOut).length;
const summary = (phase, label, results) => ({
  phase,
  config: label + (timedOut(results) ? ` (${timedOut(results)} of ${results.length} probes timed out after ${PROBE_TIMEOUT_MS / 1000} s)` : ""),
  threads: results[0].threads,
  "prefill tok/s (median)": finished(results, "ppTokS").length ? median(finished(results, "ppTokS")) : "timed out",
  "prefill min–max": finished(results, "ppTokS").length ? spread(finished(results, "ppTokS")) : "",
  "decode tok/s (median)": finished(results, "tgTokS").length ? median(finished(results, "tgTokS")) : "timed out",
  "decode min–max": finished(results, "tgTokS").length ? spread(finished(results, "tgTokS")) : "",
  "load 1-min avg": spread(results.map((r) => r.load1)),
});
/** Per round: a's tok/s ÷ b's (each round's two runs were neighbours in time), then the median and range. */
function ratio(a, b, key) {
  const per = a.map((x, i) => x[key] / b[i][key]).filter(Number.isFinite);
  if (!per.length) return { median: NaN, min: NaN, max: NaN, perRound: [] };
  return { median: median(per), min: Math.min(...per), max: Math.max(...per), perRound: per.map((v) => Number(v.toFixed(3))) };
}

const budget = threadsInfo();
console.log(`default threads here: ${formatThreads(budget)}; load before: ${loadavg().map((v) => v.toFixed(2)).join(" ")}`);

// --- one competing busy process
const busy = spawn(process.execPath, ["-e", "for(;;){}"], { stdio: "ignore" });
// Stopped with the bench, however it stops: a spinning orphan would load the machine for good.
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => (busy.kill("SIGKILL"), process.exit(130)));
let contended;
let beforeContended = null;
try {
  await new Promise((r) => setTimeout(r, 500));
  contended = await rounds("contended", [
    { label: "dki default", engine: "dki", threads: "default" },
    { label: "dki --threads 1", engine: "dki", threads: 1 },
    // 8 decode steps, one run: at its default it decodes ~0.2 tok/s here, and 32 steps × reps would
    // take minutes a round (the rounds of the others, which the targets are about, would be fewer).
    { label: LLAMA_DEFAULT, engine: "llama.cpp", threads: "default", decode: 8, reps: 1 },
    { label: "llama.cpp 1 thread", engine: "llama.cpp", threads: 1 },
  ]);
  // The pool before, once and short: it is slow enough here that a full run would take minutes.
  if (baseline && !quick) {
    const load1 = load();
    beforeContended = { ...(await probe({ engine: "dki", threads: "default", root: baseline, decode: 8 })), load1 };
    console.log("contended baseline default", JSON.stringify(beforeContended));
  }
} finally {
  busy.kill("SIGKILL");
}

// --- quiet (no busy process of ours): this build against the baseline, default threads
await new Promise((r) => setTimeout(r, 1000));
// Cheap without contention: longer decodes and twice the rounds, for a ratio near 1 to resolve.
const QUIET = { decode: 128, reps: 3 };
const quiet = baseline
  ? await rounds("quiet", [
      { label: "dki default (this build)", engine: "dki", threads: "default", ...QUIET },
      { label: `dki default (baseline ${baselineCommit.slice(0, 10)})`, engine: "dki", threads: "default", root: baseline, ...QUIET },
    ], 2 * ROUNDS)
  : null;

const rows = [...contended.entries()].map(([label, rs]) => summary("1 busy process", label, rs));
if (beforeContended) rows.push(summary("1 busy process", `dki default (baseline ${baselineCommit.slice(0, 10)}; 1 probe, 8 decode steps)`, [beforeContended]));
if (quiet) for (const [label, rs] of quiet.entries()) rows.push(summary("quiet", label, rs));

const c = (label) => contended.get(label);
const ratios = {
  "dki default ÷ --threads 1, prefill": ratio(c("dki default"), c("dki --threads 1"), "ppTokS"),
  "dki default ÷ --threads 1, decode": ratio(c("dki default"), c("dki --threads 1"), "tgTokS"),
  "llama.cpp default ÷ 1 thread, prefill": ratio(c(LLAMA_DEFAULT), c("llama.cpp 1 thread"), "ppTokS"),
  "llama.cpp default ÷ 1 thread, decode": ratio(c(LLAMA_DEFAULT), c("llama.cpp 1 thread"), "tgTokS"),
};
if (quiet) {
  const [mine, theirs] = [...quiet.values()];
  ratios["quiet decode, this build ÷ baseline"] = ratio(mine, theirs, "tgTokS");
  ratios["quiet prefill, this build ÷ baseline"] = ratio(mine, theirs, "ppTokS");
}
const fmtRatio = ([name, r]) => (r.perRound.length ? `${name}: median ${r.median.toFixed(3)} (per round ${r.perRound.join(", ")})` : `${name}: no round where both finished`);

writeResults("threads-contention-cpu", {
  machine: { ...machine(native()), threadsDefault: formatThreads(budget) },
  columns: ["phase", "config", "threads", "prefill tok/s (median)", "prefill min–max", "decode tok/s (median)", "decode min–max", "load 1-min avg"],
  rows,
  notes: [
    `Model: the SmolLM2-135M shape with random weights, Q8_0 GGUF (${model.split("/").pop()}), the same file for both engines. Prefill: one ${PREFILL}-token prompt; decode: ${DECODE} greedy single-token steps after a 16-token prompt. Each probe process: load, a warm-up (16-token prompt, 4 decode steps), then the median of ${REPS} run(s); ${ROUNDS} rounds in alternating order, median and min–max over rounds.`,
    `Default threads here: ${formatThreads(budget)}. llama.cpp's default is node-llama-cpp's maxThreads (the CPU math cores it detects); every llama.cpp run sets ideal = min = its count.`,
    "1 busy process: a child `node -e 'for(;;){}'` spinning for the whole phase, on top of whatever else the machine ran (the 1-minute load average, read before each probe, counts it and the probe itself).",
    ...Object.entries(ratios).map(fmtRatio),
    ...(quiet ? [`Quiet: no busy process of this bench's (the machine's other users still ran: see the load); decode ${QUIET.decode} steps, median of ${QUIET.reps} per probe, ${2 * ROUNDS} rounds; baseline = ${baselineCommit}, built by bench/threads-baseline.sh.`] : []),
    "Targets (issue 35): under one busy process, default ≥ 0.9× --threads 1 for prefill and decode; quiet decode within 3% of before.",
  ],
});
// The JSON beside the table keeps every probe, for anyone who wants the raw spread.
const rawFile = join(resultsDir, `threads-contention-cpu${quick ? "-quick" : ""}.json`);
const written = JSON.parse(readFileSync(rawFile, "utf8"));
written.ratios = ratios;
written.probes = { contended: Object.fromEntries(contended), beforeContended, quiet: quiet && Object.fromEntries(quiet) };
writeFileSync(rawFile, JSON.stringify(written, null, 2) + "\n");
