// The open and close sequences DKISystem and RAGSystem share: the options checked, the config
// resolved (gating's τ by default the store's embedder's), the model loaded (and owned) when given
// as a path, the store and the K/V cache opened, and whatever was opened closed again, in reverse,
// when a later step fails.
import { resolve } from "node:path";
import { performance } from "node:perf_hooks";
import type { SamplingOptions } from "../engine/generate.js";
import { Model, type LoadOptions } from "../engine/model.js";
import { TieredKVCache, type CacheBudgets } from "../cache/tiered-cache.js";
import { DkiArgumentError } from "../errors.js";
import type { Embedder, MemoryStoreApi } from "../memory/types.js";
import { MemoryStore } from "../memory/memory-store.js";
import { addLatency, emptyLatency, meanLatency, type LatencyBreakdown } from "./budget.js";
import { resolveConfig, type DKIConfig, type DKIConfigInput } from "./config.js";
import { checkMemoryRerank, type MemoryRerank } from "./routing.js";

/** Opens the memory store a system reads and writes (the memory layer's MemoryStore by default). */
export type StoreOpener = (o: { dir: string; embedder?: Embedder }) => Promise<MemoryStoreApi>;

export const DEFAULT_BUDGETS: Readonly<CacheBudgets> = Object.freeze({ l1Bytes: 256 * 2 ** 20, l2Bytes: 512 * 2 ** 20, l3Bytes: 4 * 2 ** 30 });

/** Beside the store's folder, not in it: the store refuses a folder holding anything but its own files. */
export function defaultCacheDir(dataDir: string): string {
  return `${resolve(dataDir)}.kv-cache`;
}

/** The options every system takes to open. */
export interface SystemOpenOptions {
  /** A loaded model (the caller keeps owning it) or a model path (the system loads and disposes it). */
  model: Model | string;
  /** Used when `model` is a path. */
  loadOptions?: LoadOptions;
  /** The memory store's folder (the store keeps it to itself). */
  dataDir: string;
  /** The K/V cache's folder (default: `<dataDir>.kv-cache`, beside the store's). */
  cacheDir?: string;
  budgets?: Partial<CacheBudgets>;
  embedder?: Embedder;
  config?: DKIConfigInput;
  /** Opens the store (default: MemoryStore.open). */
  openStore?: StoreOpener;
  /** Reranks the memory search's candidates before routing keeps the best maxMemories (the caller keeps owning the reranker). */
  memoryRerank?: MemoryRerank;
}

/** What openSystem hands the system being built. */
export interface SystemParts {
  model: Model;
  ownsModel: boolean;
  budgets: CacheBudgets;
  cacheDir: string;
  /**
   * Opens the store (closed again if a later step fails) and resolves the config with it: gating's
   * τ, when the caller's config leaves it out, follows the embedder the store actually uses (its
   * default one when none was given).
   */
  openStore(): Promise<{ store: MemoryStoreApi; config: DKIConfig }>;
  /** Opens the K/V cache; it is closed again if a later step fails. */
  openCache(): Promise<TieredKVCache>;
}

/**
 * Checks `o` (naming `who`), resolves its config, runs `check` (the caller's own settings, still
 * before any model is loaded), loads the model when given as a path, then `build`s the system.
 * When `build` fails, what it opened (store, cache) and a model loaded here are closed, in reverse.
 */
export async function openSystem<T, C = undefined>(who: string, o: SystemOpenOptions, build: (parts: SystemParts, checked: C) => Promise<T>, check?: () => C): Promise<T> {
  if (o === null || typeof o !== "object") throw new DkiArgumentError(`${who}.open needs { model, dataDir }`);
  if (typeof o.dataDir !== "string" || o.dataDir === "") throw new DkiArgumentError(`${who}.open: dataDir must be a folder path`);
  if (!(o.model instanceof Model) && (typeof o.model !== "string" || o.model === "")) throw new DkiArgumentError(`${who}.open: model must be a loaded Model or a model path`);
  // Every value checked now, before any model is loaded; resolved again once the store is open.
  resolveConfig(o.config, o.embedder);
  checkMemoryRerank(o.memoryRerank);
  const checked = check?.() as C;
  const budgets = { ...DEFAULT_BUDGETS, ...(o.budgets ?? {}) };
  const cacheDir = o.cacheDir ?? defaultCacheDir(o.dataDir);
  const ownsModel = typeof o.model === "string";
  const model = typeof o.model === "string" ? await Model.load(o.model, o.loadOptions) : o.model;
  const undo: (() => Promise<void>)[] = ownsModel ? [async () => model.dispose()] : [];
  const undone = <X extends { close(): Promise<void> }>(x: X): X => (undo.push(() => x.close()), x);
  try {
    return await build(
      {
        model,
        ownsModel,
        budgets,
        cacheDir,
        openStore: async () => {
          const store = undone(await (o.openStore ?? defaultStoreOpener)({ dir: o.dataDir, embedder: o.embedder }));
          return { store, config: resolveConfig(o.config, store.embedder) };
        },
        openCache: async () => undone(await TieredKVCache.open({ model, dir: cacheDir, budgets })),
      },
      checked,
    );
  } catch (e) {
    for (const u of undo.reverse()) await u().catch(() => {});
    throw e;
  }
}

/** A system's close: the cache (L3 writes flushed), then the store, then the model if the system owns it, each whatever the one before did. */
export async function closeSystem(cache: TieredKVCache | null, store: MemoryStoreApi, ownedModel: Model | null): Promise<void> {
  try {
    await cache?.close();
  } finally {
    try {
      await store.close();
    } finally {
      ownedModel?.dispose();
    }
  }
}

/**
 * What both systems keep about their calls: whether the system is closed, the calls in flight
 * (close() waits for them), and the turns answered and failed with their summed latency.
 */
