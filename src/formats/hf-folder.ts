// A Hugging Face model folder: config.json + one or more safetensors files (sharded through
// model.safetensors.index.json). Resolves and checks every tensor the config needs.
import { access } from "node:fs/promises";
import { basename, join } from "node:path";
import { FormatError } from "../errors.js";
import { expectedTensors, parseHfConfig, type ModelConfig } from "./hf-config.js";
import { readJsonObject } from "./json-file.js";
import { readSafetensorsHeader, type TensorInfo } from "./safetensors.js";

export interface HfModelFiles {
  dir: string;
  config: ModelConfig;
  /** Raw config.json, kept for fingerprints and `models info`. */
  rawConfig: Record<string, unknown>;
  tensors: TensorInfo[];
}

const exists = (p: string) => access(p).then(() => true, () => false);

/** The safetensors files of a folder: the shards named by the index, or model.safetensors. */
async function weightFiles(dir: string): Promise<string[]> {
  const indexFile = join(dir, "model.safetensors.index.json");
  if (await exists(indexFile)) {
    const index = await readJsonObject(indexFile);
    const map = index.weight_map;
    if (typeof map !== "object" || map === null) throw new FormatError(indexFile, "weight_map is missing");
    const shards = [...new Set(Object.values(map as Record<string, unknown>))];
    for (const s of shards) {
      if (typeof s !== "string" || s.includes("/") || s.includes("\\")) throw new FormatError(indexFile, `shard name ${JSON.stringify(s)} is not a plain file name`);
    }
    return (shards as string[]).sort().map((s) => join(dir, s));
  }
  const single = join(dir, "model.safetensors");
  if (await exists(single)) return [single];
  throw new FormatError(dir, "no model.safetensors or model.safetensors.index.json in this folder");
}

export async function readHfFolder(dir: string): Promise<HfModelFiles> {
  const configFile = join(dir, "config.json");
  const rawConfig = await readJsonObject(configFile);
  const config = parseHfConfig(rawConfig, configFile);
  const byName = new Map<string, TensorInfo>();
  for (const f of await weightFiles(dir)) {
    for (const t of (await readSafetensorsHeader(f)).tensors) {
      const other = byName.get(t.name);
      if (other) throw new FormatError(dir, `tensor "${t.name}" is in both ${basename(other.file)} and ${basename(t.file)}`);
      byName.set(t.name, t);
    }
  }
  const tensors: TensorInfo[] = [];
  for (const [name, shape] of expectedTensors(config)) {
    const t = byName.get(name);
    if (!t) throw new FormatError(dir, `tensor "${name}" is missing from the safetensors files`);
    if (t.dtype !== "F32" && t.dtype !== "F16" && t.dtype !== "BF16") {
      throw new FormatError(t.file, `tensor "${name}" has dtype ${t.dtype}; supported: F32, F16, BF16`);
    }
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new FormatError(t.file, `tensor "${name}" has shape [${t.shape.join(", ")}], config.json implies [${shape.join(", ")}]`);
    }
    tensors.push(t);
  }
  return { dir, config, rawConfig, tensors };
}
