// Prefill and decode throughput of the native engine on random-weight models at real shapes.
// Usage: node bench/engine.js [--quick]   (quick: smollm2-135m only)
import { Bench } from "tinybench";
import { Model } from "../dist/src/engine/model.js";
import { native } from "../dist/src/engine/native.js";
import { LogitsMode } from "../dist/src/engine/native.js";
import { machine } from "./lib/machine.js";
import { benchModel } from "./lib/models.js";
import { writeResults } from "./lib/results.js";

const quick = process.argv.includes("--quick");
const PREFILL = 512;
const DECODE = 128;
const cases = [
  ["smollm2-135m", "f16"],
  ["smollm2-135m", "bf16"],
  ...(quick ? [] : [["llama-1b", "f16"], ["llama-1b", "bf16"]]),
];

const rows = [];
for (const [preset, dtype] of cases) {
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

writeResults("engine-cpu", {
  machine: machine(native()),
  columns: ["model", "dtype", "params", "prefill tok/s", "decode tok/s", "prefill ms", "decode ms/token"],
  rows,
  notes: [
    `prefill: one ${PREFILL}-token prompt, logits of the last position; decode: ${DECODE} single-token steps after a 16-token prompt (logits every step).`,
    "Random weights at the real shapes (vocabulary 49152, the bundled SmolLM2 tokenizer's); mean of 3 runs after 1 warm-up.",
    "Baseline for the GGUF/performance issue: no comparison with llama.cpp yet.",
  ],
});
