// HF folder → GGUF conversion: llama.cpp's metadata, q/k row permutation, Q8_0 quantisation
// and F16 rounding, Llama 3 rope_freqs, the `dki models convert` / `info` commands.
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { GgmlType, GgufMeta, readGguf, writeGguf, type GgufFile } from "../src/formats/gguf.js";
import { readGgufModel } from "../src/formats/gguf-model.js";
import { readHfFolder } from "../src/formats/hf-folder.js";
import { convertHfToGguf, quantizeQ8_0 } from "../src/models/convert.js";
import { f32ToF16Bits } from "../src/models/half.js";
import { dki } from "./support/models-cli.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { hfLlamaTiny, tempDir } from "./support/paths.js";

/** Rows of a 2-D (or 1-D: rows of one) float32 tensor from a file. */
function f32Rows(file: string, offset: number, rows: number, cols: number): Float32Array[] {
  const buf = readFileSync(file);
  const all = new Float32Array(buf.buffer.slice(buf.byteOffset + offset, buf.byteOffset + offset + rows * cols * 4));
  return Array.from({ length: rows }, (_, r) => all.subarray(r * cols, (r + 1) * cols));
}

/**
 * numpy's `w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)`
 * (llama.cpp's LlamaModel.permute), computed with explicit strides: output element
 * [h, j, s, c] is input element [h, s, j, c].
 */
function llamaCppPermute(w: Float32Array[], nHead: number): Float32Array[] {
  const rows = w.length;
  const half = rows / nHead / 2;
  const out: Float32Array[] = new Array(rows);
  for (let h = 0; h < nHead; h++)
    for (let j = 0; j < half; j++)
      for (let s = 0; s < 2; s++) out[h * 2 * half + j * 2 + s] = w[h * 2 * half + s * half + j];
  return out;
}

function unpermute(g: Float32Array[], nHead: number): Float32Array[] {
  const rows = g.length;
  const half = rows / nHead / 2;
  const out: Float32Array[] = new Array(rows);
  for (let h = 0; h < nHead; h++)
    for (let j = 0; j < half; j++)
      for (let s = 0; s < 2; s++) out[h * 2 * half + s * half + j] = g[h * 2 * half + j * 2 + s];
  return out;
}

