// Loads the compiled addon and describes its surface. The addon is deliberately thin: these
// types are the whole contract between TypeScript and C++.
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { ModelShape } from "../formats/hf-config.js";

export interface NativeConfig extends ModelShape {
  rmsNormEps: number;
  ropeTheta: number;
  tieWordEmbeddings: boolean;
  attentionBias: boolean;
  /** Rotary pairs (2i, 2i+1), as llama GGUF files need; default false (HF rotate-half). */
  ropeInterleaved?: boolean;
  ropeScaling: { factor: number; lowFreqFactor: number; highFreqFactor: number; originalMaxPositionEmbeddings: number } | null;
}

export interface NativeTensorSpec {
  name: string;
  file: string;
  dtype: string;
  shape: number[];
  offset: number;
  nbytes: number;
}

export interface NativeModelHandle {
  /** device: where the weights live and every context of the model runs; deviceBytes: weight bytes held there; deviceIndex: the GPU (-1 on the CPU). */
  info(): { fingerprint: string; paramCount: number; weightBytes: number; device: "cpu" | "cuda"; deviceBytes: number; deviceIndex: number };
  dispose(): void;
}

export interface NativeKVBlockInfo {
  nLayers: number;
  nKvHeads: number;
  headDim: number;
  nTokens: number;
  startPos: number;
  fingerprint: string;
  tokens: Int32Array;
  /** Bytes of K and V in host memory (0 for a block on a GPU). */
  byteSize: number;
  /** Bytes of K and V in GPU memory (0 for a host block). */
  deviceBytes: number;
  /** The GPU holding K and V, or -1 for host memory. */
  device: number;
}

export type KVStorage = "f32" | "f16" | "bf16" | "int8";

export interface NativeKVBlockHandle {
  info(): NativeKVBlockInfo;
  scaleValues(alpha: number): Promise<NativeKVBlockHandle>;
  slice(from: number, to: number): Promise<NativeKVBlockHandle>;
  serialize(storage: KVStorage): Promise<Buffer>;
  storageBytes(storage: KVStorage): number;
  serializedBytes(storage: KVStorage): number;
  keys(): Float32Array;
  values(): Float32Array;
  /** The largest |value|; Infinity when a key or value is NaN or ±inf. Scanned once, then remembered. */
  valueAbsMax(): number;
  /** The block with K and V in that GPU's memory (itself if they are there). CUDA builds only. */
  toDevice(deviceIndex: number): Promise<NativeKVBlockHandle>;
  /** The block with K and V in host memory (itself if they are there). */
  toHost(): Promise<NativeKVBlockHandle>;
  dispose(): void;
}

export interface NativeSegment {
  block: NativeKVBlockHandle;
  alpha: number;
  logit: boolean;
  /** The block sits at its startPos + shift (default 0), with no remapped copy of it made. */
  shift?: number;
  /** Divides the block's attention scores (default 1); finite and > 0. CPU only: CUDA refuses one ≠ 1. */
  temperature?: number;
}

/** Which logits eval returns: none, the last row, or every row. */
export const LogitsMode = { None: 0, Last: 1, All: 2 } as const;
export type LogitsMode = (typeof LogitsMode)[keyof typeof LogitsMode];

/** One stage of a decode step (e.g. "norm + q/k/v", "attention"), summed over `steps` steps. */
export interface NativeStageTime {
  stage: string;
  /** GPU time, summed over the profile's steps. */
  ms: number;
  /** Weight bytes the stage reads per step (0 for stages that read none). */
  bytes: number;
}

export interface NativeStageProfile {
  steps: number;
  stages: NativeStageTime[];
}

