// Safetensors: an 8-byte little-endian header length, a JSON header, then raw tensor bytes.
// The header is parsed here and every number in it is checked against the file; the native
// loader re-checks offsets against the mapped file size before it touches a byte.
import { open, stat, writeFile } from "node:fs/promises";
import { FormatError } from "../errors.js";

export type WeightDType = "F32" | "F16" | "BF16";

/** Bytes per element of every dtype the safetensors format defines. */
const DTYPE_BYTES: Record<string, number> = {
  F64: 8, F32: 4, F16: 2, BF16: 2, I64: 8, I32: 4, I16: 2, I8: 1, U8: 1, BOOL: 1,
  F8_E4M3: 1, F8_E5M2: 1, U16: 2, U32: 4, U64: 8,
};

export interface TensorInfo {
  name: string;
  dtype: string;
  shape: number[];
  /** Path of the file holding the bytes. */
  file: string;
  /** Absolute byte offset of the first element in `file`. */
  offset: number;
  nbytes: number;
}

/** Refuse headers larger than this: real ones are a few hundred KiB at most. */
const MAX_HEADER_BYTES = 100 * 1024 * 1024;

export function dtypeBytes(dtype: string): number {
  const n = DTYPE_BYTES[dtype];
  if (n === undefined) throw new Error(`unknown dtype "${dtype}"`);
  return n;
}

export async function readSafetensorsHeader(file: string): Promise<{ tensors: TensorInfo[]; metadata: Record<string, string> }> {
  const size = (await stat(file)).size;
  const fail = (msg: string): never => { throw new FormatError(file, msg); };
  if (size < 8) fail(`file is ${size} bytes, too short for a safetensors header`);
  const fh = await open(file, "r");
  try {
    const lenBuf = Buffer.alloc(8);
    await fh.read(lenBuf, 0, 8, 0);
    const headerLen = lenBuf.readBigUInt64LE(0);
    if (headerLen > BigInt(MAX_HEADER_BYTES)) fail(`header length ${headerLen} exceeds the ${MAX_HEADER_BYTES}-byte limit`);
    if (headerLen > BigInt(size - 8)) fail(`header length ${headerLen} runs past the end of the ${size}-byte file`);
    const hlen = Number(headerLen);
    const hbuf = Buffer.alloc(hlen);
    await fh.read(hbuf, 0, hlen, 8);
    let header: unknown;
    try {
      header = JSON.parse(hbuf.toString("utf8"));
    } catch (e) {
      return fail(`header is not valid JSON (${(e as Error).message})`);
    }
    if (typeof header !== "object" || header === null || Array.isArray(header)) return fail("header is not a JSON object");
    const dataStart = 8 + hlen;
    const dataLen = size - dataStart;
    const tensors: TensorInfo[] = [];
    let metadata: Record<string, string> = {};
    for (const [name, raw] of Object.entries(header as Record<string, unknown>)) {
      if (name === "__metadata__") {
        metadata = (raw ?? {}) as Record<string, string>;
        continue;
      }
      if (typeof raw !== "object" || raw === null) fail(`tensor "${name}": entry is not an object`);
      const { dtype, shape, data_offsets } = raw as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
      if (typeof dtype !== "string" || !(dtype in DTYPE_BYTES)) fail(`tensor "${name}": unknown dtype ${JSON.stringify(dtype)}`);
      if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
        fail(`tensor "${name}": shape ${JSON.stringify(shape)} is not a list of non-negative integers`);
      }
      if (!Array.isArray(data_offsets) || data_offsets.length !== 2 || !data_offsets.every((d) => Number.isSafeInteger(d) && d >= 0)) {
        fail(`tensor "${name}": data_offsets ${JSON.stringify(data_offsets)} is not a pair of non-negative integers`);
      }
      const [begin, end] = data_offsets as [number, number];
      const dims = shape as number[];
      const elements = dims.reduce((a, b) => a * b, 1);
      const expected = elements * DTYPE_BYTES[dtype as string];
      if (end < begin) fail(`tensor "${name}": data_offsets end ${end} is before begin ${begin}`);
      if (end > dataLen) fail(`tensor "${name}": data ends at byte ${end} of the data section, past its end (${dataLen} bytes; file truncated?)`);
      if (end - begin !== expected) {
        fail(`tensor "${name}": ${end - begin} bytes for shape [${dims.join(", ")}] of ${dtype}, expected ${expected}`);
      }
      tensors.push({ name, dtype: dtype as string, shape: dims, file, offset: dataStart + begin, nbytes: expected });
    }
    // Each tensor owns its bytes: two sharing or overlapping them is a broken (or crafted) file.
    const byOffset = [...tensors].sort((a, b) => a.offset - b.offset);
    for (let i = 1; i < byOffset.length; i++) {
      const prev = byOffset[i - 1], t = byOffset[i];
      if (t.nbytes > 0 && prev.nbytes > 0 && t.offset < prev.offset + prev.nbytes) fail(`tensors "${prev.name}" and "${t.name}" overlap in the data section`);
    }
    return { tensors, metadata };
  } finally {
    await fh.close();
  }
}

export interface TensorToWrite {
  name: string;
  dtype: WeightDType;
  shape: number[];
  data: Uint8Array;
}

/** Writes one safetensors file; tensor data is laid out in the given order, header padded to 8 bytes. */
export async function writeSafetensors(file: string, tensors: TensorToWrite[], metadata: Record<string, string> = {}): Promise<void> {
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length > 0) header.__metadata__ = metadata;
  let offset = 0;
  for (const t of tensors) {
    const expected = t.shape.reduce((a, b) => a * b, 1) * dtypeBytes(t.dtype);
    if (t.data.byteLength !== expected) throw new Error(`tensor "${t.name}": ${t.data.byteLength} bytes given for shape [${t.shape}] of ${t.dtype}, expected ${expected}`);
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + expected] };
    offset += expected;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - ((8 + Buffer.byteLength(json)) % 8)) % 8);
  const hbytes = Buffer.from(json, "utf8");
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(hbytes.length));
  await writeFile(file, [len, hbytes, ...tensors.map((t) => t.data)]);
}
