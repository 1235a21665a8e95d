// GGUF reader and writer: round trips of every metadata type and of tensor data, and clear
// errors for malformed headers.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { FormatError } from "../src/errors.js";
import { GgmlType, ggmlTensorBytes, ggmlTypeName, GgufMeta, readGguf, writeGguf, type GgufEntry } from "../src/formats/gguf.js";
import { tempDir } from "./support/paths.js";

const METADATA: [string, GgufEntry][] = [
  ["general.architecture", { type: "string", value: "llama" }],
  ["u8", { type: "u8", value: 255 }],
  ["i8", { type: "i8", value: -128 }],
  ["u16", { type: "u16", value: 65535 }],
  ["i16", { type: "i16", value: -32768 }],
  ["u32", { type: "u32", value: 4294967295 }],
  ["i32", { type: "i32", value: -2147483648 }],
  ["f32", { type: "f32", value: Math.fround(1e-5) }],
  ["f64", { type: "f64", value: Math.PI }],
  ["bool.t", { type: "bool", value: true }],
  ["bool.f", { type: "bool", value: false }],
  ["u64.small", { type: "u64", value: 2 ** 40 + 3 }],
  ["u64.big", { type: "u64", value: 2n ** 64n - 1n }],
  ["i64.neg", { type: "i64", value: -(2n ** 63n) }],
  ["string.unicode", { type: "string", value: "héllo 世界 👍🏽 \u0000 end" }],
  ["string.empty", { type: "string", value: "" }],
  ["arr.strings", { type: "array", itemType: "string", value: ["a", "", "Ġthe", "<|im_end|>", "中"] }],
  ["arr.i32", { type: "array", itemType: "i32", value: [1, -2, 3, 2147483647] }],
  ["arr.f32", { type: "array", itemType: "f32", value: [0.5, -1.25, Math.fround(0.1)] }],
  ["arr.bool", { type: "array", itemType: "bool", value: [true, false] }],
  ["arr.u64", { type: "array", itemType: "u64", value: [0, 1, 2n ** 63n] }],
  ["arr.empty", { type: "array", itemType: "u8", value: [] }],
];

function f32Bytes(values: number[]): Uint8Array {
  return new Uint8Array(Float32Array.from(values).buffer);
}