describe("llama q/k permutation", () => {
  const dir = tempDir();
  let hfDir: string;
  let file: string;
  let g: GgufFile;

  beforeAll(async () => {
    hfDir = join(dir, "hf");
    await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: hfDir, seed: 3, overrides: { attentionBias: true } });
    file = join(dir, "f32.gguf");
    await convertHfToGguf({ dir: hfDir, out: file, type: "f32" });
    g = await readGguf(file);
  });

  test.each([
    ["q", "attn_q", "q_proj", 4],
    ["k", "attn_k", "k_proj", 2],
  ])("%s rows are llama.cpp's permutation of the HF rows, and un-permuting them gives the HF rows exactly", async (_, gg, hfName, nHead) => {
    const hf = await readHfFolder(hfDir);
    for (const layer of [0, 1]) {
      for (const kind of ["weight", "bias"]) {
        const h = hf.tensors.find((t) => t.name === `model.layers.${layer}.self_attn.${hfName}.${kind}`)!;
        const t = g.tensors.find((t) => t.name === `blk.${layer}.${gg}.${kind}`)!;
        expect(t.type).toBe(GgmlType.F32);
        const rows = h.shape[0];
        const cols = h.shape[1] ?? 1;
        expect(t.dims).toEqual(kind === "weight" ? [cols, rows] : [rows]);
        const hfRows = f32Rows(h.file, h.offset, rows, cols);
        const ggRows = f32Rows(file, t.offset, rows, cols);
        expect(ggRows).toEqual(llamaCppPermute(hfRows, nHead));
        expect(unpermute(ggRows, nHead)).toEqual(hfRows);
        expect(ggRows).not.toEqual(hfRows);
      }
    }
  });

  test("other tensors are copied unchanged, transposed dims only", async () => {
    const hf = await readHfFolder(hfDir);
    for (const [hfName, ggName] of [["model.layers.1.self_attn.v_proj.weight", "blk.1.attn_v.weight"], ["model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight"], ["lm_head.weight", "output.weight"], ["model.norm.weight", "output_norm.weight"]]) {
      const h = hf.tensors.find((t) => t.name === hfName)!;
      const t = g.tensors.find((t) => t.name === ggName)!;
      expect(t.dims).toEqual([...h.shape].reverse());
      expect(readFileSync(file).subarray(t.offset, t.offset + t.nbytes).equals(readFileSync(h.file).subarray(h.offset, h.offset + h.nbytes)), hfName).toBe(true);
    }
  });

  test("qwen2 rows are not permuted", async () => {
    const q = join(dir, "qwen");
    await makeTinyModel({ arch: "qwen2", preset: "tiny", dtype: "f32", out: q, seed: 3 });
    const qf = join(dir, "qwen.gguf");
    await convertHfToGguf({ dir: q, out: qf, type: "f32" });
    const m = await readGgufModel(qf);
    expect(m.config.ropeInterleaved).toBe(false);
    const hf = await readHfFolder(q);
    for (const name of ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.k_proj.bias"]) {
      const h = hf.tensors.find((t) => t.name === name)!;
      const t = m.tensors.find((t) => t.name === name)!;
      expect(readFileSync(qf).subarray(t.offset, t.offset + t.nbytes).equals(readFileSync(h.file).subarray(h.offset, h.offset + h.nbytes)), name).toBe(true);
    }
  });
});

describe("weight types", () => {
  test("quantize_row_q8_0_ref: d = amax/127 as fp16, q rounded half away from zero", () => {
    const x = new Float32Array(64);
    x[0] = 127;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 0.5;
    x[4] = -0.5;
    x[5] = -127;
    x[6] = 1.4999;
    // second block: all zero → d = 0, q = 0
    const out = new Uint8Array(68);
    quantizeQ8_0(x, out);
    expect(out[0] | (out[1] << 8)).toBe(f32ToF16Bits(1));
    expect(Array.from(out.subarray(2, 9), (b) => (b << 24) >> 24)).toEqual([127, 3, -3, 1, -1, -127, 1]);
    expect(Array.from(out.subarray(34))).toEqual(new Array(34).fill(0));
    // a scale that is not exactly representable in fp16: d is rounded, q is computed from the float32 d
    const y = Float32Array.from({ length: 32 }, (_, i) => (i - 15.5) * 0.0123);
    const o2 = new Uint8Array(34);
    quantizeQ8_0(y, o2);
    const d = Math.fround(Math.fround(15.5 * 0.0123) / 127);
    expect(o2[0] | (o2[1] << 8)).toBe(f32ToF16Bits(d));
    const id = Math.fround(1 / d);
    for (let i = 0; i < 32; i++) {
      const v = Math.fround(y[i] * id);
      expect((o2[2 + i] << 24) >> 24).toBe(Math.sign(v) * Math.round(Math.abs(v)));
    }
  });

  test("q8_0 and f16 files: matrices quantised / rounded from the (permuted) F32 rows, norms and biases F32", async () => {
    const dir = tempDir();
    const hfDir = join(dir, "hf");
    await makeTinyModel({ arch: "qwen2", preset: "tiny", dtype: "f32", out: hfDir, seed: 5 });
    const f32 = join(dir, "f32.gguf");
    await convertHfToGguf({ dir: hfDir, out: f32, type: "f32" });
    const gf = await readGguf(f32);
    for (const type of ["q8_0", "f16"] as const) {
      const file = join(dir, `${type}.gguf`);
      await convertHfToGguf({ dir: hfDir, out: file, type });
      const g = await readGguf(file);
      const meta = new GgufMeta(file, g.metadata);
      expect(meta.int("general.file_type")).toBe(type === "q8_0" ? 7 : 1);
      for (const t of g.tensors) {
        const src = gf.tensors.find((s) => s.name === t.name)!;
        const x = new Float32Array(readFileSync(f32).buffer.slice(src.offset, src.offset + src.nbytes));
        const bytes = readFileSync(file).subarray(t.offset, t.offset + t.nbytes);
        if (t.dims.length === 1) {
          expect(t.type, t.name).toBe(GgmlType.F32);
          expect(Buffer.from(bytes).equals(Buffer.from(x.buffer)), t.name).toBe(true);
        } else if (type === "q8_0" && t.dims[0] % 32 === 0) {
          expect(t.type, t.name).toBe(GgmlType.Q8_0);
          const want = new Uint8Array(t.nbytes);
          quantizeQ8_0(x, want);
          expect(Buffer.from(bytes).equals(Buffer.from(want)), t.name).toBe(true);
        } else {
          // f16, and llama.cpp's fallback for q8_0 rows that are not whole blocks (ffn_down: 172 columns)
          expect(t.type, t.name).toBe(GgmlType.F16);
          expect(Buffer.from(bytes).equals(Buffer.from(Uint16Array.from(x, f32ToF16Bits).buffer)), t.name).toBe(true);
        }
      }
    }
  });
});

