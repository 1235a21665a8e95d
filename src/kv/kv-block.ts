// K/V blocks: every layer's keys and values for a run of tokens, computed by one model and
// refused by any other. Blocks are immutable; every operation returns a new block and runs
// off the main thread. Memory is native: call dispose() (or let the GC reclaim it).
import { constants as bufferConstants } from "node:buffer";
import { DkiArgumentError } from "../errors.js";
import { native, type KVStorage, type NativeKVBlockHandle, type NativeModelHandle } from "../engine/native.js";

export type { KVStorage };

/** The model a block is read for: a Model (anything with nativeHandle()) or its native handle. */
export type BlockModel = NativeModelHandle | { nativeHandle(): NativeModelHandle };

const STORAGES: readonly KVStorage[] = ["f32", "f16", "bf16", "int8"];

function checkStorage(storage: KVStorage): KVStorage {
  if (!STORAGES.includes(storage)) throw new DkiArgumentError(`unknown K/V storage ${JSON.stringify(storage)} (expected ${STORAGES.join(", ")})`);
  return storage;
}

/** The native handle of a Model, or the handle itself. Never null: the native side reads null as "skip the model check". */
function handleOf(m: BlockModel): NativeModelHandle {
  if (m === null || typeof m !== "object") throw new DkiArgumentError("deserialize: model must be a Model or its nativeHandle()");
  return "nativeHandle" in m ? m.nativeHandle() : m;
}

export class KVBlock {
  private handle: NativeKVBlockHandle | null;
  readonly nLayers: number;
  readonly nKvHeads: number;
  readonly headDim: number;
  readonly nTokens: number;
  /** Position of the first token when its keys were rotated. */
  readonly startPos: number;
  /** Fingerprint of the model that computed it. */
  readonly fingerprint: string;
  readonly tokens: readonly number[];
  /** Bytes of K and V in host memory (fp32); 0 for a block on a GPU. */
  readonly byteSize: number;
  /** Bytes of K and V in GPU memory (fp32); 0 for a host block. */
  readonly deviceBytes: number;
  /** The GPU whose memory holds K and V, or null when they are in host memory. */
  readonly device: number | null;

  /** Wraps a native handle; `model` is the owner, needed by the position-dependent ops. */
  constructor(handle: NativeKVBlockHandle, private readonly model: NativeModelHandle) {
    this.handle = handle;
    const i = handle.info();
    this.nLayers = i.nLayers;
    this.nKvHeads = i.nKvHeads;
    this.headDim = i.headDim;
    this.nTokens = i.nTokens;
    this.startPos = i.startPos;
    this.fingerprint = i.fingerprint;
    this.tokens = Array.from(i.tokens);
    this.byteSize = i.byteSize;
    this.deviceBytes = i.deviceBytes;
    this.device = i.device < 0 ? null : i.device;
  }

  /** The native handle (for injection into a context). */
  nativeHandle(): NativeKVBlockHandle {
    if (!this.handle) throw new Error("K/V block has been disposed");
    return this.handle;
  }

  private wrap(h: NativeKVBlockHandle): KVBlock {
    return new KVBlock(h, this.model);
  }

  /** V ← α·V. Keys are never scaled. An α whose scaled values overflow float32 is refused (NonFiniteError). */
  async scaleValues(alpha: number): Promise<KVBlock> {
    // The engine scales in 32-bit floats: 1e39 is finite here and +inf there.
    if (typeof alpha !== "number" || !Number.isFinite(Math.fround(alpha)) || alpha < 0)
      throw new DkiArgumentError(`alpha must be a finite number >= 0 (as a 32-bit float, at most ~3.4e38), got ${String(alpha)}`);
    return this.wrap(await this.nativeHandle().scaleValues(alpha));
  }

  /** Moves the block to start at `newStart` by re-rotating its keys (no recompute). */
  async remap(newStart: number): Promise<KVBlock> {
    if (!Number.isInteger(newStart)) throw new DkiArgumentError(`position must be an integer, got ${newStart}`);
    return this.wrap(await native().remapBlock(this.model, this.nativeHandle(), newStart));
  }

  /** Tokens [from, to). */
  async slice(from: number, to: number): Promise<KVBlock> {
    return this.wrap(await this.nativeHandle().slice(from, to));
  }

  /** Joins blocks along the token axis, each placed right after the previous, starting at the first block's position. */
  static async concat(blocks: KVBlock[]): Promise<KVBlock> {
    if (blocks.length === 0) throw new DkiArgumentError("concat needs at least one block");
    const model = blocks[0].model;
    return new KVBlock(await native().concatBlocks(model, blocks.map((b) => b.nativeHandle())), model);
  }

