// Prefill and decode throughput of the native engine on random-weight models at real shapes:
// first on HF folders (F16/BF16), then against llama.cpp (node-llama-cpp) on the same GGUF files.
// Usage: node bench/engine.js [--quick] [--gguf-only]   (quick: smollm2-135m only)
import { readFileSync } from "node:fs";
import { Bench } from "tinybench";
import { Model } from "../dist/src/engine/model.js";
import { native } from "../dist/src/engine/native.js";
import { LogitsMode } from "../dist/src/engine/native.js";
import { machine } from "./lib/machine.js";
import { benchGguf, benchModel } from "./lib/models.js";
import { writeResults } from "./lib/results.js";

const quick = process.argv.includes("--quick");
const ggufOnly = process.argv.includes("--gguf-only");
const PREFILL = 512;
const DECODE = 128;
const cases = [
  ["smollm2-135m", "f16"],
  ["smollm2-135m", "bf16"],
  ...(quick ? [] : [["llama-1b", "f16"], ["llama-1b", "bf16"]]),
];

const prompt = Array.from({ length: PREFILL }, (_, i) => 100 + ((i * 7919) % 40000));

const rows = [];
for (const [preset, dtype] of ggufOnly ? [] : cases) {
  const dir = await benchModel(preset, dtype);
  const model = await Model.load(dir, { contextSize: PREFILL + DECODE + 8 });
  const prompt = Array.from({ length: PREFILL }, (_, i) => 100 + ((i * 7919) % 40000));
  const ctx = model.createContext(PREFILL + DECODE + 8);
  const bench = new Bench({ iterations: 3, warmupIterations: 1, time: 0, warmupTime: 0 });
  bench.add(`prefill ${PREFILL}`, async () => {
    ctx.reset(0);
    await ctx.eval(Int32Array.from(prompt), LogitsMode.Last);
  });
  bench.add(`decode ${DECODE}`, async () => {
    ctx.reset(0);
    await ctx.eval(Int32Array.from(prompt.slice(0, 16)), LogitsMode.Last);
    for (let i = 0; i < DECODE; i++) await ctx.eval(Int32Array.of(prompt[i]), LogitsMode.Last);
  });
  await bench.run();
  const [pre, dec] = bench.tasks.map((t) => t.result.latency.mean);
  rows.push({
    model: `llama ${preset}`,
    dtype,
    params: `${(model.info.paramCount / 1e6).toFixed(0)}M`,
    "prefill tok/s": (PREFILL * 1000) / pre,
    "decode tok/s": (DECODE * 1000) / dec,
    "prefill ms": pre,
    "decode ms/token": dec / DECODE,
  });
  ctx.dispose();
  model.dispose();
}

if (!ggufOnly) writeResults("engine-cpu", {
  machine: machine(native()),
  columns: ["model", "dtype", "params", "prefill tok/s", "decode tok/s", "prefill ms", "decode ms/token"],
  rows,
  notes: [
    `prefill: one ${PREFILL}-token prompt, logits of the last position; decode: ${DECODE} single-token steps after a 16-token prompt (logits every step).`,
    "Random weights at the real shapes (vocabulary 49152, the bundled SmolLM2 tokenizer's); mean of 3 runs after 1 warm-up.",
    "The baseline from HF folders; engine-vs-llamacpp-cpu compares GGUF files with llama.cpp.",
  ],
});

// ---------------------------------------------------------------------------------------------
// The same GGUF file through this engine and through llama.cpp, same thread count, one run.

const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
const nodeLlamaCppVersion = JSON.parse(readFileSync(new URL("../node_modules/node-llama-cpp/package.json", import.meta.url), "utf8")).version;
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false });
const threads = native().getThreads();

/** pp: one PREFILL-token prompt; tg: DECODE greedy tokens after a 16-token prompt. Mean ms of each. */
async function timeOurs(file, iterations) {
  const model = await Model.load(file, { contextSize: PREFILL + DECODE + 8, threads });
  const ctx = model.createContext(PREFILL + DECODE + 8);
  const bench = new Bench({ iterations, warmupIterations: 1, time: 0, warmupTime: 0 });
  bench.add("pp", async () => {
    ctx.reset(0);
    await ctx.eval(Int32Array.from(prompt), LogitsMode.Last);
  });
  bench.add("tg", async () => {
    ctx.reset(0);
    let logits = await ctx.eval(Int32Array.from(prompt.slice(0, 16)), LogitsMode.Last);
    for (let i = 0; i < DECODE; i++) {
      let best = 0;
      for (let j = 1; j < logits.length; j++) if (logits[j] > logits[best]) best = j;
      logits = await ctx.eval(Int32Array.of(best), LogitsMode.Last);
    }
  });
  await bench.run();
  const out = bench.tasks.map((t) => t.result.latency.mean);
  ctx.dispose();
  model.dispose();
  return out;
}

