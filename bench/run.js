// npm run bench [-- NAME... [--FLAG [VALUE]]...]: runs the named suites (default: all) one after
// another, each with the flags. Names come first; from the first flag on, everything is passed
// through, so a flag's value (--presets smollm2-135m) is not read as a suite name.
import { spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const suites = { engine: "engine.js", injection: "injection.js", cache: "cache.js", "cache-burst": "cache-burst.js", "peak-rss": "peak-rss.js", memory: "memory.js", gpu: "gpu.js", "dki-chat": "dki-chat.js", "dki-vs-rag": "dki-vs-rag.js", "relevance-calibration": "calibrate-relevance.js", "threads-contention": "threads-contention.js", "serve-load": "serve-load.js", "rag-pipeline": "rag-pipeline.js" };
// The CPU suites run by default; gpu needs the CUDA addon and a GPU (bench/gpu/run.sh);
// threads-contention loads the machine on purpose and wants a baseline build (see its header).
const defaults = ["engine", "injection", "cache", "cache-burst", "peak-rss", "memory", "relevance-calibration", "dki-chat", "dki-vs-rag"];
const args = process.argv.slice(2);
const firstFlag = args.findIndex((a) => a.startsWith("--"));
const names = firstFlag < 0 ? args : args.slice(0, firstFlag);
const flags = firstFlag < 0 ? [] : args.slice(firstFlag);
for (const name of names.length ? names : defaults) {
  const file = suites[name];
  if (!file) {
    console.error(`unknown bench suite "${name}" (known: ${Object.keys(suites).join(", ")})`);
    process.exit(1);
  }
  const r = spawnSync(process.execPath, [join(here, file), ...flags], { stdio: "inherit" });
  if (r.status !== 0) process.exit(r.status ?? 1);
}