describe("metadata", () => {
  test("llama.cpp's keys and values", async () => {
    const dir = tempDir();
    await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "bf16", out: join(dir, "hf"), seed: 2, overrides: { tieWordEmbeddings: true } });
    const file = join(dir, "m.gguf");
    const r = await convertHfToGguf({ dir: join(dir, "hf"), out: file, type: "f16", name: "Tiny" });
    expect(r.pre).toBe("smollm");
    const g = await readGguf(file);
    expect(g.version).toBe(3);
    const meta = new GgufMeta(file, g.metadata);
    expect(meta.str("general.architecture")).toBe("llama");
    expect(meta.str("general.name")).toBe("Tiny");
    const want: Record<string, number> = {
      "llama.block_count": 2, "llama.context_length": 4096, "llama.embedding_length": 64, "llama.feed_forward_length": 172,
      "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2, "llama.attention.key_length": 16, "llama.rope.dimension_count": 16,
      "llama.vocab_size": 49152, "general.file_type": 1, "general.quantization_version": 2,
    };
    for (const [k, v] of Object.entries(want)) {
      expect(g.metadata.get(k), k).toEqual({ type: "u32", value: v });
    }
    expect(g.metadata.get("llama.rope.freq_base")).toEqual({ type: "f32", value: 10000 });
    expect(g.metadata.get("llama.attention.layer_norm_rms_epsilon")).toEqual({ type: "f32", value: Math.fround(1e-5) });
    expect(meta.str("tokenizer.chat_template")).toContain("<|im_start|>");
    // tied: no output.weight; BF16 source rounded to F16
    expect(g.tensors.some((t) => t.name === "output.weight")).toBe(false);
    expect(g.tensors.find((t) => t.name === "token_embd.weight")!.typeName).toBe("F16");
    const m = await readGgufModel(file);
    expect(m.config).toMatchObject({ arch: "llama", tieWordEmbeddings: true, vocabSize: 49152, headDim: 16, bosTokenId: 1, eosTokenIds: [2], ropeScaling: null, ropeInterleaved: true });
  });

  test("Llama 3 rope scaling travels as rope_freqs.weight and is recovered on load", async () => {
    const dir = tempDir();
    await makeTinyModel({ arch: "llama", preset: "llama-1b", dtype: "f32", out: join(dir, "hf"), seed: 2, overrides: { hiddenSize: 64, intermediateSize: 128, numLayers: 1, numHeads: 2, numKvHeads: 1, headDim: 32 } });
    const file = join(dir, "m.gguf");
    await convertHfToGguf({ dir: join(dir, "hf"), out: file, type: "f32" });
    const g = await readGguf(file);
    const rf = g.tensors.find((t) => t.name === "rope_freqs.weight")!;
    expect(rf).toMatchObject({ typeName: "F32", dims: [16] });
    const m = await readGgufModel(file);
    const hf = await readHfFolder(join(dir, "hf"));
    expect(hf.config.ropeScaling).not.toBeNull();
    expect(m.config.ropeScaling).toEqual(hf.config.ropeScaling);
  });

  test("refuses folders it cannot convert", async () => {
    const dir = tempDir();
    await expect(convertHfToGguf({ dir, out: join(dir, "x.gguf"), type: "f16" })).rejects.toThrow(/config\.json/);
    // the committed fixture has a word-level tokenizer: no GGUF form
    await expect(convertHfToGguf({ dir: hfLlamaTiny, out: join(dir, "y.gguf"), type: "f16" })).rejects.toThrow(/only byte-level BPE tokenizers convert/);
  });
});

