// The CUDA backend against the CPU backend and transformers (issue #9, must-show 1). Runs only
// where the addon was built with `npm run build:cuda` and sees a GPU (bench/gpu/run.sh on the GPU
// host); elsewhere every test here is skipped, and device.test.ts checks the error paths.
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model, logSoftmaxAt, type InjectionOptions } from "../src/engine/model.js";
import { LogitsMode, native } from "../src/engine/native.js";
import { TieredKVCache } from "../src/cache/index.js";
import { KVBlock } from "../src/kv/kv-block.js";
import { readHfFolder } from "../src/formats/hf-folder.js";
import { f16BitsToF32, f32ToF16Bits } from "../src/models/half.js";
import { convertHfToGguf } from "../src/models/convert.js";
import { makeTinyModel, type TinyArch, type TinyDType } from "../src/models/make-tiny.js";
import { fixtures, maxAbsDiff, repoRoot, tempDir } from "./support/paths.js";

const gpu = native().cuda().devices > 0;
const maxRowDiff = (a: ArrayLike<number>[], b: ArrayLike<number>[]) => Math.max(...a.map((row, i) => maxAbsDiff(row, b[i])));
// Prompts long enough for the GEMM path (more than 4 tokens) and, with 1100, two chunks on the
// GPU (1024 tokens each) and five on the CPU (256).
const prompt = Array.from({ length: 40 }, (_, i) => (i * 977 + 13) % 49152);
const longPrompt = Array.from({ length: 1100 }, (_, i) => (i * 7919 + 5) % 49152);
const memory = [3, 1200, 77, 4501, 9, 18000, 256, 31, 40000, 12, 600, 7];
// Decode GEMV rows of 2048 columns (q/k/v, gate/up) and 8192 (the down projection): several
// rounds of a lane's loads a row, every lane's loads used, where the tiny shapes' 96 leave most
// lanes idle.
const wideShape = { numHeads: 32, numKvHeads: 8, hiddenSize: 2048, intermediateSize: 8192 };

/** Logits of the prompt, then of 8 single-token steps and a 3-token one (the GEMV path), on one
 * context. The steps feed fixed tokens rather than each model's own choice, so two models never
 * drift apart by taking different paths: only their arithmetic differs. */
async function promptAndDecode(m: Model, tokens: number[]): Promise<Float32Array[]> {
  const ctx = m.createContext(512);
  try {
    const all = (await ctx.eval(Int32Array.from(tokens), LogitsMode.All))!;
    const V = m.config.vocabSize;
    const rows = Array.from({ length: tokens.length }, (_, i) => all.subarray(i * V, (i + 1) * V));
    for (let s = 0; s < 8; s++) rows.push((await ctx.eval(Int32Array.of((s * 4099 + 17) % V), LogitsMode.Last))!);
    const three = (await ctx.eval(Int32Array.of(5, 900, 31000), LogitsMode.All))!;
    for (let i = 0; i < 3; i++) rows.push(three.subarray(i * V, (i + 1) * V));
    return rows;
  } finally {
    ctx.dispose();
  }
}

