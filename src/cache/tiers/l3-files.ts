// L3: int8 blocks (per-channel key scales, per-token value scales) as files in a folder, one per
// entry, at <dir>/<userHash>/<key>.kvb. The name scheme is the index: on open the folder is
// scanned, so entries survive restarts with no separate index to keep consistent, and
// clear(userId) finds a user's files by their folder. Recency across restarts comes from file
// mtimes (refreshed on every hit); frequencies start again at 1.
//
// Each file is a 64-byte entry header (magic, version, the entry's key, the block's length)
// followed by the serialised block, which carries its own header, model fingerprint and body
// checksum. The entry header binds a file to its key, so a file copied or renamed onto another
// key's name is refused even when it is a valid block. Writes go to a temporary file that is
// renamed into place (atomic on POSIX): a reader sees the old file, the new one, or none, and a
// crash leaves only a *.tmp file, deleted on the next open.
//
// Budget accounting counts every byte this tier has on disk or is about to write: a write
// reserves its size before creating its temporary file, and deleted or cancelled files are
// counted until their unlink finishes. So the files in the folder never add up to more than the
// budget, not even for a moment (the cache's lock file, a few bytes, is not an entry and is not
// counted). One cache object per folder: two sharing one would each keep their own accounting,
// which the cache's folder lock (folder-lock.ts) prevents.
import { mkdir, open, readdir, readFile, rename, stat, unlink, utimes } from "node:fs/promises";
import { dirname, join } from "node:path";
import { KEY_PATTERN, USER_HASH_PATTERN } from "../keys.js";
import { LOCK_FILE } from "./folder-lock.js";
import { Usage } from "../usage.js";

export const ENTRY_HEADER_BYTES = 64;
const ENTRY_MAGIC = Buffer.from("DKIKVL3\0", "latin1");
const ENTRY_VERSION = 1;
const FILE_PATTERN = /^([0-9a-f]{64})\.kvb$/;

/** An L3 entry that cannot be trusted (truncated, bit-flipped, foreign): it is dropped and recomputed. */
export class CorruptEntryError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "CorruptEntryError";
  }
}

/** The entry header for a serialised block of `blockBytes` bytes stored under `key`. */
export function entryHeader(key: string, blockBytes: number): Buffer {
  const h = Buffer.alloc(ENTRY_HEADER_BYTES);
  ENTRY_MAGIC.copy(h, 0);
  h.writeUInt32LE(ENTRY_VERSION, 8);
  Buffer.from(key, "hex").copy(h, 16);
  h.writeBigUInt64LE(BigInt(blockBytes), 48);
  return h;
}

/** A complete L3 file for a serialised block (tests and tools use this to craft entries). */
export function encodeEntry(key: string, block: Uint8Array): Buffer {
  return Buffer.concat([entryHeader(key, block.length), block]);
}

/** Checks a file's entry header against the key it was read for; returns the block bytes. */
export function decodeEntry(key: string, file: Buffer): Buffer {
  if (file.length < ENTRY_HEADER_BYTES) throw new CorruptEntryError(`L3 entry ${key} is ${file.length} bytes, shorter than its header`);
  if (!file.subarray(0, 8).equals(ENTRY_MAGIC)) throw new CorruptEntryError(`L3 entry ${key} is not a cache entry (bad magic)`);
  const version = file.readUInt32LE(8);
  if (version !== ENTRY_VERSION) throw new CorruptEntryError(`L3 entry ${key} has format version ${version}, expected ${ENTRY_VERSION}`);
  if (file.subarray(16, 48).toString("hex") !== key) throw new CorruptEntryError(`L3 entry ${key} was written for another key`);
  const n = file.readBigUInt64LE(48);
  if (n !== BigInt(file.length - ENTRY_HEADER_BYTES)) {
    throw new CorruptEntryError(`L3 entry ${key} is ${file.length - ENTRY_HEADER_BYTES} bytes after its header, its header says ${n} (truncated?)`);
  }
  return file.subarray(ENTRY_HEADER_BYTES);
}