describe("GGUF round trip", () => {
  test("metadata of every type and tensors of F32, F16 and Q8_0 read back as written", async () => {
    const file = join(tempDir(), "rt.gguf");
    const q8 = new Uint8Array(2 * 34).map((_, i) => (i * 37) & 255);
    const f16 = new Uint8Array(3 * 4 * 2).map((_, i) => i);
    const f32 = f32Bytes([1, 2, 3, 4, 5]);
    await writeGguf(file, {
      metadata: new Map(METADATA),
      tensors: [
        { name: "a.f32", type: GgmlType.F32, dims: [5], data: f32 },
        { name: "b.q8", type: GgmlType.Q8_0, dims: [32, 2], data: () => [q8.subarray(0, 34), q8.subarray(34)] },
        {
          name: "c.f16",
          type: GgmlType.F16,
          dims: [4, 3],
          data: async function* () {
            yield f16.subarray(0, 10);
            yield f16.subarray(10);
          },
        },
      ],
    });
    const g = await readGguf(file);
    expect(g.version).toBe(3);
    expect(g.alignment).toBe(32);
    expect(g.dataOffset % 32).toBe(0);
    expect([...g.metadata.keys()]).toEqual(METADATA.map(([k]) => k));
    for (const [k, e] of METADATA) {
      const got = g.metadata.get(k)!;
      expect(got.type, k).toBe(e.type);
      const norm = (v: unknown) => (typeof v === "bigint" && v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(v) : v);
      const want = e.type === "array" ? e.value.map(norm) : norm(e.value);
      expect(got.value, k).toEqual(want);
      if (e.type === "array") expect((got as { itemType: string }).itemType).toBe(e.itemType);
    }
    expect(g.tensors.map((t) => [t.name, t.typeName, t.dims, t.nbytes])).toEqual([
      ["a.f32", "F32", [5], 20],
      ["b.q8", "Q8_0", [32, 2], 68],
      ["c.f16", "F16", [4, 3], 24],
    ]);
    const bytes = readFileSync(file);
    for (const t of g.tensors) expect(t.offset % 32).toBe(0);
    expect(bytes.subarray(g.tensors[0].offset, g.tensors[0].offset + 20)).toEqual(Buffer.from(f32));
    expect(bytes.subarray(g.tensors[1].offset, g.tensors[1].offset + 68)).toEqual(Buffer.from(q8));
    expect(bytes.subarray(g.tensors[2].offset, g.tensors[2].offset + 24)).toEqual(Buffer.from(f16));
    // llama.cpp's layout: contiguous, each tensor padded to the alignment
    expect(g.tensors.map((t) => t.offset - g.dataOffset)).toEqual([0, 32, 128]);
    expect(bytes.length).toBe(g.dataOffset + 160);

    const meta = new GgufMeta(file, g.metadata);
    expect(meta.int("u32")).toBe(4294967295);
    expect(meta.num("f32")).toBeCloseTo(1e-5, 10);
    expect(meta.str("general.architecture")).toBe("llama");
    expect(meta.arr("arr.strings", "string")).toHaveLength(5);
    expect(() => meta.int("string.empty")).toThrow(/must be a non-negative integer/);
    expect(() => meta.arr("arr.i32", "string")).toThrow(/array of strings/);
    expect(() => meta.int("missing")).toThrow(/missing/);
  });

  test("a custom alignment is written as general.alignment and honoured", async () => {
    const file = join(tempDir(), "al.gguf");
    await writeGguf(file, {
      alignment: 64,
      metadata: { x: { type: "u32", value: 1 } },
      tensors: [
        { name: "a", type: GgmlType.F32, dims: [3], data: f32Bytes([1, 2, 3]) },
        { name: "b", type: GgmlType.F32, dims: [1], data: f32Bytes([4]) },
      ],
    });
    const g = await readGguf(file);
    expect(g.alignment).toBe(64);
    expect(g.metadata.get("general.alignment")).toEqual({ type: "u32", value: 64 });
    expect(g.tensors.map((t) => (t.offset - g.dataOffset) % 64)).toEqual([0, 0]);
    expect(g.dataOffset % 64).toBe(0);
  });

  test("the writer refuses data of the wrong size and bad values", async () => {
    const file = join(tempDir(), "bad.gguf");
    await expect(writeGguf(file, { metadata: {}, tensors: [{ name: "a", type: GgmlType.F32, dims: [4], data: f32Bytes([1]) }] })).rejects.toThrow(/needs 16/);
    await expect(writeGguf(file, { metadata: { a: { type: "u8", value: 256 } }, tensors: [] })).rejects.toThrow(/not a valid u8/);
    await expect(writeGguf(file, { metadata: {}, tensors: [{ name: "q", type: GgmlType.Q8_0, dims: [31], data: new Uint8Array(0) }] })).rejects.toThrow(/multiple of/);
  });

  test("type names and sizes", () => {
    expect(ggmlTypeName(12)).toBe("Q4_K");
    expect(ggmlTypeName(2)).toBe("Q4_0");
    expect(ggmlTypeName(30)).toBe("BF16");
    expect(ggmlTypeName(99)).toBe("type 99");
    expect(ggmlTensorBytes(GgmlType.Q8_0, [64, 3])).toBe(2 * 34 * 3);
    expect(ggmlTensorBytes(12, [256, 2])).toBe(288);
  });
});

