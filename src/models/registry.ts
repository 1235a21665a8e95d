// The model registry (models/registry.json): short names → Hugging Face repos, the files a model
// folder needs, and their sizes/checksums where known. A null sha256 means the file is only
// size-checked (against `size`, or, when that is null too, against the server's Content-Length).
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { packageRoot } from "../engine/native.js";
import { DkiArgumentError, FormatError } from "../errors.js";

/** A name that stays inside the folder it is joined to: no separators, no "..", no leading dot. */
export function isPlainFileName(name: unknown): name is string {
  return typeof name === "string" && /^[\w][\w.-]*$/.test(name);
}

export const DEFAULT_HUB_URL = "https://huggingface.co";

export interface RegistryFile {
  /** Plain file name inside the repo and the local folder. */
  name: string;
  /** Size in bytes, or null when unknown. */
  size: number | null;
  /** Lower-case hex SHA-256, or null when unknown (then only the size is checked). */
  sha256: string | null;
}

export interface RegistryModel {
  name: string;
  /** Hugging Face repo id, owner/name. */
  repo: string;
  /** Branch, tag or commit; a commit pins the content the checksums describe. */
  revision: string;
  description: string;
  license: string | null;
  files: RegistryFile[];
}

export type ModelRegistry = ReadonlyMap<string, RegistryModel>;

export function registryPath(): string {
  return join(packageRoot(), "models", "registry.json");
}

export async function loadRegistry(file = registryPath()): Promise<ModelRegistry> {
  let raw: unknown;
  try {
    raw = JSON.parse(await readFile(file, "utf8"));
  } catch (e) {
    throw new FormatError(file, `cannot read the model registry (${(e as Error).message})`);
  }
  return parseRegistry(raw, file);
}

/** Checks a registry document; file names must be plain names since they become local paths. */
export function parseRegistry(raw: unknown, file = "registry.json"): ModelRegistry {
  const fail = (msg: string): never => { throw new FormatError(file, msg); };
  const models = (raw as { models?: unknown } | null)?.models;
  if (typeof models !== "object" || models === null || Array.isArray(models)) return fail("`models` must be an object");
  const out = new Map<string, RegistryModel>();
  for (const [name, entry] of Object.entries(models as Record<string, unknown>)) {
    const e = (entry ?? {}) as Record<string, unknown>;
    const where = `model "${name}"`;
    if (typeof e.repo !== "string" || !/^[\w.-]+\/[\w.-]+$/.test(e.repo)) fail(`${where}: repo must be "owner/name", got ${JSON.stringify(e.repo)}`);
    const revision = e.revision ?? "main";
    if (typeof revision !== "string" || revision.length === 0 || revision.includes("..")) fail(`${where}: bad revision ${JSON.stringify(revision)}`);
    if (!Array.isArray(e.files) || e.files.length === 0) fail(`${where}: files must be a non-empty list`);
    const files = (e.files as unknown[]).map((f): RegistryFile => {
      const r = (f ?? {}) as Record<string, unknown>;
      if (!isPlainFileName(r.name)) fail(`${where}: file name ${JSON.stringify(r.name)} is not a plain file name`);
      const size = r.size ?? null;
      if (size !== null && (typeof size !== "number" || !Number.isSafeInteger(size) || size < 0)) fail(`${where}, ${String(r.name)}: size must be a byte count or null`);
      const sha256 = r.sha256 ?? null;
      if (sha256 !== null && (typeof sha256 !== "string" || !/^[0-9a-f]{64}$/.test(sha256))) fail(`${where}, ${String(r.name)}: sha256 must be 64 lower-case hex digits or null`);
      return { name: r.name as string, size: size as number | null, sha256: sha256 as string | null };
    });
    out.set(name, {
      name,
      repo: e.repo as string,
      revision: revision as string,
      description: typeof e.description === "string" ? e.description : "",
      license: typeof e.license === "string" ? e.license : null,
      files,
    });
  }
  return out;
}

export function findModel(registry: ModelRegistry, name: string): RegistryModel {
  const m = registry.get(name);
  if (!m) throw new DkiArgumentError(`unknown model "${name}"; known models: ${[...registry.keys()].join(", ")}`);
  return m;
}

/** The hub to download from: an explicit URL, else DKI_HUB_URL, else huggingface.co. */
export function hubUrl(explicit?: string): string {
  const url = explicit || process.env.DKI_HUB_URL || DEFAULT_HUB_URL;
  try {
    const u = new URL(url);
    if (u.protocol !== "http:" && u.protocol !== "https:") throw new Error();
  } catch {
    throw new DkiArgumentError(`hub URL must be an http(s) URL, got "${url}"`);
  }
  return url.replace(/\/+$/, "");
}

/** https://huggingface.co/{repo}/resolve/{revision}/ under the chosen hub. */
export function modelBaseUrl(model: RegistryModel, hub?: string): string {
  return `${hubUrl(hub)}/${model.repo}/resolve/${encodeURIComponent(model.revision)}/`;
}
