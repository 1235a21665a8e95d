// K/V block operations, checked against recomputation and exact identities.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { readHfFolder } from "../src/formats/hf-folder.js";
import { LogitsMode, native, type NativeModelHandle } from "../src/engine/native.js";
import { KVBlock } from "../src/kv/kv-block.js";
import { Model } from "../src/engine/model.js";
import { hfLlamaTiny, maxAbsDiff, tempDir } from "./support/paths.js";

let model: NativeModelHandle;
let other: NativeModelHandle;
const tokens = [5, 17, 300, 42, 8, 99, 250, 3, 77, 410, 12, 64, 128];

beforeAll(async () => {
  const f = await readHfFolder(hfLlamaTiny);
  model = await native().loadModel({ config: f.config, tensors: f.tensors });
  // Same weights, different rope theta: a different model whose blocks must not mix.
  other = await native().loadModel({ config: { ...f.config, ropeTheta: 20000 }, tensors: f.tensors });
});

async function compute(m: NativeModelHandle, toks: number[], start: number): Promise<KVBlock> {
  const ctx = new (native().NativeContext)(m, toks.length);
  ctx.reset(start);
  await ctx.eval(Int32Array.from(toks), LogitsMode.None);
  const b = new KVBlock(ctx.exportBlock(0, toks.length), m);
  ctx.dispose();
  return b;
}

