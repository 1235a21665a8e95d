// GPU benchmark (issue #9): prefill (512 and 4096 tokens) and batch-1 decode of the CUDA backend
// on BF16 random-weight models at the smollm2-135m, llama-1b and llama-8b shapes; time to first
// token with an injected 1024-token memory block against the same memory as prompt text; the
// same models through PyTorch transformers (eager and sdpa) in the same run; and decode speed as
// a share of the HBM bound (weight bytes read per token ÷ the device's measured copy bandwidth).
// Needs the CUDA addon (npm run build:cuda) and, for the comparison, python3 with torch +
// transformers. Usage: node bench/gpu.js [--quick]   (quick: no llama-8b)
//        node bench/gpu.js --smoke   the same code on the CPU with a tiny model and short runs, to
//                                    check this script where no GPU is (results: gpu-smoke.*)
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { Bench } from "tinybench";
import { Model } from "../dist/src/engine/model.js";
import { LogitsMode, native } from "../dist/src/engine/native.js";
import { machine } from "./lib/machine.js";
import { contextWith } from "./lib/context.js";
import { benchModel } from "./lib/models.js";
import { writeResults } from "./lib/results.js";

const smoke = process.argv.includes("--smoke");
const cuda = native().cuda();
if (cuda.devices === 0 && !smoke) {
  console.error(`bench/gpu needs a GPU and the CUDA addon (npm run build:cuda): ${cuda.reason}`);
  process.exit(1);
}
const quick = process.argv.includes("--quick");
const presets = smoke ? ["tiny"] : ["smollm2-135m", "llama-1b", ...(quick ? [] : ["llama-8b"])];
const device = smoke ? "cpu" : "cuda";
const PREFILL = smoke ? [64, 128] : [512, 4096];
const DECODE = smoke ? 8 : 128;
const MEMORY = smoke ? 64 : 1024;
const PROMPT = 32;
const python = process.env.PYTHON ?? "python3";
const script = join(import.meta.dirname, "gpu", "transformers_speed.py");

const tokens = (n, salt) => Array.from({ length: n }, (_, i) => 100 + ((i * 7919 + salt) % 40000));

/** Runs the transformers side; null (with the reason in notes) where python/torch are missing. */
function transformers(args, notes) {
  const r = spawnSync(python, [script, ...args, "--device", device], { encoding: "utf8", maxBuffer: 1 << 24 });
  if (r.status !== 0) {
    notes.push(`transformers ${args.join(" ")} failed: ${(r.error?.message ?? r.stderr).trim().split("\n").pop()}`);
    return null;
  }
  return JSON.parse(r.stdout.trim().split("\n").pop());
}

const notes = [];
const copy = smoke ? null : transformers(["--copy-bandwidth"], notes);
const copyGBs = copy?.copy_gb_s ?? null;
const rows = [];
const stageRows = [];  // the decode step's stages (DKI_CUDA_PROFILE=1), model by model

/** Writes the rows so far: a run cut short (the 8B shape is long) keeps the models it finished. */
function save() {
  writeResults(smoke ? "gpu-smoke" : "gpu-cuda", {
    machine: { ...machine(native()), gpu: cuda.names[0] },
    columns: Object.keys(rows[0]),
    rows,
    notes: [
      `GPU: ${cuda.names[0]}; device copy bandwidth ${copyGBs ? copyGBs.toFixed(0) + " GB/s (read + write, torch copy_ of 2 GiB)" : "not measured"}.`,
      `BF16 weights, batch 1; decode = ${DECODE} tokens after a 16-token prompt (ctx.eval one token at a time; generate(): the same through the public API, greedy); transformers runs the same folders in bfloat16 with its own K/V cache.`,
      `TTFT: a ${PROMPT}-token prompt with a ${MEMORY}-token memory, injected as a precomputed K/V block vs prepended as text.`,
      ...notes,
    ],
  });
  if (stageRows.length)
    writeResults(smoke ? "gpu-decode-stages-smoke" : "gpu-decode-stages", {
      machine: { ...machine(native()), gpu: cuda.names[0] },
      columns: Object.keys(stageRows[0]),
      rows: stageRows,
      notes: [
        `Where a decode step's GPU time goes: contexts made with DKI_CUDA_PROFILE=1 record an event after each stage of every one-token step (event nodes in the CUDA graph), over ${DECODE} steps after a 16-token prompt.`,
        "GB/s: the weight bytes the stage reads per step over its time; copy bandwidth is the bound. The events cost time of their own: \"whole step\" compares the profiled step with the unprofiled one of gpu-cuda.",
      ],
    });
}

/** The stage profile of DECODE one-token steps of `model` (null where there is none: the CPU). */
async function decodeStages(model, preset, decode, plainStepUs) {
  const profiled = contextWith(model, { DKI_CUDA_PROFILE: "1" }, DECODE + 32);
  try {
    await decode(profiled)();
    const p = profiled.cudaProfile();
    if (!p) return;
    const stepUs = (ms) => (1000 * ms) / p.steps;
    const total = p.stages.reduce((n, s) => n + s.ms, 0);
    for (const s of p.stages)
      stageRows.push({
        model: `llama ${preset}`,
        stage: s.stage,
        "µs per step": stepUs(s.ms),
        share: `${((100 * s.ms) / total).toFixed(1)}%`,
        "MB per step": s.bytes / 1e6,
        "GB/s": s.bytes ? s.bytes / 1e3 / stepUs(s.ms) : null,
      });
    stageRows.push({ model: `llama ${preset}`, stage: "whole step", "µs per step": stepUs(total), share: `unprofiled (1 / decode tok/s): ${plainStepUs.toFixed(1)} µs`, "MB per step": p.stages.reduce((n, s) => n + s.bytes, 0) / 1e6, "GB/s": null });
  } finally {
    profiled.dispose();
  }
}

