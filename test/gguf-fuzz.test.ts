// Malformed GGUF files must give a FormatError naming the file, never crash the process: 400
// seeded corruptions of a small llama GGUF (F32/F16/Q8_0 tensors, a byte-level BPE tokenizer).
// Whatever survives the header checks is loaded by the native engine and run.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { FormatError } from "../src/errors.js";
import { GgmlType, readGguf, writeGguf, type GgufEntry, type GgufTensorToWrite } from "../src/formats/gguf.js";
import { readGgufModel } from "../src/formats/gguf-model.js";
import { LogitsMode, native } from "../src/engine/native.js";
import { quantizeQ8_0 } from "../src/models/convert.js";
import { f32ToF16Bits } from "../src/models/half.js";
import { ggufTokenizer } from "../src/tokenizer/gguf-tokenizer.js";
import { tempDir } from "./support/paths.js";
import { prng } from "./support/prng.js";

const H = 32, HEADS = 2, KV = 1, HD = 16, FF = 64, VOCAB = 300;

function weights(n: number, type: number, r: () => number): Uint8Array {
  const x = Float32Array.from({ length: n }, () => (r() - 0.5) * 0.5);
  if (type === GgmlType.F32) return new Uint8Array(x.buffer);
  if (type === GgmlType.F16) return new Uint8Array(Uint16Array.from(x, f32ToF16Bits).buffer);
  const out = new Uint8Array((n / 32) * 34);
  quantizeQ8_0(x, out);
  return out;
}

/** A small llama GGUF, written with our writer. */
async function makeSmallGguf(file: string): Promise<void> {
  const r = prng(12345);
  const printable = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  const bytes: string[] = [];
  let n = 0;
  for (let b = 0; b < 256; b++) bytes.push(String.fromCodePoint(printable(b) ? b : 256 + n++));
  const merges = ["Ġ t", "h e", "Ġt he", "i n", "a n", "e r", "o n", "Ġ a", "r e", "a t"];
  const tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", ...bytes, ...merges.map((m) => m.replace(" ", ""))];
  while (tokens.length < VOCAB) tokens.push(`[PAD${tokens.length}]`);
  const types = tokens.map((t, i) => (i < 3 ? 3 : t.startsWith("[PAD") ? 5 : 1));
  const u32 = (v: number): GgufEntry => ({ type: "u32", value: v });
  const metadata = new Map<string, GgufEntry>([
    ["general.architecture", { type: "string", value: "llama" }],
    ["general.name", { type: "string", value: "fuzz" }],
    ["llama.block_count", u32(1)],
    ["llama.context_length", u32(64)],
    ["llama.embedding_length", u32(H)],
    ["llama.feed_forward_length", u32(FF)],
    ["llama.attention.head_count", u32(HEADS)],
    ["llama.attention.head_count_kv", u32(KV)],
    ["llama.rope.freq_base", { type: "f32", value: 10000 }],
    ["llama.attention.layer_norm_rms_epsilon", { type: "f32", value: 1e-5 }],
    ["llama.rope.dimension_count", u32(HD)],
    ["tokenizer.ggml.model", { type: "string", value: "gpt2" }],
    ["tokenizer.ggml.pre", { type: "string", value: "smollm" }],
    ["tokenizer.ggml.tokens", { type: "array", itemType: "string", value: tokens }],
    ["tokenizer.ggml.token_type", { type: "array", itemType: "i32", value: types }],
    ["tokenizer.ggml.merges", { type: "array", itemType: "string", value: merges }],
    ["tokenizer.ggml.bos_token_id", u32(1)],
    ["tokenizer.ggml.eos_token_id", u32(2)],
    ["tokenizer.ggml.add_bos_token", { type: "bool", value: false }],
    ["tokenizer.chat_template", { type: "string", value: "{% for m in messages %}{{ m['content'] }}{% endfor %}" }],
  ]);
  const t = (name: string, type: number, dims: number[]): GgufTensorToWrite => ({ name, type, dims, data: weights(dims.reduce((a, b) => a * b, 1), type, r) });
  await writeGguf(file, {
    metadata,
    tensors: [
      t("token_embd.weight", GgmlType.F16, [H, VOCAB]),
      t("blk.0.attn_norm.weight", GgmlType.F32, [H]),
      t("blk.0.attn_q.weight", GgmlType.Q8_0, [H, HEADS * HD]),
      t("blk.0.attn_k.weight", GgmlType.F32, [H, KV * HD]),
      t("blk.0.attn_v.weight", GgmlType.Q8_0, [H, KV * HD]),
      t("blk.0.attn_output.weight", GgmlType.F16, [HEADS * HD, H]),
      t("blk.0.ffn_norm.weight", GgmlType.F32, [H]),
      t("blk.0.ffn_gate.weight", GgmlType.Q8_0, [H, FF]),
      t("blk.0.ffn_up.weight", GgmlType.Q8_0, [H, FF]),
      t("blk.0.ffn_down.weight", GgmlType.Q8_0, [FF, H]),
      t("output_norm.weight", GgmlType.F32, [H]),
      t("output.weight", GgmlType.Q8_0, [H, VOCAB]),
    ],
  });
}

