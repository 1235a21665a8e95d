// Hugging Face folder → GGUF, laid out as llama.cpp's convert_hf_to_gguf.py writes it, so that
// llama.cpp itself loads the result: its metadata keys, tensor names, llama q/k row permutation
// (interleaved rotary pairs), byte-level BPE tokenizer and Q8_0 quantisation (bit-exact with
// quantize_row_q8_0_ref). Tensors are streamed a chunk of rows at a time: memory stays small
// at any model size.
import { open, readFile, realpath, stat, type FileHandle } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import { DkiArgumentError, FormatError } from "../errors.js";
import { GgmlType, writeGguf, type GgufEntry, type GgufTensorToWrite } from "../formats/gguf.js";
import { hfToGgufName, llama3RopeFactors } from "../formats/gguf-model.js";
import type { ModelConfig } from "../formats/hf-config.js";
import { readHfFolder } from "../formats/hf-folder.js";
import { readJsonObject } from "../formats/json-file.js";
import type { TensorInfo } from "../formats/safetensors.js";
import { ggufPreForTokenizerJson, TokenType } from "../tokenizer/gguf-tokenizer.js";
import { tokenString } from "../tokenizer/tokenizer.js";
import { f16BitsToF32, f32ToBf16Bits, f32ToF16Bits } from "./half.js";

export type GgufOutType = "f32" | "f16" | "bf16" | "q8_0";
export const GGUF_OUT_TYPES: readonly GgufOutType[] = ["f32", "f16", "bf16", "q8_0"];

/** llama.cpp's llama_ftype values for general.file_type. */
const FILE_TYPE: Record<GgufOutType, number> = { f32: 0, f16: 1, q8_0: 7, bf16: 32 };
const MATRIX_TYPE: Record<GgufOutType, number> = { f32: GgmlType.F32, f16: GgmlType.F16, bf16: GgmlType.BF16, q8_0: GgmlType.Q8_0 };

export interface ConvertOptions {
  /** Hugging Face model folder. */
  dir: string;
  /** Output .gguf file (replaced). */
  out: string;
  type: GgufOutType;
  /** general.name (default: the folder's name). */
  name?: string;
  /** Write the tokenizer (tokenizer.ggml.*; default true). Without it the file still runs on token ids. */
  tokenizer?: boolean;
  /** Called after each tensor with bytes of tensor data written so far and in all. */
  onProgress?: (done: number, total: number) => void;
}

export interface ConvertResult {
  file: string;
  bytes: number;
  tensorCount: number;
  config: ModelConfig;
  /** tokenizer.ggml.pre written ("" without a tokenizer). */
  pre: string;
}

type Json = Record<string, unknown>;

/** llama.cpp's convert_hf_to_gguf `does_token_look_special`: added tokens it marks CONTROL even when not flagged special. */
function looksSpecial(t: string): boolean {
  return (
    ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].includes(t) ||
    (t.startsWith("<|") && t.endsWith("|>")) ||
    (t.startsWith("<｜") && t.endsWith("｜>")) ||
    (t.startsWith("<unused") && t.endsWith(">"))
  );
}

