// The thread pool and the default thread count. The pool cuts every loop into chunks the threads
// claim one at a time: the logits must be the same bits whatever the thread count (1 runs no
// pool at all: the reference), oversubscribed included. The default count is what the process
// may use: its affinity mask (checked in a child started under taskset) and its cgroup's CPU
// quota (checked on cgroup folders the test writes, read through DKI_CGROUP_ROOT).
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { LogitsMode, native } from "../src/engine/native.js";
import { formatThreads, type ThreadsInfo } from "../src/engine/threads.js";
import { makeTinyModel, type ShapeOverrides } from "../src/models/make-tiny.js";
import { dkiBin } from "./support/dki-bin.js";
import { repoRoot, tempDir } from "./support/paths.js";

const run = promisify(execFile);
const dist = join(repoRoot, "dist");
const taskset = ["/usr/bin/taskset", "/bin/taskset"].find((f) => existsSync(f));

// Shapes whose row counts are not multiples of the loops' alignment (16 rows), so chunk edges
// fall inside a projection; heads and MLP widths differ to vary every loop's length.
const shapes: [string, ShapeOverrides][] = [
  ["tiny", {}],
  ["odd", { hiddenSize: 96, intermediateSize: 200, numHeads: 6, numKvHeads: 2, headDim: 16 }],
  ["narrow", { hiddenSize: 64, intermediateSize: 96, numHeads: 4, numKvHeads: 4, headDim: 16 }],
];
const dirs = new Map<string, string>();
beforeAll(async () => {
  for (const [name, overrides] of shapes) {
    const dir = join(tempDir(), name);
    await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 5, overrides });
    dirs.set(name, dir);
  }
}, 120_000);

/** Every prompt row's logits, then 24 decode steps' (the decode loops are the small, frequent ones). */
async function logitsWith(dir: string, threads: number, quantize: "none" | "q8_0"): Promise<Float32Array[]> {
  const model = await Model.load(dir, { contextSize: 128, threads, quantize });
  try {
    expect(native().getThreads()).toBe(threads);
    const ctx = model.createContext(128);
    const prompt = Int32Array.from({ length: 70 }, (_, i) => 100 + ((i * 7919) % 40000));
    const out = [Float32Array.from((await ctx.eval(prompt, LogitsMode.All))!)];
    for (let i = 0; i < 24; i++) out.push(Float32Array.from((await ctx.eval(Int32Array.of(prompt[i]), LogitsMode.Last))!));
    ctx.dispose();
    return out;
  } finally {
    model.dispose();
  }
}

describe("the pool gives the same bits for every thread count", () => {
  for (const [name] of shapes)
    for (const quantize of ["none", "q8_0"] as const)
      test(`${name}, ${quantize}: threads 2, 3 and 8 (oversubscribed) match 1`, async () => {
        const dir = dirs.get(name)!;
        const reference = await logitsWith(dir, 1, quantize);
        for (const threads of [2, 3, 8]) {
          const got = await logitsWith(dir, threads, quantize);
          expect(got.length).toBe(reference.length);
          for (let i = 0; i < got.length; i++) expect(Buffer.from(got[i].buffer).equals(Buffer.from(reference[i].buffer)), `threads ${threads}, eval ${i}`).toBe(true);
        }
        native().setThreads(0);
      }, 120_000);
});

/** threadsInfo() of a fresh process started with `prefix` (e.g. taskset) and `env` added. */
async function childThreads(env: Record<string, string> = {}, prefix: string[] = []): Promise<ThreadsInfo> {
  const script = `const { threadsInfo } = await import(${JSON.stringify(new URL(`file://${join(dist, "src/engine/threads.js")}`).href)}); console.log(JSON.stringify(threadsInfo()));`;
  const argv = [...prefix, process.execPath, "--input-type=module", "-e", script];
  const { stdout } = await run(argv[0], argv.slice(1), { env: { ...process.env, ...env } });
  return JSON.parse(stdout) as ThreadsInfo;
}

/** A folder laid out like /sys/fs/cgroup with the given files (path → content). */
function cgroupRoot(files: Record<string, string>): string {
  const root = tempDir("dki-cgroup-");
  for (const [path, content] of Object.entries(files)) {
    mkdirSync(join(root, path, ".."), { recursive: true });
    writeFileSync(join(root, path), content);
  }
  return root;
}

