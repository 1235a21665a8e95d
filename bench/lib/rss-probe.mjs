// Run as a child process by test/gguf-memory.test.ts and bench/memory.js: loads a model file and generates. Reports the
// process's resident memory before the work, its peak during it (reset through
// /proc/self/clear_refs once the modules are loaded, so only this work counts), and how much
// memory JavaScript took meanwhile: the V8 heap (the JS tokenizer, token strings) and
// ArrayBuffers, and the engine's growth measured apart from JavaScript's. Linux only.
//   node rss-probe.mjs DIST_DIR MODEL_FILE CONTEXT_SIZE NEW_TOKENS
import { readFileSync, realpathSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { getHeapStatistics } from "node:v8";

const [dist, file, contextSize, newTokens] = process.argv.slice(2);
const load = (path) => import(pathToFileURL(join(dist, "src", ...path.split("/"))).href);
const { Model } = await load("engine/model.js");

const status = (field) => Number(/(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8").split("\n").find((l) => l.startsWith(field)))[1]) * 1024;
// V8's heap, its own malloc'd memory (compiler zones, tables) and ArrayBuffers.
const jsBytes = () => process.memoryUsage().heapTotal + process.memoryUsage().arrayBuffers + getHeapStatistics().malloced_memory;
const jsBefore = jsBytes();
const before = status("VmRSS:");
writeFileSync("/proc/self/clear_refs", "5");
// The engine's own memory at one moment: the model file's resident pages, the addon's, and the
// anonymous memory (malloc, mmap) less what JavaScript holds of it (the V8 heap, ArrayBuffers),
// all read together, after the load and after the generation (the engine's memory only grows in
// a run: weights paged in, K/V cache and scratch made with the context; reading smaps at every
// token made garbage that blurred JavaScript's side). Pages of the node executable that running
// the JS tokenizer touches are not the engine's (~5 MB), and subtracting JavaScript's size at the
// end from the peak mixed two moments: a GC that shrank the heap after it charged the engine.
const mapped = realpathSync(file);
const engineOwned = (path) => path === "" || path === "[heap]" || path === mapped || path.endsWith(".node");
function engineBytes() {
  let kb = 0;
  let owned = false;
  for (const line of readFileSync("/proc/self/smaps", "utf8").split("\n")) {
    const head = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$/.exec(line);
    if (head) owned = engineOwned(head[1]);
    else if (owned && line.startsWith("Rss:")) kb += Number(/(\d+) kB/.exec(line)[1]);
  }
  return kb * 1024 - jsBytes();
}
const engineBefore = engineBytes();
let engineGrew = 0;
const sample = () => (engineGrew = Math.max(engineGrew, engineBytes() - engineBefore));
const model = await Model.load(file, { contextSize: Number(contextSize) });
sample();
const result = await model.generate("The quick brown fox", { maxNewTokens: Number(newTokens), sampling: { temperature: 0 }, stopOnEos: false });
sample();
const peak = status("VmHWM:");
const jsGrew = jsBytes() - jsBefore;
model.dispose();
process.stdout.write(JSON.stringify({ before, peak, jsGrew, engineGrew, generated: result.tokens.length }) + "\n");
