// GGUF, llama.cpp's model file: a little-endian header (magic "GGUF", version, tensor and
// metadata counts), typed metadata key/value pairs, tensor infos (name, dims with ne0 — the row
// length — first, ggml type, offset into the data section), then the aligned tensor data.
// The header is read incrementally through a file handle (multi-GB files are never read whole)
// and every count, length and offset is checked against the file size before it is trusted.
import { open, rename, stat, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { FormatError } from "../errors.js";

/** Items of one metadata array (a tokenizer's 256k-token vocabulary and its merges fit many times). */
const MAX_ARRAY_ITEMS = 1 << 24;

// ---------------------------------------------------------------------------------------------
// ggml tensor types

interface GgmlTypeInfo {
  name: string;
  /** Elements per block (1 for plain types). */
  blockSize: number;
  /** Bytes per block. */
  typeSize: number;
}

/** Every ggml type id a GGUF file may name, with its block layout (ids 4, 5, 31-33 and 36-38 were removed from ggml). */
const GGML_TYPES: Record<number, GgmlTypeInfo> = {
  0: { name: "F32", blockSize: 1, typeSize: 4 },
  1: { name: "F16", blockSize: 1, typeSize: 2 },
  2: { name: "Q4_0", blockSize: 32, typeSize: 18 },
  3: { name: "Q4_1", blockSize: 32, typeSize: 20 },
  6: { name: "Q5_0", blockSize: 32, typeSize: 22 },
  7: { name: "Q5_1", blockSize: 32, typeSize: 24 },
  8: { name: "Q8_0", blockSize: 32, typeSize: 34 },
  9: { name: "Q8_1", blockSize: 32, typeSize: 36 },
  10: { name: "Q2_K", blockSize: 256, typeSize: 84 },
  11: { name: "Q3_K", blockSize: 256, typeSize: 110 },
  12: { name: "Q4_K", blockSize: 256, typeSize: 144 },
  13: { name: "Q5_K", blockSize: 256, typeSize: 176 },
  14: { name: "Q6_K", blockSize: 256, typeSize: 210 },
  15: { name: "Q8_K", blockSize: 256, typeSize: 292 },
  16: { name: "IQ2_XXS", blockSize: 256, typeSize: 66 },
  17: { name: "IQ2_XS", blockSize: 256, typeSize: 74 },
  18: { name: "IQ3_XXS", blockSize: 256, typeSize: 98 },
  19: { name: "IQ1_S", blockSize: 256, typeSize: 50 },
  20: { name: "IQ4_NL", blockSize: 32, typeSize: 18 },
  21: { name: "IQ3_S", blockSize: 256, typeSize: 110 },
  22: { name: "IQ2_S", blockSize: 256, typeSize: 82 },
  23: { name: "IQ4_XS", blockSize: 256, typeSize: 136 },
  24: { name: "I8", blockSize: 1, typeSize: 1 },
  25: { name: "I16", blockSize: 1, typeSize: 2 },
  26: { name: "I32", blockSize: 1, typeSize: 4 },
  27: { name: "I64", blockSize: 1, typeSize: 8 },
  28: { name: "F64", blockSize: 1, typeSize: 8 },
  29: { name: "IQ1_M", blockSize: 256, typeSize: 56 },
  30: { name: "BF16", blockSize: 1, typeSize: 2 },
  34: { name: "TQ1_0", blockSize: 256, typeSize: 54 },
  35: { name: "TQ2_0", blockSize: 256, typeSize: 66 },
  39: { name: "MXFP4", blockSize: 32, typeSize: 17 },
};

/** The ggml type ids this package reads and writes tensor data of. */
export const GgmlType = { F32: 0, F16: 1, Q8_0: 8, BF16: 30 } as const;

/** The name of a ggml type id ("Q4_K"), or `type N` for an id ggml does not define. */
export function ggmlTypeName(type: number): string {
  return GGML_TYPES[type]?.name ?? `type ${type}`;
}

/** Bytes of a tensor of this type and dims (ne0 first); throws when ne0 is not a whole number of blocks. */
export function ggmlTensorBytes(type: number, dims: readonly number[]): number {
  const t = GGML_TYPES[type];
  if (!t) throw new Error(`unknown ggml type ${type}`);
  const ne0 = dims[0] ?? 1;
  if (ne0 % t.blockSize !== 0) throw new Error(`${t.name} rows of ${ne0} elements are not a multiple of its ${t.blockSize}-element block`);
  const rows = dims.slice(1).reduce((a, b) => a * b, 1);
  return (ne0 / t.blockSize) * t.typeSize * rows;
}

// ---------------------------------------------------------------------------------------------
// Metadata values

export type GgufScalarType = "u8" | "i8" | "u16" | "i16" | "u32" | "i32" | "f32" | "bool" | "string" | "u64" | "i64" | "f64";
export type GgufScalar = number | bigint | boolean | string;

/**
 * One metadata value with its GGUF type. Integers are numbers, except 64-bit ones beyond 2^53,
 * which are bigints; a writer accepts either for any integer type.
 */
export type GgufEntry =
  | { type: GgufScalarType; value: GgufScalar }
  | { type: "array"; itemType: GgufScalarType; value: GgufScalar[] };

export type GgufMetadata = Map<string, GgufEntry>;

const VALUE_TYPE_IDS: Record<GgufScalarType | "array", number> = {
  u8: 0, i8: 1, u16: 2, i16: 3, u32: 4, i32: 5, f32: 6, bool: 7, string: 8, array: 9, u64: 10, i64: 11, f64: 12,
};
const VALUE_TYPE_NAMES: (GgufScalarType | "array")[] = ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"];
/** Bytes of a fixed-size value; strings take at least their 8-byte length. */
const VALUE_BYTES: Record<GgufScalarType, number> = { u8: 1, i8: 1, u16: 2, i16: 2, u32: 4, i32: 4, f32: 4, bool: 1, string: 8, u64: 8, i64: 8, f64: 8 };

// ---------------------------------------------------------------------------------------------
// Reading

export interface GgufTensorInfo {
  name: string;
  /** ggml type id. */
  type: number;
  typeName: string;
  /** ggml dims, ne0 (the contiguous row length) first. */
  dims: number[];
  /** Absolute byte offset of the tensor's data in the file. */
  offset: number;
  nbytes: number;
}

export interface GgufFile {
  file: string;
  version: number;
  /** File size in bytes. */
  size: number;
  alignment: number;
  /** Absolute offset of the data section. */
  dataOffset: number;
  metadata: GgufMetadata;
  tensors: GgufTensorInfo[];
}

export const GGUF_MAGIC = 0x46554747; // "GGUF" read as a little-endian u32
export const GGUF_DEFAULT_ALIGNMENT = 32;
/** ggml's GGML_MAX_DIMS. */
const MAX_DIMS = 4;
/** ggml's GGML_MAX_NAME, terminating NUL included. */
const MAX_TENSOR_NAME = 64;
const CHUNK = 1 << 20;

/** Buffered little-endian reads from a file handle, each checked against the file size. */
class HeaderReader {
  private buf = Buffer.alloc(0);
  /** File offset of buf[0]. */
  private bufStart = 0;
  /** Current file offset. */
  pos = 0;
  private readonly decoder = new TextDecoder("utf-8");

  constructor(private readonly fh: import("node:fs/promises").FileHandle, readonly size: number, private readonly fail: (msg: string) => never) {}

  get remaining(): number {
    return this.size - this.pos;
  }

  /** Makes `n` bytes from `pos` available in the buffer, or fails naming `what`. */
  async need(n: number, what: string): Promise<void> {
    if (n > this.size - this.pos) {
      this.fail(`${what} at byte ${this.pos} needs ${n} bytes, past the end of the ${this.size}-byte file (truncated?)`);
    }
    if (this.pos + n <= this.bufStart + this.buf.length) return;
    const len = Math.min(Math.max(n, CHUNK), this.size - this.pos);
    const buf = Buffer.allocUnsafe(len);
    let got = 0;
    while (got < len) {
      const { bytesRead } = await this.fh.read(buf, got, len - got, this.pos + got);
      if (bytesRead === 0) this.fail(`file ended at byte ${this.pos + got} while reading ${what} (it shrank while being read?)`);
      got += bytesRead;
    }
    this.buf = buf;
    this.bufStart = this.pos;
  }

  /** Bytes from `pos` that are already in the buffer. */
  get buffered(): number {
    return this.bufStart + this.buf.length - this.pos;
  }

  /**
   * The next string when it is already buffered (length prefix and bytes), else undefined with
   * nothing consumed. Lets the large token/merge arrays be read without a promise per item.
   */
  bufferedString(): string | undefined {
    if (this.buffered < 8) return undefined;
    const o = this.pos - this.bufStart;
    const len = this.buf.readUInt32LE(o + 4) * 2 ** 32 + this.buf.readUInt32LE(o);
    if (len > this.buffered - 8) return undefined; // also covers lengths past the end: the slow path reports them
    this.pos += 8 + len;
    return this.decoder.decode(this.buf.subarray(o + 8, o + 8 + len));
  }

  private at(n: number): number {
    const o = this.pos - this.bufStart;
    this.pos += n;
    return o;
  }

  // These assume `need` was called for the bytes.
  u8(): number { return this.buf.readUInt8(this.at(1)); }
  i8(): number { return this.buf.readInt8(this.at(1)); }
  u16(): number { return this.buf.readUInt16LE(this.at(2)); }
  i16(): number { return this.buf.readInt16LE(this.at(2)); }
  u32(): number { return this.buf.readUInt32LE(this.at(4)); }
  i32(): number { return this.buf.readInt32LE(this.at(4)); }
  f32(): number { return this.buf.readFloatLE(this.at(4)); }
  f64(): number { return this.buf.readDoubleLE(this.at(8)); }
  u64(): bigint { return this.buf.readBigUInt64LE(this.at(8)); }
  i64(): bigint { return this.buf.readBigInt64LE(this.at(8)); }

  /** A u64 that must fit in a JS number and be at most `max`. */
  async count(what: string, max: number): Promise<number> {
    await this.need(8, what);
    const at = this.pos;
    const v = this.u64();
    if (v > BigInt(max)) this.fail(`${what} ${v} at byte ${at} is impossible in a ${this.size}-byte file`);
    return Number(v);
  }

  async string(what: string): Promise<string> {
    const len = await this.count(`${what} length`, this.remaining - 8);
    await this.need(len, what);
    const o = this.at(len);
    return this.decoder.decode(this.buf.subarray(o, o + len));
  }
}

/** A key or name for an error message: quoted, control characters escaped, long ones cut. */
const q = (s: string): string => JSON.stringify(s.length > 80 ? s.slice(0, 80) + "…" : s);

const toNumberIfSafe = (v: bigint): number | bigint => (v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v);

async function readScalar(r: HeaderReader, type: GgufScalarType, what: string, fail: (m: string) => never): Promise<GgufScalar> {
  if (type === "string") return r.string(what);
  await r.need(VALUE_BYTES[type], what);
  return bufferedScalar(r, type, () => what, fail);
}

/** A fixed-size scalar whose bytes are buffered (`what` is only built for an error message). */
function bufferedScalar(r: HeaderReader, type: Exclude<GgufScalarType, "string">, what: () => string, fail: (m: string) => never): GgufScalar {
  switch (type) {
    case "u8": return r.u8();
    case "i8": return r.i8();
    case "u16": return r.u16();
    case "i16": return r.i16();
    case "u32": return r.u32();
    case "i32": return r.i32();
    case "f32": return r.f32();
    case "f64": return r.f64();
    case "u64": return toNumberIfSafe(r.u64());
    case "i64": return toNumberIfSafe(r.i64());
    case "bool": {
      const b = r.u8();
      if (b > 1) fail(`${what()}: bool byte is ${b}, not 0 or 1`);
      return b === 1;
    }
  }
}

/** Reads and checks a GGUF header: metadata and tensor infos (no tensor data). */
export async function readGguf(file: string): Promise<GgufFile> {
  const fail = (msg: string): never => { throw new FormatError(file, msg); };
  let st;
  try {
    st = await stat(file);
  } catch (e) {
    return fail(`cannot read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  if (!st.isFile()) fail("not a regular file");
  const size = st.size;
  if (size < 24) fail(`file is ${size} bytes, too short for a GGUF header`);
  const fh = await open(file, "r");
  try {
    const r = new HeaderReader(fh, size, fail);
    await r.need(8, "header");
    const magic = r.u32();
    if (magic !== GGUF_MAGIC) {
      const bytes = Buffer.alloc(4);
      bytes.writeUInt32LE(magic);
      fail(`bad magic ${JSON.stringify(bytes.toString("latin1"))} (0x${magic.toString(16).padStart(8, "0")}): not a GGUF file`);
    }
    const version = r.u32();
    if (version === 1) fail("GGUF version 1 is not supported (versions 2 and 3 are): reconvert the model");
    if (version !== 2 && version !== 3) fail(`GGUF version ${version} is not supported (versions 2 and 3 are)`);
    // Every tensor info takes at least 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset)
    // bytes, every key/value at least 8 (key length) + 4 (type) + 1 bytes.
    const tensorCount = await r.count("tensor count", Math.floor((r.remaining - 8) / 32));
    const kvCount = await r.count("metadata key/value count", Math.floor((r.remaining - tensorCount * 32) / 13));

    const metadata: GgufMetadata = new Map();
    for (let i = 0; i < kvCount; i++) {
      const key = await r.string(`metadata key #${i}`);
      if (metadata.has(key)) fail(`metadata key ${q(key)} appears twice`);
      await r.need(4, `type of metadata ${q(key)}`);
      const typeAt = r.pos;
      const typeId = r.u32();
      const type = VALUE_TYPE_NAMES[typeId];
      if (type === undefined) fail(`metadata ${q(key)} has unknown value type ${typeId} (at byte ${typeAt})`);
      if (type === "array") {
        await r.need(4, `item type of metadata array ${q(key)}`);
        const itemId = r.u32();
        const itemType = VALUE_TYPE_NAMES[itemId];
        if (itemType === undefined) fail(`metadata array ${q(key)} has unknown item type ${itemId}`);
        if (itemType === "array") fail(`metadata array ${q(key)} holds arrays, which GGUF readers do not support`);
        const t = itemType as GgufScalarType;
        const n = await r.count(`length of metadata array ${q(key)}`, Math.floor(r.remaining / VALUE_BYTES[t]));
        // Items become JS values (~15× their bytes): a file's size alone does not bound the memory.
        if (n > MAX_ARRAY_ITEMS) fail(`metadata array ${q(key)} has ${n} items; more than ${MAX_ARRAY_ITEMS} are not supported`);
        const value: GgufScalar[] = new Array(n);
        for (let j = 0; j < n; j++) {
          // Tokenizer arrays hold ~10⁵ items: read buffered ones synchronously, no promise each.
          const fast = t === "string" ? r.bufferedString() : r.buffered >= VALUE_BYTES[t] ? bufferedScalar(r, t, () => `item ${j} of metadata array ${q(key)}`, fail) : undefined;
          value[j] = fast !== undefined ? fast : await readScalar(r, t, `item ${j} of metadata array ${q(key)}`, fail);
        }
        metadata.set(key, { type: "array", itemType: t, value });
      } else {
        const t = type as GgufScalarType;
        metadata.set(key, { type: t, value: await readScalar(r, t, `metadata ${q(key)}`, fail) });
      }
    }

    let alignment = GGUF_DEFAULT_ALIGNMENT;
    const al = metadata.get("general.alignment");
    if (al) {
      if (al.type !== "u32") fail(`general.alignment has type ${al.type}, expected u32`);
      const a = al.value as number;
      if (a === 0 || (a & (a - 1)) !== 0) fail(`general.alignment ${a} is not a power of two`);
      alignment = a;
    }

    const raw: { name: string; type: number; dims: number[]; rel: number; nbytes: number }[] = [];
    const names = new Set<string>();
    for (let i = 0; i < tensorCount; i++) {
      const name = await r.string(`name of tensor #${i}`);
      const label = `tensor ${q(name)}`;
      if (Buffer.byteLength(name) >= MAX_TENSOR_NAME) fail(`${label}: name is ${Buffer.byteLength(name)} bytes, ggml allows at most ${MAX_TENSOR_NAME - 1}`);
      if (names.has(name)) fail(`${label} appears twice`);
      names.add(name);
      await r.need(4, `${label} dimension count`);
      const nDims = r.u32();
      if (nDims < 1 || nDims > MAX_DIMS) fail(`${label} has ${nDims} dimensions (1 to ${MAX_DIMS} allowed)`);
      await r.need(8 * nDims + 4 + 8, `${label} dims, type and offset`);
      const dims: number[] = [];
      let elements = 1n;
      for (let d = 0; d < nDims; d++) {
        const v = r.u64();
        if (v > BigInt(Number.MAX_SAFE_INTEGER)) fail(`${label} dimension ${d} is ${v}, beyond what this reader handles`);
        elements *= v;
        if (elements > BigInt(size) * 8n) fail(`${label} dims [${[...dims, v].join(", ")}${d + 1 < nDims ? ", …" : ""}] describe more elements than the file can hold`);
        dims.push(Number(v));
      }
      const type = r.u32();
      const info = GGML_TYPES[type];
      if (!info) fail(`${label} has unknown ggml type ${type}`);
      const rel = r.u64();
      if (dims[0] % info.blockSize !== 0) fail(`${label} is ${info.name} but its rows of ${dims[0]} elements are not a multiple of the ${info.blockSize}-element block`);
      if (rel % BigInt(alignment) !== 0n) fail(`${label} data offset ${rel} is not a multiple of the alignment ${alignment}`);
      if (rel > BigInt(size)) fail(`${label} data offset ${rel} is past the end of the ${size}-byte file`);
      raw.push({ name, type, dims, rel: Number(rel), nbytes: ggmlTensorBytes(type, dims) });
    }
    const dataOffset = Math.ceil(r.pos / alignment) * alignment;
    const tensors: GgufTensorInfo[] = raw.map((t) => {
      const offset = dataOffset + t.rel;
      if (offset + t.nbytes > size) {
        fail(`tensor ${q(t.name)} (${ggmlTypeName(t.type)} [${t.dims.join(", ")}]) at bytes ${offset}..${offset + t.nbytes} runs past the end of the ${size}-byte file (truncated?)`);
      }
      return { name: t.name, type: t.type, typeName: ggmlTypeName(t.type), dims: t.dims, offset, nbytes: t.nbytes };
    });
    const byOffset = [...tensors].sort((a, b) => a.offset - b.offset);
    for (let i = 1; i < byOffset.length; i++) {
      const prev = byOffset[i - 1];
      if (byOffset[i].offset < prev.offset + prev.nbytes) fail(`tensors ${q(prev.name)} and ${q(byOffset[i].name)} overlap`);
    }
    return { file, version, size, alignment, dataOffset, metadata, tensors };
  } finally {
    await fh.close();
  }
}

// ---------------------------------------------------------------------------------------------
// Metadata accessors

/** Typed views of metadata values for readers of a GgufFile; each failure names the file and key. */
export class GgufMeta {
  constructor(readonly file: string, readonly map: GgufMetadata) {}

  private fail(msg: string): never {
    throw new FormatError(this.file, msg);
  }

  has(key: string): boolean {
    return this.map.has(key);
  }

  /** A non-negative integer (any integer type). */
  int(key: string, dflt?: number): number {
    const e = this.map.get(key);
    if (!e) {
      if (dflt !== undefined) return dflt;
      return this.fail(`metadata "${key}" is missing`);
    }
    const v = e.value;
    if (e.type === "array" || e.type === "string" || e.type === "bool" || e.type === "f32" || e.type === "f64" || typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
      return this.fail(`metadata "${key}" must be a non-negative integer, got ${describe(e)}`);
    }
    return v;
  }

  /** A finite number (float or integer type). */
  num(key: string, dflt?: number): number {
    const e = this.map.get(key);
    if (!e) {
      if (dflt !== undefined) return dflt;
      return this.fail(`metadata "${key}" is missing`);
    }
    if (e.type === "array" || typeof e.value !== "number" || !Number.isFinite(e.value)) return this.fail(`metadata "${key}" must be a number, got ${describe(e)}`);
    return e.value;
  }

  str(key: string): string | undefined;
  str(key: string, required: true): string;
  str(key: string, required = false): string | undefined {
    const e = this.map.get(key);
    if (!e) return required ? this.fail(`metadata "${key}" is missing`) : undefined;
    if (e.type !== "string") return this.fail(`metadata "${key}" must be a string, got ${describe(e)}`);
    return e.value as string;
  }

  bool(key: string): boolean | undefined {
    const e = this.map.get(key);
    if (!e) return undefined;
    if (e.type !== "bool") return this.fail(`metadata "${key}" must be a bool, got ${describe(e)}`);
    return e.value as boolean;
  }

  /** An array whose items are strings ("string") or numbers ("number"). */
  arr(key: string, kind: "string"): string[] | undefined;
  arr(key: string, kind: "number"): number[] | undefined;
  arr(key: string, kind: "string" | "number"): (string | number)[] | undefined {
    const e = this.map.get(key);
    if (!e) return undefined;
    if (e.type !== "array") return this.fail(`metadata "${key}" must be an array, got ${describe(e)}`);
    const isString = e.itemType === "string";
    const isNumber = !isString && e.itemType !== "bool" && e.value.every((x) => typeof x === "number");
    if (kind === "string" ? !isString : !isNumber) return this.fail(`metadata "${key}" must be an array of ${kind}s, got an array of ${e.itemType}`);
    return e.value as (string | number)[];
  }
}

function describe(e: GgufEntry): string {
  if (e.type === "array") return `an array of ${e.value.length} ${e.itemType}`;
  return `${e.type} ${typeof e.value === "string" ? JSON.stringify(e.value.length > 40 ? e.value.slice(0, 40) + "…" : e.value) : String(e.value)}`;
}

// ---------------------------------------------------------------------------------------------
// Writing

export interface GgufTensorToWrite {
  name: string;
  /** ggml type id (GgmlType.F32, …). */
  type: number;
  /** ggml dims, ne0 (the contiguous row length) first. */
  dims: number[];
  /** The bytes, or a function producing them in order, chunk by chunk (streamed to the file). */
  data: Uint8Array | (() => AsyncIterable<Uint8Array> | Iterable<Uint8Array>);
}

export interface GgufToWrite {
  /** Written in insertion order. `general.alignment` is added when `alignment` is not 32. */
  metadata: GgufMetadata | Record<string, GgufEntry>;
  tensors: GgufTensorToWrite[];
  /** Tensor data alignment (default 32). */
  alignment?: number;
}

class ByteSink {
  private parts: Buffer[] = [];
  length = 0;
  push(b: Buffer): void {
    this.parts.push(b);
    this.length += b.length;
  }
  u32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    this.push(b);
  }
  u64(v: number | bigint): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.push(b);
  }
  string(s: string): void {
    const b = Buffer.from(s, "utf8");
    this.u64(b.length);
    this.push(b);
  }
  concat(): Buffer {
    return Buffer.concat(this.parts, this.length);
  }
}