  /** The block as it comes back from storage in `storage` form (values rounded to fp16/bf16/int8). */
  async toStorage(storage: KVStorage): Promise<KVBlock> {
    return KVBlock.deserialize(this.model, await this.serialize(storage), { inPlace: true });
  }

  /** Payload bytes of this block in a storage form. */
  storageBytes(storage: KVStorage): number {
    return this.nativeHandle().storageBytes(checkStorage(storage));
  }

  /** Exact length of serialize(storage): header, int32 token ids, payload. */
  serializedBytes(storage: KVStorage): number {
    return this.nativeHandle().serializedBytes(checkStorage(storage));
  }

  /**
   * Versioned binary with header, model fingerprint, token ids and checksum. A block on a GPU is
   * converted or quantised there, to the same bytes, so only the stored form crosses PCIe. A form
   * larger than a Node Buffer can hold (4 GiB on Node 20) is refused before any work. "f16"
   * refuses a block holding a value that rounds to inf there (|x| ≥ 65520) or a NaN: use "bf16" or "int8".
   */
  async serialize(storage: KVStorage = "f32"): Promise<Buffer> {
    const bytes = this.serializedBytes(storage);
    if (bytes > bufferConstants.MAX_LENGTH) {
      throw new DkiArgumentError(
        `serialize: the ${storage} form of this block is ${bytes} bytes, more than a Node Buffer can hold (${bufferConstants.MAX_LENGTH}); serialize slices, or a smaller storage (f16, int8)`,
      );
    }
    return this.nativeHandle().serialize(storage);
  }

  /**
   * Parses and verifies bytes from serialize(); refuses corrupt data and other models' blocks.
   * onDevice (a model on CUDA): the payload is decoded on the model's GPU into a device block,
   * after every check has passed on the host. The block is what the bytes held at the call: they
   * are copied first (on this thread, into pooled memory), so the caller may change, transfer or
   * resize them at once; `inPlace` skips the copy for bytes nothing will touch until the promise
   * settles.
   */
  static async deserialize(of: BlockModel, bytes: Uint8Array, opts: DeserializeOptions = {}): Promise<KVBlock> {
    const model = handleOf(of);
    if (!(bytes instanceof Uint8Array)) throw new DkiArgumentError("deserialize: bytes must be a Uint8Array (or a Buffer)");
    let deviceIndex = -1;
    if (opts.onDevice) {
      const info = model.info();
      if (info.device !== "cuda") throw new DkiArgumentError('deserialize: onDevice needs a model loaded with device "cuda"; this one runs on the CPU');
      deviceIndex = info.deviceIndex;
    }
    // Without the copy, the worker thread reads the bytes while JavaScript runs, and nothing in
    // Node-API stops a caller's buffer being transferred or shrunk meanwhile.
    return new KVBlock(await native().deserializeBlock(model, bytes, deviceIndex, !opts.inPlace), model);
  }

  /**
   * The block in GPU memory, on the GPU its model runs on. A device block is injected without a
   * trip over PCIe, and scaleValues, remap, slice, concat and serialize run on the device;
   * keys() and values() need toHost() first. Off the main thread. Like every op it returns a new block
   * (sharing the tensors when they are on that GPU already), so disposing this one is safe.
   */
  async toDevice(): Promise<KVBlock> {
    const { device, deviceIndex } = this.model.info();
    if (device !== "cuda") throw new DkiArgumentError('toDevice: the model runs on the CPU; K/V blocks live on a GPU only for a model loaded with device "cuda"');
    return this.wrap(await this.nativeHandle().toDevice(deviceIndex));
  }

  /** The block in host memory (a new block, sharing the tensors when they are there already). Off the main thread. */
  async toHost(): Promise<KVBlock> {
    return this.wrap(await this.nativeHandle().toHost());
  }

  /** Copies of K and V, [layer][kv_head][token][head_dim]. */
  keys(): Float32Array {
    return this.nativeHandle().keys();
  }

  values(): Float32Array {
    return this.nativeHandle().values();
  }

  /**
   * The largest |value| in V, or Infinity when any key or value is NaN or ±inf (such a block
   * cannot be injected). Scanned once, where the block lives, then remembered by the block.
   */
  valueAbsMax(): number {
    return this.nativeHandle().valueAbsMax();
  }

  dispose(): void {
    this.handle?.dispose();
    this.handle = null;
  }
}

export interface DeserializeOptions {
  /** Decode into the GPU memory of the model's device (a model loaded on CUDA). */
  onDevice?: boolean;
  /**
   * Read the bytes where they are, on a worker thread, instead of a copy: the caller promises not
   * to change, transfer or resize them until the promise settles (the cache's own buffers).
   */
  inPlace?: boolean;
}
