// Checksummed records for the memory store's LMDB tables. LMDB checks no data: a flipped bit in a
// record would come back as another text, another user id or a JSON error with no file named.
// Every record this store writes therefore carries a CRC-32 of its bytes, checked on every read:
//   JSON record:  0x01, CRC-32 (u32 LE) of the JSON bytes, the JSON bytes (UTF-8)
//   vector:       the float32 values (LE), then CRC-32 (u32 LE) of them
// A CRC-32 catches every flip of up to 3 bits in records this short, and all but 2^-32 of the rest.
// Records of stores written before schema version 2 have no checksum (plain JSON, bare floats);
// they are still read, unchecked: plain JSON never starts with byte 0x01, and a bare vector is 4
// bytes shorter, so the two kinds cannot be taken for each other.
import { crc32 } from "node:zlib";
import { StoreFileError } from "./errors.js";

const CHECKED = 0x01;

/**
 * An lmdb-js encoder (encode/decode) for JSON records of one table of `file`. `plain`: written
 * without checksum, for the records an older dki-engine must still read to refuse the store
 * cleanly (the schema record); read errors still name the file.
 */
export function checkedJson(file: string, table: string, plain = false): { encode(value: unknown): Buffer; decode(bytes: Uint8Array): unknown; needsStableBuffer: false } {
  const damaged = (what: string) => new StoreFileError(file, "memory store", `is damaged: a record of its ${table} table ${what}`);
  return {
    encode(value: unknown): Buffer {
      const json = Buffer.from(JSON.stringify(value), "utf8");
      if (plain) return json;
      const out = Buffer.allocUnsafe(5 + json.length);
      out[0] = CHECKED;
      out.writeUInt32LE(crc32(json), 1);
      json.copy(out, 5);
      return out;
    },
    decode(bytes: Uint8Array): unknown {
      // .length, not .byteLength: lmdb-js hands out its reused read buffer with .length set to the record's size.
      const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length);
      let json: Buffer = b;
      if (b[0] === CHECKED) {
        if (b.length < 5) throw damaged("is cut short");
        json = b.subarray(5);
        if (crc32(json) !== b.readUInt32LE(1)) throw damaged("fails its checksum");
      }
      try {
        return JSON.parse(json.toString("utf8"));
      } catch (e) {
        throw damaged(`is not JSON (${(e as Error).message})`);
      }
    },
    needsStableBuffer: false,
  };
}

/** A vector's bytes as stored: its values, then their CRC-32. */
export function checkedVectorBytes(v: Float32Array): Buffer {
  const values = Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  const out = Buffer.allocUnsafe(values.length + 4);
  values.copy(out);
  out.writeUInt32LE(crc32(values), values.length);
  return out;
}

/** A stored vector of `dim` values read back (a copy), checked; `where` names it in an error. */
export function readCheckedVector(bytes: Uint8Array, dim: number, file: string, where: string): Float32Array {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length);
  const n = dim * 4;
  if (b.length === n + 4) {
    if (crc32(b.subarray(0, n)) !== b.readUInt32LE(n)) throw new StoreFileError(file, "memory store", `is damaged: the vector of ${where} fails its checksum`);
  } else if (b.length !== n) {
    throw new StoreFileError(file, "memory store", `is damaged: the vector of ${where} is ${b.length} bytes, not ${n} (+4)`);
  }
  // Copied: LMDB may hand out a view of a reused buffer.
  const v = new Float32Array(dim);
  new Uint8Array(v.buffer).set(b.subarray(0, n));
  return v;
}
