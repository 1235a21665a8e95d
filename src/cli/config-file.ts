// `--config FILE`: DKIConfig's keys (the same as DKISystem.open's `config`) in a JSON or YAML file,
// for the commands that open a system. A file is checked whole when it is read, before the model
// loads: a typo'd key or a bad value fails there, naming the file and the key.
import { readFile } from "node:fs/promises";
import { extname } from "node:path";
import { parse as parseYaml } from "yaml";
import { resolveConfig, type DKIConfigInput } from "../dki/config.js";
import { DkiArgumentError } from "../errors.js";

/** The settings of `file` (.json as JSON, anything else as YAML, of which JSON is a subset). */
export async function readConfigFile(file: string): Promise<DKIConfigInput> {
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    throw new Error(`--config ${file}: cannot read it (${err.code === "ENOENT" ? "no such file" : err.code === "EISDIR" ? "a folder, not a file" : err.message})`);
  }
  const json = extname(file).toLowerCase() === ".json";
  let data: unknown;
  try {
    // uniqueKeys: a key given twice is an error, not a silent last-one-wins.
    data = json ? JSON.parse(text) : parseYaml(text, { uniqueKeys: true, prettyErrors: true });
  } catch (e) {
    throw new Error(`--config ${file}: not valid ${json ? "JSON" : "YAML"}: ${(e as Error).message.split("\n")[0]}`);
  }
  if (data === null || data === undefined) return {}; // an empty file: the defaults
  if (typeof data !== "object" || Array.isArray(data)) throw new Error(`--config ${file}: expected a mapping of settings (e.g. maxMemories: 5), got ${Array.isArray(data) ? "a list" : typeof data}`);
  try {
    resolveConfig(data as DKIConfigInput);
  } catch (e) {
    if (e instanceof DkiArgumentError) throw new Error(`--config ${file}: ${e.message}`);
    throw e;
  }
  return data as DKIConfigInput;
}

/** `over` on top of `base`; gating's and recall's settings merge key by key. */
export function mergeConfig(base: DKIConfigInput, over: DKIConfigInput): DKIConfigInput {
  const out: DKIConfigInput = { ...base, ...over };
  if (base.gating !== undefined || over.gating !== undefined) out.gating = { ...base.gating, ...over.gating };
  if (base.recall !== undefined || over.recall !== undefined) out.recall = { ...base.recall, ...over.recall };
  return out;
}
