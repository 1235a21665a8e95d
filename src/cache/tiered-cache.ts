// The tiered K/V cache: memory blocks are expensive to compute and cheap to reuse, so keep them
// at four levels of cost.
//
//   L1  live fp32 KVBlocks, in GPU memory on CUDA (l1OnDevice)           costed by their bytes
//   L2  serialised fp16/bf16 Buffers in host RAM                          costed by buffer length
//   L3  int8 files in a folder, surviving restarts (tiers/l3-files.ts)    costed by file size
//   L4  nothing: recompute with the model
//
// get() looks from L1 down and promotes what it finds to L1; a full miss computes the block and
// put()s it. put() stores in L1 and writes behind to L3 (int8), so a block outlives the process
// from its first use. Each tier has a byte budget, enforced synchronously on every insert, so it
// holds at every moment. When a tier is full, its coldest entries by frequency × recency
// (usage.ts) move down: L1 → L2 → L3, and out of L3 means deleted. L1 and L2 hold a key at most
// once between them; L3 keeps its copy while the key is hot (it is the persistent backing store).
//
// Trust: every block that comes back from L2 or L3 is checked (the serialised checksum, the model
// fingerprint, the L3 entry header, and its tokens and position against the request) before it
// is handed out. One that fails is dropped, counted in stats().corruptDropped and recomputed;
// it is never injected. Keys (keys.ts) cover the user, the model, the content and the dtype.
//
// Ownership: blocks returned by get() and blocks given to put() belong to the cache. Callers may
// use them (inject them, slice or remap them into new blocks) but must not dispose them. A caller
// done with a hit calls hit.release(): a block the cache made itself (restored or computed) is
// then freed as soon as it has also left L1 and no background job or other hit holds it, and its
// buffers go back to the engine's pool for the next restore. Blocks never released, and blocks
// given to put(), are left to the garbage collector (blocks report their size to V8): the cache
// keeps no reference to a block once it has left L1.
//
// Conversions (serialise, quantise, dequantise, host↔GPU copies) run on libuv worker threads and
// file I/O is asynchronous, so the event loop is never blocked by cache work. With l1OnDevice,
// blocks are computed on the GPU and L2/L3 bytes are decoded there (only the stored form crosses
// PCIe); blocks on their way down are encoded there too. A block put() by a caller stays where
// the caller made it.
import { mkdir } from "node:fs/promises";
import { performance } from "node:perf_hooks";
import type { ComputeBlockOptions } from "../engine/model.js";
import type { NativeModelHandle } from "../engine/native.js";
import { DkiArgumentError, NonFiniteError } from "../errors.js";
import { KVBlock } from "../kv/kv-block.js";
import { blockKey, checkTokenList, KEY_PATTERN, userHash } from "./keys.js";
import { LatencyStats } from "./latency.js";
import type { Entry } from "./tiers/budgeted-map.js";
import { FolderLock } from "./tiers/folder-lock.js";
import { L1Blocks } from "./tiers/l1.js";
import { L2Buffers, type L2Storage } from "./tiers/l2.js";
import { CorruptEntryError, ENTRY_HEADER_BYTES, L3Files } from "./tiers/l3-files.js";
import { Usage } from "./usage.js";
import { Semaphore } from "../util/semaphore.js";

export type Tier = "L1" | "L2" | "L3" | "L4";

/** Identifies a block and says how to compute it on a miss. */
export interface BlockRequest {
  userId: string;
  /** Token ids of the block. */
  tokens: readonly number[];
  /** Position of its first token (default 0). */
  startPos?: number;
  /** Tokens encoded before the block but not kept (see ComputeBlockOptions.prefix); part of the key. */
  prefix?: number[];
}

/** What the cache needs from a model; `Model` has it. */
export interface CacheModel {
  readonly info: { readonly fingerprint: string; readonly device?: "cpu" | "cuda" };
  nativeHandle(): NativeModelHandle;
  computeBlock(tokens: readonly number[], opts: ComputeBlockOptions): Promise<KVBlock>;
}

export interface CacheBudgets {
  l1Bytes: number;
  l2Bytes: number;
  l3Bytes: number;
}