function writeScalar(out: ByteSink, type: GgufScalarType, v: GgufScalar, key: string): void {
  const bad = (): never => { throw new Error(`gguf: metadata "${key}": ${typeof v} ${String(v)} is not a valid ${type}`); };
  if (type === "string") {
    if (typeof v !== "string") bad();
    out.string(v as string);
    return;
  }
  if (type === "bool") {
    if (typeof v !== "boolean") bad();
    out.push(Buffer.of(v ? 1 : 0));
    return;
  }
  const b = Buffer.alloc(VALUE_BYTES[type]);
  if (type === "f32" || type === "f64") {
    if (typeof v !== "number") bad();
    if (type === "f32") b.writeFloatLE(v as number);
    else b.writeDoubleLE(v as number);
  } else {
    if (typeof v !== "number" && typeof v !== "bigint") bad();
    if (typeof v === "number" && !Number.isInteger(v)) bad();
    try {
      switch (type) {
        case "u8": b.writeUInt8(Number(v)); break;
        case "i8": b.writeInt8(Number(v)); break;
        case "u16": b.writeUInt16LE(Number(v)); break;
        case "i16": b.writeInt16LE(Number(v)); break;
        case "u32": b.writeUInt32LE(Number(v)); break;
        case "i32": b.writeInt32LE(Number(v)); break;
        case "u64": b.writeBigUInt64LE(BigInt(v as number | bigint)); break;
        case "i64": b.writeBigInt64LE(BigInt(v as number | bigint)); break;
      }
    } catch {
      bad();
    }
  }
  out.push(b);
}

