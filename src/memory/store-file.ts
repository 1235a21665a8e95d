// The check an LMDB file gets before LMDB maps it. LMDB trusts its file: it follows page numbers,
// node offsets and value sizes as they are written, through a memory map, so a truncated or
// damaged file makes it read past the end of the file (SIGBUS) or of the map (SIGSEGV) and the
// process dies with no message. This check reads the file the way LMDB would (plain reads,
// every offset and size checked first) and refuses it with a StoreFileError if any of that would
// go wrong. Both the memory store and the knowledge base call it.
//
// The layout read here is that of the LMDB inside the `lmdb` package (its mdb.c: the data-file
// format version 2, 64-bit page numbers):
//   - pages 0 and 1 are meta pages (and, with lmdb-js's overlapping sync, a third meta at half a
//     page); each page starts with a 24-byte header: page number u64, txnid u64, pad u16,
//     flags u16, lower/upper u16 (or an overflow page's count u32); a meta follows the header:
//     magic u32 0xBEEFC0DE, version u32, address u64, map size u64, the free-page and main
//     databases (48 bytes each: pad/page size u32, flags u16, depth u16, branch, leaf and overflow
//     page counts, entries and root page, u64 each), last page u64, txnid u64;
//   - LMDB reads the meta with the highest txnid and walks B-trees from its two roots; named
//     databases are leaf nodes of the main database whose value is such a 48-byte record;
//   - a node is lo u16, hi u16, flags u16, key size u16, then the key and the value: a branch
//     node's child page is lo | hi << 16 | flags << 32, a leaf node's value size lo | hi << 16; a
//     value too large for the page lives on overflow pages, the node then holding their first page.
// The walk visits every branch and leaf page reachable from the meta and checks each page's
// number, kind and node bounds, every child and overflow page against the file's size, and that
// no page is reached twice or also listed as free. Leaf contents (the records) are not read: that
// is LMDB's and the caller's business. It reads every tree page once, so it costs a fraction of
// a read of the file (overflow pages, the vectors, are checked by their header only).
//
// Another process may commit while the walk runs and reuse pages of the snapshot being walked,
// or be growing the file: a problem is only believed when the file's size and meta pages did not
// change while it was found.
import { createHash } from "node:crypto";
import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import { StoreFileError } from "./errors.js";

const MAGIC = 0xbeefc0de;
const DATA_VERSION = 2;
const PAGE_HEADER = 24;
const META_BYTES = PAGE_HEADER + 144;
const NODE_HEADER = 8;
const DB_RECORD = 48;
const P_BRANCH = 0x01;
const P_LEAF = 0x02;
const P_OVERFLOW = 0x04;
const P_META = 0x08;
const P_LEAF2 = 0x20;
const P_KIND = P_BRANCH | P_LEAF | P_OVERFLOW | P_META | P_LEAF2;
const F_BIGDATA = 0x01;
const F_SUBDATA = 0x02;
const F_DUPDATA = 0x04;
/** Database flags that change the page layout (duplicate keys); this project's stores use none. */
const MDB_DUPSORT = 0x04;
const MDB_DUPFIXED = 0x10;
const INVALID_PAGE = 0xffff_ffff_ffff_ffffn;
const RETRIES = 5;

interface Db {
  flags: number;
  depth: number;
  root: bigint;
}

interface Meta {
  offset: number;
  pageSize: number;
  lastPage: bigint;
  txnid: bigint;
  free: Db;
  main: Db;
}

/** A problem found in the file; the message follows the file's name ("is truncated: …"). */
class Damage extends Error {}

const damaged = (detail: string): Damage => new Damage(`is damaged: ${detail}`);

/**
 * Refuses, with a StoreFileError naming the file and what to do, an LMDB file that LMDB could not
 * read safely: empty, truncated, not LMDB, or with a damaged page structure. `what` names the
 * file's role in the message ("memory store", "knowledge base"). A file that does not exist is fine.
 */
export function checkLmdbFile(file: string, what: string): void {
  let fd: number;
  try {
    fd = openSync(file, "r");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return;
    throw new StoreFileError(file, what, `cannot be read: ${(e as Error).message}`);
  }
  try {
    for (let attempt = 1; ; attempt++) {
      const before = fingerprint(fd);
      try {
        walk(fd, readMetas(fd));
        return;
      } catch (e) {
        if (!(e instanceof Damage)) throw e;
        if (attempt === RETRIES || fingerprint(fd) === before) throw new StoreFileError(file, what, e.message);
      }
    }
  } finally {
    closeSync(fd);
  }
}

