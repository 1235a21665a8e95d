// One cache object per L3 folder: a second one, in this process or another, would keep its own
// budget accounting over the same files, and together they would overrun the budget and evict
// each other's entries unseen. The lock is a file `<dir>/.lock` holding the owner's pid, created
// exclusively. A lock left by a process that is gone (a crash, an exit without close()) is taken
// over. Two processes that find the same stale lock at the same moment can both take it over;
// the window is the few microseconds between reading it and replacing it.
import { open, readFile, unlink } from "node:fs/promises";
import { join } from "node:path";

const LOCK_FILE = ".lock";

/** Folders locked by this process: a pid check cannot tell two of its own caches apart. */
const heldHere = new Set<string>();

export class FolderLockedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "FolderLockedError";
  }
}

export class FolderLock {
  private released = false;

  private constructor(private readonly path: string) {}

  /** Takes the folder's lock (the folder must exist), or throws FolderLockedError naming the holder. */
  static async acquire(dir: string): Promise<FolderLock> {
    const path = join(dir, LOCK_FILE);
    if (heldHere.has(path)) throw new FolderLockedError(`the cache folder ${dir} is already open in this process: close() that cache first`);
    // Once to create the lock, and once more after removing a stale one.
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        const fh = await open(path, "wx");
        try {
          await fh.writeFile(`${process.pid}\n`);
        } finally {
          await fh.close();
        }
        heldHere.add(path);
        return new FolderLock(path);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
      }
      const holder = Number.parseInt(await readFile(path, "utf8").catch(() => ""), 10);
      if (Number.isInteger(holder) && holder > 0 && holder !== process.pid && isRunning(holder)) {
        throw new FolderLockedError(
          `the cache folder ${dir} is in use by process ${holder} (${path}); if no such process uses it, delete that file`,
        );
      }
      // Unreadable, or its process is gone (or it is this pid, left by an earlier process that had it).
      await unlink(path).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== "ENOENT") throw err;
      });
    }
    throw new FolderLockedError(`the cache folder ${dir}: another process took its lock (${path}) as this one replaced a stale one`);
  }

  /** Lets go of the lock (once; later calls do nothing). */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    heldHere.delete(this.path);
    await unlink(this.path).catch(() => {});
  }
}

/** Whether a process with this pid exists (EPERM: it does, under another user). */
function isRunning(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}
