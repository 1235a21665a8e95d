// Checks of the paths a command is given, made before any work so that a wrong kind of path is
// reported as what the user did wrong, not as the ENOTDIR/EISDIR/ENOENT of a file deep inside.
import type { Stats } from "node:fs";
import { readdir, stat } from "node:fs/promises";
import { dirname, resolve } from "node:path";

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
