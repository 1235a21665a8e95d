// Kernel selection: every path this CPU can run is listed and selectable, the others are refused
// by name, and a DKI_SIMD the CPU cannot honour fails the addon's load with the reason instead of
// crashing a worker thread later.
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { native, packageRoot } from "../src/engine/native.js";

const ALL = ["scalar", "avx2", "avx512"];

function loadWithEnv(simd: string): { status: number | null; stderr: string; active: string } {
  const addon = join(packageRoot(), "build", "Release", "dki_native.node");
  const r = spawnSync(process.execPath, ["-e", `console.log(require(${JSON.stringify(addon)}).simd().active)`], {
    env: { ...process.env, DKI_SIMD: simd },
    encoding: "utf8",
  });
  return { status: r.status, stderr: r.stderr, active: r.stdout.trim() };
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
    expect(r.stderr).toContain('DKI_SIMD: unknown SIMD path "avx9000" (expected auto, scalar, avx2 or avx512)');
    expect(() => native().setSimd("avx9000")).toThrow(/unknown SIMD path/);
  });
});