describe("K/V blocks", () => {
  test("metadata", async () => {
    const b = await compute(model, tokens, 0);
    expect(b.nTokens).toBe(tokens.length);
    expect(b.tokens).toEqual(tokens);
    expect(b.nLayers).toBe(3);
    expect(b.nKvHeads).toBe(2);
    expect(b.headDim).toBe(32);
    expect(b.byteSize).toBe(2 * 3 * 2 * tokens.length * 32 * 4);
  });

  test.each([7, -13, 1000, -4096])("remap from 0 to %i equals computing at that position (≤ 1e-5)", async (s) => {
    const at0 = await compute(model, tokens, 0);
    const direct = await compute(model, tokens, s);
    const moved = await at0.remap(s);
    expect(moved.startPos).toBe(s);
    const scale = Math.max(...Array.from(direct.keys(), Math.abs));
    expect(maxAbsDiff(moved.keys(), direct.keys()) / Math.max(1, scale)).toBeLessThan(1e-5);
    // Values only change through float rounding: attention depends on relative positions alone.
    expect(maxAbsDiff(moved.values(), direct.values())).toBeLessThan(1e-5);
  });

  test("scaleValues multiplies V and leaves K untouched", async () => {
    const b = await compute(model, tokens, 0);
    const s = await b.scaleValues(0.25);
    expect(Array.from(s.keys())).toEqual(Array.from(b.keys()));
    const v = b.values(), sv = s.values();
    for (let i = 0; i < v.length; i++) expect(sv[i]).toBe(Math.fround(v[i] * 0.25));
  });

  test("slice and concat are inverse; concat re-places blocks contiguously", async () => {
    const b = await compute(model, tokens, 0);
    const a = await b.slice(0, 5);
    const c = await b.slice(5, tokens.length);
    expect(c.startPos).toBe(5);
    const joined = await KVBlock.concat([a, c]);
    expect(joined.tokens).toEqual(tokens);
    expect(maxAbsDiff(joined.keys(), b.keys())).toBe(0);
    // c before a: c stays at 5, a is re-rotated to follow it at 5 + c.nTokens.
    const swapped = await KVBlock.concat([c, a]);
    expect(swapped.startPos).toBe(5);
    expect(swapped.tokens).toEqual([...tokens.slice(5), ...tokens.slice(0, 5)]);
    expect(maxAbsDiff((await swapped.slice(0, c.nTokens)).keys(), c.keys())).toBe(0);
    const aMoved = await a.remap(5 + c.nTokens);
    expect(maxAbsDiff((await swapped.slice(c.nTokens, tokens.length)).keys(), aMoved.keys())).toBe(0);
  });

  test("deserialize takes a Model (as the README's examples hold one) as well as its native handle", async () => {
    const m = await Model.load(hfLlamaTiny, { contextSize: 32 });
    try {
      const b = await m.computeBlock(tokens, { startPos: 4 });
      const bytes = await b.serialize("f16");
      const viaModel = await KVBlock.deserialize(m, bytes);
      const viaHandle = await KVBlock.deserialize(m.nativeHandle(), bytes);
      expect(viaModel.startPos).toBe(4);
      expect(Array.from(viaModel.keys())).toEqual(Array.from(viaHandle.keys()));
      await expect(KVBlock.deserialize(other, bytes)).rejects.toThrow(/another model/);
    } finally {
      m.dispose();
    }
  });

  test("serialise round trip is exact for f32", async () => {
    const b = await compute(model, tokens, -13);
    const bytes = await b.serialize("f32");
    const back = await KVBlock.deserialize(model, bytes);
    expect(back.startPos).toBe(-13);
    expect(back.tokens).toEqual(tokens);
    expect(Array.from(back.keys())).toEqual(Array.from(b.keys()));
    expect(Array.from(back.values())).toEqual(Array.from(b.values()));
  });

  test("f16 / bf16 / int8 storage: sizes and bounded round-trip error", async () => {
    const b = await compute(model, tokens, 0);
    const f32 = b.storageBytes("f32");
    expect(b.storageBytes("f16")).toBe(f32 / 2);
    expect(b.storageBytes("bf16")).toBe(f32 / 2);
    expect(b.storageBytes("int8")).toBeLessThan(f32 / 3.2);
    for (const storage of ["f32", "f16", "bf16", "int8"] as const) {
      expect(b.serializedBytes(storage), storage).toBe((await b.serialize(storage)).length);
    }
    expect(() => b.serializedBytes("f8" as "f16")).toThrow(/f8/);
    const maxK = Math.max(...Array.from(b.keys(), Math.abs));
    const maxV = Math.max(...Array.from(b.values(), Math.abs));
    for (const [storage, rel] of [["f16", 1e-3], ["bf16", 8e-3], ["int8", 1 / 127]] as const) {
      const r = await b.toStorage(storage);
      // Relative to the largest magnitude: int8 is off by at most half a quantisation step.
      expect(maxAbsDiff(r.keys(), b.keys()) / maxK, storage).toBeLessThanOrEqual(rel);
      expect(maxAbsDiff(r.values(), b.values()) / maxV, storage).toBeLessThanOrEqual(rel);
    }
  });

  test("f16 storage refuses values beyond its range instead of storing inf; bf16 and int8 keep them", async () => {
    const b = await compute(model, tokens, 0);
    const maxV = Math.max(...Array.from(b.values(), Math.abs));
    const big = await b.scaleValues(1e5 / maxV); // the largest value becomes 1e5 > 65504
    await expect(big.serialize("f16")).rejects.toThrow(/value in layer \d+ is beyond f16's range \(it rounds to ±inf past ±65504\).*bf16/);
    await expect(big.toStorage("f16")).rejects.toThrow(/beyond f16's range/);
    for (const storage of ["bf16", "int8"] as const) {
      const r = await big.toStorage(storage);
      expect(Array.from(r.values()).every(Number.isFinite), storage).toBe(true);
      expect(maxAbsDiff(r.values(), big.values()) / 1e5, storage).toBeLessThanOrEqual(8e-3);
    }
    // Within range (65500 is an f16 value), the same block is stored as before.
    expect((await b.serialize("f16")).length).toBe(b.serializedBytes("f16"));
    const edge = await b.scaleValues(65500 / maxV);
    const back = await KVBlock.deserialize(model, await edge.serialize("f16"));
    expect(Array.from(back.values()).every(Number.isFinite)).toBe(true);
    expect(Math.abs(Math.max(...Array.from(back.values(), Math.abs)) - 65500)).toBeLessThanOrEqual(32); // f16's step there
  });

  test("f16/bf16 storage is bit-identical on every SIMD path (round to nearest even)", async () => {
    const b = await compute(model, tokens, 0);
    for (const storage of ["f16", "bf16"] as const) {
      const out: Buffer[] = [];
      const back: Float32Array[] = [];
      for (const simd of native().simd().available) {
        native().setSimd(simd);
        out.push(await b.serialize(storage));
        back.push((await KVBlock.deserialize(model, out[out.length - 1])).keys());
      }
      native().setSimd("auto");
      for (let i = 1; i < out.length; i++) {
        expect(out[i].equals(out[0]), storage).toBe(true);
        expect(Buffer.from(back[i].buffer).equals(Buffer.from(back[0].buffer)), storage).toBe(true);
      }
    }
  });

  test("buffers of freed large blocks are pooled up to the set size and reused with correct contents", async () => {
    const small = await compute(model, tokens, 0);
    const big = await KVBlock.concat(Array.from({ length: 220 }, () => small)); // K and V 2.1 MB each
    const bytes = await big.serialize("f16");
    const addon = native();
    try {
      addon.setKVPoolBytes(0);
      expect(addon.kvPoolBytes()).toBe(0);
      addon.setKVPoolBytes(64 << 20);
      // In place: a copy of the bytes would take a pooled buffer of its own.
      const first = await KVBlock.deserialize(model, bytes, { inPlace: true });
      const want = { k: first.keys(), v: first.values() };
      first.dispose();
      expect(addon.kvPoolBytes()).toBe(2 * (4 << 20)); // K and V, each rounded up to 2 MiB pages
      const again = await KVBlock.deserialize(model, bytes, { inPlace: true }); // reuses both buffers, overwriting all
      expect(addon.kvPoolBytes()).toBe(0);
      expect(again.keys()).toEqual(want.k);
      expect(again.values()).toEqual(want.v);
      // Large restores stream their stores past the cache: still the original within fp16 rounding.
      for (const [got, orig] of [[again.keys(), big.keys()], [again.values(), big.values()]]) {
        let worst = 0;
        for (let i = 0; i < orig.length; i++) worst = Math.max(worst, Math.abs(got[i] - orig[i]) / Math.max(Math.abs(orig[i]), 1e-3));
        expect(worst).toBeLessThan(2 ** -10);
      }
      again.dispose();
      addon.setKVPoolBytes(4 << 20); // room for one of the two: the older is freed
      expect(addon.kvPoolBytes()).toBe(4 << 20);
      expect(() => addon.setKVPoolBytes(-1)).toThrow(/non-negative integer/);
    } finally {
      addon.setKVPoolBytes(256 << 20);
      big.dispose();
      small.dispose();
    }
  });

  test("corrupt, truncated and foreign serialised blocks are refused", async () => {
    const b = await compute(model, tokens, 0);
    for (const storage of ["f32", "int8"] as const) {
      const bytes = await b.serialize(storage);
      const flipped = Buffer.from(bytes);
      flipped[200] ^= 0x10;
      await expect(KVBlock.deserialize(model, flipped)).rejects.toThrow(/checksum mismatch/);
      const headerFlip = Buffer.from(bytes);
      headerFlip[32] ^= 0x01; // start_pos
      await expect(KVBlock.deserialize(model, headerFlip)).rejects.toThrow(/checksum mismatch/);
      await expect(KVBlock.deserialize(model, bytes.subarray(0, bytes.length - 1))).rejects.toThrow(/truncated/);
      await expect(KVBlock.deserialize(model, bytes.subarray(0, 10))).rejects.toThrow(/shorter than its 64-byte header/);
      await expect(KVBlock.deserialize(model, Buffer.concat([bytes, Buffer.alloc(3)]))).rejects.toThrow(/trailing bytes/);
      const badMagic = Buffer.from(bytes);
      badMagic[0] = 0x41;
      await expect(KVBlock.deserialize(model, badMagic)).rejects.toThrow(/bad magic/);
      await expect(KVBlock.deserialize(other, bytes)).rejects.toThrow(/another model/);
    }
    // Random garbage of many lengths never crashes.
    for (let n = 0; n < 200; n++) {
      const junk = Buffer.alloc(n * 7);
      for (let i = 0; i < junk.length; i++) junk[i] = (i * 131 + n * 7) & 0xff;
      await expect(KVBlock.deserialize(model, junk)).rejects.toThrow();
    }
  });

  test("a block from another model is refused by injection and by ops", async () => {
    const foreign = await compute(other, tokens, 0);
    const ctx = new (native().NativeContext)(model, 16);
    expect(() => ctx.setSegments([{ block: foreign.nativeHandle(), alpha: 1, logit: false }])).toThrow(/another model/);
    const mine = await compute(model, tokens, 0);
    await expect(KVBlock.concat([mine, foreign])).rejects.toThrow(/another model/);
    await expect((async () => native().remapBlock(model, foreign.nativeHandle(), 3))()).rejects.toThrow(/another model/);
  });

  test("a model whose weights differ in one token's embedding row has another fingerprint", async () => {
    // What a fine-tune of a few new tokens changes. The fingerprint used to hash 4 KiB samples
    // of each tensor (its start, middle and end), and missed this.
    const f = await readHfFolder(hfLlamaTiny);
    const embed = f.tensors.find((t) => t.name === "model.embed_tokens.weight")!;
    const copy = join(tempDir(), "model.safetensors");
    const bytes = readFileSync(embed.file);
    const row = Math.floor(f.config.vocabSize / 4) * f.config.hiddenSize * (embed.nbytes / (f.config.vocabSize * f.config.hiddenSize));
    bytes[embed.offset + row] ^= 0x01;
    writeFileSync(copy, bytes);
    const tuned = await native().loadModel({ config: f.config, tensors: f.tensors.map((t) => (t.file === embed.file ? { ...t, file: copy } : t)) });
    expect(tuned.info().fingerprint).not.toBe(model.info().fingerprint);
    const block = await compute(tuned, tokens, 0);
    const ctx = new (native().NativeContext)(model, 16);
    expect(() => ctx.setSegments([{ block: block.nativeHandle(), alpha: 1, logit: false }])).toThrow(/another model/);
    ctx.dispose();
    block.dispose();
    tuned.dispose();
  });

  test("disposed blocks give a clear error", async () => {
    const b = await compute(model, tokens, 0);
    b.dispose();
    expect(() => b.keys()).toThrow(/disposed/);
  });
});
