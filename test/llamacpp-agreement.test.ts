// An independent check with llama.cpp itself (node-llama-cpp's prebuilt CPU binary): on the same
// GGUF files, converted here from a random-weight HF folder that carries the real SmolLM2
// tokenizer, llama.cpp and this engine tokenise text identically and their greedy continuations
// agree. Tiny shapes cover llama, qwen2 and Llama 3 rope scaling quickly; the issue's own shape,
// SmolLM2-135M's, runs with the default and with calm (gains 1) random weights; and the two small
// trained models of test/fixtures/trained bring a second tokenizer and real logit margins.
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { LogitsMode } from "../src/engine/native.js";
import { convertHfToGguf, type GgufOutType } from "../src/models/convert.js";
import { makeTinyModel, type ShapeOverrides, type TinyArch, type TinyPreset, type WeightGains } from "../src/models/make-tiny.js";
import { fixtures, tempDir } from "./support/paths.js";
import { TOKENIZER_TEXTS } from "./support/tokenizer-texts.js";

type NodeLlamaCpp = typeof import("node-llama-cpp");
type Llama = Awaited<ReturnType<NodeLlamaCpp["getLlama"]>>;

/** llama.cpp's prebuilt CPU binary, or why it could not be loaded on this machine. */
async function loadLlamaCpp(): Promise<{ llama: Llama; lib: NodeLlamaCpp } | { error: string }> {
  try {
    const lib = await import("node-llama-cpp");
    const llama = await lib.getLlama({ gpu: false, build: "never", logLevel: lib.LlamaLogLevel.error, progressLogs: false });
    return { llama, lib };
  } catch (e) {
    return { error: (e as Error).message };
  }
}

const loaded = await loadLlamaCpp();
if ("error" in loaded) console.warn(`llamacpp-agreement: skipped, node-llama-cpp cannot load its binary here: ${loaded.error}`);

const PROMPTS = [
  "The capital of France is",
  "def fibonacci(n):\n    if n < 2:\n        return n\n",
  "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n",
  "Once upon a time, in a land far away, there lived",
  "你好，世界！今天天气很好。",
];
const NEW_TOKENS = 64;

/** Greedy continuation with this engine: argmax at every step, no stop token. */
async function oursGreedy(model: Model, prompt: number[]): Promise<number[]> {
  const ctx = model.createContext(prompt.length + NEW_TOKENS);
  try {
    let logits = (await ctx.eval(Int32Array.from(prompt), LogitsMode.Last))!;
    const out: number[] = [];
    for (let i = 0; i < NEW_TOKENS; i++) {
      let best = 0;
      for (let j = 1; j < logits.length; j++) if (logits[j] > logits[best]) best = j;
      out.push(best);
      if (i + 1 < NEW_TOKENS) logits = (await ctx.eval(Int32Array.of(best), LogitsMode.Last))!;
    }
    return out;
  } finally {
    ctx.dispose();
  }
}

interface Variant {
  label: string;
  /** A committed HF folder to convert instead of a generated random-weight model. */
  hfDir?: string;
  arch: TinyArch;
  preset: TinyPreset;
  overrides?: ShapeOverrides;
  gains?: Partial<WeightGains>;
  types: GgufOutType[];
  /** Lower bounds on free-running agreement, where the model is calm enough for one to hold. */
  freeRunning?: Partial<Record<GgufOutType, number>>;
  /** Lower bounds on step-by-step agreement above the 95%, where the model is calm. */
  stepwise?: Partial<Record<GgufOutType, number>>;
  tokenizer: boolean;
}

