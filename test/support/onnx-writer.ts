// A minimal ONNX model writer for tests: just enough of the protobuf wire format and of
// onnx.proto (ModelProto, GraphProto, NodeProto, AttributeProto, TensorProto, ValueInfoProto) to
// build small graphs whose outputs a test can recompute by hand. onnxruntime validates what it
// loads, so a wrong field number or wire type here shows up as a load error, not a wrong result.

// ---- protobuf wire format ----

const WIRE_VARINT = 0;
const WIRE_FIXED32 = 5;
const WIRE_BYTES = 2;

class ProtoWriter {
  private chunks: Uint8Array[] = [];

  private push(bytes: number[] | Uint8Array): void {
    this.chunks.push(bytes instanceof Uint8Array ? bytes : Uint8Array.from(bytes));
  }

  private varint(value: bigint): void {
    // int64 fields are encoded as 64-bit two's complement: negatives take 10 bytes.
    let v = BigInt.asUintN(64, value);
    const out: number[] = [];
    while (v >= 0x80n) {
      out.push(Number(v & 0x7fn) | 0x80);
      v >>= 7n;
    }
    out.push(Number(v));
    this.push(out);
  }

  private tag(field: number, wire: number): void {
    this.varint(BigInt((field << 3) | wire));
  }

  int(field: number, value: number | bigint): this {
    this.tag(field, WIRE_VARINT);
    this.varint(BigInt(value));
    return this;
  }

  float(field: number, value: number): this {
    this.tag(field, WIRE_FIXED32);
    const b = new Uint8Array(4);
    new DataView(b.buffer).setFloat32(0, value, true);
    this.push(b);
    return this;
  }

  bytes(field: number, value: Uint8Array): this {
    this.tag(field, WIRE_BYTES);
    this.varint(BigInt(value.length));
    this.push(value);
    return this;
  }

  string(field: number, value: string): this {
    return this.bytes(field, new TextEncoder().encode(value));
  }

  message(field: number, body: ProtoWriter): this {
    return this.bytes(field, body.finish());
  }

  finish(): Uint8Array {
    const total = this.chunks.reduce((n, c) => n + c.length, 0);
    const out = new Uint8Array(total);
    let at = 0;
    for (const c of this.chunks) {
      out.set(c, at);
      at += c.length;
    }
    return out;
  }
}

// ---- onnx.proto ----

/** TensorProto.DataType values used here. */
export const DataType = { FLOAT: 1, INT32: 6, INT64: 7 } as const;
export type DataTypeId = (typeof DataType)[keyof typeof DataType];

export type AttributeValue =
  | { kind: "float"; value: number }
  | { kind: "int"; value: number }
  | { kind: "floats"; value: number[] }
  | { kind: "ints"; value: number[] };

export interface OnnxNode {
  op: string;
  inputs: string[];
  outputs: string[];
  attributes?: Record<string, AttributeValue>;
}

export interface OnnxTensor {
  name: string;
  dims: number[];
  type: DataTypeId;
  /** Values in row-major order; stored as little-endian raw_data. */
  data: ArrayLike<number> | BigInt64Array;
}

/** A graph input or output: element type and dims (a string is a symbolic dimension). */
export interface OnnxValueInfo {
  name: string;
  type: DataTypeId;
  shape: (number | string)[];
}

export interface OnnxGraph {
  name: string;
  nodes: OnnxNode[];
  initializers: OnnxTensor[];
  inputs: OnnxValueInfo[];
  outputs: OnnxValueInfo[];
}

const ATTR_TYPE = { float: 1, int: 2, floats: 6, ints: 7 } as const;

function attributeProto(name: string, a: AttributeValue): ProtoWriter {
  const w = new ProtoWriter().string(1, name);
  if (a.kind === "float") w.float(2, a.value);
  else if (a.kind === "int") w.int(3, a.value);
  else if (a.kind === "floats") for (const v of a.value) w.float(7, v);
  else for (const v of a.value) w.int(8, v);
  return w.int(20, ATTR_TYPE[a.kind]);
}

function nodeProto(n: OnnxNode, index: number): ProtoWriter {
  const w = new ProtoWriter();
  for (const i of n.inputs) w.string(1, i);
  for (const o of n.outputs) w.string(2, o);
  w.string(3, `${n.op}_${index}`).string(4, n.op);
  for (const [name, a] of Object.entries(n.attributes ?? {})) w.message(5, attributeProto(name, a));
  return w;
}

function rawData(t: OnnxTensor): Uint8Array {
  const count = t.dims.reduce((a, b) => a * b, 1);
  if (t.data.length !== count) throw new Error(`tensor ${t.name}: ${t.data.length} values for dims [${t.dims}]`);
  if (t.type === DataType.FLOAT) return new Uint8Array(Float32Array.from(t.data as ArrayLike<number>).buffer);
  if (t.type === DataType.INT32) return new Uint8Array(Int32Array.from(t.data as ArrayLike<number>).buffer);
  const big = t.data instanceof BigInt64Array ? t.data : BigInt64Array.from(Array.from(t.data as ArrayLike<number>, (v) => BigInt(v)));
  return new Uint8Array(big.buffer, big.byteOffset, big.byteLength);
}

function tensorProto(t: OnnxTensor): ProtoWriter {
  const w = new ProtoWriter();
  for (const d of t.dims) w.int(1, d);
  return w.int(2, t.type).string(8, t.name).bytes(9, rawData(t));
}

function valueInfoProto(v: OnnxValueInfo): ProtoWriter {
  const shape = new ProtoWriter();
  for (const d of v.shape) {
    shape.message(1, typeof d === "number" ? new ProtoWriter().int(1, d) : new ProtoWriter().string(2, d));
  }
  const tensorType = new ProtoWriter().int(1, v.type).message(2, shape);
  return new ProtoWriter().string(1, v.name).message(2, new ProtoWriter().message(1, tensorType));
}

/** Serialises a graph as an ONNX model (IR version 8, default-domain opset 17). */
export function writeOnnxModel(graph: OnnxGraph, opts: { irVersion?: number; opset?: number } = {}): Uint8Array {
  const g = new ProtoWriter();
  graph.nodes.forEach((n, i) => g.message(1, nodeProto(n, i)));
  g.string(2, graph.name);
  for (const t of graph.initializers) g.message(5, tensorProto(t));
  for (const v of graph.inputs) g.message(11, valueInfoProto(v));
  for (const v of graph.outputs) g.message(12, valueInfoProto(v));
  return new ProtoWriter()
    .int(1, opts.irVersion ?? 8)
    .string(2, "dki-engine test/support/onnx-writer")
    .message(7, g)
    .message(8, new ProtoWriter().string(1, "").int(2, opts.opset ?? 17))
    .finish();
}