/** The file's size and its first 68 KiB (every meta page of any page size): what a commit changes. */
function fingerprint(fd: number): string {
  return `${fstatSync(fd).size}:${createHash("sha256").update(readAt(fd, 65536 + 4096, 0)).digest("hex")}`;
}

/** Fills `buf` from `position` as far as the file goes; returns the bytes read. */
function readInto(fd: number, buf: Buffer, position: number): number {
  let got = 0;
  while (got < buf.length) {
    const n = readSync(fd, buf, got, buf.length - got, position + got);
    if (n === 0) break;
    got += n;
  }
  return got;
}

function readAt(fd: number, length: number, position: number): Buffer {
  const buf = Buffer.alloc(length);
  return buf.subarray(0, readInto(fd, buf, position));
}

function readDb(b: Buffer, at: number): Db {
  return { flags: b.readUInt16LE(at + 4), depth: b.readUInt16LE(at + 6), root: b.readBigUInt64LE(at + 40) };
}

function parseMeta(b: Buffer, offset: number): Meta {
  return {
    offset,
    pageSize: b.readUInt32LE(PAGE_HEADER + 24),
    free: readDb(b, PAGE_HEADER + 24),
    main: readDb(b, PAGE_HEADER + 24 + DB_RECORD),
    lastPage: b.readBigUInt64LE(PAGE_HEADER + 120),
    txnid: b.readBigUInt64LE(PAGE_HEADER + 128),
  };
}

/** The meta pages LMDB may choose from, after checking the first one and the file's size against it. */
function readMetas(fd: number): Meta[] {
  const size = fstatSync(fd).size;
  if (size === 0) throw new Damage("is empty (0 bytes), so it holds no store: an interrupted copy or a damaged disk, not a new store");
  const first = readAt(fd, META_BYTES, 0);
  if (first.length < META_BYTES) throw new Damage(`is ${size} bytes long, too short for an LMDB file (truncated, or not LMDB)`);
  const magic = first.readUInt32LE(PAGE_HEADER);
  const version = first.readUInt32LE(PAGE_HEADER + 4) & 0xffff;
  if (!(first.readUInt16LE(18) & P_META) || magic !== MAGIC) throw new Damage("is not an LMDB file (its first page is not an LMDB meta page)");
  if (version !== DATA_VERSION) throw new Damage(`is an LMDB file of data format ${version}; this build reads format ${DATA_VERSION}`);
  const meta0 = parseMeta(first, 0);
  const ps = meta0.pageSize;
  if (ps < 512 || ps > 65536 || (ps & (ps - 1)) !== 0) throw damaged(`its page size ${ps} is not a power of two from 512 to 65536`);
  if (size < 2 * ps) throw new Damage(`is truncated: ${size} bytes, less than its two ${ps}-byte meta pages`);
  if (size % ps !== 0) throw new Damage(`is truncated: ${size} bytes is not a whole number of its ${ps}-byte pages`);
  const second = readAt(fd, META_BYTES, ps);
  if (!(second.readUInt16LE(18) & P_META) || second.readUInt32LE(PAGE_HEADER) !== MAGIC) throw damaged("its second meta page (page 1) is not a meta page");
  // The half-page meta of overlapping sync has no page header flags of its own; LMDB reads it
  // when the environment uses overlapping sync, and only a nonzero txnid can make it chosen.
  const half = parseMeta(readAt(fd, META_BYTES, ps / 2), ps / 2);
  return [meta0, half, parseMeta(second, ps)];
}

/** Walks the trees of every meta LMDB could choose (with and without overlapping sync). */
function walk(fd: number, metas: Meta[]): void {
  const [m0, half, m1] = metas;
  const latest = (a: Meta, b: Meta) => (a.txnid >= b.txnid ? a : b);
  const chosen = new Set([latest(m0, m1), latest(latest(m0, half), m1)]);
  const size = fstatSync(fd).size;
  for (const meta of chosen) new Walker(fd, meta, size).run();
}

