// A burst of concurrent cache misses: 48 gets of distinct 512-token memories at once on the
// smollm2-135m shape, tiers of 64 MB, with maxConcurrentLoads 64 (every miss loads at once, as
// before the limit existed) and 2 (the default). Each setting runs in a fresh process, which
// reports its peak RSS growth (VmHWM after clear_refs, Linux), the most computes running at once,
// the most bytes seen leaving L1, and the wall time.
// Usage: node bench/cache-burst.js
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Model } from "../dist/src/engine/model.js";
import { native } from "../dist/src/engine/native.js";
import { TieredKVCache } from "../dist/src/cache/index.js";
import { machine } from "./lib/machine.js";
import { benchModel } from "./lib/models.js";
import { writeResults } from "./lib/results.js";

const GETS = 48;
const TOKENS = 512;
const BUDGET = 64e6;
const SETTINGS = [64, 2];
const mb = (n) => n / 2 ** 20;

const childArg = process.argv.indexOf("--child");
if (childArg > 0) {
  process.stdout.write(JSON.stringify(await burst(Number(process.argv[childArg + 1]))) + "\n");
} else {
  const dir = await benchModel("smollm2-135m", "f16");
  const rows = SETTINGS.map((loads) => {
    const r = spawnSync(process.execPath, [fileURLToPath(import.meta.url), "--child", String(loads), dir], { encoding: "utf8" });
    if (r.status !== 0) throw new Error(`burst with maxConcurrentLoads ${loads} failed: ${r.stderr}`);
    const m = JSON.parse(r.stdout);
    return {
      maxConcurrentLoads: loads,
      "computes at once (most)": m.mostRunning,
      "leaving L1, most MB": mb(m.mostLeaving),
      "L1 budget MB": mb(BUDGET),
      "peak RSS growth MB": mb(m.rssGrew),
      "wall s": m.ms / 1000,
    };
  });
  writeResults("cache-burst-cpu", {
    machine: machine(native()),
    columns: Object.keys(rows[0]),
    rows,
    notes: [
      `${GETS} concurrent cache.get()s of distinct ${TOKENS}-token memories (all L4 misses) on the smollm2-135m F16 shape, budgets L1 = L2 = ${mb(BUDGET).toFixed(0)} MB, L3 1 GB; one fresh process per row.`,
      "maxConcurrentLoads 64 lets every miss load at once, as the cache did before the limit; 2 is the default. Both rows hold each load's turn until the blocks leaving L1 are back within budget.",
      "Peak RSS growth includes the K/V buffer pool (up to 256 MiB by default), which is outside the tiers' budgets. Computes run one at a time natively either way, so the wall time is about the same.",
    ],
  });
}

/** One burst in this process. */
async function burst(maxConcurrentLoads) {
  const dir = process.argv[process.argv.indexOf("--child") + 2];
  const model = await Model.load(dir, { contextSize: 64 });
  let running = 0;
  let mostRunning = 0;
  const counting = {
    get info() {
      return model.info;
    },
    nativeHandle: () => model.nativeHandle(),
    async computeBlock(tokens, opts) {
      mostRunning = Math.max(mostRunning, ++running);
      try {
        return await model.computeBlock(tokens, opts);
      } finally {
        running--;
      }
    },
  };
  const scratch = mkdtempSync(join(tmpdir(), "dki-bench-burst-"));
  const cache = await TieredKVCache.open({ model: counting, dir: scratch, budgets: { l1Bytes: BUDGET, l2Bytes: BUDGET, l3Bytes: 1e9 }, maxConcurrentLoads });
  const status = (field) => Number(/(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8").split("\n").find((l) => l.startsWith(field)))[1]) * 1024;
  const before = status("VmRSS:");
  writeFileSync("/proc/self/clear_refs", "5");
  let mostLeaving = 0;
  const watch = setInterval(() => (mostLeaving = Math.max(mostLeaving, cache.stats().L1.leavingBytes)), 2);
  const t0 = performance.now();
  const memory = (i) => Array.from({ length: TOKENS }, (_, j) => ((i * 7919 + j * 31) % 49000) + 100);
  await Promise.all(Array.from({ length: GETS }, (_, i) => cache.get({ userId: "bench", tokens: memory(i) }).then((hit) => hit.release())));
  const ms = performance.now() - t0;
  clearInterval(watch);
  const rssGrew = status("VmHWM:") - before;
  await cache.close();
  model.dispose();
  rmSync(scratch, { recursive: true, force: true });
  return { mostRunning, mostLeaving, rssGrew, ms };
}