/** An entry file found in an L3 folder. */
export interface L3FileEntry {
  key: string;
  userHash: string;
  bytes: number;
  mtime: number;
}

/**
 * What a folder holds, read as an L3 folder: its entry files, the temporary files of writes cut
 * short, and the paths that are none of the cache's own (the lock file, user-hash folders, entry
 * and temporary files in them): a folder with any of those is not (only) a K/V cache.
 */
export async function readL3Folder(dir: string): Promise<{ entries: L3FileEntry[]; temporary: string[]; foreign: string[] }> {
  const entries: L3FileEntry[] = [];
  const temporary: string[] = [];
  const foreign: string[] = [];
  for (const u of await readdir(dir, { withFileTypes: true })) {
    if (u.name === LOCK_FILE && u.isFile()) continue;
    if (!u.isDirectory() || !USER_HASH_PATTERN.test(u.name)) {
      foreign.push(join(dir, u.name));
      continue;
    }
    for (const f of await readdir(join(dir, u.name))) {
      const path = join(dir, u.name, f);
      const m = FILE_PATTERN.exec(f);
      const st = m || f.endsWith(".tmp") ? await stat(path) : null;
      if (m && st?.isFile()) entries.push({ key: m[1], userHash: u.name, bytes: st.size, mtime: st.mtimeMs });
      else if (f.endsWith(".tmp") && st?.isFile()) temporary.push(path);
      else foreign.push(path);
    }
  }
  return { entries, temporary, foreign };
}

interface L3Record {
  key: string;
  userHash: string;
  /** File size (entry header + block). */
  bytes: number;
  usage: Usage;
  state: "writing" | "ready";
  /** Set when the entry is removed while its write is still running: the writer cleans up. */
  cancelled: boolean;
  task?: Promise<L3WriteResult>;
}

export type L3WriteResult = "written" | "exists" | "too-large" | "no-room" | "cancelled" | "failed";

/** A read entry: its block bytes, and a way to drop exactly this file if the block fails to verify. */
export interface L3Read {
  bytes: Buffer;
  drop(): Promise<void>;
}

export class L3Files {
  private readonly records = new Map<string, L3Record>();
  /** Bytes on disk or reserved, including files being deleted. Never above the budget. */
  private used = 0;
  /** Part of `used` that is on its way out (unlinks and cancelled writes in progress). */
  private leaving = 0;
  /** Unlinks and cancelled writes in progress; writes wait for these before creating files. */
  private readonly settling = new Set<Promise<unknown>>();
  private tmpSeq = 0;
  /** Failed writes and unexpected I/O errors, for stats. */
  writeFailures = 0;
  lastWriteError: string | undefined;

  private constructor(
    readonly dir: string,
    readonly budget: number,
  ) {}

  /**
   * Scans the folder, deletes leftovers of interrupted writes, and trims to the budget. The folder
   * exists already: the cache creates it and takes its lock before anything here touches it.
   */
  static async open(dir: string, budget: number, halfLife: number): Promise<L3Files> {
    const l3 = new L3Files(dir, budget);
    const { entries: found, temporary } = await readL3Folder(dir);
    for (const path of temporary) await unlink(path).catch(() => {}); // writes cut short by a crash
    // Oldest first, with ticks before the new session's clock starts at 0, so recency carries over.
    found.sort((a, b) => a.mtime - b.mtime);
    found.forEach((f, i) => {
      if (l3.records.has(f.key)) {
        // The same key under two user folders cannot come from this cache: refuse the copy.
        void unlink(join(dir, f.userHash, `${f.key}.kvb`)).catch(() => {});
        return;
      }
      const usage = new Usage(halfLife, i - found.length, 1);
      l3.records.set(f.key, { key: f.key, userHash: f.userHash, bytes: f.bytes, usage, state: "ready", cancelled: false });
      l3.used += f.bytes;
    });
    // Reopened with a smaller budget: evict the coldest entries now.
    while (l3.used - l3.leaving > budget) {
      const v = l3.lowestReady();
      if (!v) break;
      void l3.remove(v.key);
    }
    await l3.settled();
    return l3;
  }

