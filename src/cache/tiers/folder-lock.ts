// One cache object per L3 folder: a second one, in this process or another, would keep its own
// budget accounting over the same files, and together they would overrun the budget and evict
// each other's entries unseen. The lock is flock(2) on `<dir>/.lock`, taken through the addon
// (Node has no flock) on a descriptor kept open for the cache's life. The kernel holds it and
// drops it when the descriptor is closed or the process ends, a crash or SIGKILL included, so a
// lock is never stale and never taken over. (A pid file, which this replaced, had to be taken
// over once its process was gone: two newcomers could both do so at once, and after a pid was
// reused by an unrelated process the folder was refused until someone deleted the file.)
//
// The file's contents, the holder's pid, only name the holder in the refusal. The file is never
// deleted, at close or ever: a newcomer may have opened it already and would lock the deleted
// file while a third process created and locked a new one, and both would hold the folder.
// Deleting it by hand while a cache is open lets a second cache in for the same reason.
import { readFile } from "node:fs/promises";
import { resolve } from "node:path";
import { native } from "../../engine/native.js";

/** The lock file in a cache folder (the one file there that is not an entry). */
export const LOCK_FILE = ".lock";

/**
 * Folders locked by this process. flock already refuses a second lock here (each open is its own
 * holder), but this names the reason plainly.
 */
const heldHere = new Set<string>();

export class FolderLockedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "FolderLockedError";
  }
}

export class FolderLock {
  private released = false;

  private constructor(
    private readonly path: string,
    private readonly fd: number,
  ) {}

  /** Takes the folder's lock (the folder must exist), or throws FolderLockedError naming the holder. */
  static async acquire(dir: string): Promise<FolderLock> {
    const path = resolve(dir, LOCK_FILE);
    if (heldHere.has(path)) throw new FolderLockedError(`the cache folder ${dir} is already open in this process: close() that cache first`);
    let fd: number;
    try {
      fd = native().lockFile(path);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === "EWOULDBLOCK") throw new FolderLockedError(await heldMessage(dir, path));
      if (code === "ENOLCK" || code === "EOPNOTSUPP") {
        throw new Error(`the cache folder ${dir} cannot be locked, so one cache per folder cannot be ensured there: ${(e as Error).message}; put it on a filesystem with flock support`);
      }
      throw e;
    }
    heldHere.add(path);
    return new FolderLock(path, fd);
  }

  /** Lets go of the lock (once; later calls do nothing). The file stays: see the header. */
  release(): void {
    if (this.released) return;
    this.released = true;
    heldHere.delete(this.path);
    native().unlockFile(this.fd);
  }
}

/** Why the folder was refused, naming the holder by the pid it wrote after taking the lock. */
async function heldMessage(dir: string, path: string): Promise<string> {
  // Empty, or its predecessor's pid, for the moment between the holder's lock and its write.
  const holder = Number.parseInt(await readFile(path, "utf8").catch(() => ""), 10);
  // Another cache here reached through another spelling of the path (a symlink), or a worker
  // thread's; or, as pids are per container, a process with this pid in another container that
  // shares the folder. The file may also still name an earlier holder (see lock_file), hence "names".
  if (holder === process.pid) return `the cache folder ${dir} is already open: its lock file ${path} names this process (${holder}); close() that cache first`;
  if (Number.isInteger(holder) && holder > 0) return `the cache folder ${dir} is in use by another open cache: its lock file ${path} names process ${holder}`;
  return `the cache folder ${dir} is in use by another open cache (${path})`;
}
