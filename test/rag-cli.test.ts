// `dki rag` and `dki chat --mode rag` as a user runs them (node bin/dki.js), on a generated model,
// the real memory store and a knowledge-base collection made with `dki kb ingest`.
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { Tokenizer } from "../src/tokenizer/tokenizer.js";
import { ctrlCTests, dki, dkiFails } from "./support/dki-bin.js";
import { tempDir } from "./support/paths.js";
import { writeTinyCrossEncoderFolder } from "./support/tiny-bert.js";

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
    expect(text.stderr).toMatch(/^\[memories: .* \| prompt \d+ tokens \(context \d+\) \| ttft \d+ ms, \d+ tokens \| session rag-\S+\]\n$/);
  });

  test("--decompose, --step-back, --step-model: the LLM steps in metadata.pipeline, the searches in the summary", async () => {
    const base = ["--model", model, "--data", data, "--user", "alice", "--max-tokens", "2", "--threads", "1", "--no-memory", "--collection", "hb"];
    const r = JSON.parse((await dki(["rag", ...base, "--decompose", "2", "--step-back", "--step-model", model, "--step-timeout", "60000", "--query", "How many vacation days and parking spaces?", "--format", "json"])).stdout);
    expect(r.metadata.pipeline.steps.map((s: { step: string }) => s.step)[0]).toBe("decompose");
    for (const s of r.metadata.pipeline.steps) expect(Object.keys(s)).toEqual(expect.arrayContaining(["step", "prompt", "raw", "parsed", "fell_back", "constrained", "ms"]));
    expect(r.metadata.pipeline.hops.length).toBeGreaterThanOrEqual(1);
    const rr = JSON.parse((await dki(["rag", ...base, "--rerank", "lexical", "--rerank-depth", "4", "--top-k", "1", "--prompt-mode", "precise", "--layout", "seed", "--query", "How many vacation days?", "--format", "json"])).stdout);
    expect(rr.metadata.pipeline.rerank.method).toBe("lexical");
    expect(rr.sources[0].chunk_id).toBe(rr.metadata.pipeline.rerank.after[0]);
    expect(rr.prompt_info.final_prompt).toMatch(/^System: .*Answer only with facts stated/s);
    const sr = JSON.parse((await dki(["rag", ...base, "--self-rag", "--query", "How many vacation days?", "--format", "json"])).stdout);
    expect(sr.metadata.pipeline.self_rag.config.max_rounds).toBe(3);
    const ad = JSON.parse((await dki(["rag", ...base, "--adaptive", "--query", "How many vacation days?", "--format", "json"])).stdout);
    expect(ad.metadata.pipeline.adaptive.query_class).toMatch(/^(no_retrieval|simple|multi_hop)$/);
    const cq = JSON.parse((await dki(["rag", ...base, "--citations", "markdown", "--empty-retrieval", "answer", "--truncate-first-context", "--query", "How many vacation days?", "--format", "json"])).stdout);
    expect(typeof cq.metadata.citation_quality.formatted).toBe("string");
    expect(Array.isArray(cq.metadata.citation_quality.unsupported)).toBe(true);
    const none = await dki(["rag", ...base, "--empty-retrieval", "answer", "--filter", '{"eq":{"category":"nothing"}}', "--query", "How many vacation days?"]);
    expect(none.stdout).toBe("I found no relevant information to answer this question.\n");
    const text = await dki(["rag", ...base, "--step-back", "--query", "How many vacation days?"]);
    expect(text.stderr).toMatch(/\| searched: "How many vacation days\?"/);
  });

  test("--rerank cross-encoder --rerank-model DIR: the collection's results reranked by the cross-encoder folder; the two flags go together", async () => {
    const xenc = writeTinyCrossEncoderFolder(join(tempDir(), "xenc"), 21);
    const base = ["--model", model, "--data", data, "--user", "alice", "--max-tokens", "2", "--threads", "1", "--no-memory", "--collection", "hb"];
    const r = JSON.parse((await dki(["rag", ...base, "--rerank", "cross-encoder", "--rerank-model", xenc, "--top-k", "1", "--query", "How many vacation days and garage spaces?", "--format", "json"])).stdout);
    const rr = r.metadata.pipeline.rerank;
    expect(rr.method).toBe("cross-encoder");
    expect(rr.before.length).toBeGreaterThan(1); // both sections match: there is an order to make
    for (const id of rr.after) expect(rr.scores[id] > 0 && rr.scores[id] < 1).toBe(true);
    expect(r.sources[0].chunk_id).toBe(rr.after[0]);
    expect(await dkiFails(["rag", ...base, "--rerank-model", xenc, "--query", "q"])).toMatch(/--rerank-model needs --rerank cross-encoder/);
    expect(await dkiFails(["rag", ...base, "--rerank", "lexical", "--rerank-model", xenc, "--query", "q"])).toMatch(/--rerank-model needs --rerank cross-encoder/);
    expect(await dkiFails(["rag", ...base, "--rerank", "cross-encoder", "--query", "q"])).toMatch(/--rerank cross-encoder needs --rerank-model DIR/);
    expect(await dkiFails(["rag", ...base, "--rerank", "cross-encoder", "--rerank-model", join(xenc, "nowhere"), "--query", "q"])).toMatch(/OnnxCrossEncoder\.load: .*nowhere is not a folder/);
  });

  test("bad flags are refused by name", async () => {
    const base = ["--model", model, "--data", data, "--user", "alice"];
    expect(await dkiFails(["rag", ...base, "--kb-mode", "kv", "--query", "q"])).toMatch(/--kb-mode needs --collection/);
    expect(await dkiFails(["rag", ...base, "--collection", "nope", "--query", "q"])).toMatch(/no collection "nope"; collections: hb/);
    expect(await dkiFails(["rag", ...base, "--collection", "hb", "--filter", '{"eq":{"colour":"x"}}', "--query", "q"])).toMatch(/unknown field "colour"/);
    expect(await dkiFails(["rag", ...base, "--format", "json"])).toMatch(/--format json prints one answer/);
    expect(await dkiFails(["chat", "--mode", "rag", "--alpha", "0.5", ...base, "--query", "q"])).toMatch(/--alpha applies to --mode dki only/);
    expect(await dkiFails(["rag", ...base, "--kb-mode", "html", "--query", "q"])).toMatch(/--kb-mode/);
    expect(await dkiFails(["rag", ...base, "--decompose", "2", "--query", "q"])).toMatch(/--decompose needs --collection/);
    expect(await dkiFails(["rag", ...base, "--collection", "hb", "--rerank", "cross", "--query", "q"])).toMatch(/--rerank/);
    expect(await dkiFails(["rag", ...base, "--collection", "hb", "--rerank-depth", "5", "--query", "q"])).toMatch(/--rerank-depth needs --rerank/);
    expect(await dkiFails(["rag", ...base, "--prompt-mode", "loud", "--query", "q"])).toMatch(/--prompt-mode/);
    expect(await dkiFails(["rag", ...base, "--self-rag", "--query", "q"])).toMatch(/--self-rag needs --collection/);
    expect(await dkiFails(["rag", ...base, "--adaptive", "--query", "q"])).toMatch(/--adaptive needs --collection/);
    expect(await dkiFails(["rag", ...base, "--empty-retrieval", "answer", "--query", "q"])).toMatch(/--empty-retrieval needs --collection/);
    expect(await dkiFails(["rag", ...base, "--citations", "latex", "--query", "q"])).toMatch(/--citations must be one of markdown, html, plain, inline/);
    expect(await dkiFails(["rag", ...base, "--collection", "hb", "--decompose", "9", "--query", "q"])).toMatch(/--decompose must be an integer in \[2, 5\], got "9"/);
    expect(await dkiFails(["rag", ...base, "--collection", "hb", "--no-iterative", "--query", "q"])).toMatch(/--no-iterative needs --decompose/);
    expect(await dkiFails(["rag", ...base, "--collection", "hb", "--step-back", "--step-model", join(model, "config.json"), "--query", "q"])).toMatch(/--step-model must be a model folder or a \.gguf file/);
  });
});

