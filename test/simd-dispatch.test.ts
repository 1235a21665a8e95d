// Kernel selection: every path this CPU can run is listed and selectable, the others are refused
// by name, and a DKI_SIMD the CPU cannot honour fails the addon's load with the reason instead of
// crashing a worker thread later. The decode loops' software prefetch is checked the same way, and
// must not change a single bit of the logits on any path.
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { LogitsMode, native, packageRoot } from "../src/engine/native.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { tempDir } from "./support/paths.js";

const ALL = ["scalar", "avx2", "avx512", "amx"];

function loadWithEnv(
  simd: string,
  prefetch?: string,
  streams?: string,
): { status: number | null; stderr: string; active: string; prefetchBytes: number; decodeStreams: number } {
  const addon = join(packageRoot(), "build", "Release", "dki_native.node");
  const env: NodeJS.ProcessEnv = { ...process.env, DKI_SIMD: simd };
  if (prefetch === undefined) delete env.DKI_PREFETCH;
  else env.DKI_PREFETCH = prefetch;
  if (streams === undefined) delete env.DKI_DECODE_STREAMS;
  else env.DKI_DECODE_STREAMS = streams;
  const r = spawnSync(process.execPath, ["-e", `const s = require(${JSON.stringify(addon)}).simd(); console.log(s.active, s.prefetchBytes, s.decodeStreams)`], {
    env,
    encoding: "utf8",
  });
  const [active = "", bytes = "NaN", n = "NaN"] = r.stdout.trim().split(" ");
  return { status: r.status, stderr: r.stderr, active, prefetchBytes: Number(bytes), decodeStreams: Number(n) };
}

describe("SIMD dispatch", () => {
  const { available, active } = native().simd();

  test("auto picks the best path this CPU can run; scalar is always there", () => {
    expect(available[0]).toBe("scalar");
    expect(available.every((n) => ALL.includes(n))).toBe(true);
    expect(loadWithEnv("auto").active).toBe(available[available.length - 1]);
    expect(ALL).toContain(active);
  });

  test.each(ALL)("DKI_SIMD=%s selects that path, or fails the load naming why", (name) => {
    const r = loadWithEnv(name);
    if (available.includes(name)) {
      expect(r.status).toBe(0);
      expect(r.active).toBe(name);
    } else {
      expect(r.status).not.toBe(0);
      expect(r.stderr).toContain(`DKI_SIMD: SIMD path "${name}" is not supported by this CPU`);
      expect(() => native().setSimd(name)).toThrow(/not supported by this CPU/);
    }
  });

  test("an unknown DKI_SIMD fails the load with a clear error, not a crash", () => {
    const r = loadWithEnv("avx9000");
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('DKI_SIMD: unknown SIMD path "avx9000" (expected auto, scalar, avx2, avx512 or amx)');
    expect(() => native().setSimd("avx9000")).toThrow(/unknown SIMD path/);
  });
});

describe("decode prefetch distance and streams", () => {
  const models: Model[] = [];
  afterAll(() => models.forEach((m) => m.dispose()));

  test("DKI_PREFETCH sets it at load; a bad value fails the load naming it; setPrefetch checks its range", () => {
    expect(loadWithEnv("auto", "4096").prefetchBytes).toBe(4096);
    expect(loadWithEnv("auto", "0").prefetchBytes).toBe(0);
    const def = loadWithEnv("auto").prefetchBytes;
    expect([0, 8192]).toContain(def); // 8 KiB on Intel cores, 0 elsewhere
    for (const bad of ["-1", "12abc", "", String(2 ** 21)]) {
      const r = loadWithEnv("auto", bad);
      expect(r.status).toBe(1);
      expect(r.stderr).toContain("DKI_PREFETCH: ");
    }
    for (const bad of [-1, 1.5, 2 ** 21, Number.NaN]) expect(() => native().setPrefetch(bad)).toThrow(/setPrefetch: bytes must be an integer from 0 to 1048576/);
  });

  test("DKI_DECODE_STREAMS sets them at load; a bad value fails the load naming it; setDecodeStreams takes 1 or 2", () => {
    expect(loadWithEnv("auto", undefined, "1").decodeStreams).toBe(1);
    expect(loadWithEnv("auto", undefined, "2").decodeStreams).toBe(2);
    expect([1, 2]).toContain(loadWithEnv("auto").decodeStreams); // 2 on Intel cores, 1 elsewhere
    for (const bad of ["0", "3", "two", ""]) {
      const r = loadWithEnv("auto", undefined, bad);
      expect(r.status).toBe(1);
      expect(r.stderr).toContain("DKI_DECODE_STREAMS: ");
    }
    for (const bad of [0, 3, 1.5, Number.NaN]) expect(() => native().setDecodeStreams(bad)).toThrow(/setDecodeStreams: streams must be 1 or 2/);
  });

  // Rows longer than the prefetch distance, so the prefetched lines run ahead into the next rows.
  const shape = { numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 64, hiddenSize: 256, intermediateSize: 1024 };
  const prompt = [1, 450, 3000, 17, 9021, 44];
  const weights = [
    ["f32", "none"],
    ["f16", "none"],
    ["bf16", "none"],
    ["f32", "q8_0"],
  ] as const;

  test.each(weights)("decode logits are bit-identical with and without prefetching, in one or two streams (%s weights, quantize %s), on every SIMD path", async (dtype, quantize) => {
    const dir = tempDir();
    await makeTinyModel({ arch: "llama", preset: "tiny", dtype, out: dir, seed: 5, overrides: shape });
    const model = await Model.load(dir, { quantize, contextSize: 16 });
    models.push(model);
    const decode = async (): Promise<Float32Array[]> => {
      const ctx = model.createContext(prompt.length);
      const out: Float32Array[] = [];
      for (const t of prompt) out.push((await ctx.eval(Int32Array.of(t), LogitsMode.Last))!);
      ctx.dispose();
      return out;
    };
    const { prefetchBytes, decodeStreams } = native().simd();
    try {
      for (const simd of native().simd().available) {
        native().setSimd(simd);
        native().setPrefetch(0);
        native().setDecodeStreams(1);
        const plain = await decode();
        for (const [bytes, streams] of [[512, 1], [0, 2], [512, 2]]) {
          native().setPrefetch(bytes);
          native().setDecodeStreams(streams);
          const other = await decode();
          other.forEach((row, i) => expect(row, `${simd}, prefetch ${bytes}, ${streams} streams, token ${i}`).toEqual(plain[i]));
        }
      }
    } finally {
      native().setSimd("auto");
      native().setPrefetch(prefetchBytes);
      native().setDecodeStreams(decodeStreams);
    }
  });
});
