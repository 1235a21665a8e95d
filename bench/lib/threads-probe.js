// One measurement for bench/threads-contention.js, in its own process (so that a thread count,
// an affinity or an addon build applies to it alone): loads a GGUF file in this engine or in
// llama.cpp, warms up (a 16-token prompt and 4 decode steps), then times --reps prefills and
// greedy decodes, and prints one JSON line with the medians.
// Usage: node bench/lib/threads-probe.js --engine dki|llama.cpp --model FILE --threads N|default
//          [--root DIR] [--prefill N] [--decode N] [--reps N]
// --root: the package root whose dist/ and build/ to load (default: this one); the bench points
// it at a build of an older commit to compare against.
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const arg = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`);
  return i < 0 ? fallback : process.argv[i + 1];
};
const engine = arg("engine", "dki");
const model = arg("model");
const threadsArg = arg("threads", "default");
const root = resolve(arg("root", join(dirname(fileURLToPath(import.meta.url)), "..", "..")));
const PREFILL = Number(arg("prefill", 256));
const DECODE = Number(arg("decode", 64));
const REPS = Number(arg("reps", 1));
const threads = threadsArg === "default" ? undefined : Number(threadsArg);
const prompt = Array.from({ length: PREFILL }, (_, i) => 100 + ((i * 7919) % 40000));
const ms = (t0) => performance.now() - t0;

async function dki() {
  const { Model } = await import(pathToFileURL(join(root, "dist/src/engine/model.js")).href);
  const { LogitsMode, native } = await import(pathToFileURL(join(root, "dist/src/engine/native.js")).href);
  const m = await Model.load(model, { contextSize: PREFILL + DECODE + 8, ...(threads === undefined ? {} : { threads }) });
  const ctx = m.createContext(PREFILL + DECODE + 8);
  const greedy = (logits) => {
    let best = 0;
    for (let j = 1; j < logits.length; j++) if (logits[j] > logits[best]) best = j;
    return best;
  };
  const decode = async (steps) => {
    ctx.reset(0);
    let logits = await ctx.eval(Int32Array.from(prompt.slice(0, 16)), LogitsMode.Last);
    const t0 = performance.now();
    for (let i = 0; i < steps; i++) logits = await ctx.eval(Int32Array.of(greedy(logits)), LogitsMode.Last);
    return ms(t0);
  };
  await decode(4);
  const runs = [];
  for (let rep = 0; rep < REPS; rep++) {
    ctx.reset(0);
    const t0 = performance.now();
    await ctx.eval(Int32Array.from(prompt), LogitsMode.Last);
    const pp = ms(t0);
    runs.push({ pp, tg: await decode(DECODE) });
  }
  const used = native().getThreads();
  ctx.dispose();
  m.dispose();
  return { threads: used, runs };
}

async function llamaCpp() {
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false });
  // Its own default: node-llama-cpp's maxThreads (the CPU math cores it detects).
  const n = threads ?? llama.maxThreads;
  const m = await llama.loadModel({ modelPath: model, gpuLayers: 0 });
  const context = await m.createContext({ contextSize: PREFILL + DECODE + 32, batchSize: PREFILL, sequences: 1, threads: { ideal: n, min: n } });
  const seq = context.getSequence();
  const decode = async (steps) => {
    await seq.clearHistory();
    // The first yield comes after the 16-token prompt; `steps` single-token steps follow it.
    let count = 0;
    let t0 = 0;
    for await (const _ of seq.evaluate(prompt.slice(0, 16), { temperature: 0, yieldEogToken: true })) {
      if (count === 0) t0 = performance.now();
      if (++count > steps) break;
    }
    return ms(t0);
  };
  await decode(4);
  const runs = [];
  for (let rep = 0; rep < REPS; rep++) {
    await seq.clearHistory();
    const t0 = performance.now();
    await seq.evaluateWithoutGeneratingNewTokens(prompt);
    const pp = ms(t0);
    runs.push({ pp, tg: await decode(DECODE) });
  }
  await context.dispose();
  await m.dispose();
  await llama.dispose();
  return { threads: n, runs };
}

const r = engine === "dki" ? await dki() : await llamaCpp();
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
process.stdout.write(
  JSON.stringify({
    engine,
    threads: r.threads,
    ppTokS: median(r.runs.map((x) => (PREFILL * 1000) / x.pp)),
    tgTokS: median(r.runs.map((x) => (DECODE * 1000) / x.tg)),
  }) + "\n",
);