export interface TieredKVCacheOptions {
  model: CacheModel;
  /**
   * Folder of the L3 files (created if missing). One cache object per folder at a time: open()
   * takes an OS lock (flock) on `<dir>/.lock`, which close() lets go of, and refuses a folder
   * another open cache holds, in this process or another (FolderLockedError). The kernel drops
   * the lock when its process ends, however it ends, so a crash never leaves the folder locked.
   * The file stays after close (it holds the last holder's process id, only to name it when
   * refusing); do not delete it while a cache is open.
   */
  dir: string;
  budgets: CacheBudgets;
  /** Form of L2 entries (default "f16"). */
  l2Storage?: L2Storage;
  /**
   * true (default): put() returns once the block is in L1 and the L3 write runs in the background
   * (flush() waits for it). false: put() waits for it. Either way the write can be skipped or
   * fail (stats().l3Skipped, backgroundErrors); `locate(key)` says whether the entry is in L3.
   */
  writeBehind?: boolean;
  /** Accesses (gets and puts) after which an entry's use count has halved in the eviction score (default 64). */
  recencyHalfLife?: number;
  /** L1 blocks live in GPU memory, and l1Bytes budgets that memory (default: true when the model runs on CUDA). */
  l1OnDevice?: boolean;
  /**
   * Gets that miss L1 and load (decode from L2/L3 or compute) at once; the others wait their
   * turn (default 2: computes run one at a time anyway, and a decode can overlap one). Bounds the
   * memory a burst of gets takes beyond the budgets.
   */
  maxConcurrentLoads?: number;
}

export interface CacheHit {
  /** Owned by the cache: do not dispose it. */
  block: KVBlock;
  /** Where it came from; L4 = computed now. */
  tier: Tier;
  /** From the call to the block being ready. */
  loadMs: number;
  key: string;
  /**
   * Says this caller is done with the block (optional; further calls do nothing). Once it has
   * also left L1, the cache frees it at once instead of waiting for the garbage collector, so
   * its memory serves the next restore. Do not use the block after releasing it.
   */
  release(): void;
}

/** A hit before it is handed to one caller (concurrent gets of one key share it). */
type Served = Omit<CacheHit, "release">;

export interface TierStats {
  entries: number;
  bytes: number;
  budgetBytes: number;
  /**
   * Bytes of entries on their way down from this tier (being encoded for the next one): no
   * longer in `bytes`, still in memory. put() waits while this exceeds the budget.
   */
  leavingBytes: number;
  /** Gets this tier served. For L4: blocks computed. */
  hits: number;
  /** Gets that reached this tier and went on to the next. For L4: failed computes. */
  misses: number;
  /** Load latency of the gets this tier served: mean over all, p95 over the last 1024. */
  meanLoadMs: number;
  p95LoadMs: number;
}

export interface CacheStats {
  L1: TierStats;
  L2: TierStats;
  L3: TierStats;
  L4: TierStats;
  /** L2/L3 entries that failed verification (truncated, corrupt, foreign, mismatched) and were dropped. */
  corruptDropped: number;
  /** Gets that waited for an identical get already in progress instead of loading again. */
  singleFlightJoins: number;
  /** Background conversions and writes still running. */
  pending: number;
  /** Failed background jobs and L3 writes (the entry is then just not cached further down). */
  backgroundErrors: number;
  /**
   * What L3 could not take, so will not outlive the process: `tooLarge`, blocks bigger than the
   * whole L3 budget (each block taken in, computed or put, counted once); `noRoom`, writes
   * skipped because writes in progress held the budget (a block is tried again when it leaves L1
   * or L2, so one may count more than once). Nothing is counted when L3 is off (a zero budget).
   */
  l3Skipped: { tooLarge: number; noRoom: number };
  lastError?: string;
}

/** A background conversion or write for one key; invalidate/clear cancel it. */
interface Job {
  key: string;
  userHash: string;
  cancelled: boolean;
  done?: Promise<void>;
}

interface Identified {
  key: string;
  userHash: string;
  tokens: readonly number[];
  startPos: number;
  prefix: number[];
}