  get bytes(): number {
    return this.used;
  }

  /** Entries stored or being written. */
  get size(): number {
    return this.records.size;
  }

  fits(fileBytes: number): boolean {
    return fileBytes <= this.budget;
  }

  /** Readable now. */
  isReady(key: string): boolean {
    return this.records.get(key)?.state === "ready";
  }

  /** Stored or being written. */
  holds(key: string): boolean {
    return this.records.has(key);
  }

  usageOf(key: string): Usage | undefined {
    return this.records.get(key)?.usage;
  }

  private pathOf(r: { key: string; userHash: string }): string {
    return join(this.dir, r.userHash, `${r.key}.kvb`);
  }

  /**
   * Reads a ready entry and checks its entry header. Null when there is none (or its file has
   * vanished). A bad entry header drops the file and throws CorruptEntryError; other I/O errors
   * are thrown as they are and leave the file alone.
   */
  async read(key: string): Promise<L3Read | null> {
    const rec = this.records.get(key);
    if (!rec || rec.state !== "ready") return null;
    let file: Buffer;
    try {
      file = await readFile(this.pathOf(rec));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
      // Deleted behind our back: forget it (nothing left on disk to count).
      if (this.records.get(key) === rec) {
        this.records.delete(key);
        this.used -= rec.bytes;
      }
      return null;
    }
    const drop = () => (this.records.get(key) === rec ? this.remove(key) : Promise.resolve());
    let bytes: Buffer;
    try {
      bytes = decodeEntry(key, file);
    } catch (e) {
      await drop();
      throw e;
    }
    return { bytes, drop };
  }

  /**
   * Writes the session's ranking into the files' mtimes, least worth keeping oldest, so the next
   * open() ranks them the same way (entries used only from L1 or L2 never touched their files).
   */
  async persistRanking(): Promise<void> {
    const ready = [...this.records.values()].filter((r) => r.state === "ready").sort((a, b) => a.usage.priority() - b.usage.priority());
    const now = Date.now();
    await Promise.all(
      ready.map((r, i) => {
        const t = new Date(now - (ready.length - i)); // 1 ms apart
        return utimes(this.pathOf(r), t, t).catch(() => {});
      }),
    );
  }

  /**
   * Marks an entry's file as just used (its mtime: recency after a restart). Its in-memory usage
   * is the caller's to touch: the tiers above share it.
   */
  touchFile(key: string): void {
    const rec = this.records.get(key);
    if (!rec) return;
    if (rec.state === "ready") {
      const t = new Date();
      void utimes(this.pathOf(rec), t, t).catch(() => {});
    }
  }

  /**
   * Stores a serialised block under `key`, evicting the coldest entries to make room. Resolves
   * when the file is in place (or the write was skipped: see the result). `cancelled` is asked
   * right before the space is reserved, so a caller invalidated while waiting writes nothing.
   */
  async write(key: string, userHash: string, usage: Usage, block: Buffer, cancelled: () => boolean = () => false): Promise<L3WriteResult> {
    const size = ENTRY_HEADER_BYTES + block.length;
    if (!KEY_PATTERN.test(key) || !USER_HASH_PATTERN.test(userHash)) throw new Error("invalid L3 key or user hash");
    if (!this.fits(size)) return "too-large";
    for (;;) {
      if (this.records.has(key)) return "exists"; // keys name content: an existing entry is this block
      if (cancelled()) return "cancelled";
      // Evict until the bytes that will remain once pending deletions finish leave room.
      while (this.used - this.leaving + size > this.budget) {
        const v = this.lowestReady();
        if (!v) break;
        void this.remove(v.key);
      }
      if (this.used - this.leaving + size > this.budget) return "no-room"; // the rest is being written by others
      if (this.used + size <= this.budget) break;
      await this.settled(); // deletions are under way; reserve once their space is free
    }
    const rec: L3Record = { key, userHash, bytes: size, usage, state: "writing", cancelled: false };
    this.records.set(key, rec);
    this.used += size;
    // Deletions that started earlier (possibly of an older file with this very name) finish first.
    const before = [...this.settling];
    rec.task = this.writeFile(rec, block, before);
    return rec.task;
  }

