// `dki rag` and `dki chat --mode rag` as a user runs them (node bin/dki.js), on a generated model,
// the real memory store and a knowledge-base collection made with `dki kb ingest`.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { dki, dkiFails } from "./support/dki-bin.js";
import { tempDir } from "./support/paths.js";

let model: string;
let data: string;
beforeAll(async () => {
  model = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: model, seed: 3 });
  data = join(tempDir(), "store");
  const store = await MemoryStore.open({ dir: data });
  await store.memories.add("Alice loves hiking in the Alps.", { userId: "alice" });
  await store.memories.add("Alice is allergic to peanuts.", { userId: "alice" });
  await store.close();
  const files = tempDir();
  writeFileSync(join(files, "handbook.md"), "# Leave\nEvery employee gets 25 days of paid vacation a year.\n# Parking\nThe garage has 120 spaces.\n");
  await dki(["kb", "ingest", join(files, "handbook.md"), "--collection", "hb", "--data", data]);
});

describe("dki rag", () => {
  test("--format json: the RAGResponse in snake_case with latency.ttft_ms, the turn recorded", async () => {
    const base = ["--model", model, "--data", data, "--user", "alice", "--max-tokens", "3", "--threads", "1"];
    const r = JSON.parse((await dki(["rag", ...base, "--query", "Tips for hiking with a peanut allergy?", "--format", "json", "--layout", "seed"])).stdout);
    expect(r.memories_used.map((m: { text: string }) => m.text).sort()).toEqual(["Alice is allergic to peanuts.", "Alice loves hiking in the Alps."]);
    expect(r.latency.ttft_ms).toBeGreaterThan(0);
    expect(r.prompt_info.final_prompt).toMatch(/^Relevant information:\n\[1\] Alice/);
    expect(r.prompt_info.original_query).toBe("Tips for hiking with a peanut allergy?");
    expect(r.input_tokens).toBeGreaterThan(0);
    expect(r.output_tokens).toBeGreaterThan(0);
    // With the collection, as text (numbered with sources) and as K/V.
    const kb = JSON.parse((await dki(["rag", ...base, "--no-memory", "--collection", "hb", "--top-k", "1", "--query", "How many vacation days?", "--format", "json", "--layout", "seed"])).stdout);
    expect(kb.prompt_info.retrieved_context).toMatch(/^Relevant information:\n\[1\] \(source: .*handbook\.md › Leave\) # Leave/);
    expect(kb.sources[0]).toMatchObject({ kind: "chunk", heading_path: ["Leave"], collection: "hb" });
    const kv = JSON.parse((await dki(["rag", ...base, "--no-memory", "--collection", "hb", "--top-k", "1", "--kb-mode", "kv", "--query", "How many vacation days?", "--format", "json"])).stdout);
    expect(kv.metadata.injected_tokens).toBeGreaterThan(0);
    expect(kv.metadata.context_tokens).toBe(0);
    // Text mode: the answer streams to stdout, the summary goes to stderr.
    const text = await dki(["chat", "--mode", "rag", ...base, "--query", "Where do I like hiking?"]);
    expect(text.stderr).toMatch(/^\[memories: .* \| prompt \d+ tokens \(context \d+\) \| ttft \d+ ms, \d+ tokens\]/);
  });

  test("bad flags are refused by name", async () => {
    const base = ["--model", model, "--data", data, "--user", "alice"];
    expect(await dkiFails(["rag", ...base, "--kb-mode", "kv", "--query", "q"])).toMatch(/--kb-mode needs --collection/);
    expect(await dkiFails(["rag", ...base, "--collection", "nope", "--query", "q"])).toMatch(/no collection "nope"; collections: hb/);
    expect(await dkiFails(["rag", ...base, "--collection", "hb", "--filter", '{"eq":{"colour":"x"}}', "--query", "q"])).toMatch(/unknown field "colour"/);
    expect(await dkiFails(["rag", ...base, "--format", "json"])).toMatch(/--format json prints one answer/);
    expect(await dkiFails(["chat", "--mode", "rag", "--alpha", "0.5", ...base, "--query", "q"])).toMatch(/--alpha applies to --mode dki only/);
    expect(await dkiFails(["rag", ...base, "--kb-mode", "html", "--query", "q"])).toMatch(/--kb-mode/);
  });
});