export class TieredKVCache {
  private readonly l1: L1Blocks;
  private readonly l2: L2Buffers;
  /** L1 victims being converted for L2/L3: still in memory, so a get takes them back as L1 hits. */
  private readonly leavingL1 = new Map<string, Entry<KVBlock>>();
  /** L2 victims being converted for L3: a get restores them as L2 hits. */
  private readonly leavingL2 = new Map<string, Entry<Buffer>>();
  /** Write-behinds in flight, by key, so a key is written to L3 once. */
  private readonly writing = new Map<string, Job>();
  private readonly jobs = new Set<Job>();
  /** Gets in progress: identical requests share one load (single flight). */
  private readonly inflight = new Map<string, Promise<Served>>();
  /** Unreleased hits per block (weak: a hit never released must not keep its block alive). */
  private readonly leases = new WeakMap<KVBlock, number>();
  /** Background jobs reading a block (encoding it for L2, writing it to L3). */
  private readonly pins = new Map<KVBlock, number>();
  /** Blocks the cache made (restored or computed), the only ones it may free. */
  private readonly made = new WeakSet<KVBlock>();
  /** Cancellation flags of the loads in progress. */
  private readonly loads = new Set<Job>();
  private clock = 0;
  private closed = false;
  private lastUser: { id: string; hash: string } | null = null;
  private readonly hits = { L1: 0, L2: 0, L3: 0, L4: 0 };
  private readonly misses = { L1: 0, L2: 0, L3: 0, L4: 0 };
  private readonly latency = { L1: new LatencyStats(), L2: new LatencyStats(), L3: new LatencyStats(), L4: new LatencyStats() };
  private corruptDropped = 0;
  private singleFlightJoins = 0;
  private readonly l3Skipped = { tooLarge: 0, noRoom: 0 };
  private backgroundErrors = 0;
  private lastError: string | undefined;
  private readonly writeBehind: boolean;
  private readonly halfLife: number;

  private constructor(
    private readonly model: CacheModel,
    private readonly l3: L3Files,
    budgets: CacheBudgets,
    l2Storage: L2Storage,
    writeBehind: boolean,
    halfLife: number,
    private readonly l1OnDevice: boolean,
    /** Loads from L2, L3 or the model that may run at once. */
    private readonly loadSlots: Semaphore,
    /** This object's hold on `dir`, let go by close(). */
    private readonly lock: FolderLock,
  ) {
    this.l1 = new L1Blocks(budgets.l1Bytes);
    this.l2 = new L2Buffers(budgets.l2Bytes, l2Storage);
    this.writeBehind = writeBehind;
    this.halfLife = halfLife;
  }

  /** Opens (or creates) the cache; existing L3 files in `dir` become entries again. */
  static async open(opts: TieredKVCacheOptions): Promise<TieredKVCache> {
    const { model, dir, budgets } = opts;
    if (!model || typeof model.computeBlock !== "function") throw new DkiArgumentError("open() needs a model");
    if (typeof dir !== "string" || dir === "") throw new DkiArgumentError("open() needs a folder for the L3 tier (dir)");
    for (const name of ["l1Bytes", "l2Bytes", "l3Bytes"] as const) {
      const b = budgets?.[name];
      if (typeof b !== "number" || !(b >= 0) || !Number.isFinite(b)) throw new DkiArgumentError(`budgets.${name} must be a finite number of bytes >= 0, got ${String(b)}`);
    }
    const l2Storage = opts.l2Storage ?? "f16";
    if (l2Storage !== "f16" && l2Storage !== "bf16") throw new DkiArgumentError(`l2Storage must be "f16" or "bf16", got ${JSON.stringify(l2Storage)}`);
    const halfLife = opts.recencyHalfLife ?? 64;
    if (!(halfLife > 0) || !Number.isFinite(halfLife)) throw new DkiArgumentError(`recencyHalfLife must be a positive number, got ${halfLife}`);
    const onCuda = model.info.device === "cuda";
    const l1OnDevice = opts.l1OnDevice ?? onCuda;
    if (l1OnDevice && !onCuda) throw new DkiArgumentError('l1OnDevice needs a model loaded with device "cuda"; this one runs on the CPU');
    const maxLoads = opts.maxConcurrentLoads ?? 2;
    if (!Number.isInteger(maxLoads) || maxLoads < 1) throw new DkiArgumentError(`maxConcurrentLoads must be a positive integer, got ${maxLoads}`);
    await makeFolder(dir);
    const lock = await FolderLock.acquire(dir);
    try {
      const l3 = await L3Files.open(dir, budgets.l3Bytes, halfLife);
      return new TieredKVCache(model, l3, budgets, l2Storage, opts.writeBehind ?? true, halfLife, l1OnDevice, new Semaphore(maxLoads), lock);
    } catch (e) {
      lock.release();
      throw e;
    }
  }

  /** The key a request maps to (validates the request). */
  keyOf(req: BlockRequest): string {
    return this.identify(req).key;
  }

