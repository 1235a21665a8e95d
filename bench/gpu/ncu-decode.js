// The process Nsight Compute profiles for bench/gpu/run.sh --only ncu (issue #9): a 16-token prompt
// and a few one-token decode steps without CUDA graphs, so that every kernel of a step is a launch
// of its own that ncu can replay and measure. The prompt returns no logits, so prefill launches
// none of the kernels below; each decode step launches, per layer, the q/k/v GEMV, the split
// attention, the output, gate/up and down GEMVs, and then the LM head's GEMV.
//
// Usage: node bench/gpu/ncu-decode.js [--model llama-1b] [--steps 3]
//   --ncu-args: print ncu's arguments that select the kernels of the first layer of the second
//   step (the first is a warm-up), and exit; run.sh passes them to ncu.
//   --smoke: the tiny model on the CPU, to check this script without a GPU.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Model } from "../../dist/src/engine/model.js";
import { LogitsMode } from "../../dist/src/engine/native.js";
import { contextWith } from "../lib/context.js";
import { benchModel } from "../lib/models.js";

const { values: opts } = parseArgs({
  options: {
    model: { type: "string", default: "llama-1b" },
    steps: { type: "string", default: "3" },
    "ncu-args": { type: "boolean", default: false },
    smoke: { type: "boolean", default: false },
  },
});
const preset = opts.smoke ? "tiny" : opts.model;
const steps = Number(opts.steps);
if (!Number.isSafeInteger(steps) || steps < 2) throw new Error(`--steps must be an integer of at least 2, got ${opts.steps}`);

const dir = await benchModel(preset, "bf16");
if (opts["ncu-args"]) {
  const layers = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")).num_hidden_layers;
  const perStep = 5 * layers + 1;
  console.log(`--kernel-name regex:gemv_kernel|attention_split_kernel --launch-skip ${perStep} --launch-count 5`);
  process.exit(0);
}

const model = await Model.load(dir, { device: opts.smoke ? "cpu" : "cuda", contextSize: 64 });
const ctx = contextWith(model, { DKI_CUDA_GRAPHS: "0" }, 64);
await ctx.eval(Int32Array.from({ length: 16 }, (_, i) => 100 + i), LogitsMode.None);
for (let i = 0; i < steps; i++) await ctx.eval(Int32Array.of(7 + i), LogitsMode.Last);
ctx.dispose();
model.dispose();
console.log(`ncu-decode: ${preset}, ${steps} decode steps`);