async function timeLlamaCpp(file, iterations) {
  const model = await llama.loadModel({ modelPath: file, gpuLayers: 0 });
  const context = await model.createContext({ contextSize: PREFILL + DECODE + 32, batchSize: PREFILL, sequences: 1, threads: { ideal: threads, min: threads } });
  const seq = context.getSequence();
  const bench = new Bench({ iterations, warmupIterations: 1, time: 0, warmupTime: 0 });
  bench.add("pp", async () => {
    await seq.clearHistory();
    await seq.evaluateWithoutGeneratingNewTokens(prompt);
  });
  bench.add("tg", async () => {
    await seq.clearHistory();
    // The generator evaluates the prompt, then one token per further yield: DECODE + 1 yields
    // make DECODE single-token evaluations, as the loop above does.
    let n = 0;
    for await (const _ of seq.evaluate(prompt.slice(0, 16), { temperature: 0, yieldEogToken: true })) if (++n > DECODE) break;
  });
  await bench.run();
  const out = bench.tasks.map((t) => t.result.latency.mean);
  await context.dispose();
  await model.dispose();
  return out;
}

const versus = [];
for (const preset of quick ? ["smollm2-135m"] : ["smollm2-135m", "llama-1b"]) {
  for (const type of ["f16", "q8_0"]) {
    const file = await benchGguf(preset, type);
    const iterations = preset === "llama-1b" ? 2 : 3;
    const [ourPp, ourTg] = await timeOurs(file, iterations);
    const [theirPp, theirTg] = await timeLlamaCpp(file, iterations);
    const row = {
      model: `llama ${preset}`,
      type: type.toUpperCase(),
      "pp512 tok/s (ours)": (PREFILL * 1000) / ourPp,
      "pp512 tok/s (llama.cpp)": (PREFILL * 1000) / theirPp,
      "pp ratio": theirPp / ourPp,
      "tg128 tok/s (ours)": (DECODE * 1000) / ourTg,
      "tg128 tok/s (llama.cpp)": (DECODE * 1000) / theirTg,
      "tg ratio": theirTg / ourTg,
    };
    console.log(row);
    versus.push(row);
  }
}

// DKI_SIMD=avx2 (with llama.cpp's better CPU variants moved out of its bins folder) compares the
// AVX2 paths of both engines, the situation of a CPU without AVX-512: kept in its own file.
const simdSuffix = process.env.DKI_SIMD && process.env.DKI_SIMD !== "auto" ? `-${process.env.DKI_SIMD}` : "";
writeResults(`engine-vs-llamacpp-cpu${simdSuffix}`, {
  machine: machine(native()),
  columns: ["model", "type", "pp512 tok/s (ours)", "pp512 tok/s (llama.cpp)", "pp ratio", "tg128 tok/s (ours)", "tg128 tok/s (llama.cpp)", "tg ratio"],
  rows: versus,
  notes: [
    `Same GGUF file (converted here from the random-weight F16 HF folder) and ${threads} threads for both engines, in one run; ratio = ours ÷ llama.cpp's tokens/s (> 1: we are faster).`,
    `pp512: one ${PREFILL}-token prompt (llama.cpp: evaluateWithoutGeneratingNewTokens, batch ${PREFILL}); tg128: ${DECODE} greedy single-token steps after a 16-token prompt.`,
    `llama.cpp (release tag ${llama.llamaCppRelease.release}) through node-llama-cpp ${nodeLlamaCppVersion} (prebuilt CPU binary, ${llama.buildType}); its system info: ${llama.systemInfo.trim()}`,
    "Targets of the issue on this 2-core machine: tg ≥ 1.0× and, for Q8_0, pp ≥ 0.8×.",
  ],
});
await llama.dispose();