  /**
   * The block for a request, from the fastest tier that has it (promoted to L1), or computed with
   * the model and stored. Concurrent gets of one key load it once and share the result. The block
   * is owned by the cache: do not dispose it.
   */
  async get(req: BlockRequest): Promise<CacheHit> {
    this.checkOpen();
    const r = this.identify(req);
    const t0 = performance.now();
    const now = ++this.clock;
    const hot = this.l1.get(r.key);
    if (hot) {
      hot.usage.touch(now);
      return this.leased(this.served("L1", hot.value, r.key, t0));
    }
    const leaving = this.leavingL1.get(r.key);
    if (leaving) {
      // Still in memory on its way down: take it back.
      this.leavingL1.delete(r.key);
      leaving.usage.touch(now);
      this.admitL1(leaving);
      return this.leased(this.served("L1", leaving.value, r.key, t0));
    }
    const running = this.inflight.get(r.key);
    if (running) {
      this.singleFlightJoins++;
      return this.leased(await running);
    }
    const p = this.load(r, t0, now).finally(() => this.inflight.delete(r.key));
    this.inflight.set(r.key, p);
    const hit = this.leased(await p);
    // Every block load() returns was made here (restored or computed); marked only now that a
    // lease holds it, so nothing frees it between its load and its hand-out.
    this.made.add(hit.block);
    return hit;
  }

  /**
   * Stores a block computed for `req` (in L1, and written behind to L3); returns its key. The
   * block must be the one `req` describes (same model, tokens and start position) and now
   * belongs to the cache: do not dispose it.
   */
  async put(req: BlockRequest, block: KVBlock): Promise<string> {
    this.checkOpen();
    const r = this.identify(req);
    this.checkBlock(block, r, (m) => new DkiArgumentError(`put(): ${m}`));
    const now = ++this.clock;
    const usage = this.usageOf(r.key) ?? new Usage(this.halfLife);
    usage.touch(now);
    const written = this.store(r, block, usage);
    if (!this.writeBehind) await written;
    await this.leavingWithinBudgets();
    return r.key;
  }

  /**
   * Waits while the blocks on their way down from L1 (or buffers from L2) take more memory than
   * that tier's budget: they have left the tier's count but not memory, and a loop of put()s
   * would otherwise pile them up faster than they are encoded.
   */
  private async leavingWithinBudgets(): Promise<void> {
    while (bytesOf(this.leavingL1) > this.l1.budget || bytesOf(this.leavingL2) > this.l2.budget) {
      if (this.jobs.size === 0) return;
      await Promise.race([...this.jobs].map((j) => j.done));
    }
  }

  /** Removes one entry from every tier (its L3 file is deleted before this resolves). */
  async invalidate(key: string): Promise<void> {
    this.checkOpen();
    if (typeof key !== "string" || !KEY_PATTERN.test(key)) throw new DkiArgumentError(`not a cache key: ${JSON.stringify(key)}`);
    for (const j of [...this.jobs, ...this.loads]) if (j.key === key) j.cancelled = true;
    const dropped = this.l1BlocksWhere((k) => k === key);
    this.l1.remove(key);
    this.l2.remove(key);
    this.leavingL1.delete(key);
    this.leavingL2.delete(key);
    this.writing.delete(key);
    for (const b of dropped) this.freeIfUnused(b);
    await this.l3.remove(key);
  }

  /** The blocks in L1 or on their way down from it whose key passes `pick`. */
  private l1BlocksWhere(pick: (key: string, userHash: string) => boolean): KVBlock[] {
    const out: KVBlock[] = [];
    for (const e of [...this.l1.values(), ...this.leavingL1.values()]) if (pick(e.key, e.userHash)) out.push(e.value);
    return out;
  }

  /** Removes every entry of one user from every tier, including L3 files from earlier sessions. */
  async clear(userId: string): Promise<void> {
    this.checkOpen();
    if (typeof userId !== "string" || userId === "") throw new DkiArgumentError("userId must be a non-empty string");
    const uh = userHash(userId);
    for (const j of [...this.jobs, ...this.loads]) if (j.userHash === uh) j.cancelled = true;
    const dropped = this.l1BlocksWhere((_, u) => u === uh);
    this.l1.removeUser(uh);
    this.l2.removeUser(uh);
    for (const m of [this.leavingL1, this.leavingL2, this.writing]) {
      for (const [k, v] of m) if (v.userHash === uh) m.delete(k);
    }
    for (const b of dropped) this.freeIfUnused(b);
    await this.l3.removeUser(uh);
  }