class Walker {
  private readonly ps: number;
  private readonly pages: bigint;
  /** Pages reached so far, one byte each (a file's pages fit in memory many times over). */
  private readonly seen: Uint8Array;
  /**
   * A page buffer per recursion depth, reused: a page's nodes are read while its children (and a
   * named database's pages, below a main-database leaf) are.
   */
  private readonly buffers: Buffer[] = [];
  private depth = 0;
  private readonly header = Buffer.alloc(PAGE_HEADER);
  /** Free blocks: first page, length. */
  private readonly free: [bigint, bigint][] = [];

  constructor(
    private readonly fd: number,
    private readonly meta: Meta,
    fileSize: number,
  ) {
    this.ps = meta.pageSize;
    this.pages = BigInt(fileSize / this.ps);
    this.seen = new Uint8Array(fileSize / this.ps);
  }

  run(): void {
    const where = `meta page at byte ${this.meta.offset} (txn ${this.meta.txnid})`;
    if (this.meta.pageSize !== this.ps) throw damaged(`${where}: page size ${this.meta.pageSize}`);
    // Pages past the end of the file may be free ones never written, but not 2^40 of them.
    if (this.meta.lastPage < 1n || this.meta.lastPage >= 2n ** 40n) throw damaged(`${where}: last page ${this.meta.lastPage}`);
    this.tree(this.meta.free, "the free-page database", true);
    this.tree(this.meta.main, "the main database", false);
    for (const [first, length] of this.free) {
      if (first < 2n || first + length - 1n > this.meta.lastPage) throw damaged(`the free-page list names pages ${first}..${first + length - 1n}, outside pages 2..${this.meta.lastPage}`);
      const end = Number(first + length < this.pages ? first + length : this.pages);
      for (let p = Number(first); p < end; p++) if (this.seen[p]) throw damaged(`page ${p} is both in use and listed as free`);
    }
  }

  private tree(db: Db, name: string, freeList: boolean): void {
    if (db.root === INVALID_PAGE) return;
    if (db.flags & (MDB_DUPSORT | MDB_DUPFIXED)) throw damaged(`${name} has flags 0x${db.flags.toString(16)} (duplicate keys), which this project's stores never use`);
    if (db.depth < 1 || db.depth > 64) throw damaged(`${name} has depth ${db.depth}`);
    this.page(db.root, db.depth, name, freeList);
  }

  private checkPage(pgno: bigint, count: number, name: string): void {
    if (pgno < 2n || pgno + BigInt(count) > this.pages) throw damaged(`${name} names page ${pgno}${count > 1 ? ` (+${count - 1})` : ""}, outside the file's ${this.pages} pages (truncated?)`);
    if (pgno + BigInt(count) - 1n > this.meta.lastPage) throw damaged(`${name} names page ${pgno}, past the last page ${this.meta.lastPage}`);
    const n = Number(pgno);
    if (this.seen[n]) throw damaged(`${name}: page ${pgno} is reached twice`);
    this.seen[n] = 1;
  }

  private page(pgno: bigint, level: number, name: string, freeList: boolean): void {
    this.checkPage(pgno, 1, name);
    const p = (this.buffers[this.depth] ??= Buffer.alloc(this.ps));
    if (readInto(this.fd, p, Number(pgno) * this.ps) < this.ps) throw damaged(`${name}, page ${pgno}: cut short by the end of the file`);
    this.depth++;
    try {
      this.nodes(p, pgno, level, name, freeList);
    } finally {
      this.depth--;
    }
  }