describe.skipIf(!gpu)("CUDA backend", () => {
  // Prefill attention through the default register-tiled kernel at head sizes 16, 64 and 128 (its
  // one and two groups of output dimensions per thread) or the warp kernel (DKI_CUDA_ATTENTION=warp,
  // read when a context is made: set for the whole describe). The "wide" rows take wideShape.
  describe.each(([
    ["llama", "f32", 1e-3, 16, "DKI_CUDA_ATTENTION=warp"],
    ["qwen2", "f32", 1e-3, 16, "DKI_CUDA_ATTENTION=warp"],
    ["llama", "f16", 2e-2, 16, "DKI_CUDA_ATTENTION=warp"],
    ["llama", "bf16", 2e-2, 16, "DKI_CUDA_ATTENTION=warp"],
    ["llama", "f32", 1e-3, 16, "defaults"],
    ["qwen2", "f32", 1e-3, 64, "defaults"],
    ["llama", "f32", 1e-3, 128, "defaults"],
    ["llama", "bf16", 2e-2, 64, "defaults"],
    ["llama", "bf16", 2e-2, 64, "defaults", "wide"],
    ["qwen2", "f16", 2e-2, 64, "defaults", "wide"],
    ["llama", "bf16", 2e-2, 128, "defaults", "wide"],
    ["llama", "f32", 1e-3, 128, "defaults", "wide"],
    ["qwen2", "bf16", 2e-2, 64, "defaults", "wide"],
    ["llama", "f16", 2e-2, 64, "defaults", "wide"],
  ] as [TinyArch, TinyDType, number, number, "DKI_CUDA_ATTENTION=warp" | "defaults", ("wide" | "")?][]))("%s %s, head size %i, %s, against the CPU", (arch, dtype, tol, headDim, env, shape = "") => {
    let cpu: Model, cuda: Model;
    beforeAll(async () => {
      if (env === "DKI_CUDA_ATTENTION=warp") process.env.DKI_CUDA_ATTENTION = "warp";
      const dir = tempDir();
      const overrides = shape === "wide" ? { ...wideShape, headDim } : { numHeads: 6, numKvHeads: 2, headDim, hiddenSize: 96 };
      await makeTinyModel({ arch, preset: "tiny", dtype, out: dir, seed: 5, overrides });
      cpu = await Model.load(dir, { contextSize: 1200 });
      cuda = await Model.load(dir, { contextSize: 1200, device: "cuda" });
    });
    afterAll(() => {
      delete process.env.DKI_CUDA_ATTENTION;
      cpu.dispose();
      cuda.dispose();
    });

    test("the model reports its device and the bytes uploaded", () => {
      expect(cuda.info.device).toBe("cuda");
      expect(cuda.info.deviceBytes).toBeGreaterThan(0.9 * cuda.info.weightBytes);
    });

    test(`prompt (GEMM) and decode (GEMV) logits within ${tol}`, async () => {
      expect(maxRowDiff(await promptAndDecode(cpu, prompt), await promptAndDecode(cuda, prompt))).toBeLessThan(tol);
    });

    // (Not for the wide shapes, whose rows test decode: 1100 tokens of them are slow on the CPU.)
    test.skipIf(shape === "wide")(`a 1100-token prompt (chunks of 1024 on the GPU, 256 on the CPU) within ${tol}`, async () => {
      expect(maxRowDiff(await cpu.logits(longPrompt), await cuda.logits(longPrompt))).toBeLessThan(tol);
    });

    test("an exported K/V block equals the CPU's", async () => {
      const a = await cpu.computeBlock(memory), b = await cuda.computeBlock(memory);
      expect(maxAbsDiff(a.keys(), b.keys())).toBeLessThan(tol);
      expect(maxAbsDiff(a.values(), b.values())).toBeLessThan(tol);
    });

    test.each([
      ["value α = 0.5, negative positions", { alpha: 0.5, scaling: "value", positions: "negative" }],
      ["logit α = 0.5, prefix positions", { alpha: 0.5, scaling: "logit", positions: "prefix" }],
      ["value α = 1.7, prefix positions", { alpha: 1.7, scaling: "value", positions: "prefix" }],
    ] as const)("injection with %s matches the CPU", async (_, o) => {
      // The same block (computed on the CPU) injected on both backends: only the attention differs.
      const kv = await cpu.computeBlock(memory, { startPos: o.positions === "negative" ? -memory.length : 0 });
      const inj: InjectionOptions = { segments: [{ kv, alpha: o.alpha, scaling: o.scaling }], positions: o.positions };
      expect(maxRowDiff(await cpu.logits(prompt, inj), await cuda.logits(prompt, inj))).toBeLessThan(tol);
    });

    test("the same block injected again with another α (not uploaded again) still matches the CPU", async () => {
      const kv = await cpu.computeBlock(memory, { startPos: -memory.length });
      for (const alpha of [0.5, 0.9, 0.5]) {
        const inj: InjectionOptions = { segments: [{ kv, alpha }], positions: "negative" };
        expect(maxRowDiff(await cpu.logits(prompt, inj), await cuda.logits(prompt, inj))).toBeLessThan(tol);
      }
    });

    test("attention entropy probe matches the CPU", async () => {
      for (const layer of [0, 1]) {
        const a = await cpu.attentionEntropy({ tokens: prompt }, layer), b = await cuda.attentionEntropy({ tokens: prompt }, layer);
        expect(Math.abs(a.nats - b.nats)).toBeLessThan(tol);
      }
    });

    test("blocks computed at their own positions, moved by their shifts (keys rotated as the GPU copies them), from host and GPU memory, match the CPU; the same blocks at other shifts are copied again", async () => {
      // Each memory computed alone at position 0, as DKISystem computes them: both placements
      // shift every block, each by its own amount.
      const blocks = await Promise.all([memory, memory.slice(3), [5, 600, 9000, 12]].map((ids) => cpu.computeBlock(ids)));
      // The same tensors in the CUDA model's GPU memory (f32 bytes: exact).
      const onGpu = await Promise.all(blocks.map(async (b) => KVBlock.deserialize(cuda.nativeHandle(), await b.serialize(), { onDevice: true })));
      try {
        for (const positions of ["negative", "prefix", "negative"] as const)
          for (const from of [blocks, onGpu]) {
            const inj: InjectionOptions = { segments: from.map((kv, i) => ({ kv, alpha: [1, 0.6, 1.3][i] })), positions };
            const hostInj: InjectionOptions = { ...inj, segments: blocks.map((kv, i) => ({ kv, alpha: [1, 0.6, 1.3][i] })) };
            expect(maxRowDiff(await cpu.logits(prompt, hostInj), await cuda.logits(prompt, inj)), `${positions}, ${from === blocks ? "host" : "GPU"} blocks`).toBeLessThan(tol);
          }
      } finally {
        for (const b of onGpu) b.dispose();
      }
    });

    // A prompt of 5..64 tokens after a long memory splits its attention columns across blocks
    // (DKI_CUDA_SPLIT_PREFILL, on by default); the warp rows (DKI_CUDA_ATTENTION=warp) never split.
    test.skipIf(shape === "wide")(`a short prompt after a 1000-token memory (columns split across blocks) within ${tol}, entropy probe included`, async () => {
      const long = await cpu.computeBlock(longPrompt.slice(0, 1000), { startPos: -1000 });
      for (const T of [5, 40, 64]) {
        const inj: InjectionOptions = { segments: [{ kv: long, alpha: 0.8 }], positions: "negative" };
        const p = prompt.concat(prompt).slice(0, T);
        expect(maxRowDiff(await cpu.logits(p, inj), await cuda.logits(p, inj)), `${T} tokens`).toBeLessThan(tol);
        const a = await cpu.attentionEntropy({ tokens: p }, 1, inj), b = await cuda.attentionEntropy({ tokens: p }, 1, inj);
        expect(Math.abs(a.nats - b.nats)).toBeLessThan(tol);
      }
    });
  });

  describe("identities on the GPU", () => {
    let m: Model;
    beforeAll(async () => {
      const dir = tempDir();
      await makeTinyModel({ arch: "qwen2", preset: "tiny", dtype: "f32", out: dir, seed: 3, overrides: { numHeads: 6, numKvHeads: 2, headDim: 16 } });
      m = await Model.load(dir, { contextSize: 128, device: "cuda" });
    });
    afterAll(() => m.dispose());

    test("scoreContinuations (one prefill, then each option decoded after truncating back to the prompt) equals the log-probabilities of one prefill of prompt + option", async () => {
      const options = [[5, 900, 31000], [77], [12, 12]];
      const scores = await m.scoreContinuations({ tokens: prompt }, options);
      for (const [i, c] of options.entries()) {
        const rows = await m.logits([...prompt, ...c]);
        const expected = c.reduce((sum, id, k) => sum + logSoftmaxAt(rows[prompt.length - 1 + k]!, id), 0);
        expect(Math.abs(scores[i]! - expected), `option ${i}`).toBeLessThan(1e-3);
      }
    });

    test("α = 1 injection equals [memory ; prompt] as one sequence; negative equals prefix", async () => {
      const full = (await m.logits([...memory, ...prompt])).slice(memory.length);
      const kv = await m.computeBlock(memory);
      const prefix = await m.logits(prompt, { segments: [{ kv, alpha: 1 }], positions: "prefix" });
      expect(maxRowDiff(full, prefix)).toBeLessThan(1e-3);
      const negative = await m.logits(prompt, { segments: [{ kv, alpha: 1 }], positions: "negative" });
      expect(maxRowDiff(prefix, negative)).toBeLessThan(1e-3);
    });

    test("a context too big for the GPU is refused before any of it is allocated, naming the bytes needed and free, and the model still works", async () => {
      // 32 layers × 8 K/V heads × 128 dims: 128 KiB of K per token, 2 TiB for 16M tokens.
      const dir = tempDir();
      await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f16", out: dir, overrides: { numLayers: 32, numHeads: 8, numKvHeads: 8, headDim: 128 } });
      const big = await Model.load(dir, { contextSize: 64, device: "cuda" });
      try {
        expect(() => big.createContext(16_777_216)).toThrow(
          /^a 16777216-token context on cuda:0 needs [\d.]+ TB \(\d+ bytes\) of GPU memory \(its K\/V cache 4\.4 TB \(4398046511104 bytes\)\); [\d.]+ [KMGT]?B \(\d+ bytes\) is free of /,
        );
        expect((await big.logits(prompt)).length).toBe(prompt.length);
      } finally {
        big.dispose();
      }
    });

    test("a head size the CUDA attention cannot hold is refused at load, before any upload", async () => {
      const dir = tempDir();
      await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, overrides: { numHeads: 2, numKvHeads: 1, headDim: 512 } });
      await expect(Model.load(dir, { contextSize: 16, device: "cuda" })).rejects.toThrow(/CUDA backend supports head_dim up to 256, this model has 512/);
      (await Model.load(dir, { contextSize: 16 })).dispose(); // the CPU runs it
    });

    test("segments too large for the GPU are a clean error, and the next injection uploads its blocks again", async () => {
      // A failed allocation used to leave the last upload marked current: the same segments set
      // again were then read from fresh, never-written buffers (or a null one).
      const dir = tempDir();
      await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 6, overrides: { numLayers: 32, numHeads: 8, numKvHeads: 8, headDim: 128 } });
      const big = await Model.load(dir, { contextSize: 64, device: "cuda" });
      try {
        const small = await big.computeBlock(memory);
        const wide = await big.computeBlock(Array.from({ length: 4096 }, (_, i) => (i * 31 + 7) % 49152)); // 1 GiB of K and V
        const short = prompt.slice(0, 8);
        const before = await big.logits(short, { segments: [{ kv: small, alpha: 0.7 }] });
        // Keys alone past this GPU's memory: each copy of `wide` adds 0.5 GiB. The device memory
        // is reserved before anything is copied (when the segments still became remapped copies
        // in host memory first, 200 blocks of 1 GiB killed the test process on an H200 host with
        // 128 GiB of RAM, before any error).
        const gib = Number(/([\d.]+) GiB/.exec(native().cuda().names[0]!)![1]);
        const huge = [{ kv: small, alpha: 0.7 }, ...Array.from({ length: Math.ceil(gib / 0.5) + 1 }, () => ({ kv: wide, alpha: 1 }))];
        await expect(big.logits(short, { segments: huge })).rejects.toThrow(/out of memory/i);
        const after = await big.logits(short, { segments: [{ kv: small, alpha: 0.7 }] });
        expect(maxRowDiff(after, before)).toBe(0);
      } finally {
        big.dispose();
      }
    });

    test("prefill with F16 weights survives activations beyond the F16 range (MLP inputs ~1e5 and more)", async () => {
      // The GEMMs of F16 and Q8_0 weights split fp32 activations into two halves; a value above
      // 65504 became inf there, and prefill then disagreed with decode and with the CPU.
      const dir = tempDir();
      await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f16", out: dir, seed: 8 });
      const file = join(dir, "model.safetensors");
      const bytes = readFileSync(file);
      for (const t of (await readHfFolder(dir)).tensors) {
        if (!t.name.endsWith("post_attention_layernorm.weight")) continue;
        for (let at = t.offset; at < t.offset + t.nbytes; at += 2) bytes.writeUInt16LE(f32ToF16Bits(500 * f16BitsToF32(bytes.readUInt16LE(at))), at);
      }
      writeFileSync(file, bytes);
      const cpu = await Model.load(dir, { contextSize: 128 });
      const cuda = await Model.load(dir, { contextSize: 128, device: "cuda" });
      try {
        const a = await promptAndDecode(cpu, prompt), b = await promptAndDecode(cuda, prompt);
        expect(b.every((row) => row.every(Number.isFinite))).toBe(true);
        const scale = Math.max(...a.map((row) => Math.max(...Array.from(row, Math.abs))));
        expect(maxRowDiff(b, a) / scale).toBeLessThan(2e-2);
      } finally {
        cpu.dispose();
        cuda.dispose();
      }
    });

    test.each([
      ["tiny", {}],
      ["wide", wideShape],
    ])("Q8_0 weights (quantised at load), %s rows: the GPU departs from the CPU's Q8_0 run by less than Q8_0 departs from F32", async (_, overrides) => {
      const dir = tempDir();
      await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 9, gains: { qk: 1, residual: 1, logit: 1 }, overrides });
      const f32 = await Model.load(dir, { contextSize: 128 });
      const cpu = await Model.load(dir, { quantize: "q8_0", contextSize: 128 });
      const cuda = await Model.load(dir, { quantize: "q8_0", contextSize: 128, device: "cuda" });
      // Both backends use the same int8 weights; the CPU also rounds activations to 8 bits (as
      // llama.cpp does), the GPU keeps them fp32. So the backends differ by that rounding alone,
      // which is part of, and smaller than, the whole Q8_0 error against F32.
      const ref = await promptAndDecode(f32, prompt);
      const onCpu = await promptAndDecode(cpu, prompt);
      const quantError = maxRowDiff(onCpu, ref);
      expect(quantError).toBeGreaterThan(1e-3);
      expect(maxRowDiff(await promptAndDecode(cuda, prompt), onCpu)).toBeLessThan(quantError);
      for (const m of [f32, cpu, cuda]) m.dispose();
    });

    test("a GGUF model (llama.cpp's interleaved q/k rows, with q/k/v biases) on the GPU matches the CPU, decode GEMVs included", async () => {
      const dir = tempDir(), file = join(dir, "f16.gguf");
      await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: join(dir, "hf"), seed: 4, overrides: { ...wideShape, attentionBias: true } });
      await convertHfToGguf({ dir: join(dir, "hf"), out: file, type: "f16" });
      const cpu = await Model.load(file, { contextSize: 128 });
      const cuda = await Model.load(file, { contextSize: 128, device: "cuda" });
      expect(maxRowDiff(await promptAndDecode(cpu, prompt), await promptAndDecode(cuda, prompt))).toBeLessThan(2e-2);
      for (const m of [cpu, cuda]) m.dispose();
    });
  });

  describe("K/V blocks in GPU memory", () => {
    let m: Model;
    const dir = tempDir();
    beforeAll(async () => {
      await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 4, overrides: { numHeads: 6, numKvHeads: 2, headDim: 16 } });
      m = await Model.load(dir, { contextSize: 256, device: "cuda" });
    });
    afterAll(() => m.dispose());

    /** test/support/staged-restore.mjs in a process whose uploads use `chunk`-byte staging chunks. */
    function stagedRestore(chunk: string) {
      const script = join(repoRoot, "test", "support", "staged-restore.mjs");
      const r = spawnSync(process.execPath, [script, join(repoRoot, "dist"), dir, "300"], {
        env: { ...process.env, DKI_CUDA_STAGING_CHUNK: chunk },
        encoding: "utf8",
      });
      if (r.status !== 0) throw new Error(`staged-restore.mjs failed: ${r.stderr}`);
      return JSON.parse(r.stdout) as {
        error?: string;
        toDevice?: boolean;
        storages: Record<string, { bytes: number; encoded: boolean; decoded: boolean }>;
        corrupt: Record<string, string | null>;
        segmentsMaxDiff: number;
      };
    }

    test("copies go through pinned staging chunks: with 48-byte chunks (hash words cut anywhere) every storage encodes to the host's bytes and decodes to its tensors, and a flipped bit in any chunk is refused", () => {
      const r = stagedRestore("48");
      expect(r.error).toBeUndefined();
      expect(r.toDevice).toBe(true);
      for (const storage of ["f32", "f16", "bf16", "int8"]) {
        expect(r.storages[storage].bytes, storage).toBeGreaterThan(100 * 48);  // many chunks
        expect(r.storages[storage], storage).toMatchObject({ encoded: true, decoded: true });
      }
      expect(r.corrupt).toEqual({ first: expect.stringMatching(/checksum mismatch/), last: expect.stringMatching(/checksum mismatch/) });
      expect(r.segmentsMaxDiff).toBeLessThan(1e-5);
    });

    test("injected segments from host memory go up through the staging lane in chunks of whole rows too (400 bytes: 2 of the 4 rows of a 3-token block; the test above cuts rows in 48-byte pieces): logits equal those of the same blocks on the GPU", () => {
      const r = stagedRestore("400");
      expect(r.error).toBeUndefined();
      expect(r.segmentsMaxDiff).toBeLessThan(1e-5);
    });

    test("freed device blocks go to the GPU's pool, capped by setKVPoolBytes, and their memory serves the next block", async () => {
      const addon = native();
      // Blocks left to the garbage collector by other tests may join the pool at any await, so
      // only bounds are checked.
      addon.setKVPoolBytes(0);
      expect(addon.kvPoolBytes(0)).toBe(0);
      addon.setKVPoolBytes(256 << 20);
      const host = await m.computeBlock(memory);
      const dev = await host.toDevice();
      dev.dispose();
      expect(addon.kvPoolBytes(0)).toBeGreaterThanOrEqual(2 * (64 << 10)); // K and V, each a 64 KiB size class
      for (let i = 0; i < 3; i++) {
        const again = await host.toDevice();
        const back = await again.toHost();
        again.dispose();
        expect(back.keys()).toEqual(host.keys());
        expect(back.values()).toEqual(host.values());
      }
      addon.setKVPoolBytes(64 << 10);
      expect(addon.kvPoolBytes(0)).toBeLessThanOrEqual(64 << 10);
      addon.setKVPoolBytes(256 << 20);
    });

    test("DKI_CUDA_PROFILE=1: a context times each stage of its one-token steps (graph replays included) and counts the weights each reads", async () => {
      process.env.DKI_CUDA_PROFILE = "1";
      const ctx = m.createContext(64);
      delete process.env.DKI_CUDA_PROFILE;
      try {
        await ctx.eval(Int32Array.from(prompt), 1); // prefill: not profiled
        for (let i = 0; i < 6; i++) await ctx.eval(Int32Array.of(100 + i), 1);
        const p = ctx.cudaProfile()!;
        expect(p.steps).toBe(6);
        expect(p.stages.map((s) => s.stage)).toEqual([
          "embedding", "norm + q/k/v + rotary", "attention", "output projection", "norm + gate/up + SiLU", "down projection", "norm + LM head",
        ]);
        for (const s of p.stages) expect(s.ms, s.stage).toBeGreaterThan(0);
        // f32 weights: 4 bytes each, every layer's matrices once per step.
        const { config: c } = m;
        const hd = c.headDim, layers = c.numLayers, D = c.hiddenSize, F = c.intermediateSize;
        const bytes = Object.fromEntries(p.stages.map((s) => [s.stage, s.bytes]));
        expect(bytes["norm + q/k/v + rotary"]).toBe(4 * layers * D * (c.numHeads + 2 * c.numKvHeads) * hd);
        expect(bytes["norm + gate/up + SiLU"]).toBe(4 * layers * 2 * F * D);
        expect(bytes["down projection"]).toBe(4 * layers * F * D);
        expect(bytes["norm + LM head"]).toBe(4 * c.vocabSize * D);
        expect(bytes["attention"]).toBe(0);
      } finally {
        ctx.dispose();
      }
      const plain = m.createContext(8);
      expect(plain.cudaProfile()).toBeNull();
      plain.dispose();
    });

    test.each([
      ["DKI_CUDA_ATTENTION", "flash", '"warp" or "tiled"'],
      ["DKI_CUDA_SPLIT_PREFILL", "yes", '"on" or "off"'],
    ])("a bad %s is an error naming it when a context is made", (name, value, expected) => {
      process.env[name] = value;
      try {
        expect(() => m.createContext(64)).toThrow(`${name} must be ${expected}, not "${value}"`);
      } finally {
        delete process.env[name];
      }
    });

    test("a bad DKI_CUDA_STAGING_CHUNK is an error naming it", () => {
      expect(stagedRestore("40").error).toMatch(/DKI_CUDA_STAGING_CHUNK must be a multiple of 16 bytes from 16 to 1 GiB, not "40"/);
    });

    test("a GPU index the machine does not have is an error naming it", async () => {
      const host = await m.computeBlock(memory);
      await expect(host.nativeHandle().toDevice(97)).rejects.toThrow(/there is no GPU cuda:97 \(this machine has cuda:0\.\.cuda:\d+\)/);
      await expect(native().deserializeBlock(m.nativeHandle(), await host.serialize("f16"), 97)).rejects.toThrow(/there is no GPU cuda:97/);
      host.dispose();
    });

    test("toDevice / toHost round trip is exact, and a device block names what needs the host", async () => {
      const host = await m.computeBlock(memory);
      const dev = await host.toDevice();
      expect(dev.device).toBe(0);
      expect(dev.byteSize).toBe(0);
      expect(dev.deviceBytes).toBe(host.byteSize);
      expect(() => dev.keys()).toThrow(/lives only in GPU memory; copy it back with toHost\(\) first/);
      // serialize copies a device block back for itself: the same bytes as from the host block.
      expect(await dev.serialize("int8")).toEqual(await host.serialize("int8"));
      const back = await dev.toHost();
      expect(back.device).toBeNull();
      expect(back.keys()).toEqual(host.keys());
      expect(back.values()).toEqual(host.values());
    });

    test("serialize on the device gives the host's bytes, and deserialize onto it the host's tensors", async () => {
      const host = await m.computeBlock(memory, { startPos: 5 });
      const dev = await host.toDevice();
      for (const storage of ["f32", "f16", "bf16", "int8"] as const) {
        const bytes = await host.serialize(storage);
        expect(await dev.serialize(storage), storage).toEqual(bytes);
        const onHost = await KVBlock.deserialize(m.nativeHandle(), bytes);
        const onGpu = await KVBlock.deserialize(m.nativeHandle(), bytes, { onDevice: true });
        expect(onGpu.device, storage).toBe(0);
        expect({ start: onGpu.startPos, tokens: onGpu.tokens }).toEqual({ start: 5, tokens: memory });
        const back = await onGpu.toHost();
        expect(back.keys(), storage).toEqual(onHost.keys());
        expect(back.values(), storage).toEqual(onHost.values());
      }
      // Corrupt bytes are refused: the checksum, computed as the payload is staged, fails and the
      // restored block is dropped.
      const bad = await host.serialize("int8");
      bad[100] ^= 4;
      await expect(KVBlock.deserialize(m.nativeHandle(), bad, { onDevice: true })).rejects.toThrow(/checksum mismatch/);
    });

    test("f16 storage on the device refuses values beyond its range, as on the host", async () => {
      const dev = await m.computeBlock(memory, { onDevice: true });
      const maxV = Math.max(...Array.from((await dev.toHost()).values(), Math.abs));
      const big = await dev.scaleValues(1e5 / maxV);
      expect(big.device).toBe(0);
      await expect(big.serialize("f16")).rejects.toThrow(/beyond f16's range/);
      expect(await big.serialize("bf16")).toEqual(await (await big.toHost()).serialize("bf16"));
    });

    test("computeBlock({ onDevice }) keeps the block on the GPU with the same tensors", async () => {
      const host = await m.computeBlock(memory, { startPos: -memory.length });
      const dev = await m.computeBlock(memory, { startPos: -memory.length, onDevice: true });
      expect(dev.device).not.toBeNull();
      const back = await dev.toHost();
      expect(back.keys()).toEqual(host.keys());
      expect(back.values()).toEqual(host.values());
    });

    test("a device block injects exactly like the same block from host memory", async () => {
      const host = await m.computeBlock(memory, { startPos: -memory.length });
      const dev = await host.toDevice();
      for (const o of [{ alpha: 1, scaling: "value" }, { alpha: 0.5, scaling: "logit" }] as const) {
        const a = await m.logits(prompt, { segments: [{ kv: host, ...o }], positions: "negative" });
        const b = await m.logits(prompt, { segments: [{ kv: dev, ...o }], positions: "negative" });
        expect(maxRowDiff(a, b)).toBe(0);
      }
      // Injection at prefix positions rotates the device block's keys as they are copied.
      const p = await m.logits(prompt, { segments: [{ kv: dev }], positions: "prefix" });
      const full = (await m.logits([...memory, ...prompt])).slice(memory.length);
      expect(maxRowDiff(full, p)).toBeLessThan(1e-3);
    });

    test("scaleValues, remap, slice and concat on the device equal the host operations", async () => {
      const host = await m.computeBlock(memory, { startPos: 3 });
      const dev = await host.toDevice();
      const same = async (d: KVBlock, h: KVBlock, tol: number) => {
        expect(d.device).not.toBeNull();
        const back = await d.toHost();
        expect({ n: back.nTokens, start: back.startPos, tokens: back.tokens }).toEqual({ n: h.nTokens, start: h.startPos, tokens: h.tokens });
        expect(maxAbsDiff(back.keys(), h.keys())).toBeLessThanOrEqual(tol);
        expect(maxAbsDiff(back.values(), h.values())).toBeLessThanOrEqual(tol);
      };
      await same(await dev.scaleValues(0.37), await host.scaleValues(0.37), 0);
      await same(await dev.remap(-40), await host.remap(-40), 1e-5);
      await same(await dev.slice(2, 9), await host.slice(2, 9), 0);
      const parts = [await dev.slice(0, 5), await (await dev.slice(5, 12)).remap(100)];
      const hostParts = [await host.slice(0, 5), await (await host.slice(5, 12)).remap(100)];
      await same(await KVBlock.concat(parts), await KVBlock.concat(hostParts), 1e-5);
      await expect(KVBlock.concat([parts[0], hostParts[1]])).rejects.toThrow(/must all be in host memory or all on the same GPU/);
    });

    test("the tiered cache holds L1 in GPU memory: computed, demoted and restored blocks", async () => {
      const dir = tempDir();
      const one = (await m.computeBlock(memory)).byteSize;
      // Room in L1 for one block: the second get demotes the first through the host to L2.
      const budgets = { l1Bytes: one, l2Bytes: 1 << 24, l3Bytes: 1 << 24 };
      const reqA = { userId: "u", tokens: memory };
      const reqB = { userId: "u", tokens: memory.slice().reverse() };
      const cache = await TieredKVCache.open({ model: m, dir, budgets });
      const a = await cache.get(reqA);
      expect({ tier: a.tier, device: a.block.device }).toEqual({ tier: "L4", device: 0 });
      await cache.flush();
      expect(cache.stats().L1.bytes).toBe(a.block.deviceBytes);
      await cache.get(reqB);
      await cache.flush();
      expect(cache.locate(a.key)[0]).toBe("L2");
      const fromL2 = await cache.get(reqA);
      expect({ tier: fromL2.tier, device: fromL2.block.device }).toEqual({ tier: "L2", device: 0 });
      const exact = await m.computeBlock(memory);
      const l2Back = await fromL2.block.toHost();
      expect(maxAbsDiff(l2Back.values(), exact.values())).toBeLessThan(1e-2); // fp16 in L2
      await cache.close();

      // After a restart the block comes from the int8 file in L3 and goes straight to the GPU.
      const again = await TieredKVCache.open({ model: m, dir, budgets });
      const fromL3 = await again.get(reqA);
      expect({ tier: fromL3.tier, device: fromL3.block.device }).toEqual({ tier: "L3", device: 0 });
      const l3Back = await fromL3.block.toHost();
      expect(maxAbsDiff(l3Back.keys(), exact.keys())).toBeLessThan(5e-2);
      await again.close();
    });
  });

  describe.each([
    ["llama-f32", 1e-3],
    ["qwen2-f32", 1e-3],
    ["llama3-bf16-sharded", 2e-2],
  ] as [string, number][])("transformers reference %s on the GPU", (name, tol) => {
    const dir = join(fixtures, "hf", name);
    const refs = JSON.parse(readFileSync(join(dir, "refs.json"), "utf8")) as { prompt_ids: number[]; logits: number[][]; greedy: number[] };
    let m: Model;
    beforeAll(async () => {
      m = await Model.load(dir, { contextSize: 128, device: "cuda" });
    });
    afterAll(() => m.dispose());

    test(`logits within ${tol} and the same 32 greedy tokens`, async () => {
      const rows = await m.logits(refs.prompt_ids);
      expect(Math.max(...refs.logits.map((r, i) => maxAbsDiff(r, rows[i])))).toBeLessThan(tol);
      const r = await m.generate({ tokens: refs.prompt_ids }, { maxNewTokens: 32, stopOnEos: false });
      expect(r.tokens).toEqual(refs.greedy);
    });
  });
});