  /**
   * The tiers that hold a key now, without touching it (for tests, tools and experiments). A key
   * on its way down counts as still in the tier it is leaving; an L3 entry counts once written.
   */
  locate(key: string): Tier[] {
    const out: Tier[] = [];
    if (this.l1.has(key) || this.leavingL1.has(key)) out.push("L1");
    if (this.l2.has(key) || this.leavingL2.has(key)) out.push("L2");
    if (this.l3.isReady(key)) out.push("L3");
    return out;
  }

  stats(): CacheStats {
    const tier = (t: Tier, entries: number, bytes: number, budgetBytes: number, leavingBytes = 0): TierStats => ({
      entries,
      bytes,
      budgetBytes,
      leavingBytes,
      hits: this.hits[t],
      misses: this.misses[t],
      meanLoadMs: this.latency[t].mean,
      p95LoadMs: this.latency[t].p95,
    });
    return {
      L1: tier("L1", this.l1.size, this.l1.bytes, this.l1.budget, bytesOf(this.leavingL1)),
      L2: tier("L2", this.l2.size, this.l2.bytes, this.l2.budget, bytesOf(this.leavingL2)),
      L3: tier("L3", this.l3.size, this.l3.bytes, this.l3.budget),
      L4: tier("L4", 0, 0, 0),
      corruptDropped: this.corruptDropped,
      singleFlightJoins: this.singleFlightJoins,
      pending: this.jobs.size,
      backgroundErrors: this.backgroundErrors + this.l3.writeFailures,
      l3Skipped: { ...this.l3Skipped },
      lastError: this.lastError ?? this.l3.lastWriteError,
    };
  }

  /** Waits until every background conversion and L3 write (and deletion) has finished. */
  async flush(): Promise<void> {
    for (;;) {
      if (this.jobs.size > 0) await Promise.all([...this.jobs].map((j) => j.done));
      await this.l3.idle();
      if (this.jobs.size === 0) return;
    }
  }

  /**
   * Finishes pending gets and writes, then lets go of every block. L3 files stay for the next
   * open, which ranks them for eviction as this session last did.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    try {
      await Promise.allSettled([...this.inflight.values()]);
      await this.flush();
      await this.l3.persistRanking();
    } finally {
      try {
        this.letGo();
      } finally {
        this.lock.release();
      }
    }
  }

  /** Drops every block of L1 and L2 (those the cache made are freed once unused). */
  private letGo(): void {
    const dropped = this.l1BlocksWhere(() => true);
    for (const m of [this.l1, this.l2]) for (const e of [...m.values()]) m.remove(e.key);
    this.leavingL1.clear();
    this.leavingL2.clear();
    for (const b of dropped) this.freeIfUnused(b);
  }

  // ---- loading

  /**
   * A miss in L1: at most maxConcurrentLoads of these work at once (the others wait their turn),
   * and a load's slot is held until the blocks it pushed out of L1 are back within budget, so a
   * burst of gets cannot hold more blocks, contexts and buffers than that in memory.
   */
  private async load(r: Identified, t0: number, now: number): Promise<Served> {
    const ctl: Job = { key: r.key, userHash: r.userHash, cancelled: false };
    this.loads.add(ctl);
    try {
      return await this.loadSlots.run(async () => {
        const served = await this.loadFromTiers(r, ctl, t0, now);
        await this.leavingWithinBudgets();
        return served;
      });
    } finally {
      this.loads.delete(ctl);
    }
  }

  private async loadFromTiers(r: Identified, ctl: Job, t0: number, now: number): Promise<Served> {
    this.misses.L1++;
    const usage = this.usageOf(r.key) ?? new Usage(this.halfLife);
    usage.touch(now);

    // L2, or on its way from L2 to L3.
    const e2 = this.l2.get(r.key) ?? this.leavingL2.get(r.key);
    if (e2) {
      const block = await this.restore(r, e2.value);
      if (this.l2.get(r.key) === e2) this.l2.remove(r.key);
      if (this.leavingL2.get(r.key) === e2) this.leavingL2.delete(r.key);
      if (block) {
        if (!ctl.cancelled) this.admitL1({ ...e2, bytes: L1Blocks.cost(block), usage, value: block });
        return this.served("L2", block, r.key, t0);
      }
    }
    this.misses.L2++;

    if (this.l3.isReady(r.key)) {
      const block = await this.readL3(r);
      if (block) {
        this.l3.touchFile(r.key);
        if (!ctl.cancelled) this.admitL1({ key: r.key, userHash: r.userHash, bytes: L1Blocks.cost(block), usage, value: block });
        return this.served("L3", block, r.key, t0);
      }
    }
    this.misses.L3++;

    let block: KVBlock;
    try {
      block = await this.model.computeBlock(r.tokens, { startPos: r.startPos, prefix: r.prefix, onDevice: this.l1OnDevice });
      // Damaged weights (or activations that overflow) give a block no injection will take: it is
      // refused here, before any tier stores it and serves it to every later turn.
      if (!(block.valueAbsMax() < Infinity)) {
        block.dispose();
        throw new NonFiniteError(`the K/V computed for ${r.tokens.length} tokens at position ${r.startPos} holds NaN or ±inf (the model's weights or its activations on these tokens are not finite); nothing was cached`);
      }
    } catch (e) {
      this.misses.L4++;
      throw e;
    }
    if (!ctl.cancelled) void this.store(r, block, usage);
    return this.served("L4", block, r.key, t0);
  }

