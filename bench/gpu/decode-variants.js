// Decode step time under context settings, for GPU kernel experiments (issue #9). Each variant is
// a set of environment variables the engine reads when a context is made (e.g. DKI_CUDA_GRAPHS=0,
// or a setting an experiment adds); all variants run in one process on one model, one after
// another, so their ratios are the measurement (bench/results/gpu-gemv-experiments.md was made
// this way). Per variant: the wall time of one ctx.eval step with the logits returned (into a
// reused Float32Array) and without (LogitsMode.None: no LM head, no copy to the host), and, with
// DKI_CUDA_PROFILE=1 among its settings, the GPU time of each stage of the steps with logits.
//
// Usage: node bench/gpu/decode-variants.js [--model llama-1b] [--steps 256] [VARIANT ...]
//   VARIANT: "default" (nothing set) or NAME=VALUE[,NAME=VALUE...]; default: "default" and
//   "DKI_CUDA_GRAPHS=0". --smoke: the tiny model on the CPU, to check this script without a GPU.
// Results: bench/results/gpu-decode-variants-<model>.md (-smoke for --smoke).
import { parseArgs } from "node:util";
import { Model } from "../../dist/src/engine/model.js";
import { LogitsMode, native } from "../../dist/src/engine/native.js";
import { contextWith } from "../lib/context.js";
import { machine } from "../lib/machine.js";
import { benchModel } from "../lib/models.js";
import { writeResults } from "../lib/results.js";

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: { model: { type: "string", default: "llama-1b" }, steps: { type: "string", default: "256" }, smoke: { type: "boolean", default: false } },
});
const cuda = native().cuda();
if (cuda.devices === 0 && !opts.smoke) {
  console.error(`bench/gpu/decode-variants needs a GPU and the CUDA addon (npm run build:cuda): ${cuda.reason}`);
  process.exit(1);
}
const preset = opts.smoke ? "tiny" : opts.model;
const steps = Number(opts.steps);
if (!Number.isSafeInteger(steps) || steps < 1) throw new Error(`--steps must be a positive integer, got ${opts.steps}`);
const variants = positionals.length ? positionals : ["default", "DKI_CUDA_GRAPHS=0"];

/** { NAME: value } of a variant argument; an argument that is not NAME=VALUE pairs is an error naming it. */
function settings(variant) {
  if (variant === "default") return {};
  return Object.fromEntries(
    variant.split(",").map((pair) => {
      const m = /^([A-Z][A-Z0-9_]*)=(.*)$/.exec(pair);
      if (!m) throw new Error(`variant "${variant}": "${pair}" is not NAME=VALUE`);
      return [m[1], m[2]];
    }),
  );
}

const envs = variants.map(settings);  // a bad argument fails before the model loads
const model = await Model.load(await benchModel(preset, "bf16"), { device: opts.smoke ? "cpu" : "cuda", contextSize: 1024 });
const V = model.config.vocabSize;
const prompt = Int32Array.from({ length: 16 }, (_, i) => 100 + i);
const out = new Float32Array(V);

/** µs per one-token step of `ctx` in logits mode `mode`, after the prompt and 16 unmeasured steps. */
async function stepUs(ctx, mode) {
  ctx.reset(0);
  await ctx.eval(prompt, LogitsMode.Last);
  const step = (i) => ctx.eval(Int32Array.of(7 + (i % 1000)), mode, mode === LogitsMode.None ? undefined : out);
  for (let i = 0; i < 16; i++) await step(i);
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < steps; i++) await step(i);
  return Number(process.hrtime.bigint() - t0) / 1e3 / steps;
}

const rows = [];
for (const [i, variant] of variants.entries()) {
  const ctx = contextWith(model, envs[i], 16 + 16 + steps + 8);
  try {
    const last = await stepUs(ctx, LogitsMode.Last);
    const p = ctx.cudaProfile();  // null unless DKI_CUDA_PROFILE=1; read before the steps without logits
    const none = await stepUs(ctx, LogitsMode.None);
    const stages = p ? p.stages.map((s) => `${s.stage} ${((1000 * s.ms) / p.steps).toFixed(1)}`).join("; ") : null;
    rows.push({
      variant,
      "µs per step": last,
      "µs per step without logits": none,
      [`vs ${variants[0]}`]: rows.length ? `${(rows[0]["µs per step"] / last).toFixed(3)}×` : "1×",
      "GPU µs per stage (steps with logits)": stages,
    });
  } finally {
    ctx.dispose();
  }
}
model.dispose();

writeResults(`gpu-decode-variants-${preset}${opts.smoke ? "-smoke" : ""}`, {
  machine: { ...machine(native()), gpu: cuda.names[0] ?? "none" },
  columns: Object.keys(rows[0]),
  rows,
  notes: [
    `GPU: ${opts.smoke ? "none (--smoke: the CPU)" : cuda.names[0]}. BF16 random weights (${preset}); ${steps} one-token steps after a 16-token prompt and 16 unmeasured steps, per variant and mode, one process.`,
    `vs ${variants[0]}: speed relative to the first variant (above 1 is faster).`,
  ],
});
