// Parity with Hugging Face transformers on the committed fixture (test/fixtures/hf/README.md):
// a random-weight LlamaForCausalLM saved by transformers, and the logits transformers computed
// for plain, full-text and injected runs. Checked on every SIMD path this CPU can run.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { readHfFolder } from "../src/formats/hf-folder.js";
import { LogitsMode, native, type NativeContextHandle, type NativeModelHandle } from "../src/engine/native.js";
import { llamaTinyRefs } from "./support/llama-tiny-refs.js";
import { hfLlamaTiny, maxAbsDiff } from "./support/paths.js";

const refs = llamaTinyRefs;
const V = 512;
const M = refs.mem_ids.length;
let model: NativeModelHandle;
let ctx: NativeContextHandle;

beforeAll(async () => {
  const f = await readHfFolder(hfLlamaTiny);
  model = await native().loadModel({ config: f.config, tensors: f.tensors });
  ctx = new (native().NativeContext)(model, 128);
});
afterAll(() => {
  native().setSimd("auto");
});

function rows(flat: Float32Array, from = 0): Float32Array[] {
  const out: Float32Array[] = [];
  for (let i = from; i < flat.length / V; i++) out.push(flat.subarray(i * V, (i + 1) * V));
  return out;
}

function maxDiffRows(expected: number[][], got: Float32Array[]): number {
  expect(got.length).toBe(expected.length);
  return Math.max(...expected.map((row, i) => maxAbsDiff(row, got[i])));
}

/** Memory K/V computed alone at startPos, then the prompt at promptPos with it injected. */
async function injected(memStart: number, promptPos: number, alpha: number, logit: boolean): Promise<Float32Array[]> {
  ctx.setSegments([]);
  ctx.reset(memStart);
  await ctx.eval(Int32Array.from(refs.mem_ids), LogitsMode.None);
  const block = ctx.exportBlock(0, M);
  ctx.reset(promptPos);
  ctx.setSegments([{ block, alpha, logit }]);
  const out = rows((await ctx.eval(Int32Array.from(refs.prompt_ids), LogitsMode.All))!);
  ctx.setSegments([]);
  return out;
}

async function greedy(prefix: number[], steps: number): Promise<number[]> {
  let logits = (await ctx.eval(Int32Array.from(prefix), LogitsMode.Last))!;
  const out: number[] = [];
  for (let i = 0; i < steps; i++) {
    let best = 0;
    for (let j = 1; j < V; j++) if (logits[j] > logits[best]) best = j;
    out.push(best);
    logits = (await ctx.eval(Int32Array.of(best), LogitsMode.Last))!;
  }
  return out;
}

describe.each(native().simd().available)("transformers parity (%s kernels)", (simd) => {
  beforeAll(() => native().setSimd(simd));
  const tol = 1e-4;

  test("prompt alone", async () => {
    ctx.setSegments([]);
    ctx.reset(0);
    expect(maxDiffRows(refs.none, rows((await ctx.eval(Int32Array.from(refs.prompt_ids), LogitsMode.All))!))).toBeLessThan(tol);
  });

  test("memory + prompt as one sequence", async () => {
    ctx.reset(0);
    const all = (await ctx.eval(Int32Array.from([...refs.mem_ids, ...refs.prompt_ids]), LogitsMode.All))!;
    expect(maxDiffRows(refs.full, rows(all, M))).toBeLessThan(tol);
  });

  test("memory injected as past K/V (prefix positions, α = 1)", async () => {
    expect(maxDiffRows(refs.inject_a1, await injected(0, M, 1, false))).toBeLessThan(tol);
  });

  test("memory injected at negative positions", async () => {
    expect(maxDiffRows(refs.inject_neg, await injected(-M, 0, 1, false))).toBeLessThan(tol);
  });

  test("value scaling α = 0.5", async () => {
    expect(maxDiffRows(refs.inject_v05, await injected(0, M, 0.5, false))).toBeLessThan(tol);
  });

  test("logit scaling α = 0.5", async () => {
    expect(maxDiffRows(refs.logit_a05, await injected(0, M, 0.5, true))).toBeLessThan(tol);
  });

  test("greedy continuation with and without memory", async () => {
    ctx.setSegments([]);
    ctx.reset(0);
    expect(await greedy(refs.prompt_ids, refs.greedy_none.length)).toEqual(refs.greedy_none);
    ctx.reset(0);
    expect(await greedy([...refs.mem_ids, ...refs.prompt_ids], refs.greedy_mem.length)).toEqual(refs.greedy_mem);
  });
});