export interface NativeContextHandle {
  /** With `out` (exactly the logits' size) the logits are written there and `out` is returned: no allocation per step. */
  eval(tokens: Int32Array, mode: LogitsMode, out?: Float32Array): Promise<Float32Array | null>;
  reset(posBase?: number): void;
  truncate(n: number): void;
  cancel(): void;
  /**
   * Checks that `tokens` of segments can be injected and, on a GPU, allocates their memory now:
   * a too-large injection fails before anything is copied.
   */
  reserveSegments(tokens: number): void;
  setSegments(segments: NativeSegment[]): void;
  /** onDevice: on a GPU context, the block stays in GPU memory. */
  exportBlock(from: number, to: number, onDevice?: boolean): NativeKVBlockHandle;
  setAttentionProbe(layer: number): void;
  attentionEntropy(): Float32Array;
  /** Where the one-token steps of a GPU context made with DKI_CUDA_PROFILE=1 spend their time; null otherwise. */
  cudaProfile(): NativeStageProfile | null;
  dispose(): void;
  readonly nPast: number;
  readonly maxTokens: number;
  readonly posBase: number;
}

export interface NativeSamplingParams {
  temperature: number;
  topK: number;
  topP: number;
  repetitionPenalty: number;
  seed: number;
}

export interface NativeSamplerHandle {
  sample(logits: Float32Array, recent: Int32Array): number;
}

/** The sizes the engine takes (native/model.h, kv_ops.h, context.h): the largest model shape, and more. */
export interface NativeLimits extends ModelShape {
  headsTimesHeadDim: number;
  /** Tokens of one K/V block. */
  blockTokens: number;
  /** Tokens of one context's own K/V cache. */
  contextTokens: number;
  /** Tokens of all injected segments together. */
  segmentTokens: number;
  /** A block's start position stays within ± this. */
  position: number;
  /** A context's first own position (reset's posBase) stays within ± this. */
  positionBase: number;
  /** Engine threads (setThreads; 0 means the default, threadBudget().threads). */
  threads: number;
  /** GPU indices run from 0 to this. */
  deviceIndex: number;
}

export interface NativeThreadBudget {
  threads: number;
  affinity: number;
  cgroupQuota: number | null;
  cgroupFile: string | null;
}