let original: Buffer;
let dataOffset: number;
const KEYS = ["general.architecture", "llama.block_count", "llama.embedding_length", "llama.attention.head_count", "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.pre", "tokenizer.chat_template"];
const TENSORS = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight", "output.weight", "output_norm.weight"];

beforeAll(async () => {
  const file = join(tempDir(), "small.gguf");
  await makeSmallGguf(file);
  original = readFileSync(file);
  dataOffset = (await readGguf(file)).dataOffset;
});

function corrupt(i: number): Buffer {
  const r = prng(i + 1);
  const buf = Buffer.from(original);
  const pick = <T>(a: readonly T[]) => a[Math.floor(r() * a.length)];
  /** Position of the u64 length in front of a string in the header. */
  const lengthOf = (s: string) => buf.indexOf(Buffer.from(s)) - 8;
  const anyU64 = () => pick([0n, 1n, 7n, 31n, 33n, BigInt(buf.length), BigInt(buf.length) + 1n, 2n ** 32n, 2n ** 63n, 2n ** 64n - 1n, BigInt(Math.floor(r() * 2 ** 48))]);
  switch (i % 10) {
    case 0: // truncate anywhere (mostly in or near the header)
      return buf.subarray(0, Math.floor(r() < 0.7 ? r() * dataOffset * 1.2 : r() * buf.length));
    case 1: // bad magic or version
      buf.writeUInt32LE(r() < 0.5 ? Math.floor(r() * 2 ** 32) : pick([0, 1, 2, 4, 0xffffffff]), r() < 0.4 ? 0 : 4);
      return buf;
    case 2: // tensor or key/value count
      buf.writeBigUInt64LE(anyU64() & (2n ** 64n - 1n), r() < 0.5 ? 8 : 16);
      if (r() < 0.5) buf.writeBigUInt64LE(BigInt(Math.floor(r() * 64)), r() < 0.5 ? 8 : 16);
      return buf;
    case 3: { // a string length: a key, a tensor name, or a token inside the tokens array
      const at = r() < 0.3 ? lengthOf("Ġt") : lengthOf(r() < 0.5 ? pick(KEYS) : pick(TENSORS));
      buf.writeBigUInt64LE(r() < 0.5 ? anyU64() : BigInt(Math.max(0, Number(buf.readBigUInt64LE(at)) + Math.floor(r() * 7) - 3)), at);
      return buf;
    }
    case 4: { // a value type or an array's item type / length
      const key = pick(KEYS);
      const at = buf.indexOf(Buffer.from(key)) + Buffer.byteLength(key);
      const which = Math.floor(r() * 3); // 0: value type, 1: item type, 2: array length
      if (which === 2) buf.writeBigUInt64LE(anyU64(), at + 8);
      else buf.writeUInt32LE(r() < 0.5 ? Math.floor(r() * 16) : Math.floor(r() * 2 ** 32), at + 4 * which);
      return buf;
    }
    case 5: { // a tensor's ggml type
      const name = pick(TENSORS);
      const at = buf.indexOf(Buffer.from(name)) + name.length;
      const nDims = buf.readUInt32LE(at);
      buf.writeUInt32LE(pick([2, 3, 4, 5, 6, 9, 12, 14, 30, 31, 36, 40, 1000, Math.floor(r() * 2 ** 32)]), at + 4 + 8 * nDims);
      return buf;
    }
    case 6: { // a tensor's offset: misaligned, past the end, overlapping another
      const name = pick(TENSORS);
      const at = buf.indexOf(Buffer.from(name)) + name.length;
      const nDims = buf.readUInt32LE(at);
      const offAt = at + 4 + 8 * nDims + 4;
      const old = buf.readBigUInt64LE(offAt);
      buf.writeBigUInt64LE(pick([old + 1n, old + 16n, old + 32n, old - 32n < 0n ? 0n : old - 32n, 0n, anyU64()]), offAt);
      return buf;
    }
    case 7: { // a tensor's dims or dim count
      const name = pick(TENSORS);
      const at = buf.indexOf(Buffer.from(name)) + name.length;
      if (r() < 0.3) buf.writeUInt32LE(pick([0, 2, 3, 5, 100, 2 ** 31]), at);
      else buf.writeBigUInt64LE(pick([0n, 1n, 16n, 31n, 64n, 96n, 2n ** 33n, 2n ** 63n]), at + 4 + 8 * Math.floor(r() * buf.readUInt32LE(at)));
      return buf;
    }
    case 8: // random byte flips in the header
      for (let k = 0; k < 1 + Math.floor(r() * 6); k++) buf[Math.floor(r() * dataOffset)] ^= 1 << Math.floor(r() * 8);
      return buf;
    default: // random bytes anywhere, tensor data included (must still load and run)
      for (let k = 0; k < 8; k++) buf[Math.floor(r() * buf.length)] = Math.floor(r() * 256);
      return buf;
  }
}