/** The tokenizer.ggml.* metadata of a byte-level BPE tokenizer.json (+ tokenizer_config.json and config ids). */
async function tokenizerMetadata(dir: string, cfg: ModelConfig): Promise<{ entries: [string, GgufEntry][]; pre: string }> {
  const tjPath = join(dir, "tokenizer.json");
  const tj = await readJsonObject(tjPath);
  const tc = (await readJsonObject(join(dir, "tokenizer_config.json"), { optional: true })) ?? {};
  const fail = (msg: string): never => { throw new FormatError(tjPath, msg); };
  const model = tj.model as Json | undefined;
  if (!model || model.type !== "BPE") fail(`model type ${JSON.stringify(model?.type)} is not supported: only byte-level BPE tokenizers convert`);
  if ((tj.decoder as Json | null)?.type !== "ByteLevel") fail("the decoder is not ByteLevel: only byte-level BPE tokenizers convert");
  const pre = ggufPreForTokenizerJson(tj) ?? fail("the pre-tokenizer matches none that llama.cpp knows (smollm, gpt-2, qwen2, llama-bpe)");
  if (pre === "qwen2" && (tj.normalizer as Json | null)?.type !== "NFC") fail("a qwen2 pre-tokenizer without the NFC normalizer is not supported");
  if (pre !== "qwen2" && tj.normalizer != null) fail("a normalizer with a byte-level BPE tokenizer is not supported");

  const n = cfg.vocabSize;
  const tokens: string[] = new Array(n);
  const types: number[] = new Array(n).fill(TokenType.NORMAL);
  for (const [tok, id] of Object.entries((model!.vocab ?? {}) as Record<string, number>)) {
    if (!Number.isInteger(id) || id < 0) fail(`vocab entry ${JSON.stringify(tok)} has id ${id}`);
    if (id >= n) fail(`token ${JSON.stringify(tok)} has id ${id}, beyond the model's vocab_size ${n}`);
    tokens[id] = tok;
  }
  for (const a of (Array.isArray(tj.added_tokens) ? tj.added_tokens : []) as Json[]) {
    const id = a.id as number;
    const content = a.content as string;
    if (!Number.isInteger(id) || id < 0 || typeof content !== "string") fail("malformed added_tokens entry");
    if (id >= n) fail(`added token ${JSON.stringify(content)} has id ${id}, beyond the model's vocab_size ${n}`);
    tokens[id] = content;
    types[id] = a.special === true || looksSpecial(content) ? TokenType.CONTROL : TokenType.USER_DEFINED;
  }
  for (let i = 0; i < n; i++) {
    if (tokens[i] === undefined) {
      tokens[i] = `[PAD${i}]`;
      types[i] = TokenType.UNUSED;
    }
  }
  const merges = ((model!.merges ?? []) as (string | string[])[]).map((m) => (Array.isArray(m) ? m.join(" ") : m));
  const idOf = (s: string | null): number | null => {
    if (s === null) return null;
    const i = tokens.indexOf(s);
    return i < 0 ? null : i;
  };
  const bos = idOf(tokenString(tc.bos_token)) ?? cfg.bosTokenId;
  const eos = idOf(tokenString(tc.eos_token)) ?? cfg.eosTokenIds[0] ?? null;
  const unk = idOf(tokenString(tc.unk_token));
  const pad = idOf(tokenString(tc.pad_token));

  let addBos = false;
  if (typeof tc.add_bos_token === "boolean") addBos = tc.add_bos_token;
  else {
    const pp = tj.post_processor as Json | null;
    const first = pp?.type === "TemplateProcessing" && Array.isArray(pp.single) ? (pp.single[0] as Json) : null;
    addBos = first !== null && "SpecialToken" in first;
  }
  let addEos = typeof tc.add_eos_token === "boolean" ? tc.add_eos_token : false;
  if (typeof tc.add_eos_token !== "boolean") {
    const pp = tj.post_processor as Json | null;
    const last = pp?.type === "TemplateProcessing" && Array.isArray(pp.single) ? (pp.single[pp.single.length - 1] as Json) : null;
    addEos = last !== null && "SpecialToken" in last;
  }

  const entries: [string, GgufEntry][] = [
    ["tokenizer.ggml.model", { type: "string", value: "gpt2" }],
    ["tokenizer.ggml.pre", { type: "string", value: pre }],
    ["tokenizer.ggml.tokens", { type: "array", itemType: "string", value: tokens }],
    ["tokenizer.ggml.token_type", { type: "array", itemType: "i32", value: types }],
    ["tokenizer.ggml.merges", { type: "array", itemType: "string", value: merges }],
  ];
  if (bos !== null) entries.push(["tokenizer.ggml.bos_token_id", { type: "u32", value: bos }]);
  if (eos !== null) entries.push(["tokenizer.ggml.eos_token_id", { type: "u32", value: eos }]);
  if (unk !== null) entries.push(["tokenizer.ggml.unknown_token_id", { type: "u32", value: unk }]);
  if (pad !== null) entries.push(["tokenizer.ggml.padding_token_id", { type: "u32", value: pad }]);
  entries.push(["tokenizer.ggml.add_bos_token", { type: "bool", value: addBos }]);
  entries.push(["tokenizer.ggml.add_eos_token", { type: "bool", value: addEos }]);
  let template: unknown = tc.chat_template;
  if (Array.isArray(template)) template = (template as Json[]).find((t) => t.name === "default")?.template;
  if (typeof template !== "string") {
    try {
      template = await readFile(join(dir, "chat_template.jinja"), "utf8");
    } catch {
      template = undefined;
    }
  }
  if (typeof template === "string") entries.push(["tokenizer.chat_template", { type: "string", value: template }]);
  return { entries, pre };
}