/**
 * Writes a GGUF v3 file: header and metadata first, then each tensor's data in order, each
 * starting on the alignment, streamed from its producer. Offsets are laid out exactly as
 * llama.cpp's writer does (contiguous, every tensor padded to the alignment).
 */
export async function writeGguf(file: string, spec: GgufToWrite): Promise<void> {
  const alignment = spec.alignment ?? GGUF_DEFAULT_ALIGNMENT;
  if (!Number.isInteger(alignment) || alignment <= 0 || (alignment & (alignment - 1)) !== 0) throw new Error(`gguf: alignment ${alignment} is not a power of two`);
  const entries: [string, GgufEntry][] = spec.metadata instanceof Map ? [...spec.metadata] : Object.entries(spec.metadata);
  const meta = entries.filter(([k]) => k !== "general.alignment");
  if (alignment !== GGUF_DEFAULT_ALIGNMENT) meta.unshift(["general.alignment", { type: "u32", value: alignment }]);

  const out = new ByteSink();
  out.u32(GGUF_MAGIC);
  out.u32(3);
  out.u64(spec.tensors.length);
  out.u64(meta.length);
  for (const [key, e] of meta) {
    out.string(key);
    out.u32(VALUE_TYPE_IDS[e.type]);
    if (e.type === "array") {
      if (!(e.itemType in VALUE_BYTES)) throw new Error(`gguf: metadata "${key}": bad item type ${String(e.itemType)}`);
      out.u32(VALUE_TYPE_IDS[e.itemType]);
      out.u64(e.value.length);
      for (const v of e.value) writeScalar(out, e.itemType, v, key);
    } else {
      if (!(e.type in VALUE_BYTES)) throw new Error(`gguf: metadata "${key}": bad type ${String(e.type)}`);
      writeScalar(out, e.type, e.value, key);
    }
  }
  const pad = (n: number) => (alignment - (n % alignment)) % alignment;
  let rel = 0;
  const sizes: number[] = [];
  for (const t of spec.tensors) {
    if (Buffer.byteLength(t.name) >= MAX_TENSOR_NAME) throw new Error(`gguf: tensor name "${t.name}" is longer than ${MAX_TENSOR_NAME - 1} bytes`);
    if (t.dims.length < 1 || t.dims.length > MAX_DIMS) throw new Error(`gguf: tensor "${t.name}" has ${t.dims.length} dims`);
    const nbytes = ggmlTensorBytes(t.type, t.dims);
    sizes.push(nbytes);
    out.string(t.name);
    out.u32(t.dims.length);
    for (const d of t.dims) out.u64(d);
    out.u32(t.type);
    out.u64(rel);
    rel += nbytes + pad(nbytes);
  }
  out.push(Buffer.alloc(pad(out.length)));
  const header = out.concat();

  // Written beside the target and renamed over it once complete and on disk: a failed or
  // interrupted write leaves any previous file whole (and a process that maps it unharmed).
  const tmp = join(dirname(file), `.${basename(file)}.${process.pid}.${Date.now()}.tmp`);
  const fh = await open(tmp, "wx");
  let complete = false;
  try {
    let pos = 0;
    const write = async (b: Uint8Array) => {
      let done = 0;
      while (done < b.byteLength) {
        const { bytesWritten } = await fh.write(b, done, b.byteLength - done, pos + done);
        done += bytesWritten;
      }
      pos += b.byteLength;
    };
    await write(header);
    for (let i = 0; i < spec.tensors.length; i++) {
      const t = spec.tensors[i];
      let written = 0;
      const chunks = t.data instanceof Uint8Array ? [t.data] : t.data();
      for await (const c of chunks) {
        written += c.byteLength;
        if (written > sizes[i]) break;
        await write(c);
      }
      if (written !== sizes[i]) throw new Error(`gguf: tensor "${t.name}" produced ${written > sizes[i] ? "more than" : "only"} ${written} bytes, ${ggmlTypeName(t.type)} [${t.dims.join(", ")}] needs ${sizes[i]}`);
      await write(Buffer.alloc(pad(sizes[i])));
    }
    await fh.sync();
    complete = true;
  } finally {
    await fh.close();
    if (!complete) await unlink(tmp).catch(() => {});
  }
  try {
    await rename(tmp, file);
  } catch (e) {
    await unlink(tmp).catch(() => {});
    throw e;
  }
}
