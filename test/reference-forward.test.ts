// The float64 reference forward pass (test/reference/forward.ts) against the logits Hugging Face
// transformers computed for the llama-tiny fixture (test/fixtures/hf/README.md): the reference
// has to be right before the native engine is judged by it.
import { copyFileSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import type { ModelConfig } from "../src/formats/hf-config.js";
import { readSafetensorsHeader, writeSafetensors, type TensorToWrite } from "../src/formats/safetensors.js";
import { decodeBF16, decodeF16, loadRefWeights, refForward, ropeInvFreq, type RefSegment, type RefWeights } from "./reference/forward.js";
import { llamaTinyRefs } from "./support/llama-tiny-refs.js";
import { hfLlamaTiny, maxAbsDiff, tempDir } from "./support/paths.js";

const refs = llamaTinyRefs;
const TOL = 1e-4;
let w: RefWeights;

const maxRowDiff = (got: ArrayLike<number>[], want: number[][]) => {
  expect(got.length).toBe(want.length);
  return Math.max(...want.map((row, i) => maxAbsDiff(got[i], row)));
};

function segment(startPos: number, alpha: number, scaling: "value" | "logit"): RefSegment {
  const mem = refForward(w, refs.mem_ids, { startPos });
  return { k: mem.k, v: mem.v, nTokens: refs.mem_ids.length, alpha, scaling };
}

beforeAll(async () => {
  w = await loadRefWeights(hfLlamaTiny);
});

describe("reference forward vs transformers (llama-tiny)", () => {
  const diffs: Record<string, number> = {};

  test("none: the prompt alone", () => {
    diffs.none = maxRowDiff(refForward(w, refs.prompt_ids).logits, refs.none);
    expect(diffs.none).toBeLessThan(TOL);
  });

  test("full: [memory ; prompt] as one sequence, prompt rows", () => {
    const all = refForward(w, [...refs.mem_ids, ...refs.prompt_ids]).logits.slice(refs.mem_ids.length);
    diffs.full = maxRowDiff(all, refs.full);
    expect(diffs.full).toBeLessThan(TOL);
  });

  const M = refs.mem_ids.length;
  const injected = [
    { name: "inject_a1", title: "memory K/V at 0..10 as a segment, prompt at 11..17", promptAt: M, memAt: 0, alpha: 1, scaling: "value" },
    { name: "inject_neg", title: "memory at -11..-1, prompt at 0..6", promptAt: 0, memAt: -M, alpha: 1, scaling: "value" },
    { name: "inject_v05", title: "memory values × 0.5, keys untouched", promptAt: M, memAt: 0, alpha: 0.5, scaling: "value" },
    { name: "logit_a05", title: "ln 0.5 added to the memory columns' scores", promptAt: M, memAt: 0, alpha: 0.5, scaling: "logit" },
  ] as const;
  for (const { name, title, promptAt, memAt, alpha, scaling } of injected)
    test(`${name}: ${title}`, () => {
      const got = refForward(w, refs.prompt_ids, { startPos: promptAt, segments: [segment(memAt, alpha, scaling)] }).logits;
      diffs[name] = maxRowDiff(got, refs[name]);
      expect(diffs[name]).toBeLessThan(TOL);
    });

  test("a segment equals the same tokens run in one sequence (K/V of the memory run included)", () => {
    const all = refForward(w, [...refs.mem_ids, ...refs.prompt_ids]);
    const mem = refForward(w, refs.mem_ids);
    const M = refs.mem_ids.length, T = M + refs.prompt_ids.length, c = w.config;
    for (let l = 0; l < c.numLayers; l++) {
      for (let h = 0; h < c.numKvHeads; h++) {
        const a = all.k[l].subarray(h * T * c.headDim, (h * T + M) * c.headDim);
        expect(maxAbsDiff(mem.k[l].subarray(h * M * c.headDim, (h + 1) * M * c.headDim), a)).toBeLessThan(1e-12);
      }
    }
    // two segments splitting the memory give the same result as one
    const split = (from: number, to: number): RefSegment => {
      const sub = (arr: Float64Array[]) =>
        arr.map((x) => {
          const out = new Float64Array(c.numKvHeads * (to - from) * c.headDim);
          for (let h = 0; h < c.numKvHeads; h++) out.set(x.subarray((h * M + from) * c.headDim, (h * M + to) * c.headDim), h * (to - from) * c.headDim);
          return out;
        });
      return { k: sub(mem.k), v: sub(mem.v), nTokens: to - from, alpha: 1, scaling: "value" };
    };
    const two = refForward(w, refs.prompt_ids, { startPos: M, segments: [split(0, 4), split(4, M)] }).logits;
    expect(maxRowDiff(two, all.logits.slice(M).map((r) => Array.from(r)))).toBeLessThan(1e-10);
  });

  test("report", () => {
    console.log("reference vs transformers, max abs diff:", diffs);
  });
});

describe("weight decoding", () => {
  test("F16 bit patterns", () => {
    expect(decodeF16(0x3c00)).toBe(1);
    expect(decodeF16(0xc000)).toBe(-2);
    expect(decodeF16(0x7bff)).toBe(65504);
    expect(decodeF16(0x0001)).toBe(2 ** -24);
    expect(decodeF16(0x03ff)).toBe(1023 * 2 ** -24);
    expect(decodeF16(0x0400)).toBe(2 ** -14);
    expect(decodeF16(0x3555)).toBeCloseTo(0.333251953125, 12);
    expect(decodeF16(0x8000)).toBe(-0);
    expect(decodeF16(0x7c00)).toBe(Infinity);
    expect(decodeF16(0xfc00)).toBe(-Infinity);
    expect(decodeF16(0x7e00)).toBeNaN();
  });

  test("BF16 bit patterns agree with float32's upper half", () => {
    expect(decodeBF16(0x3f80)).toBe(1);
    expect(decodeBF16(0xc040)).toBe(-3);
    expect(decodeBF16(0x4049)).toBe(3.140625);
    expect(decodeBF16(0x7f80)).toBe(Infinity);
    expect(decodeBF16(0x7fc0)).toBeNaN();
    const view = new DataView(new ArrayBuffer(4));
    for (let bits = 0; bits < 0x10000; bits += 7) {
      view.setUint32(0, bits << 16 >>> 0);
      const f = view.getFloat32(0);
      if (Number.isNaN(f)) expect(decodeBF16(bits)).toBeNaN();
      else expect(decodeBF16(bits)).toBe(f);
    }
  });

  /** Writes llama-tiny's weights converted to `dtype` into a new folder; returns it and the F32 originals. */
  async function convertedCopy(dtype: "BF16" | "F16", encode: (f: number, bits32: number) => number) {
    const dir = tempDir();
    for (const f of ["config.json", "tokenizer.json"]) copyFileSync(join(hfLlamaTiny, f), join(dir, f));
    const { tensors } = await readSafetensorsHeader(join(hfLlamaTiny, "model.safetensors"));
    const src = readFileSync(join(hfLlamaTiny, "model.safetensors"));
    const out: TensorToWrite[] = [];
    const originals = new Map<string, Float64Array>();
    for (const t of tensors) {
      const n = t.nbytes / 4;
      const data = new Uint8Array(n * 2);
      const vals = new Float64Array(n);
      const dv = new DataView(src.buffer, src.byteOffset + t.offset, t.nbytes);
      const ov = new DataView(data.buffer);
      for (let i = 0; i < n; i++) {
        vals[i] = dv.getFloat32(4 * i, true);
        ov.setUint16(2 * i, encode(vals[i], dv.getUint32(4 * i, true)), true);
      }
      originals.set(t.name, vals);
      out.push({ name: t.name, dtype, shape: t.shape, data });
    }
    await writeSafetensors(join(dir, "model.safetensors"), out);
    return { weights: await loadRefWeights(dir), originals };
  }

  test("a BF16 copy of llama-tiny loads as the truncated F32 weights", async () => {
    const { weights, originals } = await convertedCopy("BF16", (_f, bits) => bits >>> 16);
    const fv = new DataView(new ArrayBuffer(4));
    for (const [name, vals] of originals) {
      const got = weights.get(name);
      for (let i = 0; i < vals.length; i++) {
        fv.setFloat32(0, vals[i]);
        fv.setUint16(2, 0); // zero the low half: truncation
        if (got[i] !== fv.getFloat32(0)) throw new Error(`${name}[${i}]: ${got[i]} vs ${fv.getFloat32(0)}`);
      }
    }
    expect(maxRowDiff(refForward(weights, refs.prompt_ids).logits, refs.none)).toBeLessThan(0.1);
  });

  test("an F16 copy of llama-tiny loads within half-precision rounding of the F32 weights", async () => {
    const toF16 = (v: number): number => {
      const sign = v < 0 ? 0x8000 : 0;
      const a = Math.abs(v);
      if (a < 2 ** -14) return sign | Math.round(a / 2 ** -24); // subnormal (1024 rounds up into the smallest normal)
      let e = Math.floor(Math.log2(a));
      if (2 ** e > a) e--;
      let m = Math.round((a / 2 ** e - 1) * 1024);
      if (m === 1024) { m = 0; e++; }
      return sign | ((e + 15) << 10) | m;
    };
    const { weights, originals } = await convertedCopy("F16", (f) => toF16(f));
    for (const [name, vals] of originals) {
      const got = weights.get(name);
      for (let i = 0; i < vals.length; i++) {
        const tol = Math.max(Math.abs(vals[i]) * 2 ** -11, 2 ** -25);
        if (!(Math.abs(got[i] - vals[i]) <= tol)) throw new Error(`${name}[${i}]: ${got[i]} vs ${vals[i]}`);
      }
    }
    expect(maxRowDiff(refForward(weights, refs.prompt_ids).logits, refs.none)).toBeLessThan(0.01);
  });
});

describe("rotary", () => {
  test("llama3 rope scaling follows transformers' _compute_llama3_parameters", () => {
    // Llama 3.1 8B's rotary settings
    const cfg: ModelConfig = {
      ...w.config,
      headDim: 128,
      ropeTheta: 500000,
      ropeScaling: { type: "llama3", factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 },
    };
    const inv = ropeInvFreq(cfg);
    const plain = ropeInvFreq({ ...cfg, ropeScaling: null });
    // high frequencies (wavelength < 8192/4) unchanged, low ones (> 8192) divided by 8
    expect(inv[0]).toBe(plain[0]);
    expect(inv[63]).toBeCloseTo(plain[63] / 8, 15);
    // a medium one: wavelength between 2048 and 8192, smoothly interpolated
    const i = plain.findIndex((f) => 2 * Math.PI / f >= 2048 && 2 * Math.PI / f <= 8192);
    const smooth = (8192 / (2 * Math.PI / plain[i]) - 1) / 3;
    expect(inv[i]).toBeCloseTo((1 - smooth) * plain[i] / 8 + smooth * plain[i], 15);
    expect(inv[i]).toBeLessThan(plain[i]);
    expect(inv[i]).toBeGreaterThan(plain[i] / 8);
  });
});
