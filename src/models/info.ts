// `dki models info`: what a Hugging Face model folder or GGUF file holds, read from its config and
// the safetensors / GGUF headers only (no weights are loaded).
import { readdir, stat } from "node:fs/promises";
import { basename, join } from "node:path";
import type { Arch, Llama3RopeScaling, ModelConfig } from "../formats/hf-config.js";
import { readHfFolder } from "../formats/hf-folder.js";
import { readGgufModel } from "../formats/gguf-model.js";
import { formatThreads, type ThreadsInfo } from "../engine/threads.js";

export interface ModelShapes {
  layers: number;
  hidden: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  intermediate: number;
  vocab: number;
}

export interface ModelInfo {
  path: string;
  /** "hf" for a Hugging Face folder, "gguf" for a GGUF file. */
  format: "hf" | "gguf";
  arch: Arch;
  /** config.json's `architectures`, e.g. ["LlamaForCausalLM"]; for GGUF, general.name when present. */
  architectures: string[];
  shapes: ModelShapes;
  /** Distinct weight dtypes, most common first. */
  dtypes: string[];
  parameterCount: number;
  /** Size of the safetensors files on disk, headers included. */
  bytes: number;
  /** Every file in the folder with its size, weights and tokenizer files alike. */
  files: { name: string; bytes: number }[];
  tied: boolean;
  bias: boolean;
  ropeTheta: number;
  ropeScaling: Llama3RopeScaling | null;
  maxPositionEmbeddings: number;
  rmsNormEps: number;
  hasTokenizer: boolean;
  /** The engine's threads on this machine and where the default came from (the CLI adds it). */
  threads?: ThreadsInfo;
}

/** The fields of ModelInfo that the config alone gives, alike for both formats. */
function fromConfig(c: ModelConfig): Pick<ModelInfo, "arch" | "shapes" | "tied" | "bias" | "ropeTheta" | "ropeScaling" | "maxPositionEmbeddings" | "rmsNormEps"> {
  return {
    arch: c.arch,
    shapes: { layers: c.numLayers, hidden: c.hiddenSize, heads: c.numHeads, kvHeads: c.numKvHeads, headDim: c.headDim, intermediate: c.intermediateSize, vocab: c.vocabSize },
    tied: c.tieWordEmbeddings,
    bias: c.attentionBias,
    ropeTheta: c.ropeTheta,
    ropeScaling: c.ropeScaling,
    maxPositionEmbeddings: c.maxPositionEmbeddings,
    rmsNormEps: c.rmsNormEps,
  };
}

/** What a GGUF file holds, from its header only. Tensor types the engine cannot run are listed too. */
async function ggufInfo(path: string): Promise<ModelInfo> {
  const g = await readGgufModel(path, { allowAnyType: true });
  const c = g.config;
  let parameterCount = 0;
  const perDtype = new Map<string, number>();
  for (const t of g.gguf.tensors) {
    const n = t.dims.reduce((a, b) => a * b, 1);
    parameterCount += n;
    perDtype.set(t.typeName, (perDtype.get(t.typeName) ?? 0) + n);
  }
  const name = g.metadata.str("general.name");
  return {
    path,
    format: "gguf",
    ...fromConfig(c),
    architectures: name ? [name] : [],
    dtypes: [...perDtype].sort((a, b) => b[1] - a[1]).map(([d]) => d),
    parameterCount,
    bytes: g.gguf.size,
    files: [{ name: basename(path), bytes: g.gguf.size }],
    hasTokenizer: g.metadata.has("tokenizer.ggml.tokens"),
  };
}

export async function modelInfo(path: string): Promise<ModelInfo> {
  if (path.toLowerCase().endsWith(".gguf")) return ggufInfo(path);
  const hf = await readHfFolder(path);
  const c = hf.config;
  let parameterCount = 0;
  const perDtype = new Map<string, number>();
  for (const t of hf.tensors) {
    const n = t.shape.reduce((a, b) => a * b, 1);
    parameterCount += n;
    perDtype.set(t.dtype, (perDtype.get(t.dtype) ?? 0) + n);
  }
  const files: { name: string; bytes: number }[] = [];
  for (const entry of (await readdir(path, { withFileTypes: true })).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
    if (entry.isFile()) files.push({ name: entry.name, bytes: (await stat(join(path, entry.name))).size });
  }
  const weightFiles = new Set(hf.tensors.map((t) => basename(t.file)));
  const archs = hf.rawConfig.architectures;
  return {
    path,
    format: "hf",
    ...fromConfig(c),
    architectures: Array.isArray(archs) ? archs.filter((a): a is string => typeof a === "string") : [],
    dtypes: [...perDtype].sort((a, b) => b[1] - a[1]).map(([d]) => d),
    parameterCount,
    bytes: files.filter((f) => weightFiles.has(f.name)).reduce((a, f) => a + f.bytes, 0),
    files,
    hasTokenizer: files.some((f) => f.name === "tokenizer.json"),
  };
}

export function formatBytes(n: number): string {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let v = n;
  let u = 0;
  while (v >= 1000 && u < units.length - 1) {
    v /= 1000;
    u++;
  }
  return u === 0 ? `${n} B` : `${v.toFixed(v < 10 ? 2 : 1)} ${units[u]}`;
}

function formatCount(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)}B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)}K`;
  return String(n);
}

export function formatModelInfo(info: ModelInfo): string {
  const s = info.shapes;
  const weightFileCount = info.format === "gguf" ? 1 : info.files.filter((f) => f.name.endsWith(".safetensors")).length;
  const rope = info.ropeScaling
    ? `theta ${info.ropeTheta}, llama3 scaling ×${info.ropeScaling.factor} (low ${info.ropeScaling.lowFreqFactor}, high ${info.ropeScaling.highFreqFactor}, original ${info.ropeScaling.originalMaxPositionEmbeddings})`
    : `theta ${info.ropeTheta}, no scaling`;
  const rows: [string, string][] = [
    ["architecture", `${info.arch}${info.architectures.length ? ` (${info.architectures.join(", ")})` : ""}${info.format === "gguf" ? ", GGUF" : ""}`],
    ["parameters", `${formatCount(info.parameterCount)} (${info.parameterCount.toLocaleString("en-US")})`],
    ["weights", `${info.dtypes.join(" + ")}, ${formatBytes(info.bytes)} in ${weightFileCount} file${weightFileCount === 1 ? "" : "s"}`],
    ["layers", String(s.layers)],
    ["hidden", `${s.hidden} (MLP ${s.intermediate})`],
    ["attention", `${s.heads} heads, ${s.kvHeads} KV heads (GQA ${s.heads / s.kvHeads}), head_dim ${s.headDim}, ${info.bias ? "q/k/v biases" : "no biases"}`],
    ["vocabulary", `${s.vocab}, ${info.tied ? "tied" : "separate"} LM head`],
    ["rope", rope],
    ["context", `${info.maxPositionEmbeddings} positions, rms_norm_eps ${info.rmsNormEps}`],
    ["files", info.files.map((f) => `${f.name} (${formatBytes(f.bytes)})`).join(", ")],
  ];
  if (info.threads) rows.push(["threads", formatThreads(info.threads)]);
  if (!info.hasTokenizer) rows.push(["note", `no ${info.format === "gguf" ? "tokenizer.ggml metadata" : "tokenizer.json"}: text prompts will not work, token ids will`]);
  const width = Math.max(...rows.map(([k]) => k.length));
  return [info.path, ...rows.map(([k, v]) => `  ${k.padEnd(width)}  ${v}`)].join("\n") + "\n";
}