  /** An L3 entry as a verified block, or null (missing, or corrupt and now dropped). */
  private async readL3(r: Identified): Promise<KVBlock | null> {
    let entry;
    try {
      entry = await this.l3.read(r.key);
    } catch (e) {
      if (e instanceof CorruptEntryError) this.noteCorrupt(e);
      else this.noteError(e);
      return null;
    }
    if (!entry) return null;
    const block = await this.restore(r, entry.bytes);
    if (!block) await entry.drop();
    return block;
  }

  /**
   * Stored bytes as a verified block in L1's form (decoded on the GPU with l1OnDevice), or null
   * (corrupt, and counted). A GPU that cannot take the block is no loss: it is decoded into host
   * memory instead and the error noted; only bytes the host decode refuses too are corrupt.
   */
  private async restore(r: Identified, bytes: Buffer): Promise<KVBlock | null> {
    const decode = (onDevice: boolean) => KVBlock.deserialize(this.model.nativeHandle(), bytes, { onDevice, inPlace: true });
    let block: KVBlock | null = null;
    try {
      block = await decode(this.l1OnDevice).catch(async (e: unknown) => {
        if (!this.l1OnDevice) throw e;
        const host = await decode(false); // throws again if the bytes are bad
        this.noteError(e); // they are not: the GPU could not take the block
        return host;
      });
      this.checkBlock(block, r, (m) => new CorruptEntryError(m));
      return block;
    } catch (e) {
      block?.dispose();
      this.noteCorrupt(e);
      return null;
    }
  }

  /** One caller's hit: counts a lease on the block until release(). */
  private leased(s: Served): CacheHit {
    addCount(this.leases, s.block, 1);
    let released = false;
    return {
      ...s,
      release: () => {
        if (released) return;
        released = true;
        addCount(this.leases, s.block, -1);
        this.freeIfUnused(s.block);
      },
    };
  }

  /**
   * Frees a block the cache made once no hit, no job and no entry of L1 or on its way down holds
   * it (under any key: a caller may put() a block it got for another user).
   */
  private freeIfUnused(block: KVBlock): void {
    if (!this.made.has(block) || this.leases.has(block) || this.pins.has(block)) return;
    if (this.l1BlocksWhere(() => true).includes(block)) return;
    this.made.delete(block);
    block.dispose();
  }

  /** Runs fn with the block held against freeing. */
  private async pinned<T>(block: KVBlock, key: string, fn: () => Promise<T>): Promise<T> {
    addCount(this.pins, block, 1);
    try {
      return await fn();
    } finally {
      addCount(this.pins, block, -1);
      this.freeIfUnused(block);
    }
  }

  private served(tier: Tier, block: KVBlock, key: string, t0: number): Served {
    const loadMs = performance.now() - t0;
    this.hits[tier]++;
    this.latency[tier].add(loadMs);
    return { block, tier, loadMs, key };
  }

  // ---- storing and moving down

  /** L1 now, and a write-behind to L3. Resolves when the L3 write has finished or been skipped. */
  private store(r: Identified, block: KVBlock, usage: Usage): Promise<void> {
    this.admitL1({ key: r.key, userHash: r.userHash, bytes: L1Blocks.cost(block), usage, value: block });
    const already = this.writing.get(r.key);
    if (already) return already.done!;
    if (this.l3.holds(r.key)) return Promise.resolve();
    if (!this.fitsL3(block)) {
      if (this.l3.budget > 0) this.l3Skipped.tooLarge++; // every block the cache takes in comes here first
      return Promise.resolve();
    }
    const job = this.background(r.key, r.userHash, async (job) => {
      try {
        const bytes = await this.pinned(block, r.key, () => block.serialize("int8"));
        if (!job.cancelled) await this.writeL3Bytes(r, usage, bytes, job);
      } finally {
        if (this.writing.get(r.key) === job) this.writing.delete(r.key);
      }
    });
    this.writing.set(r.key, job);
    return job.done!;
  }