const VARIANTS: Variant[] = [
  { label: "llama", arch: "llama", preset: "tiny", types: ["f32", "f16", "q8_0"], tokenizer: true },
  { label: "qwen2", arch: "qwen2", preset: "tiny", types: ["f32", "f16", "q8_0"], tokenizer: true },
  // The issue's own shape: SmolLM2-135M's (30 layers, hidden 576, 9/3 heads). With the default
  // sharp gains only F16 is meaningful: rounding activations to Q8_0 flips a value across a
  // rounding boundary now and then, and 30 chaotic layers amplify each flip, so llama.cpp's own
  // F16 and Q8_0 runs agree on 1.9% of greedy tokens and this engine's scalar, AVX2 and AVX-512
  // paths (the same integer arithmetic, summed in another order) on ~55% of top-1 choices.
  { label: "llama smollm2-135m shape", arch: "llama", preset: "smollm2-135m", types: ["f16"], tokenizer: false },
  // Conditioned like a trained model (gains 1), Q8_0 is measurable: llama.cpp's F16 and Q8_0 runs
  // agree on ~70% free running, and step by step this engine agrees with llama.cpp on ≥ 95%.
  {
    label: "llama smollm2-135m shape, gains 1", arch: "llama", preset: "smollm2-135m", gains: { qk: 1, residual: 1 }, types: ["f16", "q8_0"], tokenizer: false,
    // F16 free running: >= 95% on the Zen 4 this was written on, 87.8% on one with AVX-VNNI too
    // (llama.cpp picks its kernels by CPU feature): a single near-tie flip at token 25 of one prompt, the other
    // four identical, 99.7% step by step. One flip in 5 × 64 tokens is what the bar allows.
    freeRunning: { f16: 0.85 },
    stepwise: { f16: 0.99 },
  },
  // Trained models, with their own byte-level BPE tokenizer. Step by step they agree with
  // llama.cpp on ~99% for F16 and Q8_0 alike. Free running is reported only: a trained model this
  // small still meets near-ties now and then (llama.cpp's own F16 and Q8_0 runs agree on ~65%).
  ...(["llama", "qwen2"] as const).map((arch) => ({
    label: `trained ${arch}`, hfDir: join(fixtures, "trained", arch), arch, preset: "tiny" as const, types: ["f16", "q8_0"] as GgufOutType[],
    tokenizer: true,
  })),
  // llama-1b's Llama 3 rope scaling (rope_freqs.weight in the file) at tiny sizes
  {
    label: "llama (Llama 3 rope scaling)", arch: "llama", preset: "llama-1b", types: ["f32", "f16"], tokenizer: false,
    overrides: { hiddenSize: 64, intermediateSize: 192, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 16, ropeTheta: 10000 },
  },
];