describe("corrupted GGUF", () => {
  test("the uncorrupted file loads, tokenizes and runs", async () => {
    const file = join(tempDir(), "ok.gguf");
    writeFileSync(file, original);
    const m = await readGgufModel(file);
    expect(m.config).toMatchObject({ arch: "llama", hiddenSize: H, numLayers: 1, vocabSize: VOCAB, ropeInterleaved: true, tieWordEmbeddings: false });
    const tok = ggufTokenizer(m.metadata);
    const ids = tok.encode("the cat");
    expect(ids).toContain(tok.tokenToId("he")); // merges applied
    expect(ids).toContain(tok.tokenToId("at"));
    expect(tok.decode(ids)).toBe("the cat");
    const model = await native().loadModel({ config: m.config, tensors: m.tensors });
    const ctx = new (native().NativeContext)(model, 8);
    const logits = (await ctx.eval(Int32Array.of(1, 50, 60), LogitsMode.Last))!;
    expect(logits.length).toBe(VOCAB);
    expect(logits.every(Number.isFinite)).toBe(true);
    ctx.dispose();
    model.dispose();
  });

  test("400 seeded corruptions: each loads and runs, or is refused with a FormatError naming the file", async () => {
    const dir = tempDir();
    const file = join(dir, "model.gguf");
    let refused = 0, loaded = 0, nativeRefused = 0;
    const kinds = new Map<string, number>();
    for (let i = 0; i < 400; i++) {
      writeFileSync(file, corrupt(i));
      let m;
      try {
        m = await readGgufModel(file);
        ggufTokenizer(m.metadata, { bosTokenId: m.config.bosTokenId, eosTokenIds: m.config.eosTokenIds });
      } catch (e) {
        expect(e, `corruption ${i}: ${(e as Error).stack}`).toBeInstanceOf(FormatError);
        expect((e as Error).message, `corruption ${i}`).toContain(file);
        const kind = (e as Error).message.slice(file.length + 2).replace(/[\d"][^ ]*/g, "#").slice(0, 40);
        kinds.set(kind, (kinds.get(kind) ?? 0) + 1);
        refused++;
        continue;
      }
      let model;
      try {
        model = await native().loadModel({ config: m.config, tensors: m.tensors });
      } catch (e) {
        // the header passed our checks but the engine refuses the model (e.g. a shape it cannot run): still an error naming the file
        expect((e as Error).message, `corruption ${i}`).toContain(file);
        nativeRefused++;
        continue;
      }
      const ctx = new (native().NativeContext)(model, 8);
      await ctx.eval(Int32Array.of(1, 2, 3).map((x) => x % m.config.vocabSize), LogitsMode.Last);
      ctx.dispose();
      model.dispose();
      loaded++;
    }
    if (process.env.GGUF_FUZZ_VERBOSE) console.log([...kinds].map(([k, n]) => `${n}\t${k}`).join("\n"));
    console.log(`GGUF fuzz: ${refused} refused (FormatError), ${nativeRefused} refused by the native loader, ${loaded} loaded and ran; ${kinds.size} distinct messages`);
    expect(refused).toBeGreaterThan(200);
    expect(loaded).toBeGreaterThan(20);
  });
});
