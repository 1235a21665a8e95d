// The memory-QA models trained here (models/memory-qa-*, models/memory-qa/train.py):
//  - the engine computes what training computed: the block-aware model's logits for a turn with
//    memories injected as separate blocks behind [BOS] at negative positions (as DKISystem injects
//    them) equal PyTorch's with train.py's mask and position ids (golden-block-aware.json, written by
//    models/memory-qa/golden.py from the committed weights), within 1e-3;
//  - the project's prompt code still renders the prompts the models were trained on;
//  - greedy answers through the engine equal PyTorch's, right or wrong as PyTorch's were (the
//    accuracy is `dki eval memory`'s to measure);
//  - the folders load and stay small.
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Model, type Segment } from "../src/engine/model.js";
import { renderPrompt, detectLanguage } from "../src/dki/prompt.js";
import { buildRagPrompt } from "../src/rag/prompt-builder.js";
import { ANSWER_INSTRUCTION } from "../src/eval/instruction.js";
import { fullContextQuery } from "../src/eval/full-context.js";
import { maxAbsDiff, repoRoot } from "./support/paths.js";

// A retrained pair is checked before it replaces the committed one: DKI_MEMORY_QA_MODELS names the
// folder holding it, DKI_MEMORY_QA_GOLDEN golden.py's file for it (--models, --out).
const models = process.env.DKI_MEMORY_QA_MODELS ?? join(repoRoot, "models");
const goldenFile = process.env.DKI_MEMORY_QA_GOLDEN ?? join(repoRoot, "models", "memory-qa", "golden-block-aware.json");
const folders = ["memory-qa-plain", "memory-qa-block-aware"] as const;

interface ExactCase {
  mode: "dki" | "none";
  prefix: number[];
  blocks: number[][];
  tokens: number[];
  probe_ids: number[];
  probe_logits: number[][];
  last_logits: number[][];
}
interface AnswerCase {
  model: (typeof folders)[number];
  mode: "dki" | "rag" | "full";
  question: string;
  memories: string[] | null;
  conversation: string | null;
  expected: string;
  prompt: number[];
  blocks: number[][] | null;
  prefix: number[] | null;
  pytorch_answer: number[];
  pytorch_correct: boolean;
}
const golden = JSON.parse(readFileSync(goldenFile, "utf8")) as { exactness: ExactCase[]; answers: AnswerCase[] };

const loaded = new Map<string, Model>();
beforeAll(async () => {
  for (const f of folders) loaded.set(f, await Model.load(join(models, f), { contextSize: 2048 }));
});
afterAll(() => {
  for (const m of loaded.values()) m.dispose();
});
const model = (f: string) => loaded.get(f)!;

/** The blocks as DKISystem makes them: each computed behind the prefix at the canonical start (the prefix's length). */
async function blocksOf(m: Model, blocks: number[][], prefix: number[]): Promise<Segment[]> {
  return Promise.all(blocks.map(async (b) => ({ kv: await m.computeBlock(b, { prefix, startPos: prefix.length }), alpha: 1 })));
}

describe("the committed models", () => {
  it("load as HF folders with a chat template ending the answer at EOS, under 40 MB in all", () => {
    let bytes = 0;
    for (const f of folders) {
      for (const name of readdirSync(join(models, f))) bytes += statSync(join(models, f, name)).size;
      const m = model(f);
      expect(m.config.vocabSize).toBe(4096);
      expect(m.tokenizer.chatTemplate).not.toBeNull();
      const eot = m.tokenizer.encode("<|im_end|>", { addSpecialTokens: false });
      expect(eot).toHaveLength(1);
      expect(m.tokenizer.eosIds).toContain(eot[0]);
      expect(m.tokenizer.bosId).not.toBeNull();
    }
    // The reranker trained beside them (models/memory-qa-reranker) counts too.
    const reranker = join(repoRoot, "models", "memory-qa-reranker");
    for (const name of readdirSync(reranker)) bytes += statSync(join(reranker, name)).size;
    expect(bytes).toBeLessThan(40 * 2 ** 20);
  });

  it("the block-aware model's engine logits with memories injected as separate blocks equal PyTorch's training forward (max abs diff <= 1e-3)", async () => {
    const m = model("memory-qa-block-aware");
    expect(golden.exactness.filter((c) => c.blocks.length >= 3).length).toBeGreaterThanOrEqual(2);
    for (const c of golden.exactness) {
      const segments = await blocksOf(m, c.blocks, c.prefix);
      const logits = await m.logits(c.tokens, { segments, positions: "negative" });
      expect(logits).toHaveLength(c.tokens.length);
      let worst = 0;
      logits.forEach((row, i) => {
        worst = Math.max(worst, maxAbsDiff(c.probe_ids.map((id) => row[id]!), c.probe_logits[i]!));
      });
      c.last_logits.forEach((ref, j) => {
        worst = Math.max(worst, maxAbsDiff(logits[c.tokens.length - c.last_logits.length + j]!, ref));
      });
      expect(worst, `${c.mode} with ${c.blocks.length} blocks`).toBeLessThanOrEqual(1e-3);
      for (const s of segments) s.kv.dispose();
    }
  });

  it("the project's prompt code renders the prompts the models were trained on", async () => {
    for (const a of golden.answers) {
      const tok = model(a.model).tokenizer;
      const query = a.mode === "full" ? fullContextQuery(a.conversation!, a.question) : a.question;
      if (a.mode === "rag") {
        const built = buildRagPrompt(tok, { query, systemPrompt: ANSWER_INSTRUCTION, contexts: a.memories! }, { maxContext: 2048, layout: "chat" });
        expect(built.tokens, a.question).toEqual(a.prompt);
      } else {
        const p = await renderPrompt(tok, { query, systemPrompt: ANSWER_INSTRUCTION, language: detectLanguage(a.question) }, true);
        expect(p.tokens, a.question).toEqual(a.prompt);
      }
      if (a.mode === "dki") {
        expect(a.memories!.map((t) => tok.encode(t, { addSpecialTokens: false }))).toEqual(a.blocks);
        expect(a.prefix).toEqual([tok.bosId]);
      }
    }
  });

  it("answer held-out questions through the engine (greedy) exactly as PyTorch does", async () => {
    for (const a of golden.answers) {
      const m = model(a.model);
      const segments = a.blocks ? await blocksOf(m, a.blocks, a.prefix!) : [];
      const out = await m.generate({ tokens: a.prompt }, { maxNewTokens: 16, segments, positions: "negative" });
      for (const s of segments) s.kv.dispose();
      expect(out.tokens.filter((t) => !m.tokenizer.eosIds.includes(t)), `${a.model} ${a.mode}: ${a.question}`).toEqual(a.pytorch_answer);
      // Right or wrong as PyTorch said (the models' accuracy is measured by `dki eval memory`, not here).
      expect(out.text.trim() === a.expected, `${a.model} ${a.mode}: ${a.question} → ${out.text}`).toBe(a.pytorch_correct);
    }
  });
});