describe("the default thread count", () => {
  let affinity: number;
  let noQuota: string;
  beforeAll(async () => {
    noQuota = cgroupRoot({ "cgroup.controllers": "cpu io memory\n" });
    affinity = (await childThreads({ DKI_CGROUP_ROOT: noQuota })).affinity;
  });

  test("is the affinity mask's CPU count without a quota", async () => {
    const t = await childThreads({ DKI_CGROUP_ROOT: noQuota });
    expect(affinity).toBeGreaterThanOrEqual(1);
    expect(t).toEqual({ count: affinity, default: affinity, affinity, cgroupQuota: null, cgroupFile: null });
    expect(formatThreads(t)).toBe(`${affinity} (affinity ${affinity}, cgroup quota none)`);
  });

  test.skipIf(!taskset)("is 1 in a process started under taskset -c 0", async () => {
    const t = await childThreads({ DKI_CGROUP_ROOT: noQuota }, [taskset!, "-c", "0"]);
    expect(t).toEqual({ count: 1, default: 1, affinity: 1, cgroupQuota: null, cgroupFile: null });
  });

  test.each([
    ["v2 cpu.max", { "cgroup.controllers": "cpu\n", "cpu.max": "50000 100000\n" }, 0.5, "cpu.max"],
    ["v2, 1.5 CPUs round up to 2", { "cgroup.controllers": "cpu\n", "cpu.max": "150000 100000\n" }, 1.5, "cpu.max"],
    ["v2 on a hybrid layout (root/unified)", { "unified/cpu.max": "100000 100000\n", "cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n" }, 1, "unified/cpu.max"],
    ["v1 cpu", { "cpu/cpu.cfs_quota_us": "25000\n", "cpu/cpu.cfs_period_us": "50000\n" }, 0.5, "cpu/cpu.cfs_quota_us"],
    ["v1 cpu,cpuacct", { "cpu,cpuacct/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n" }, 3, "cpu,cpuacct/cpu.cfs_quota_us"],
    ["v1 and v2 both: the tighter", { "unified/cpu.max": "300000 100000\n", "cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n" }, 1, "cpu/cpu.cfs_quota_us"],
  ])("a cgroup quota caps it: %s", async (_name, files, quota, file) => {
    const root = cgroupRoot(files);
    const t = await childThreads({ DKI_CGROUP_ROOT: root });
    const expected = Math.max(1, Math.min(affinity, Math.ceil(quota)));
    expect(t).toEqual({ count: expected, default: expected, affinity, cgroupQuota: quota, cgroupFile: join(root, file) });
  });

  test.each([
    ["v2 max", { "cgroup.controllers": "cpu\n", "cpu.max": "max 100000\n" }],
    ["v1 -1", { "cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n" }],
    ["unreadable text", { "cgroup.controllers": "cpu\n", "cpu.max": "lots 0\n", "cpu/cpu.cfs_quota_us": "x\n", "cpu/cpu.cfs_period_us": "100000\n" }],
    ["a zero period", { "cgroup.controllers": "cpu\n", "cpu.max": "50000 0\n" }],
  ])("no quota: %s", async (_name, files) => {
    const t = await childThreads({ DKI_CGROUP_ROOT: cgroupRoot(files) });
    expect(t).toEqual({ count: affinity, default: affinity, affinity, cgroupQuota: null, cgroupFile: null });
  });

  test.skipIf(!taskset)("affinity and quota: the smaller wins", async () => {
    const root = cgroupRoot({ "cgroup.controllers": "cpu\n", "cpu.max": "400000 100000\n" });
    const t = await childThreads({ DKI_CGROUP_ROOT: root }, [taskset!, "-c", "0"]);
    expect(t).toEqual({ count: 1, default: 1, affinity: 1, cgroupQuota: 4, cgroupFile: join(root, "cpu.max") });
  });

  test.skipIf(!taskset)("Model.info, `dki models info` and generate's stats line say it", async () => {
    const root = cgroupRoot({ "cgroup.controllers": "cpu\n", "cpu.max": "100000 100000\n" });
    const env = { ...process.env, DKI_CGROUP_ROOT: root };
    const dir = dirs.get("tiny")!;
    const info = await run(process.execPath, [dkiBin, "models", "info", dir], { env });
    expect(info.stdout).toMatch(new RegExp(`\\n  threads +1 \\(affinity ${affinity}, cgroup quota 1 CPU\\)\\n`));
    const json = JSON.parse((await run(process.execPath, [dkiBin, "models", "info", dir, "--format", "json"], { env })).stdout);
    expect(json.threads).toEqual({ count: 1, default: 1, affinity, cgroupQuota: 1, cgroupFile: join(root, "cpu.max") });
    const gen = await run(taskset!, ["-c", "0", process.execPath, dkiBin, "generate", "--model", dir, "--prompt-tokens", "1,2,3", "-n", "2"], { env });
    expect(gen.stderr).toMatch(/ \| threads 1 \(affinity 1, cgroup quota 1 CPU\) \| /);
    const set = await run(process.execPath, [dkiBin, "generate", "--model", dir, "--prompt-tokens", "1,2,3", "-n", "2", "--threads", "3", "--format", "json"], { env });
    expect(JSON.parse(set.stdout).stats.threads).toBe(3);
    const setText = await run(process.execPath, [dkiBin, "generate", "--model", dir, "--prompt-tokens", "1,2,3", "-n", "2", "--threads", "3"], { env });
    expect(setText.stderr).toMatch(new RegExp(` \\| threads 3 \\(set; default 1: affinity ${affinity}, cgroup quota 1 CPU\\) \\| `));
  }, 60_000);

  test("Model.info.threads is the pool's count at load", async () => {
    const model = await Model.load(dirs.get("tiny")!, { contextSize: 16, threads: 3 });
    try {
      expect(model.info.threads.count).toBe(3);
      expect(model.info.threads.default).toBe(native().threadBudget().threads);
    } finally {
      model.dispose();
      native().setThreads(0);
    }
  });
});
