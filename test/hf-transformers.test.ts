// The engine against Hugging Face transformers on folders transformers itself saved
// (test/fixtures/hf/make_fixtures.py): an F32 Llama with GQA, an F32 Qwen2 with biases and tied
// embeddings, and a Llama 3 (rope_scaling llama3) in BF16 split over three safetensors shards.
// Loaded through the public Model API, as a user would, on every SIMD path this CPU runs.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { LogitsMode, native } from "../src/engine/native.js";
import { fixtures, maxAbsDiff } from "./support/paths.js";

interface Refs {
  prompt_ids: number[];
  logits: number[][];
  greedy: number[];
  greedy_logits: number[][];
  min_greedy_margin: number;
}

const TOL = 1e-3;
const NAMES = ["llama-f32", "qwen2-f32", "llama3-bf16-sharded"];

afterAll(() => native().setSimd("auto"));

describe.each(NAMES)("transformers reference: %s", (name) => {
  const dir = join(fixtures, "hf", name);
  const refs = JSON.parse(readFileSync(join(dir, "refs.json"), "utf8")) as Refs;
  let model: Model;

  beforeAll(async () => {
    model = await Model.load(dir, { contextSize: 128 });
  });
  afterAll(() => model.dispose());

  // Every top-1/top-2 gap on the reference's path is over twice the logit tolerance, so logits
  // within tolerance cannot pick another token: token equality is then a fair bar.
  test("the reference's greedy path wanders and has no near-ties", () => {
    expect(refs.greedy).toHaveLength(32);
    expect(new Set(refs.greedy).size).toBeGreaterThan(8);
    expect(refs.min_greedy_margin).toBeGreaterThan(2 * TOL);
  });

  describe.each(native().simd().available)("%s kernels", (simd) => {
    beforeAll(() => native().setSimd(simd));

    test(`prompt logits within ${TOL}`, async () => {
      const rows = await model.logits(refs.prompt_ids);
      expect(rows).toHaveLength(refs.logits.length);
      const worst = Math.max(...refs.logits.map((row, i) => maxAbsDiff(row, rows[i])));
      expect(worst).toBeLessThan(TOL);
    });

    test("32 greedy tokens identical, and each decode step's logits within tolerance", async () => {
      const result = await model.generate({ tokens: refs.prompt_ids }, { maxNewTokens: 32, stopOnEos: false });
      expect(result.tokens).toEqual(refs.greedy);

      // The same path one token at a time through the engine's K/V cache.
      const ctx = model.createContext(128);
      try {
        let logits = (await ctx.eval(Int32Array.from(refs.prompt_ids), LogitsMode.Last))!;
        let worst = 0;
        for (let i = 0; i < refs.greedy.length; i++) {
          worst = Math.max(worst, maxAbsDiff(refs.greedy_logits[i], logits));
          logits = (await ctx.eval(Int32Array.of(refs.greedy[i]), LogitsMode.Last))!;
        }
        expect(worst).toBeLessThan(TOL);
      } finally {
        ctx.dispose();
      }
    });
  });
});