describe.skipIf("error" in loaded).each(VARIANTS.map((v) => [v.label, v] as const))("%s: llama.cpp and this engine on the same GGUF", (_, v) => {
  const { llama } = loaded as { llama: Llama };
  const arch = v.label;
  const dir = tempDir();
  const hf = join(dir, "hf");
  const files: Partial<Record<GgufOutType, string>> = {};
  const greedy: Partial<Record<GgufOutType, { ours: number[][]; theirs: number[][] }>> = {};

  beforeAll(async () => {
    if (!v.hfDir) await makeTinyModel({ arch: v.arch, preset: v.preset, dtype: "f32", out: hf, seed: 21, overrides: v.overrides, gains: v.gains });
    for (const type of v.types) {
      files[type] = join(dir, `${type}.gguf`);
      await convertHfToGguf({ dir: v.hfDir ?? hf, out: files[type]!, type });
    }
  });

  async function withBoth<T>(type: GgufOutType, fn: (ours: Model, theirs: Awaited<ReturnType<Llama["loadModel"]>>) => Promise<T>): Promise<T> {
    const ours = await Model.load(files[type]!, { contextSize: 256 });
    const theirs = await llama.loadModel({ modelPath: files[type]!, gpuLayers: 0 });
    try {
      return await fn(ours, theirs);
    } finally {
      ours.dispose();
      await theirs.dispose();
    }
  }

  test.runIf(v.tokenizer)("tokenisation of the same text is identical", async () => {
    await withBoth("f16", async (ours, theirs) => {
      for (const text of [...TOKENIZER_TEXTS, ...PROMPTS]) {
        const a = ours.tokenizer.encode(text, { addSpecialTokens: false });
        const b = theirs.tokenize(text, true).map(Number);
        expect(b, JSON.stringify(text)).toEqual(a);
        expect(theirs.detokenize(b.map((x) => x as never), true), JSON.stringify(text)).toBe(ours.tokenizer.decode(a));
      }
    });
  });

  test.each(v.types)("%s: greedy continuations agree on >= 95%% of 64 tokens over 5 prompts", async (type) => {
    const r = await withBoth(type, async (ours, theirs) => {
      const context = await theirs.createContext({ contextSize: 256, sequences: 1, threads: 2 });
      const seq = context.getSequence();
      const res = { ours: [] as number[][], theirs: [] as number[][] };
      try {
        for (const p of PROMPTS) {
          const prompt = ours.tokenizer.encode(p, { addSpecialTokens: false });
          res.ours.push(await oursGreedy(ours, prompt));
          await seq.clearHistory();
          const got: number[] = [];
          for await (const t of seq.evaluate(prompt.map((x) => x as never), { temperature: 0, yieldEogToken: true })) {
            got.push(Number(t));
            if (got.length === NEW_TOKENS) break;
          }
          res.theirs.push(got);
        }
      } finally {
        await context.dispose();
      }
      return res;
    });
    greedy[type] = r;
    // Free running: position by position, each engine on its own continuation (one early
    // difference makes the rest of that continuation differ).
    let same = 0;
    const firstDiff: number[] = [];
    r.ours.forEach((o, i) => {
      const t = r.theirs[i];
      expect(t).toHaveLength(NEW_TOKENS);
      let d = -1;
      for (let k = 0; k < NEW_TOKENS; k++) {
        if (o[k] === t[k]) same++;
        else if (d < 0) d = k;
      }
      firstDiff.push(d);
    });
    const freeRunning = same / (NEW_TOKENS * PROMPTS.length);
    // Step by step: this engine's greedy choice after each prefix of llama.cpp's continuation.
    let forcedSame = 0;
    await (async () => {
      const ours = await Model.load(files[type]!, { contextSize: 256 });
      try {
        for (let i = 0; i < PROMPTS.length; i++) {
          const prompt = ours.tokenizer.encode(PROMPTS[i], { addSpecialTokens: false });
          const t = r.theirs[i];
          const rows = await ours.logits([...prompt, ...t.slice(0, -1)]);
          for (let k = 0; k < NEW_TOKENS; k++) {
            const row = rows[prompt.length - 1 + k];
            let best = 0;
            for (let j = 1; j < row.length; j++) if (row[j] > row[best]) best = j;
            if (best === t[k]) forcedSame++;
          }
        }
      } finally {
        ours.dispose();
      }
    })();
    const stepwise = forcedSame / (NEW_TOKENS * PROMPTS.length);
    console.log(
      `${arch} ${type}: greedy agreement with llama.cpp ${(100 * freeRunning).toFixed(1)}% free running (first difference per prompt: ${firstDiff.join(", ")}; -1 = none), ` +
        `${(100 * stepwise).toFixed(1)}% step by step on llama.cpp's continuation`,
    );
    if (type === "q8_0" && greedy.f16) {
      let own = 0;
      greedy.f16.theirs.forEach((t, i) => t.forEach((x, k) => { if (x === r.theirs[i][k]) own++; }));
      console.log(`${arch}: llama.cpp's own F16 vs Q8_0 greedy agreement ${(100 * own / (NEW_TOKENS * PROMPTS.length)).toFixed(1)}%`);
    }
    // Step by step, each choice is made from the same context: >= 95%, the bar (Q8_0
    // measured 95.0% llama, 95.9% qwen2, now that activations are rounded to Q8_0 as llama.cpp
    // does; 92.8% before). Free running, one flip changes the rest of a continuation, and these
    // random models are chaotic: llama.cpp's own F16 and Q8_0 runs of one model agree on ~15%
    // free running, so free-running agreement is reported, not asserted, except for F32 where
    // both engines compute in fp32 and only summation order (and llama.cpp's fp16 K/V cache)
    // differ.
    expect(stepwise).toBeGreaterThanOrEqual(v.stepwise?.[type] ?? 0.95);
    if (type === "f32") expect(freeRunning).toBeGreaterThanOrEqual(0.95);
    const bar = v.freeRunning?.[type];
    if (bar !== undefined) expect(freeRunning).toBeGreaterThanOrEqual(bar);
  });
});