  private nodes(p: Buffer, pgno: bigint, level: number, name: string, freeList: boolean): void {
    const at = `${name}, page ${pgno}`;
    if (p.readBigUInt64LE(0) !== pgno) throw damaged(`${at}: the page says it is page ${p.readBigUInt64LE(0)}`);
    const kind = p.readUInt16LE(18) & P_KIND;
    const expected = level > 1 ? P_BRANCH : P_LEAF;
    if (kind !== expected) throw damaged(`${at}: flags 0x${kind.toString(16)}, expected a ${level > 1 ? "branch" : "leaf"} page`);
    const lower = p.readUInt16LE(20);
    const upper = p.readUInt16LE(22);
    if (lower % 2 !== 0 || lower > upper || PAGE_HEADER + upper > this.ps) throw damaged(`${at}: free-space bounds ${lower}..${upper} do not fit a ${this.ps}-byte page`);
    const keys = lower / 2;
    if (level > 1 && keys === 0) throw damaged(`${at}: a branch page with no keys`);
    for (let i = 0; i < keys; i++) {
      const node = PAGE_HEADER + p.readUInt16LE(PAGE_HEADER + 2 * i);
      if (node < PAGE_HEADER + upper || node + NODE_HEADER > this.ps) throw damaged(`${at}: node ${i} at offset ${node} lies outside the page's node area`);
      const lo = p.readUInt16LE(node);
      const hi = p.readUInt16LE(node + 2);
      const flags = p.readUInt16LE(node + 4);
      const keySize = p.readUInt16LE(node + 6);
      const data = node + NODE_HEADER + keySize;
      if (data > this.ps) throw damaged(`${at}: node ${i}'s ${keySize}-byte key runs past the page`);
      if (level > 1) {
        this.page(BigInt(lo) | (BigInt(hi) << 16n) | (BigInt(flags) << 32n), level - 1, name, freeList);
        continue;
      }
      if (flags & ~(F_BIGDATA | F_SUBDATA | F_DUPDATA)) throw damaged(`${at}: node ${i} has unknown flags 0x${flags.toString(16)}`);
      if (flags & F_DUPDATA) throw damaged(`${at}: node ${i} holds duplicate keys, which this project's stores never use`);
      const dataSize = lo + hi * 65536;
      let value: Buffer | undefined;
      if (flags & F_BIGDATA) {
        if (data + 8 > this.ps) throw damaged(`${at}: node ${i}'s overflow page number runs past the page`);
        value = this.overflow(p.readBigUInt64LE(data), dataSize, `${at}, node ${i}`, freeList);
      } else {
        if (data + dataSize > this.ps) throw damaged(`${at}: node ${i}'s ${dataSize}-byte value runs past the page`);
        if (freeList || flags & F_SUBDATA) value = p.subarray(data, data + dataSize);
      }
      if (flags & F_SUBDATA) {
        if (freeList || name !== "the main database" || value === undefined || value.length !== DB_RECORD) throw damaged(`${at}: node ${i} claims a named database where none can be`);
        const key = p.subarray(node + NODE_HEADER, data).toString("utf8");
        this.tree(readDb(value, 0), `database ${JSON.stringify(key)}`, false);
      } else if (freeList && value !== undefined) {
        this.freePages(value, `${at}, node ${i}`);
      }
    }
  }

  /** Checks a value's overflow pages; returns the value's bytes only where they are read (the free list). */
  private overflow(pgno: bigint, dataSize: number, at: string, read: boolean): Buffer | undefined {
    const count = Math.ceil((dataSize + PAGE_HEADER) / this.ps);
    this.checkPage(pgno, 1, at);
    const head = this.header;
    readInto(this.fd, head, Number(pgno) * this.ps);
    if (head.readBigUInt64LE(0) !== pgno || (head.readUInt16LE(18) & P_KIND) !== P_OVERFLOW) throw damaged(`${at}: page ${pgno} is not an overflow page`);
    const pages = head.readUInt32LE(20);
    if (pages < count) throw damaged(`${at}: a ${dataSize}-byte value on ${pages} overflow page(s)`);
    // The page itself was marked above; its followers are checked against the file and marked too.
    this.seen[Number(pgno)] = 0;
    this.checkPage(pgno, pages, at);
    for (let i = Number(pgno) + 1; i < Number(pgno) + pages; i++) {
      if (this.seen[i]) throw damaged(`${at}: overflow page ${i} is reached twice`);
      this.seen[i] = 1;
    }
    return read ? readAt(this.fd, dataSize, Number(pgno) * this.ps + PAGE_HEADER) : undefined;
  }

  /**
   * A free-page record: a count, then that many signed entries: a page number, a negative block
   * length followed by the block's first page, or 0 (unused).
   */
  private freePages(value: Buffer, at: string): void {
    if (value.length < 8) throw damaged(`${at}: a free-page record of ${value.length} bytes`);
    const n = value.readBigUInt64LE(0);
    if ((n + 1n) * 8n > BigInt(value.length)) throw damaged(`${at}: a free-page record counting ${n} entries in ${value.length} bytes`);
    for (let i = 1; i <= Number(n); i++) {
      const entry = value.readBigInt64LE(8 * i);
      if (entry === 0n) continue;
      if (entry > 0n) {
        this.free.push([entry, 1n]);
        continue;
      }
      if (i === Number(n)) throw damaged(`${at}: a free block of ${-entry} pages with no first page`);
      this.free.push([value.readBigInt64LE(8 * ++i), -entry]);
    }
  }
}