for (const preset of presets) {
  const dir = await benchModel(preset, "bf16");
  const model = await Model.load(dir, { device, contextSize: PREFILL[1] + DECODE + 16 });
  const c = model.config;
  const ctx = model.createContext(PREFILL[1] + DECODE + 16);
  // The same prefills with the attention kernel that was the default before the register-tiled
  // one (DKI_CUDA_ATTENTION=warp, read when a context is made).
  const warp = contextWith(model, { DKI_CUDA_ATTENTION: "warp" }, PREFILL[1] + 16);
  const bench = new Bench({ iterations: 5, warmupIterations: 1, time: 0, warmupTime: 0 });
  for (const [on, suffix] of [[ctx, ""], [warp, " warp"]])
    for (const n of PREFILL) {
      const ids = Int32Array.from(tokens(n, 1));
      bench.add(`prefill ${n}${suffix}`, async () => {
        on.reset(0);
        await on.eval(ids, LogitsMode.Last);
      });
    }
  const start = Int32Array.from(tokens(16, 2));
  const next = tokens(DECODE, 3);
  const decode = (on) => async () => {
    on.reset(0);
    await on.eval(start, LogitsMode.Last);
    for (const t of next) await on.eval(Int32Array.of(t), LogitsMode.Last);
  };
  bench.add(`decode ${DECODE}`, decode(ctx));
  // The same steps as a user runs them: generate() (greedy) adds sampling, the stop checks and the
  // text decoded as it goes to the eval loop above.
  bench.add(`generate ${DECODE}`, async () => {
    await model.generate({ tokens: Array.from(start) }, { maxNewTokens: DECODE, stopOnEos: false });
  });
  // The same steps with every kernel launched from the host: what the CUDA graphs save.
  const eager = contextWith(model, { DKI_CUDA_GRAPHS: "0" }, PREFILL[1] + DECODE + 16);
  bench.add(`decode ${DECODE} no graphs`, decode(eager));
  // Time to first token: memory injected as a ready K/V block vs the same memory as prompt text.
  const memory = tokens(MEMORY, 4);
  const prompt = tokens(PROMPT, 5);
  const kv = await model.computeBlock(memory, { startPos: -MEMORY });
  bench.add("ttft injected", async () => {
    await model.generate({ tokens: prompt }, { maxNewTokens: 1, stopOnEos: false, segments: [{ kv }] });
  });
  // The block kept in GPU memory (the cache's L1 on CUDA): injected without a host copy.
  const kvDevice = smoke ? null : await kv.toDevice();
  if (kvDevice)
    bench.add("ttft injected from GPU memory", async () => {
      await model.generate({ tokens: prompt }, { maxNewTokens: 1, stopOnEos: false, segments: [{ kv: kvDevice }] });
    });
  bench.add("ttft as text", async () => {
    await model.generate({ tokens: [...memory, ...prompt] }, { maxNewTokens: 1, stopOnEos: false });
  });
  await bench.run();
  const ms = Object.fromEntries(bench.tasks.map((t) => [t.name, t.result.latency.mean]));

  // Decode reads every matrix once per token, but only one row of an untied embedding table.
  const embedBytes = c.tieWordEmbeddings ? 0 : c.vocabSize * c.hiddenSize * 2;
  const bytesPerToken = model.info.deviceBytes - embedBytes;
  const decodeTokS = (DECODE * 1000) / ms[`decode ${DECODE}`];
  const boundTokS = copyGBs ? (copyGBs * 1e9) / bytesPerToken : null;
  await decodeStages(model, preset, decode, (1000 * ms[`decode ${DECODE}`]) / DECODE);
  const row = {
    model: `llama ${preset}`,
    params: `${(model.info.paramCount / 1e9).toFixed(2)}B`,
    ...Object.fromEntries(PREFILL.map((n) => [`prefill ${n} tok/s`, (n * 1000) / ms[`prefill ${n}`]])),
    ...Object.fromEntries(PREFILL.map((n) => [`prefill ${n} tok/s warp attention`, (n * 1000) / ms[`prefill ${n} warp`]])),
    "decode tok/s": decodeTokS,
    "decode tok/s no graphs": (DECODE * 1000) / ms[`decode ${DECODE} no graphs`],
    "generate() tok/s": (DECODE * 1000) / ms[`generate ${DECODE}`],
    "HBM bound tok/s": boundTokS,
    "of bound": boundTokS ? `${((100 * decodeTokS) / boundTokS).toFixed(0)}%` : "n/a",
    "TTFT injected ms": ms["ttft injected"],
    "TTFT injected from GPU memory ms": ms["ttft injected from GPU memory"] ?? null,
    "TTFT as text ms": ms["ttft as text"],
  };
  ctx.dispose();
  warp.dispose();
  eager.dispose();
  kv.dispose();
  kvDevice?.dispose();
  model.dispose();

  for (const attn of ["eager", "sdpa"]) {
    const t = transformers(["--model", dir, "--attn", attn, "--prefill", PREFILL.join(","), "--decode", String(DECODE)], notes);
    for (const n of PREFILL) row[`${attn} prefill ${n}`] = t?.[`prefill_${n}_tok_s`];
    row[`${attn} decode tok/s`] = t?.decode_tok_s;
    row[`decode vs ${attn}`] = t ? `${(decodeTokS / t.decode_tok_s).toFixed(2)}×` : "n/a";
  }
  rows.push(row);
  save();
  process.stderr.write(`${preset}: ${JSON.stringify(row)}\n`);
}

