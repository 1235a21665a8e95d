// Issue #4's Q8_0 bar, on the trained test models (test/fixtures/trained): a Q8_0 GGUF converted
// from the HF folder, and the folder quantised at load time, each against the folder itself, over
// 256 positions of Python source neither model was trained on. Random-weight models are the wrong
// yardstick for this (their logits are near-ties everywhere; see gguf-logits.test.ts).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { convertHfToGguf } from "../src/models/convert.js";
import { fixtures, repoRoot, tempDir } from "./support/paths.js";

const POSITIONS = 256;

const argmax = (a: Float32Array) => {
  let b = 0;
  for (let i = 1; i < a.length; i++) if (a[i] > a[b]) b = i;
  return b;
};

/** Mean over positions of ‖got − ref‖₂ / ‖ref‖₂, and the share of positions with the same top-1 token. */
function compare(ref: Float32Array[], got: Float32Array[]): { meanRelErr: number; top1: number } {
  let rel = 0, same = 0;
  for (let p = 0; p < ref.length; p++) {
    let num = 0, den = 0;
    for (let i = 0; i < ref[p].length; i++) {
      num += (got[p][i] - ref[p][i]) ** 2;
      den += ref[p][i] ** 2;
    }
    rel += Math.sqrt(num / den);
    if (argmax(ref[p]) === argmax(got[p])) same++;
  }
  return { meanRelErr: rel / ref.length, top1: same / ref.length };
}

async function logitsOf(path: string, tokens: number[], quantize: "none" | "q8_0" = "none"): Promise<Float32Array[]> {
  const m = await Model.load(path, { contextSize: tokens.length, quantize });
  try {
    return await m.logits(tokens);
  } finally {
    m.dispose();
  }
}

describe.each(["llama", "qwen2"])("trained %s", (arch) => {
  const dir = join(fixtures, "trained", arch);
  let tokens: number[];
  let ref: Float32Array[];
  let topMargin: number;

  beforeAll(async () => {
    // Text from this repository, not from the training corpus (Python's standard library).
    const m = await Model.load(dir, { contextSize: 8 });
    tokens = m.tokenizer.encode(readFileSync(join(repoRoot, "bench", "gpu", "transformers_speed.py"), "utf8"), { addSpecialTokens: false }).slice(0, POSITIONS);
    m.dispose();
    ref = await logitsOf(dir, tokens);
    // How sure the model is: median gap between its two best logits.
    const gaps = ref.map((r) => {
      const s = [...r].sort((a, b) => b - a);
      return s[0] - s[1];
    });
    topMargin = gaps.sort((a, b) => a - b)[gaps.length >> 1];
  });

  test("the model has learnt something: it predicts the next token of unseen code 100× better than chance", () => {
    expect(tokens).toHaveLength(POSITIONS);
    let hits = 0;
    for (let p = 0; p + 1 < POSITIONS; p++) if (argmax(ref[p]) === tokens[p + 1]) hits++;
    console.log(`trained ${arch}: next-token top-1 accuracy on unseen code ${((100 * hits) / (POSITIONS - 1)).toFixed(1)}%, median top-1/top-2 logit gap ${topMargin.toFixed(2)}`);
    expect(hits / (POSITIONS - 1)).toBeGreaterThan(100 / 2048); // chance: 1 in the 2048-token vocabulary
  });

  test("Q8_0 GGUF and load-time Q8_0: mean relative logit error ≤ 2%, greedy top-1 agreement ≥ 95% over 256 positions", async () => {
    const file = join(tempDir(), "q8.gguf");
    await convertHfToGguf({ dir, out: file, type: "q8_0" });
    const gguf = compare(ref, await logitsOf(file, tokens));
    const loadTime = compare(ref, await logitsOf(dir, tokens, "q8_0"));
    console.log(
      `trained ${arch} Q8_0 vs F16 folder: GGUF ${(100 * gguf.meanRelErr).toFixed(2)}% / top-1 ${(100 * gguf.top1).toFixed(1)}%, ` +
        `load-time ${(100 * loadTime.meanRelErr).toFixed(2)}% / top-1 ${(100 * loadTime.top1).toFixed(1)}%`,
    );
    for (const r of [gguf, loadTime]) {
      expect(r.meanRelErr).toBeLessThanOrEqual(0.02);
      expect(r.top1).toBeGreaterThanOrEqual(0.95);
    }
  });

  test("F16 GGUF: logits equal the folder's within 1e-3", async () => {
    const file = join(tempDir(), "f16.gguf");
    await convertHfToGguf({ dir, out: file, type: "f16" });
    const got = await logitsOf(file, tokens.slice(0, 64));
    let worst = 0;
    got.forEach((row, p) => row.forEach((x, i) => (worst = Math.max(worst, Math.abs(x - ref[p][i])))));
    expect(worst).toBeLessThan(1e-3);
  });
});