// ---------------------------------------------------------------------------------------------
// Tensor data

let f16Table: Float32Array | null = null;
function f16ToF32Table(): Float32Array {
  if (!f16Table) {
    f16Table = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) f16Table[h] = f16BitsToF32(h);
  }
  return f16Table;
}

const SRC_BYTES: Record<string, number> = { F32: 4, F16: 2, BF16: 2 };

/**
 * llama.cpp's LlamaModel.permute for q/k rows (and biases): reshape(n_head, 2, rows/n_head/2,
 * cols).swapaxes(1, 2). GGUF row h·hd + 2j + s holds HF row h·hd + s·hd/2 + j.
 */
export function permutedSourceRow(row: number, headDim: number): number {
  const h = Math.floor(row / headDim);
  const r = row % headDim;
  return h * headDim + (r % 2) * (headDim / 2) + (r >> 1);
}

/** A GGUF written over one of the files it is made from would destroy the source model. */
async function refuseOverwritingInput(out: string, inputs: string[]): Promise<void> {
  const real = (f: string) => realpath(f).catch(() => resolve(f));
  const target = await real(out);
  for (const f of inputs) {
    if ((await real(f)) === target) throw new DkiArgumentError(`convert: the output ${out} is one of the model's own files (${basename(f)}); write the GGUF elsewhere`);
  }
}

/** llama.cpp's quantize_row_q8_0_ref, bit for bit: d = amax/127 as fp16, q = roundf(x/d), all in float32. */
export function quantizeQ8_0(x: Float32Array, out: Uint8Array, outOffset = 0): void {
  if (x.length % 32 !== 0) throw new Error(`Q8_0 needs a multiple of 32 values, got ${x.length}`);
  let o = outOffset;
  for (let b = 0; b < x.length; b += 32) {
    let amax = 0;
    for (let j = 0; j < 32; j++) {
      const a = Math.abs(x[b + j]);
      if (a > amax) amax = a;
    }
    const d = Math.fround(amax / 127);
    const id = d !== 0 ? Math.fround(1 / d) : 0;
    const dh = f32ToF16Bits(d);
    out[o] = dh & 0xff;
    out[o + 1] = dh >>> 8;
    for (let j = 0; j < 32; j++) {
      const v = Math.fround(x[b + j] * id);
      const q = v < 0 ? -Math.round(-v) : Math.round(v); // roundf: halves away from zero
      out[o + 2 + j] = q & 0xff;
    }
    o += 34;
  }
}

/** Encodes float32 rows as a ggml type. */
function encode(x: Float32Array, type: number): Uint8Array {
  switch (type) {
    case GgmlType.F32:
      return new Uint8Array(x.buffer, x.byteOffset, x.byteLength);
    case GgmlType.F16: {
      const out = new Uint16Array(x.length);
      for (let i = 0; i < x.length; i++) out[i] = f32ToF16Bits(x[i]);
      return new Uint8Array(out.buffer);
    }
    case GgmlType.BF16: {
      const out = new Uint16Array(x.length);
      for (let i = 0; i < x.length; i++) out[i] = f32ToBf16Bits(x[i]);
      return new Uint8Array(out.buffer);
    }
    case GgmlType.Q8_0: {
      const out = new Uint8Array((x.length / 32) * 34);
      quantizeQ8_0(x, out);
      return out;
    }
    default:
      throw new Error(`cannot encode ggml type ${type}`);
  }
}