describe("malformed GGUF headers", () => {
  const header = (parts: Buffer[]) => Buffer.concat(parts);
  const u32 = (v: number) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); return b; };
  const u64 = (v: bigint | number) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); return b; };
  const str = (s: string) => header([u64(Buffer.byteLength(s)), Buffer.from(s)]);

  async function expectError(bytes: Buffer, re: RegExp): Promise<void> {
    const file = join(tempDir(), "m.gguf");
    writeFileSync(file, bytes);
    const err = await readGguf(file).then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(FormatError);
    expect((err as Error).message).toContain(file);
    expect((err as Error).message).toMatch(re);
  }

  const MAGIC = Buffer.from("GGUF");
  const pad = Buffer.alloc(64);

  test("bad magic", () => expectError(header([Buffer.from("GGML"), u32(3), u64(0), u64(0), pad]), /bad magic "GGML".*not a GGUF file/));
  test("version 1 and unknown versions", async () => {
    await expectError(header([MAGIC, u32(1), u64(0), u64(0), pad]), /version 1 is not supported/);
    await expectError(header([MAGIC, u32(4), u64(0), u64(0), pad]), /version 4 is not supported/);
  });
  test("counts past the end", async () => {
    await expectError(header([MAGIC, u32(3), u64(2n ** 60n), u64(0), pad]), /tensor count .* impossible/);
    await expectError(header([MAGIC, u32(3), u64(0), u64(1e6), pad]), /key\/value count .* impossible/);
  });
  test("a string length past the end", () => expectError(header([MAGIC, u32(3), u64(0), u64(1), u64(1e9), pad]), /metadata key #0 length .* impossible/));
  test("an array length past the end", () =>
    expectError(header([MAGIC, u32(3), u64(0), u64(1), str("k"), u32(9), u32(4), u64(1e6), pad]), /length of metadata array "k" .* impossible/));
  test("an array of more than 2^24 items (held as JS values, ~15x its bytes: 400M items aborted the process)", () =>
    expectError(header([MAGIC, u32(3), u64(0), u64(1), str("k"), u32(9), u32(0), u64(2 ** 24 + 1), Buffer.alloc(2 ** 24 + 1), pad]), /metadata array "k" has 16777217 items; more than 16777216 are not supported/));
  test("unknown value and item types, nested arrays", async () => {
    await expectError(header([MAGIC, u32(3), u64(0), u64(1), str("k"), u32(13), pad]), /unknown value type 13/);
    await expectError(header([MAGIC, u32(3), u64(0), u64(1), str("k"), u32(9), u32(77), u64(1), pad]), /unknown item type 77/);
    await expectError(header([MAGIC, u32(3), u64(0), u64(1), str("k"), u32(9), u32(9), u64(1), pad]), /holds arrays/);
  });
  test("duplicate keys", () => expectError(header([MAGIC, u32(3), u64(0), u64(2), str("k"), u32(0), Buffer.of(1), str("k"), u32(0), Buffer.of(2), pad]), /"k" appears twice/));
  const tensor = (name: string, dims: number[], type: number, off: number) => header([str(name), u32(dims.length), ...dims.map((d) => u64(d)), u32(type), u64(off)]);
  test("unknown ggml type", () => expectError(header([MAGIC, u32(3), u64(1), u64(0), tensor("t", [4], 5, 0), pad]), /tensor "t" has unknown ggml type 5/));
  test("misaligned tensor data", () => expectError(header([MAGIC, u32(3), u64(1), u64(0), tensor("t", [4], 0, 4), pad]), /offset 4 is not a multiple of the alignment 32/));
  test("tensor past the end", () => expectError(header([MAGIC, u32(3), u64(1), u64(0), tensor("t", [100], 0, 0), pad]), /runs past the end/));
  test("block size", () => expectError(header([MAGIC, u32(3), u64(1), u64(0), tensor("t", [33], 8, 0), pad]), /not a multiple of the 32-element block/));
  test("too many dims", () => expectError(header([MAGIC, u32(3), u64(1), u64(0), tensor("t", [1, 1, 1, 1, 1], 0, 0), pad]), /5 dimensions/));
  test("huge dims", () => expectError(header([MAGIC, u32(3), u64(1), u64(0), tensor("t", [2 ** 40, 2 ** 40], 0, 0), pad]), /more elements than the file can hold/));
  test("overlapping tensors", () =>
    expectError(header([MAGIC, u32(3), u64(2), u64(0), tensor("a", [16], 0, 0), tensor("b", [16], 0, 32), Buffer.alloc(256)]), /overlap/));
  test("bad alignment", () => expectError(header([MAGIC, u32(3), u64(0), u64(1), str("general.alignment"), u32(4), u32(48), pad]), /not a power of two/));
  test("a truncated header", () => expectError(header([MAGIC, u32(3), u64(0), u64(1), str("key"), u32(4)]).subarray(0, 40), /too short|past the end/));
  test("not a file", async () => {
    const err = await readGguf(tempDir()).then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(FormatError);
    expect((err as Error).message).toMatch(/not a regular file/);
  });
});