  private async writeFile(rec: L3Record, block: Buffer, before: Promise<unknown>[]): Promise<L3WriteResult> {
    await Promise.allSettled(before);
    const final = this.pathOf(rec);
    const tmp = join(dirname(final), `.${rec.key}.${process.pid}.${this.tmpSeq++}.tmp`);
    let created = false;
    let renamed = false;
    try {
      if (rec.cancelled) return "cancelled";
      await mkdir(dirname(final), { recursive: true });
      const fh = await open(tmp, "w");
      created = true;
      try {
        await fh.writeFile(entryHeader(rec.key, block.length));
        await fh.writeFile(block);
      } finally {
        await fh.close();
      }
      if (rec.cancelled) return "cancelled";
      await rename(tmp, final);
      renamed = true;
      if (rec.cancelled) return "cancelled";
      rec.state = "ready";
      return "written";
    } catch (e) {
      this.writeFailures++;
      this.lastWriteError = `L3 write of ${rec.key}: ${e instanceof Error ? e.message : String(e)}`;
      return "failed";
    } finally {
      if (rec.state !== "ready") {
        if (created) await unlink(renamed ? final : tmp).catch(() => {});
        if (this.records.get(rec.key) === rec) this.records.delete(rec.key); // failed, not cancelled
        this.used -= rec.bytes;
        if (rec.cancelled) this.leaving -= rec.bytes;
      }
    }
  }

  /** Removes an entry: its file is deleted (or its write abandoned). Resolves when it is gone from disk. */
  remove(key: string): Promise<void> {
    const rec = this.records.get(key);
    if (!rec) return Promise.resolve();
    this.records.delete(key);
    this.leaving += rec.bytes;
    let p: Promise<void>;
    if (rec.state === "ready") {
      p = unlink(this.pathOf(rec))
        .catch(() => {})
        .then(() => {
          this.used -= rec.bytes;
          this.leaving -= rec.bytes;
        });
    } else {
      rec.cancelled = true; // the writer deletes what it made and releases the bytes
      p = rec.task!.then(() => {});
    }
    const tracked = p.finally(() => this.settling.delete(tracked));
    this.settling.add(tracked);
    return tracked;
  }

  /** Removes every entry of one user. */
  async removeUser(userHash: string): Promise<void> {
    const keys = [...this.records.values()].filter((r) => r.userHash === userHash).map((r) => r.key);
    await Promise.all(keys.map((k) => this.remove(k)));
  }

  /** Waits for the deletions in progress. */
  async settled(): Promise<void> {
    while (this.settling.size > 0) await Promise.allSettled([...this.settling]);
  }

  /** Waits for everything in progress: writes and deletions. */
  async idle(): Promise<void> {
    for (;;) {
      const writing = [...this.records.values()].filter((r) => r.state === "writing" && r.task).map((r) => r.task!);
      if (writing.length === 0 && this.settling.size === 0) return;
      await Promise.allSettled([...writing, ...this.settling]);
    }
  }

  private lowestReady(): L3Record | undefined {
    let best: L3Record | undefined;
    let bestP = Infinity;
    for (const r of this.records.values()) {
      if (r.state !== "ready") continue;
      const p = r.usage.priority();
      if (p < bestP) {
        best = r;
        bestP = p;
      }
    }
    return best;
  }
}