  private admitL1(e: Entry<KVBlock>): void {
    // L1 and L2 hold a key at most once between them.
    this.l2.remove(e.key);
    this.leavingL1.delete(e.key);
    this.leavingL2.delete(e.key);
    const entry = { ...e, bytes: L1Blocks.cost(e.value) };
    if (!this.l1.fits(entry.bytes)) {
      this.demoteFromL1(entry); // larger than all of L1: straight to the colder forms
      return;
    }
    for (const v of this.l1.insert(entry)) this.demoteFromL1(v);
  }

  /**
   * Converts an L1 victim to L2 form (or, if L2 cannot hold it, to L3 form). A victim that cannot
   * even be costed (a block its owner disposed after put(), against the contract) is dropped and
   * noted: the get or put that evicted it goes on.
   */
  private demoteFromL1(e: Entry<KVBlock>): void {
    try {
      this.startDemotionFromL1(e);
    } catch (err) {
      this.leavingL1.delete(e.key);
      this.noteError(err);
    }
  }

  private startDemotionFromL1(e: Entry<KVBlock>): void {
    const toL2 = this.l2.fits(this.l2.cost(e.value));
    if (!toL2 && this.inL3Soon(e.key)) {
      this.freeIfUnused(e.value); // nothing to keep below L1 but the L3 copy, which exists
      return;
    }
    this.leavingL1.set(e.key, e);
    this.background(e.key, e.userHash, (job) =>
      this.pinned(e.value, e.key, async () => {
        try {
          if (toL2) {
            const bytes = await this.l2.encode(e.value);
            if (this.leavingL1.get(e.key) !== e || job.cancelled) return; // taken back, replaced or invalidated
            this.leavingL1.delete(e.key);
            this.admitL2({ ...e, bytes: bytes.length, value: bytes });
          } else {
            await this.writeL3(e, e.value, job, () => this.leavingL1.get(e.key) === e);
          }
        } finally {
          if (this.leavingL1.get(e.key) === e) this.leavingL1.delete(e.key);
        }
      }),
    );
  }

  private admitL2(e: Entry<Buffer>): void {
    if (!this.l2.fits(e.bytes)) {
      this.demoteFromL2(e);
      return;
    }
    for (const v of this.l2.insert(e)) this.demoteFromL2(v);
  }

  /** An L2 victim goes to L3 unless L3 has it already (the usual case, thanks to write-behind). */
  private demoteFromL2(e: Entry<Buffer>): void {
    if (this.inL3Soon(e.key)) return;
    this.leavingL2.set(e.key, e);
    this.background(e.key, e.userHash, async (job) => {
      try {
        const block = await this.l2.decode(this.model.nativeHandle(), e.value);
        try {
          await this.writeL3(e, block, job, () => this.leavingL2.get(e.key) === e);
        } finally {
          block.dispose(); // only the L3 bytes were wanted
        }
      } finally {
        if (this.leavingL2.get(e.key) === e) this.leavingL2.delete(e.key);
      }
    });
  }

  private async writeL3(e: Entry<unknown>, block: KVBlock, job: Job, stillWanted: () => boolean): Promise<void> {
    if (!this.fitsL3(block)) return;
    const bytes = await block.serialize("int8");
    if (job.cancelled || !stillWanted()) return;
    await this.writeL3Bytes(e, e.usage, bytes, job);
  }

  /** Whether the block's L3 entry fits the L3 budget at all. */
  private fitsL3(block: KVBlock): boolean {
    return this.l3.fits(ENTRY_HEADER_BYTES + block.serializedBytes("int8"));
  }

  /** Writes a checked block's bytes to L3 (too large is ruled out by fitsL3 before). */
  private async writeL3Bytes(r: { key: string; userHash: string }, usage: Usage, bytes: Buffer, job: Job): Promise<void> {
    if ((await this.l3.write(r.key, r.userHash, usage, bytes, () => job.cancelled)) === "no-room") this.l3Skipped.noRoom++;
  }

  private inL3Soon(key: string): boolean {
    return this.l3.holds(key) || this.writing.has(key);
  }

