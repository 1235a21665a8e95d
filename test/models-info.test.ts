// `modelInfo` on generated folders: shapes, dtypes, and a parameter count that matches the
// architecture's formula.
import { describe, expect, test } from "vitest";
import { formatModelInfo, modelInfo } from "../src/models/info.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { hfLlamaTiny, tempDir } from "./support/paths.js";

/** Parameters of a Llama/Qwen2 decoder, written out from the architecture. */
function llamaParams(c: { vocab: number; hidden: number; inter: number; layers: number; heads: number; kv: number; hd: number; tied: boolean; bias: boolean }): number {
  const q = c.heads * c.hd;
  const kv = c.kv * c.hd;
  const attn = c.hidden * q + 2 * c.hidden * kv + q * c.hidden + (c.bias ? q + 2 * kv : 0);
  const mlp = 3 * c.hidden * c.inter;
  return c.vocab * c.hidden * (c.tied ? 1 : 2) + c.layers * (attn + mlp + 2 * c.hidden) + c.hidden;
}

describe("modelInfo", () => {
  test("reports shapes, dtype and parameter count of a tiny llama", async () => {
    const dir = tempDir();
    const made = await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "bf16", out: dir });
    const info = await modelInfo(dir);
    const expected = llamaParams({ vocab: 49152, hidden: 64, inter: 172, layers: 2, heads: 4, kv: 2, hd: 16, tied: false, bias: false });
    expect(info.parameterCount).toBe(expected);
    expect(made.paramCount).toBe(expected);
    expect(info).toMatchObject({
      arch: "llama",
      architectures: ["LlamaForCausalLM"],
      shapes: { layers: 2, hidden: 64, heads: 4, kvHeads: 2, headDim: 16, intermediate: 172, vocab: 49152 },
      dtypes: ["BF16"],
      tied: false,
      bias: false,
      ropeTheta: 10000,
      ropeScaling: null,
      bytes: made.bytes,
      hasTokenizer: true,
    });
    expect(info.files.map((f) => f.name)).toEqual(["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]);
    const text = formatModelInfo(info);
    expect(text).toContain(`(${expected.toLocaleString("en-US")})`);
    expect(text).toContain("4 heads, 2 KV heads (GQA 2), head_dim 16, no biases");
  });

  test("counts biases and tied embeddings of a sharded qwen2 variant", async () => {
    const dir = tempDir();
    await makeTinyModel({ arch: "qwen2", preset: "tiny", dtype: "f16", out: dir, shards: 2, tieEmbeddings: true, overrides: { numHeads: 6, numKvHeads: 2, numLayers: 3 } });
    const info = await modelInfo(dir);
    expect(info.parameterCount).toBe(llamaParams({ vocab: 49152, hidden: 64, inter: 172, layers: 3, heads: 6, kv: 2, hd: 16, tied: true, bias: true }));
    expect(info).toMatchObject({ arch: "qwen2", tied: true, bias: true, dtypes: ["F16"], ropeTheta: 1000000 });
    expect(info.files.filter((f) => f.name.endsWith(".safetensors"))).toHaveLength(2);
    expect(info.bytes).toBe(info.files.filter((f) => f.name.endsWith(".safetensors")).reduce((a, f) => a + f.bytes, 0));
  });

  test("reads a folder saved by transformers", async () => {
    const info = await modelInfo(hfLlamaTiny);
    expect(info.shapes).toEqual({ layers: 3, hidden: 128, heads: 4, kvHeads: 2, headDim: 32, intermediate: info.shapes.intermediate, vocab: 512 });
    expect(info.dtypes).toEqual(["F32"]);
  });

  test("a folder without a model is a clear error", async () => {
    await expect(modelInfo(tempDir())).rejects.toThrow(/config\.json: cannot read/);
  });
});