/** Decodes `count` elements of F32/F16/BF16 bytes to float32. */
function decode(bytes: Uint8Array, dtype: string, count: number): Float32Array {
  const out = new Float32Array(count);
  if (dtype === "F32") {
    new Uint8Array(out.buffer).set(bytes.subarray(0, count * 4));
  } else {
    const u16 = new Uint16Array(count);
    new Uint8Array(u16.buffer).set(bytes.subarray(0, count * 2));
    if (dtype === "F16") {
      const table = f16ToF32Table();
      for (let i = 0; i < count; i++) out[i] = table[u16[i]];
    } else {
      const u32 = new Uint32Array(out.buffer);
      for (let i = 0; i < count; i++) u32[i] = u16[i] << 16;
    }
  }
  return out;
}

const SAME_TYPE: Record<string, number> = { F32: GgmlType.F32, F16: GgmlType.F16, BF16: GgmlType.BF16 };
const CHUNK_ELEMENTS = 1 << 20;

async function readExact(fh: FileHandle, buf: Uint8Array, pos: number, file: string): Promise<void> {
  let done = 0;
  while (done < buf.byteLength) {
    const { bytesRead } = await fh.read(buf, done, buf.byteLength - done, pos + done);
    if (bytesRead === 0) throw new FormatError(file, `file ended at byte ${pos + done} while reading tensor data`);
    done += bytesRead;
  }
}

/** The GGUF bytes of one HF tensor, a group of rows at a time, rows permuted when `permuteHeadDim` is set. */
async function* tensorChunks(fh: FileHandle, t: TensorInfo, outType: number, permuteHeadDim: number | null): AsyncGenerator<Uint8Array> {
  const rows = t.shape[0];
  const cols = t.shape.length === 1 ? 1 : t.shape[1];
  const eb = SRC_BYTES[t.dtype];
  if (eb === undefined) throw new FormatError(t.file, `tensor "${t.name}" has dtype ${t.dtype}; F32, F16 and BF16 convert`);
  let group = Math.max(1, Math.floor(CHUNK_ELEMENTS / cols));
  if (permuteHeadDim !== null) {
    if (rows % permuteHeadDim !== 0) throw new FormatError(t.file, `tensor "${t.name}": ${rows} rows are not whole heads of ${permuteHeadDim}`);
    group = permuteHeadDim * Math.max(1, Math.floor(group / permuteHeadDim));
  }
  const rowBytes = cols * eb;
  for (let r0 = 0; r0 < rows; r0 += group) {
    const n = Math.min(group, rows - r0);
    const src = new Uint8Array(n * rowBytes);
    await readExact(fh, src, t.offset + r0 * rowBytes, t.file);
    let bytes = src;
    if (permuteHeadDim !== null) {
      bytes = new Uint8Array(src.length);
      for (let i = 0; i < n; i++) {
        const from = permutedSourceRow(i, permuteHeadDim); // groups are whole heads, so head-relative rows work
        bytes.set(src.subarray(from * rowBytes, (from + 1) * rowBytes), i * rowBytes);
      }
    }
    yield SAME_TYPE[t.dtype] === outType ? bytes : encode(decode(bytes, t.dtype, n * cols), outType);
  }
}