  /** Runs work in the background: tracked for flush(), cancellable, never an unhandled rejection. */
  private background(key: string, uh: string, fn: (job: Job) => Promise<void>): Job {
    const job: Job = { key, userHash: uh, cancelled: false };
    this.jobs.add(job);
    job.done = (async () => {
      try {
        await fn(job);
      } catch (e) {
        this.noteError(e);
      } finally {
        this.jobs.delete(job);
      }
    })();
    return job;
  }

  // ---- helpers

  private usageOf(key: string): Usage | undefined {
    return (this.l1.get(key) ?? this.leavingL1.get(key) ?? this.l2.get(key) ?? this.leavingL2.get(key))?.usage ?? this.l3.usageOf(key);
  }

  private identify(req: BlockRequest): Identified {
    if (!req || typeof req !== "object") throw new DkiArgumentError("a block request must be an object { userId, tokens, startPos?, prefix? }");
    if (typeof req.userId !== "string" || req.userId === "") throw new DkiArgumentError("userId must be a non-empty string");
    checkTokenList("tokens", req.tokens, false);
    const prefix = req.prefix ?? [];
    checkTokenList("prefix", prefix, true);
    const startPos = req.startPos ?? 0;
    if (!Number.isInteger(startPos) || Math.abs(startPos) > 0x7fffffff) throw new DkiArgumentError(`startPos must be an integer, got ${String(startPos)}`);
    const key = blockKey({ userId: req.userId, fingerprint: this.model.info.fingerprint, tokens: req.tokens, startPos, prefix, dtype: "f32" });
    return { key, userHash: this.userHashOf(req.userId), tokens: req.tokens, startPos, prefix };
  }

  /** A turn asks for many blocks of one user: the hash of the last user is kept. */
  private userHashOf(userId: string): string {
    if (this.lastUser?.id !== userId) this.lastUser = { id: userId, hash: userHash(userId) };
    return this.lastUser.hash;
  }

  /** A block may only stand for a request if the same model computed the same tokens at the same position. */
  private checkBlock(block: KVBlock, r: Identified, error: (m: string) => Error): void {
    if (!(block instanceof KVBlock)) throw error("not a KVBlock");
    try {
      block.nativeHandle();
    } catch {
      throw error("the block has been disposed");
    }
    if (block.fingerprint !== this.model.info.fingerprint) throw error("the block was computed by another model (fingerprint mismatch)");
    if (block.startPos !== r.startPos) throw error(`the block starts at position ${block.startPos}, the request at ${r.startPos}`);
    if (block.nTokens !== r.tokens.length || block.tokens.some((t, i) => t !== r.tokens[i])) throw error("the block's tokens differ from the request's");
    if (!(block.valueAbsMax() < Infinity)) throw error("the block holds NaN or ±inf in its keys or values: it cannot be injected, and is not stored");
  }

  private noteCorrupt(e: unknown): void {
    this.corruptDropped++;
    this.lastError = e instanceof Error ? e.message : String(e);
  }

  private noteError(e: unknown): void {
    this.backgroundErrors++;
    this.lastError = e instanceof Error ? e.message : String(e);
  }

  private checkOpen(): void {
    if (this.closed) throw new Error("the K/V cache has been closed");
  }
}

/** Bytes of the entries of a map of entries. */
function bytesOf(m: Map<string, Entry<unknown>>): number {
  let n = 0;
  for (const e of m.values()) n += e.bytes;
  return n;
}

/** Adds delta to a count kept in a map; a count that reaches 0 leaves the map. */
function addCount<K extends object>(counts: Map<K, number> | WeakMap<K, number>, key: K, delta: number): void {
  const n = (counts.get(key) ?? 0) + delta;
  if (n > 0) counts.set(key, n);
  else counts.delete(key);
}

/** Creates the L3 folder, naming what stands in the way when it cannot (mkdir says only EEXIST or ENOTDIR). */
async function makeFolder(dir: string): Promise<void> {
  try {
    await mkdir(dir, { recursive: true });
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "EEXIST") throw new DkiArgumentError(`dir: ${dir} is a file; the L3 tier needs a folder there`);
    if (code === "ENOTDIR") throw new DkiArgumentError(`dir: a part of ${dir} is a file, not a folder; the L3 tier needs a folder there`);
    if (code === "EACCES" || code === "EPERM" || code === "EROFS") throw new DkiArgumentError(`dir: cannot create the folder ${dir} (${code}): the L3 tier must be able to write there`);
    throw e;
  }
}
