// Child process of native-safety.test.ts: the addon loaded by worker threads as well as the main
// thread (as an app's worker pool would). Prints one JSON line. Usage:
//   node addon-in-workers.mjs <dist folder> <model folder>
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { Worker } from "node:worker_threads";

const [dist, modelDir] = process.argv.slice(2);
const { native } = await import(pathToFileURL(join(dist, "src/engine/native.js")).href);
const { Model } = await import(pathToFileURL(join(dist, "src/engine/model.js")).href);
const nativeUrl = pathToFileURL(join(dist, "src/engine/native.js")).href;
const out = {};

// A worker that loads the addon and exits, one that stays, and one terminated mid-eval.
const worker = (body) => new Worker(`import(${JSON.stringify(nativeUrl)}).then(async ({ native }) => { ${body} });`, { eval: true });
const exited = worker(`native(); require("node:worker_threads").parentPort.postMessage("loaded");`);
await new Promise((r) => exited.on("exit", r));
const staying = worker(`native(); require("node:worker_threads").parentPort.postMessage("loaded");`);
await new Promise((r) => staying.once("message", r));
const busy = worker(`
  const { Model } = await import(${JSON.stringify(pathToFileURL(join(dist, "src/engine/model.js")).href)});
  const m = await Model.load(${JSON.stringify(modelDir)}, { contextSize: 4096 });
  const ctx = m.createContext(4096);
  void ctx.eval(Int32Array.from({ length: 4000 }, (_, i) => i % 1000), 0).catch(() => {});
  require("node:worker_threads").parentPort.postMessage("evaluating");`);
await new Promise((r) => busy.once("message", r));
await new Promise((r) => setTimeout(r, 50));
await busy.terminate();

// The main thread's classes are still its own.
const m = await Model.load(modelDir, { contextSize: 16 });
const ctx = m.createContext(16);
await ctx.eval(Int32Array.of(1, 2, 3), 0);
out.exported = ctx.exportBlock(0, 3).info().nTokens;
out.logits = (await m.logits([1, 2, 3])).length;
out.threads = native().getThreads();
await staying.terminate();
console.log(JSON.stringify(out));