describe("dki rag: limits, relevance, a missing knowledge base, Ctrl-C", () => {
  test("--memory-max-tokens leaves memories out as dki chat does, said in JSON and text; memories show their cosine relevance and a snippet", async () => {
    const base = ["rag", "--model", model, "--data", data, "--user", "alice", "--max-tokens", "2", "--threads", "1", "--query", "Tips for hiking with a peanut allergy?"];
    const all = JSON.parse((await dki([...base, "--format", "json"])).stdout);
    expect(all.memories_used).toHaveLength(2);
    // The reference cosine: the hashing embedder's unit vectors of query and memory, computed here.
    const embedder = new HashingEmbedder();
    const [q] = await embedder.embed(["Tips for hiking with a peanut allergy?"]);
    for (const m of all.memories_used as { text: string; relevance: number }[]) {
      const [v] = await embedder.embed([m.text]);
      expect(Math.abs(m.relevance - q.reduce((s, x, i) => s + x * v[i], 0))).toBeLessThan(1e-4);
    }
    // A budget that fits the first routed memory and not the second.
    const tok = await Tokenizer.fromFolder(model);
    const n = (t: string) => tok.encode(t, { addSpecialTokens: false }).length;
    const [first, second] = all.memories_used as { id: string; text: string }[];
    const budget = n(first.text) + n(second.text) - 1;
    const cut = JSON.parse((await dki([...base, "--format", "json", "--memory-max-tokens", String(budget)])).stdout);
    expect(cut.memories_used.map((m: { id: string }) => m.id)).toEqual([first.id]);
    const reason = `its ${n(second.text)} tokens exceed the ${budget - n(first.text)} left of memoryMaxTokens (${budget})`;
    expect(cut.metadata.memories_left_out).toEqual([{ id: second.id, reason }]);
    const text = await dki([...base, "--memory-max-tokens", String(budget)]);
    expect(text.stderr).toMatch(new RegExp(`^\\[memories: ${first.id} \\(relevance \\d\\.\\d\\d\\) "${first.text.replace(/\./g, "\\.")}" \\| left out: ${second.id} \\(${reason.replace(/[()]/g, "\\$&")}\\) \\| prompt`));
    expect(text.stderr).toMatch(/ \| session rag-\S+\]\n/);
    const none = JSON.parse((await dki([...base, "--format", "json", "--max-memories", "0", "--device", "cpu"])).stdout);
    expect(none.memories_used).toEqual([]);
  });

  test("--collection with no knowledge base beside the store is refused, and none is created", async () => {
    const other = join(tempDir(), "store");
    await dki(["memory", "add", "x", "--data", other, "--user", "alice"]);
    expect(await dkiFails(["rag", "--model", model, "--data", other, "--user", "alice", "--collection", "hb", "--query", "q"])).toBe(`dki: --data ${other}: no knowledge base there (${other}.kb); check the path (dki kb ingest creates one)\n`);
    expect(existsSync(`${other}.kb`)).toBe(false);
  });

  const endless = () => ["rag", "--model", model, "--data", data, "--user", "alice", "--query", "Tell me about hiking in the Alps.", "-n", "100000", "--context-size", "16384"];

  ctrlCTests("rag", endless);
});