describe("writing the file", () => {
  test("an output that is one of the model's own files is refused; a failed write leaves the previous file whole and no temporary behind", async () => {
    const dir = tempDir();
    await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f16", out: dir, seed: 3 });
    const weights = readFileSync(join(dir, "model.safetensors"));
    await expect(convertHfToGguf({ dir, out: join(dir, "model.safetensors"), type: "f16" })).rejects.toThrow(
      /the output .*model\.safetensors is one of the model's own files \(model\.safetensors\); write the GGUF elsewhere/,
    );
    expect(readFileSync(join(dir, "model.safetensors")).equals(weights)).toBe(true);

    const out = join(tempDir(), "m.gguf");
    await convertHfToGguf({ dir, out, type: "f16" });
    const good = readFileSync(out);
    const failing = { name: "t", type: GgmlType.F32, dims: [4], data: () => [new Uint8Array(8)] }; // 8 of 16 bytes
    await expect(writeGguf(out, { metadata: new Map(), tensors: [failing] })).rejects.toThrow(/produced only 8 bytes/);
    expect(readFileSync(out).equals(good)).toBe(true);
    expect(readdirSync(dirname(out))).toEqual(["m.gguf"]);
  });
});

describe("dki models convert / info", () => {

  test("convert --type q8_0 then info, text and json", async () => {
    const dir = tempDir();
    await makeTinyModel({ arch: "qwen2", preset: "tiny", dtype: "f32", out: join(dir, "hf"), seed: 1 });
    const file = join(dir, "m.gguf");
    const c = await dki("models", "convert", join(dir, "hf"), "--to", "gguf", "--type", "q8_0", "--out", file);
    expect(c.stderr).toBe("");
    expect(c.exitCode).toBe(0);
    expect(c.stdout).toMatch(/^wrote .*m\.gguf: qwen2 q8_0, 27 tensors, /);
    const info = await dki("models", "info", file, "--format", "json");
    expect(info.exitCode).toBe(0);
    const j = JSON.parse(info.stdout);
    expect(j).toMatchObject({ format: "gguf", arch: "qwen2", architectures: ["hf"], dtypes: ["Q8_0", "F16", "F32"], bias: true, hasTokenizer: true, parameterCount: 6382656 });
    const text = await dki("models", "info", file);
    expect(text.stdout).toContain("GGUF");
    expect(text.stdout).toContain("Q8_0 + F16 + F32");
    const bad = await dki("models", "convert", join(dir, "hf"), "--type", "q4_0", "--out", file);
    expect(bad.exitCode).toBe(1);
    expect(bad.stderr).toContain("--type must be one of f32, f16, bf16, q8_0");
    const missing = await dki("models", "info", join(dir, "nope.gguf"));
    expect(missing.exitCode).toBe(1);
    expect(missing.stderr).toMatch(/^dki: .*nope\.gguf: cannot read \(ENOENT\)\n$/);
  });
});
