// Checks of the paths a command is given, made before any work so that a wrong kind of path is
// reported as what the user did wrong, not as the ENOTDIR/EISDIR/ENOENT of a file deep inside.
import type { Stats } from "node:fs";
import { readdir, stat } from "node:fs/promises";
import { dirname, relative, resolve } from "node:path";
import { readL3Folder } from "../cache/tiers/l3-files.js";
import { MemoryStore } from "../memory/memory-store.js";

/** The path's stats, or null when nothing is there (ENOTDIR: a file stands where a folder would be). */
async function statOrNull(path: string): Promise<Stats | null> {
  try {
    return await stat(path);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR") return null;
    throw e;
  }
}

const isGguf = (path: string) => path.toLowerCase().endsWith(".gguf");

/**
 * A model to load: a folder or a .gguf file. A path that is missing is left to the loader,
 * whose message names the file it looked for.
 */
export async function checkModelPath(path: string, what: string): Promise<void> {
  if (isGguf(path)) return;
  const s = await statOrNull(path);
  if (s && !s.isDirectory()) throw new Error(`${what} must be a model folder or a .gguf file; ${path} is neither`);
}

/** A Hugging Face model folder (what `models convert` reads). */
export async function checkModelFolder(path: string, what: string): Promise<void> {
  const s = await statOrNull(path);
  if (s && !s.isDirectory()) throw new Error(`${what} must be a Hugging Face model folder; ${path} is a file`);
}

/** A file to write: not a folder, and in a folder that exists. */
export async function checkOutFile(path: string, what: string): Promise<void> {
  if ((await statOrNull(path))?.isDirectory()) throw new Error(`${what} must be a file path; ${path} is a folder`);
  const parent = dirname(resolve(path));
  const p = await statOrNull(parent);
  if (!p) throw new Error(`${what}: the folder ${parent} does not exist`);
  if (!p.isDirectory()) throw new Error(`${what}: ${parent} is not a folder`);
}

/**
 * A folder to write into (created when missing). With `emptyUnless`, a folder that already holds
 * something is refused unless that flag was given: writing there would replace files silently.
 */
export async function checkOutFolder(path: string, what: string, emptyUnless?: { flag: string; given: boolean }): Promise<void> {
  const s = await statOrNull(path);
  if (s && !s.isDirectory()) throw new Error(`${what} must be a folder; ${path} exists and is not a folder`);
  if (s && emptyUnless && !emptyUnless.given) {
    const n = (await readdir(path)).length;
    if (n > 0) throw new Error(`${what}: ${path} is not empty (${n} entr${n === 1 ? "y" : "ies"}); give ${emptyUnless.flag} to write into it, replacing the files of the same names`);
  }
}

/**
 * A memory store a read command opens must exist: opening creates one, and a mistyped --data
 * would read an empty store without a word. Write commands (memory add, import) may create it.
 */
export function checkStoreExists(data: string): void {
  if (!MemoryStore.exists(data)) throw new Error(`--data ${data}: no memory store there (${resolve(data)}); check the path (dki memory add or dki memory import creates a store)`);
}

/**
 * A K/V cache folder given to a command: missing or empty (it becomes one), or one the cache
 * wrote. Anything else, a model folder say, is refused before the cache writes into it.
 */
export async function checkCacheFolder(path: string, what: string): Promise<void> {
  const s = await statOrNull(path);
  if (s === null) return;
  if (!s.isDirectory()) throw new Error(`${what} ${path} is not a folder`);
  const { foreign } = await readL3Folder(path);
  if (foreign.length > 0) {
    const shown = foreign.slice(0, 3).map((f) => relative(path, f)).join(", ");
    throw new Error(`${what} ${path} is not a K/V cache folder: it holds ${shown}${foreign.length > 3 ? ` and ${foreign.length - 3} more` : ""}; give an empty or new folder`);
  }
}
