// Run as a child process by test/gguf-memory.test.ts and bench/memory.js: loads a model file and generates. Reports the
// process's resident memory before the work, its peak during it (reset through
// /proc/self/clear_refs once the modules are loaded, so only this work counts), and how much
// memory JavaScript took meanwhile: the V8 heap (the JS tokenizer, token strings) and
// ArrayBuffers. Linux only.
//   node rss-probe.mjs DIST_DIR MODEL_FILE CONTEXT_SIZE NEW_TOKENS
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [dist, file, contextSize, newTokens] = process.argv.slice(2);
const load = (path) => import(pathToFileURL(join(dist, "src", ...path.split("/"))).href);
const { Model } = await load("engine/model.js");

const status = (field) => Number(/(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8").split("\n").find((l) => l.startsWith(field)))[1]) * 1024;
const jsBytes = () => process.memoryUsage().heapTotal + process.memoryUsage().arrayBuffers;
const jsBefore = jsBytes();
const before = status("VmRSS:");
writeFileSync("/proc/self/clear_refs", "5");
const model = await Model.load(file, { contextSize: Number(contextSize) });
const result = await model.generate("The quick brown fox", { maxNewTokens: Number(newTokens), sampling: { temperature: 0 }, stopOnEos: false });
const peak = status("VmHWM:");
const jsGrew = jsBytes() - jsBefore;
model.dispose();
process.stdout.write(JSON.stringify({ before, peak, jsGrew, generated: result.tokens.length }) + "\n");
