// --embedder on every command that opens a memory store or a knowledge base: data embedded by an
// ONNX model (a generated BERT, test/support/tiny-bert.ts) is refused without it, naming both
// embedders, and served with it by `dki memory`, `dki chat`, `dki kb` and `dki rag`.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, expect, test } from "vitest";
import { dki, dkiFails } from "./support/dki-bin.js";
import { tempDir } from "./support/paths.js";
import { writeTinyBertFolder } from "./support/tiny-bert.js";

let model: string;
let embedder: string;
let data: string;
let memId: string;

beforeAll(async () => {
  model = join(tempDir(), "tiny");
  await dki(["models", "make-tiny", "--arch", "llama", "--preset", "tiny", "--dtype", "f32", "--out", model]);
  embedder = writeTinyBertFolder(join(tempDir(), "bert"), 5);
  data = join(tempDir(), "data");
  memId = JSON.parse((await dki(["memory", "add", "The user loves hiking in the Alps.", "--data", data, "--user", "u", "--embedder", embedder, "--format", "json"])).stdout).id;
  const doc = join(tempDir(), "alps.md");
  writeFileSync(doc, "# Alps\n\nThe Haute Route runs from Chamonix to Zermatt in about twelve days.\n");
  await dki(["kb", "ingest", doc, "-c", "guides", "--data", data, "--embedder", embedder]);
});

test("dki memory and dki chat: refused without the store's embedder, naming both; answered with it", async () => {
  const ask = ["--model", model, "--data", data, "--user", "u", "--query", "Where should I go hiking?", "--alpha", "1", "--format", "json", "-n", "2", "--threads", "1"];
  const refused = await dkiFails(["chat", ...ask]);
  expect(refused).toMatch(/its vectors were made by embedder onnx:\S+ \(\d+ dimensions\), not hashing-v1-d512 \(512\).*--embedder DIR/);
  const r = JSON.parse((await dki(["chat", ...ask, "--embedder", embedder])).stdout);
  expect(r.memories_used.map((m: { id: string }) => m.id)).toEqual([memId]);
  expect(await dkiFails(["memory", "search", "hiking", "--data", data, "--user", "u"])).toMatch(/not hashing-v1-d512/);
  const found = JSON.parse((await dki(["memory", "search", "hiking", "--data", data, "--user", "u", "--embedder", embedder, "--format", "json"])).stdout);
  expect(found.results.map((m: { id: string }) => m.id)).toEqual([memId]);
});

test("dki kb and dki rag: a collection embedded by the ONNX model is searched only with it", async () => {
  expect(await dkiFails(["kb", "search", "Chamonix to Zermatt", "-c", "guides", "--data", data])).toMatch(/collection "guides" holds vectors of embedder onnx:\S+; this knowledge base was opened with hashing-v1-d512: .*--embedder DIR/);
  const hits = JSON.parse((await dki(["kb", "search", "Chamonix to Zermatt", "-c", "guides", "--data", data, "--embedder", embedder, "--format", "json"])).stdout);
  expect(JSON.stringify(hits)).toContain("Haute Route");
  const r = JSON.parse((await dki(["rag", "--model", model, "--data", data, "--user", "u", "--collection", "guides", "--query", "How long is the Haute Route?", "--embedder", embedder, "--format", "json", "-n", "2", "--threads", "1"])).stdout);
  expect(r.sources.some((s: { kind: string }) => s.kind === "chunk")).toBe(true);
  expect(r.memories_used.map((m: { id: string }) => m.id)).toEqual([memId]);
});