/** Converts a Hugging Face folder to a GGUF file llama.cpp can load. */
export async function convertHfToGguf(opts: ConvertOptions): Promise<ConvertResult> {
  if (!GGUF_OUT_TYPES.includes(opts.type)) throw new DkiArgumentError(`convert: unknown type "${String(opts.type)}" (${GGUF_OUT_TYPES.join(", ")})`);
  const hf = await readHfFolder(opts.dir);
  await refuseOverwritingInput(opts.out, [...hf.tensors.map((t) => t.file), ...["config.json", "tokenizer.json", "tokenizer_config.json"].map((f) => join(opts.dir, f))]);
  const c = hf.config;
  const arch = c.arch === "qwen2" ? "qwen2" : "llama"; // llama.cpp converts Mistral as llama
  const { entries: tokEntries, pre } = opts.tokenizer === false ? { entries: [], pre: "" } : await tokenizerMetadata(opts.dir, c);

  const u32 = (v: number): GgufEntry => ({ type: "u32", value: v });
  const f32 = (v: number): GgufEntry => ({ type: "f32", value: v });
  const metadata = new Map<string, GgufEntry>([
    ["general.architecture", { type: "string", value: arch }],
    ["general.type", { type: "string", value: "model" }],
    ["general.name", { type: "string", value: opts.name ?? basename(resolve(opts.dir)) }],
    [`${arch}.block_count`, u32(c.numLayers)],
    [`${arch}.context_length`, u32(c.maxPositionEmbeddings)],
    [`${arch}.embedding_length`, u32(c.hiddenSize)],
    [`${arch}.feed_forward_length`, u32(c.intermediateSize)],
    [`${arch}.attention.head_count`, u32(c.numHeads)],
    [`${arch}.attention.head_count_kv`, u32(c.numKvHeads)],
    [`${arch}.rope.freq_base`, f32(c.ropeTheta)],
    [`${arch}.attention.layer_norm_rms_epsilon`, f32(c.rmsNormEps)],
    [`${arch}.attention.key_length`, u32(c.headDim)],
    [`${arch}.attention.value_length`, u32(c.headDim)],
    ["general.file_type", u32(FILE_TYPE[opts.type])],
    [`${arch}.vocab_size`, u32(c.vocabSize)],
    [`${arch}.rope.dimension_count`, u32(c.headDim)],
    ["general.quantization_version", u32(2)],
    ...tokEntries,
  ]);

  const handles = new Map<string, FileHandle>();
  try {
    for (const t of hf.tensors) if (!handles.has(t.file)) handles.set(t.file, await open(t.file, "r"));
    const tensors: GgufTensorToWrite[] = [];
    const allBytes = hf.tensors.reduce((a, t) => a + t.nbytes, 0);
    let done = 0;
    if (c.ropeScaling) {
      const factors = llama3RopeFactors(c.ropeScaling, c.ropeTheta, c.headDim);
      tensors.push({ name: "rope_freqs.weight", type: GgmlType.F32, dims: [factors.length], data: new Uint8Array(factors.buffer) });
    }
    for (const t of hf.tensors) {
      const dims = [...t.shape].reverse();
      let type: number = GgmlType.F32; // 1-D tensors (norms, biases) stay F32, as llama.cpp keeps them
      if (t.shape.length === 2) {
        type = MATRIX_TYPE[opts.type];
        if (type === GgmlType.Q8_0 && dims[0] % 32 !== 0) type = GgmlType.F16; // llama.cpp's fallback
      }
      let permute: number | null = null;
      if (arch === "llama" && /\.self_attn\.[qk]_proj\.(weight|bias)$/.test(t.name)) permute = c.headDim;
      const fh = handles.get(t.file)!;
      const onProgress = opts.onProgress;
      const data = !onProgress
        ? () => tensorChunks(fh, t, type, permute)
        : async function* () {
            yield* tensorChunks(fh, t, type, permute);
            done += t.nbytes;
            onProgress(done, allBytes);
          };
      tensors.push({ name: hfToGgufName(t.name), type, dims, data });
    }
    await writeGguf(opts.out, { metadata, tensors });
  } finally {
    for (const fh of handles.values()) await fh.close();
  }
  return { file: opts.out, bytes: (await stat(opts.out)).size, tensorCount: hf.tensors.length + (c.ropeScaling ? 1 : 0), config: c, pre };
}
