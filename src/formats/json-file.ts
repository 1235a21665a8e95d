// The JSON files of a model folder (config.json, tokenizer.json, tokenizer_config.json, the
// safetensors index) are untrusted input. JSON.parse of a few hundred MB of small objects needs
// more than V8's default heap (128 MB of "{}," takes 4.3 GB and 86 s here), and running out of
// heap aborts the process, so a file larger than any real one is refused before it is read.
import { readFile, stat } from "node:fs/promises";
import { FormatError } from "../errors.js";

export type JsonObject = Record<string, unknown>;

/** Real tokenizer.json files, the largest of these, are tens of MB at most (256k-token vocabularies). */
export const MAX_JSON_FILE_BYTES = 64 * 1024 * 1024;

/**
 * The JSON object in `file`. Throws FormatError naming the file when it cannot be read, is
 * larger than MAX_JSON_FILE_BYTES, is not JSON or is not an object; with `optional`, a missing
 * file gives null instead.
 */
export async function readJsonObject(file: string): Promise<JsonObject>;
export async function readJsonObject(file: string, opts: { optional: true }): Promise<JsonObject | null>;
export async function readJsonObject(file: string, opts: { optional?: boolean } = {}): Promise<JsonObject | null> {
  let text: string;
  try {
    const { size } = await stat(file);
    if (size > MAX_JSON_FILE_BYTES) throw new FormatError(file, `${size} bytes: larger than any real model or tokenizer JSON file (the limit is ${MAX_JSON_FILE_BYTES})`);
    text = await readFile(file, "utf8");
  } catch (e) {
    if (e instanceof FormatError) throw e;
    const code = (e as NodeJS.ErrnoException).code;
    if (opts.optional && code === "ENOENT") return null;
    throw new FormatError(file, `cannot read (${code ?? (e as Error).message})`);
  }
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    throw new FormatError(file, `not valid JSON (${(e as Error).message})`);
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw new FormatError(file, "not a JSON object");
  return v as JsonObject;
}