export interface NativeAddon {
  readonly limits: NativeLimits;
  loadModel(spec: {
    config: NativeConfig;
    tensors: NativeTensorSpec[];
    quantize?: "none" | "q8_0";
    device?: "cpu" | "cuda";
    deviceIndex?: number;
    /** Read every weight once and refuse the model at the first NaN/inf (norms and biases are always checked). */
    checkTensors?: boolean;
  }): Promise<NativeModelHandle>;
  NativeContext: new (model: NativeModelHandle, maxTokens: number) => NativeContextHandle;
  NativeSampler: new (params: NativeSamplingParams) => NativeSamplerHandle;
  remapBlock(model: NativeModelHandle, block: NativeKVBlockHandle, newStart: number): Promise<NativeKVBlockHandle>;
  concatBlocks(model: NativeModelHandle, blocks: NativeKVBlockHandle[]): Promise<NativeKVBlockHandle>;
  /**
   * CacheBlend: the blocks concatenated, with the ⌈ratio·n⌉ tokens whose layer-1 K/V deviate most
   * from a joint encoding behind `prefix` (a block ending where the first block starts, or null)
   * recomputed at every later layer (native/blend.h). CPU models and host blocks only.
   */
  blendBlocks(model: NativeModelHandle, prefix: NativeKVBlockHandle | null, blocks: NativeKVBlockHandle[], ratio: number): Promise<NativeKVBlockHandle>;
  /**
   * deviceIndex ≥ 0: decoded on that GPU into a device block (CUDA builds). copy (default true):
   * the bytes are copied on the calling thread first; false reads them in place on the worker
   * thread, and the caller must not change, transfer or resize them until the promise settles.
   */
  deserializeBlock(model: NativeModelHandle | null, bytes: Uint8Array, deviceIndex?: number, copy?: boolean): Promise<NativeKVBlockHandle>;
  /**
   * Engine settings (setThreads, setSimd, setPrefetch, setDecodeStreams) are checked at once and
   * take effect when no eval, load or block conversion is running: at once when idle, else when
   * the running work ends. The calling thread never waits for that work.
   */
  setThreads(n: number): void;
  getThreads(): number;
  /**
   * The default thread count and where it came from: the CPUs of the process's affinity mask,
   * capped by its cgroup's CPU quota rounded up (cgroupQuota in CPUs and cgroupFile are null when
   * there is none), at least 1. Read once per process; $DKI_CGROUP_ROOT replaces /sys/fs/cgroup.
   */
  threadBudget(): NativeThreadBudget;
  /**
   * Bytes of freed K/V block buffers kept for reuse (host buffers of ≥ 256 KiB; in CUDA builds
   * each GPU keeps as much again of its own); default 256 MiB, 0 keeps none.
   */
  setKVPoolBytes(bytes: number): void;
  /** Bytes the host's K/V buffer pool holds now, or GPU deviceIndex's (CUDA builds only). */
  kvPoolBytes(deviceIndex?: number): number;
  setSimd(name: string): void;
  /**
   * prefetchBytes: how far ahead decode loops prefetch weight rows (0: hardware prefetcher only);
   * decodeStreams: how many rows the Q8_0 decode loop streams side by side (1 or 2).
   */
  simd(): { active: string; available: string[]; prefetchBytes: number; decodeStreams: number };
  /** Overrides the prefetch distance (DKI_PREFETCH at load does the same); arithmetic is unchanged. */
  setPrefetch(bytes: number): void;
  /** Overrides the decode streams, 1 or 2 (DKI_DECODE_STREAMS at load does the same); arithmetic is unchanged. */
  setDecodeStreams(streams: number): void;
  /** Whether this addon has the CUDA backend (npm run build:cuda) and the GPUs it sees; reason says why none. */
  cuda(): { built: boolean; devices: number; names: string[]; reason: string };
  /**
   * Opens `path` (created with mode 0644 if missing), takes flock(LOCK_EX) on it without waiting
   * and writes this process's id and a newline into it (another user's file is locked read-only
   * and left as it is). Returns the descriptor, which holds the lock until unlockFile(fd), the end
   * of the thread that took it (a worker's teardown lets go of its locks) or the process's end,
   * however it ends. Throws an Error whose `code` is "EWOULDBLOCK" when another open of the file
   * holds the lock, this process's included (flock locks belong to the open, not the process);
   * else the errno's name where it is one the calls are expected to meet, such as "ENOLCK" or
   * "EOPNOTSUPP" on a filesystem without locks.
   */
  lockFile(path: string): number;
  /** Closes a descriptor lockFile returned on this thread, letting go of its lock; refuses any other descriptor. */
  unlockFile(fd: number): void;
}

/**
 * How a native call rejects when it meets a NaN or ±inf: `row` is the eval row whose logits were
 * not finite (-1: not about logits), `segment` the index of the injected segment at fault (-1:
 * none in particular). The TypeScript layer rewords it with what only it knows (the generation
 * step, the segment's index in the caller's list) as a NonFiniteError.
 */
export interface NativeNonFiniteError extends Error {
  code: "ERR_DKI_NOT_FINITE";
  row: number;
  segment: number;
}

export function isNativeNonFinite(e: unknown): e is NativeNonFiniteError {
  return e instanceof Error && (e as { code?: unknown }).code === "ERR_DKI_NOT_FINITE";
}

/** The package root: the nearest folder above this file whose package.json is dki-engine's. */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const pj = join(dir, "package.json");
    if (existsSync(pj) && (JSON.parse(readFileSync(pj, "utf8")) as { name?: string }).name === "dki-engine") return dir;
    const up = dirname(dir);
    if (up === dir) throw new Error("cannot find the dki-engine package root");
    dir = up;
  }
}

let addon: NativeAddon | undefined;

export function native(): NativeAddon {
  if (addon) return addon;
  const root = packageRoot();
  // node-gyp and cmake-js both put the addon under build/Release.
  const candidates = [join(root, "build", "Release", "dki_native.node"), join(root, "build", "Debug", "dki_native.node")];
  const file = candidates.find((f) => existsSync(f));
  if (!file) throw new Error(`the native addon is not built (looked for ${candidates.join(", ")}): run \`npm install\` or \`npm run build\``);
  addon = createRequire(import.meta.url)(file) as NativeAddon;
  return addon;
}
