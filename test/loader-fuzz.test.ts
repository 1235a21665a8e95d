// Malformed model files must give an error naming the problem, never crash the process.
import { copyFileSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { writeGguf, type GgufEntry } from "../src/formats/gguf.js";
import { readGgufModel } from "../src/formats/gguf-model.js";
import { readHfFolder } from "../src/formats/hf-folder.js";
import { readSafetensorsHeader } from "../src/formats/safetensors.js";
import { LogitsMode, native } from "../src/engine/native.js";
import { hfLlamaTiny, tempDir } from "./support/paths.js";
import { prng } from "./support/prng.js";

const original = readFileSync(join(hfLlamaTiny, "model.safetensors"));
const headerLen = Number(original.readBigUInt64LE(0));

function corrupt(i: number): Buffer {
  const r = prng(i);
  const buf = Buffer.from(original);
  switch (i % 6) {
    case 0: // truncate anywhere
      return buf.subarray(0, Math.floor(r() * buf.length));
    case 1: // flip bytes inside the JSON header
      for (let k = 0; k < 1 + Math.floor(r() * 4); k++) buf[8 + Math.floor(r() * headerLen)] ^= 1 << Math.floor(r() * 8);
      return buf;
    case 2: // a lying header length
      buf.writeBigUInt64LE(BigInt(Math.floor(r() * 2 ** 40)), 0);
      return buf;
    case 3: { // rewrite numbers in the header (offsets, shapes)
      const json = buf.subarray(8, 8 + headerLen).toString("utf8");
      const mutated = json.replace(/\d+/g, (d) => (r() < 0.05 ? String(Math.floor(r() * 10 ** (d.length + 1))).padStart(d.length, "0").slice(0, d.length) : d));
      buf.write(mutated, 8, "utf8");
      return buf;
    }
    case 4: { // an unknown dtype
      const json = buf.subarray(8, 8 + headerLen).toString("utf8");
      buf.write(json.replace('"F32"', r() < 0.5 ? '"F99"' : '"I8" '), 8, "utf8");
      return buf;
    }
    default: // flip bytes anywhere (weights included: must still load and run)
      for (let k = 0; k < 8; k++) buf[Math.floor(r() * buf.length)] ^= 0xff;
      return buf;
  }
}

describe("corrupted safetensors", () => {
  test("300 random corruptions: each loads and runs, or is refused with an error naming the file or folder", async () => {
    const dir = tempDir();
    copyFileSync(join(hfLlamaTiny, "config.json"), join(dir, "config.json"));
    let refused = 0;
    for (let i = 0; i < 300; i++) {
      const file = join(dir, "model.safetensors");
      writeFileSync(file, corrupt(i));
      let files;
      try {
        files = await readHfFolder(dir);
      } catch (e) {
        expect((e as Error).message, `corruption ${i}`).toContain(dir);
        refused++;
        continue;
      }
      const model = await native().loadModel({ config: files.config, tensors: files.tensors });
      const ctx = new (native().NativeContext)(model, 8);
      await ctx.eval(Int32Array.of(1, 2, 3), LogitsMode.Last);
      ctx.dispose();
      model.dispose();
    }
    expect(refused).toBeGreaterThan(100);
  });

  test("a header whose tensor runs past the end of the file", async () => {
    const dir = tempDir();
    const buf = Buffer.from(original);
    writeFileSync(join(dir, "x.safetensors"), buf.subarray(0, buf.length - 100));
    await expect(readSafetensorsHeader(join(dir, "x.safetensors"))).rejects.toThrow(/past its end|truncated/);
  });
});

describe("the native loader re-checks what TypeScript passes it", async () => {
  const files = await readHfFolder(hfLlamaTiny);
  const load = (patch: (t: (typeof files.tensors)[number]) => void) => {
    const tensors = files.tensors.map((t) => ({ ...t, shape: [...t.shape] }));
    patch(tensors[3]);
    return native().loadModel({ config: files.config, tensors });
  };
  test("offset past the end of the file", async () => {
    await expect(load((t) => (t.offset = original.length))).rejects.toThrow(/runs past the end/);
  });
  test("byte count disagreeing with shape and dtype", async () => {
    await expect(load((t) => (t.nbytes -= 4))).rejects.toThrow(/bytes, its shape and dtype need/);
  });
  test("shape disagreeing with the config", async () => {
    await expect(load((t) => (t.shape = [t.shape[1], t.shape[0]]))).rejects.toThrow(/has shape/);
  });
  test("missing tensor", async () => {
    await expect(load((t) => (t.name = "something.else"))).rejects.toThrow(/is missing/);
  });
  test("missing file", async () => {
    await expect(load((t) => (t.file = "/nonexistent/model.safetensors"))).rejects.toThrow(/cannot open/);
  });
  test("weights the config leaves unread (fewer layers, biases of a model without them) are refused, not dropped", async () => {
    const norm = files.tensors.find((t) => t.name === "model.layers.0.input_layernorm.weight")!;
    await expect(native().loadModel({ config: { ...files.config, numLayers: files.config.numLayers - 1 }, tensors: files.tensors })).rejects.toThrow(
      new RegExp(`tensor "model\\.layers\\.${files.config.numLayers - 1}\\..*" is not used by a model of this config \\(${files.config.numLayers - 1} layers, attention biases off\\): config and weights disagree`),
    );
    const bias = { ...norm, name: "model.layers.0.self_attn.o_proj.bias" };
    await expect(native().loadModel({ config: files.config, tensors: [...files.tensors, bias] })).rejects.toThrow(/"model\.layers\.0\.self_attn\.o_proj\.bias" is not used/);
    // As transformers does, old checkpoints' rotary buffers are left out without complaint.
    const invFreq = { ...norm, name: "model.layers.0.self_attn.rotary_emb.inv_freq" };
    await expect(native().loadModel({ config: files.config, tensors: [...files.tensors, invFreq] })).resolves.toBeDefined();
  });
  test("invalid config", async () => {
    await expect(native().loadModel({ config: { ...files.config, numKvHeads: 3 }, tensors: files.tensors })).rejects.toThrow(/multiple of/);
  });
});

describe("shapes beyond what the engine takes are refused before any work sized by them", () => {
  test("a 300-byte GGUF claiming 2^31 - 1 layers, and an HF config claiming 5 million (each used to take gigabytes and most of a minute)", async () => {
    const file = join(tempDir(), "layers.gguf");
    const u32 = (value: number) => ({ type: "u32", value }) as const;
    await writeGguf(file, {
      metadata: new Map<string, GgufEntry>([
        ["general.architecture", { type: "string", value: "llama" }],
        ["llama.embedding_length", u32(64)],
        ["llama.attention.head_count", u32(4)],
        ["llama.feed_forward_length", u32(128)],
        ["llama.block_count", u32(2 ** 31 - 1)],
        ["llama.context_length", u32(256)],
        ["llama.vocab_size", u32(512)],
        ["llama.attention.layer_norm_rms_epsilon", { type: "f32", value: 1e-5 }],
      ]),
      tensors: [],
    });
    const t0 = performance.now();
    await expect(readGgufModel(file)).rejects.toThrow(/layers\.gguf: layer count 2147483647 is more than the engine takes \(1024\)/);
    const dir = tempDir();
    for (const f of ["model.safetensors", "tokenizer.json"]) copyFileSync(join(hfLlamaTiny, f), join(dir, f));
    const config = JSON.parse(readFileSync(join(hfLlamaTiny, "config.json"), "utf8")) as Record<string, unknown>;
    writeFileSync(join(dir, "config.json"), JSON.stringify({ ...config, num_hidden_layers: 5_000_000 }));
    await expect(readHfFolder(dir)).rejects.toThrow(/config\.json: layer count 5000000 is more than the engine takes \(1024\)/);
    writeFileSync(join(dir, "config.json"), JSON.stringify({ ...config, rms_norm_eps: 1e-50 }));
    await expect(readHfFolder(dir)).rejects.toThrow(/rms_norm_eps 1e-50 must be from/); // 0 once cast to float32
    expect(performance.now() - t0).toBeLessThan(5000);
  });
});

describe("tensors that do not own their bytes", () => {
  const safetensors = (file: string, header: Record<string, unknown>, dataBytes: number) => {
    const json = Buffer.from(JSON.stringify(header));
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(json.length));
    writeFileSync(file, Buffer.concat([len, json, Buffer.alloc(dataBytes)]));
  };

  test("two tensors sharing or overlapping bytes of one file are refused", async () => {
    const file = join(tempDir(), "overlap.safetensors");
    safetensors(file, { a: { dtype: "F32", shape: [4], data_offsets: [0, 16] }, b: { dtype: "F32", shape: [4], data_offsets: [8, 24] } }, 24);
    await expect(readSafetensorsHeader(file)).rejects.toThrow(/overlap\.safetensors: tensors "a" and "b" overlap in the data section/);
  });

  test("a tensor in two shards is refused, naming both", async () => {
    const dir = tempDir();
    for (const f of ["config.json", "tokenizer.json"]) copyFileSync(join(hfLlamaTiny, f), join(dir, f));
    const norm = { dtype: "F32", shape: [4], data_offsets: [0, 16] };
    safetensors(join(dir, "a.safetensors"), { "model.norm.weight": norm }, 16);
    safetensors(join(dir, "b.safetensors"), { "model.norm.weight": norm }, 16);
    writeFileSync(join(dir, "model.safetensors.index.json"), JSON.stringify({ weight_map: { "model.norm.weight": "a.safetensors", other: "b.safetensors" } }));
    await expect(readHfFolder(dir)).rejects.toThrow(/tensor "model\.norm\.weight" is in both a\.safetensors and b\.safetensors/);
  });
});