export class TurnLedger {
  private readonly inFlight = new Set<Promise<unknown>>();
  private readonly latencySum = emptyLatency();
  private closed = false;
  private turns = 0;
  private failedTurns = 0;

  constructor(private readonly systemName: string) {}

  /** Refuses a call once the system is closed. */
  checkOpen(): void {
    if (this.closed) throw new DkiArgumentError(`this ${this.systemName} has been closed`);
  }

  /** Runs a call as one in flight (refused once closed). */
  async track<T>(fn: () => Promise<T>): Promise<T> {
    this.checkOpen();
    const p = fn();
    this.inFlight.add(p);
    try {
      return await p;
    } finally {
      this.inFlight.delete(p);
    }
  }

  /** Counts a turn: answered (its latency summed) or failed (the error passed on). */
  async count<T extends { latency: LatencyBreakdown }>(fn: () => Promise<T>): Promise<T> {
    try {
      const r = await fn();
      this.turns++;
      addLatency(this.latencySum, r.latency);
      return r;
    } catch (e) {
      this.failedTurns++;
      throw e;
    }
  }

  stats(): { turns: number; failedTurns: number; meanLatency: LatencyBreakdown } {
    return { turns: this.turns, failedTurns: this.failedTurns, meanLatency: meanLatency(this.latencySum, this.turns) };
  }

  /** Marks the system closed and waits for its calls in flight; false when it was closed already. */
  async close(): Promise<boolean> {
    if (this.closed) return false;
    this.closed = true;
    await Promise.allSettled([...this.inFlight]);
    return true;
  }
}

/** What a turn of either system (DKISystem.chat, RAGSystem.chat) takes. */
export interface TurnOptions {
  userId: string;
  sessionId: string;
  maxNewTokens?: number;
  sampling?: SamplingOptions;
  stop?: string[];
  onToken?: (text: string, tokenId: number) => void;
  /** Cancels this turn only: a waiting turn leaves the queue, a running one stops; nothing is recorded. */
  signal?: AbortSignal;
  /**
   * true: an abort once the answer has begun ends it there instead, and the turn resolves with the
   * text so far (finishReason "aborted"), recorded as any answer (a chat's stop button). An abort
   * before the first token still rejects. Default false.
   */
  stopOnAbortSignal?: boolean;
  /** Replaces config.systemPrompt for this turn. */
  systemPrompt?: string;
  /** Replaces config.maxMemories for this turn (a server's per-request setting); 0 routes none. */
  maxMemories?: number;
}

/**
 * The turns of one session, one after another. A turn reads the session's history, and the
 * conversation is only whole if each turn sees the one before it recorded; turns of other
 * sessions (and users) do not wait for each other here. An abort while waiting rejects that turn
 * only.
 */
export class SessionTurns {
  /** The last turn of each session with a turn in flight (removed when it settles and none follows). */
  private readonly tails = new Map<string, Promise<unknown>>();

  /** Runs `fn` once the session's earlier turns have settled; `fn` gets how long it waited (ms). */
  async run<T>(userId: string, sessionId: string, signal: AbortSignal | undefined, fn: (waitedMs: number) => Promise<T>): Promise<T> {
    const key = JSON.stringify([userId, sessionId]);
    const before = this.tails.get(key);
    const t0 = performance.now();
    const turn = (async () => {
      if (before !== undefined) await waitOrAbort(before, signal);
      return fn(performance.now() - t0);
    })();
    // The next turn waits for this one and for everything before it: a turn that gave up waiting
    // (aborted) must not let the next one overtake the turns it was waiting for.
    const settled = Promise.allSettled([before, turn]).then(() => undefined);
    this.tails.set(key, settled);
    try {
      return await turn;
    } finally {
      if (this.tails.get(key) === settled) this.tails.delete(key);
    }
  }
}

/** Resolves when `p` settles (whichever way), or rejects with the signal's reason when it aborts first. */
function waitOrAbort(p: Promise<unknown>, signal: AbortSignal | undefined): Promise<void> {
  signal?.throwIfAborted();
  const settled = p.then(
    () => undefined,
    () => undefined,
  );
  if (signal === undefined) return settled;
  return new Promise<void>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    void settled.then(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    });
  });
}

/** The checks every system's turn starts with: a query, and options naming the user and the session. */
export function checkTurn(query: unknown, opts: Pick<TurnOptions, "userId" | "sessionId" | "stopOnAbortSignal" | "maxMemories">): void {
  if (typeof query !== "string" || query.trim() === "") throw new DkiArgumentError("the query must be a non-empty string");
  if (opts === null || typeof opts !== "object") throw new DkiArgumentError("chat options must be an object with userId and sessionId");
  if (typeof opts.userId !== "string" || opts.userId === "") throw new DkiArgumentError("userId must be a non-empty string");
  if (typeof opts.sessionId !== "string" || opts.sessionId === "") throw new DkiArgumentError("sessionId must be a non-empty string");
  if (opts.stopOnAbortSignal !== undefined && typeof opts.stopOnAbortSignal !== "boolean") throw new DkiArgumentError(`stopOnAbortSignal must be true or false, got ${String(opts.stopOnAbortSignal)}`);
  if (opts.maxMemories !== undefined && (!Number.isInteger(opts.maxMemories) || opts.maxMemories < 0 || opts.maxMemories > MAX_MEMORIES_PER_TURN)) throw new DkiArgumentError(`maxMemories must be an integer from 0 to ${MAX_MEMORIES_PER_TURN}, got ${String(opts.maxMemories)}`);
}

/** The most memories a turn may route (config.maxMemories' own bound). */
export const MAX_MEMORIES_PER_TURN = 1000;

const defaultStoreOpener: StoreOpener = (o) => MemoryStore.open(o);
