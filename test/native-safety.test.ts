// The addon against misuse from JavaScript: what used to crash the process (a segfault, an abort)
// must be a clean error or work. Each case here was a reproduced crash or silent misbehaviour.
import { spawnSync } from "node:child_process";
import { once } from "node:events";
import { join } from "node:path";
import { Worker } from "node:worker_threads";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { nativeConfig } from "../src/engine/model.js";
import { native, type NativeContextHandle, type NativeModelHandle, type NativeSegment } from "../src/engine/native.js";
import { HEADS_TIMES_HEAD_DIM_LIMIT, SHAPE_LIMITS } from "../src/formats/hf-config.js";
import { readHfFolder } from "../src/formats/hf-folder.js";
import { KVBlock } from "../src/kv/kv-block.js";
import { hfLlamaTiny, repoRoot, tempDir } from "./support/paths.js";

const addon = native();
let model: NativeModelHandle;
let spec: Parameters<typeof addon.loadModel>[0];

beforeAll(async () => {
  const f = await readHfFolder(hfLlamaTiny);
  spec = { config: nativeConfig(f.config), tensors: f.tensors };
  model = await addon.loadModel(spec);
});
afterAll(() => model.dispose());

const tokens = (n: number) => Int32Array.from({ length: n }, (_, i) => (i * 31 + 7) % 500); // the fixture has 512 ids

describe("threads and lifetimes", () => {
  test("worker threads may load the addon too: one that exited, one alive and one terminated mid-eval leave the main thread's classes working", () => {
    const r = spawnSync(process.execPath, [join(repoRoot, "test", "support", "addon-in-workers.mjs"), join(repoRoot, "dist"), hfLlamaTiny], { encoding: "utf8" });
    expect(r.status, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout.trim().split("\n").pop()!)).toMatchObject({ exported: 3, logits: 3 });
  });

  test("an out array detached while its eval runs rejects the eval", async () => {
    const ctx = new addon.NativeContext(model, 64);
    try {
      const out = new Float32Array(spec.config.vocabSize);
      const p = ctx.eval(tokens(32), 1, out);
      structuredClone(out.buffer, { transfer: [out.buffer] });
      await expect(p).rejects.toThrow(/eval: the out array was detached or resized while the eval ran/);
    } finally {
      ctx.dispose();
    }
  });

  test("KVBlock.deserialize reads the bytes as they were at the call: zeroing, transferring or shrinking them at once changes nothing", async () => {
    const ctx = new addon.NativeContext(model, 64);
    try {
      await ctx.eval(tokens(48), 0);
      const block = new KVBlock(ctx.exportBlock(0, 48), model);
      const serialized = await block.serialize("f32");
      // A resizable ArrayBuffer (Node 20 has them; the ES2022 typings this project uses do not).
      type Resizable = ArrayBuffer & { resize(n: number): void };
      const ResizableBuffer = ArrayBuffer as unknown as new (n: number, o: { maxByteLength: number }) => Resizable;
      const caller = () => {
        const ab = new ResizableBuffer(serialized.length, { maxByteLength: serialized.length });
        const view = new Uint8Array(ab);
        view.set(serialized);
        return { ab, view };
      };
      const zeroed = caller();
      const p1 = KVBlock.deserialize(model, zeroed.view);
      zeroed.view.fill(0);
      const moved = caller();
      const p2 = KVBlock.deserialize(model, moved.view);
      structuredClone(moved.ab, { transfer: [moved.ab] });
      const shrunk = caller();
      const p3 = KVBlock.deserialize(model, shrunk.view);
      shrunk.ab.resize(0);
      for (const restored of await Promise.all([p1, p2, p3])) {
        expect(restored.keys()).toEqual(block.keys());
        expect(restored.values()).toEqual(block.values());
        restored.dispose();
      }
      await expect(KVBlock.deserialize(model, 7 as unknown as Uint8Array)).rejects.toThrow(/deserialize: bytes must be a Uint8Array/);
      expect(() => addon.deserializeBlock(model, serialized, -1, "yes" as unknown as boolean)).toThrow(/copy\?: boolean/);
      block.dispose();
    } finally {
      ctx.dispose();
    }
  });

  test("reading the segments can run JavaScript that disposes the context: setSegments then says so", async () => {
    const ctx = new addon.NativeContext(model, 16);
    await ctx.eval(tokens(4), 0);
    const block = ctx.exportBlock(0, 4);
    const sneaky = { block, alpha: 1, get logit() { ctx.dispose(); return false; } };
    expect(() => ctx.setSegments([sneaky])).toThrow(/context has been disposed/);
    block.dispose();
  });
});

describe("engine settings", () => {
  test("setThreads and setSimd during a running eval return at once (the JS thread used to wait for the eval) and hold from when it ends", async () => {
    const before = addon.getThreads();
    const ctx = new addon.NativeContext(model, 6000);
    try {
      const running = ctx.eval(tokens(6000), 0); // ~0.5 s on this fixture
      await new Promise((r) => setTimeout(r, 30));
      const t0 = performance.now();
      addon.setThreads(1);
      addon.setSimd("scalar");
      expect(performance.now() - t0).toBeLessThan(100); // waiting for the eval would take ~0.45 s
      expect(addon.getThreads()).toBe(before); // the running eval keeps its pool
      await running;
      expect(addon.getThreads()).toBe(1);
      expect(addon.simd().active).toBe("scalar");
    } finally {
      ctx.dispose();
      addon.setThreads(0);
      addon.setSimd("auto");
    }
  });

  test("a SIMD path the CPU cannot run is refused when asked for, not later", () => {
    expect(() => addon.setSimd("sse9")).toThrow(/sse9/);
  });
});

describe("cancel", () => {
  test("a cancel on the eval's own tick or while it waits stops it, and a cancelled eval leaves the context as it was", async () => {
    const a = new addon.NativeContext(model, 2048);
    const b = new addon.NativeContext(model, 2048);
    try {
      await b.eval(tokens(5), 0);
      const p = b.eval(tokens(1500), 0);
      b.cancel();
      await expect(p).rejects.toThrow(/cancelled/);
      expect(b.nPast).toBe(5);
      const first = a.eval(tokens(1500), 0); // b's next eval waits behind this one
      const queued = expect(b.eval(tokens(1500), 0)).rejects.toThrow(/cancelled/);
      b.cancel();
      await first;
      await queued;
      expect(b.nPast).toBe(5);
      await b.eval(tokens(3), 0); // a later eval is not cancelled by the earlier cancel()
      expect(b.nPast).toBe(8);
    } finally {
      a.dispose();
      b.dispose();
    }
  });
});

describe("arguments", () => {
  test("an object that only pretends to be a NativeModel (its prototype swapped) is refused", () => {
    const sampler = new addon.NativeSampler({ temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1, seed: 1 });
    Object.setPrototypeOf(sampler, Object.getPrototypeOf(model));
    expect(() => new addon.NativeContext(sampler as unknown as NativeModelHandle, 16)).toThrow(/first argument must be a NativeModel/);
  });

  test("integer arguments are integers in range, not whatever Int32 conversion makes of them", async () => {
    const ctx: NativeContextHandle = new addon.NativeContext(model, 16);
    try {
      await ctx.eval(tokens(4), 0);
      expect(() => ctx.truncate(Number.NaN)).toThrow(/n must be an integer from 0 to 2147483647, got nan/);
      expect(ctx.nPast).toBe(4);
      expect(() => ctx.eval(tokens(1), 1.5 as 1)).toThrow(/logits mode must be an integer from 0 to 2, got 1.5/);
      expect(() => ctx.exportBlock(Number.NaN, 2)).toThrow(/from must be an integer/);
      const block = ctx.exportBlock(0, 4);
      expect(() => block.slice(0, 2 ** 32 + 1)).toThrow(/to must be an integer from 0 to 2147483647/);
      expect(() => addon.remapBlock(model, block, 2 ** 31)).toThrow(/newStart must be an integer from -536870912 to 536870912/);
      expect(() => addon.setThreads(2 ** 32 + 1)).toThrow(/thread count \(0: the default\) must be an integer from 0 to 1024/);
      block.dispose();
    } finally {
      ctx.dispose();
    }
  });

  test("injected segments are capped at 2^24 tokens together (a count that used to wrap an int)", async () => {
    const ctx = new addon.NativeContext(model, 4200);
    try {
      await ctx.eval(tokens(4096), 0);
      const block = ctx.exportBlock(0, 4096);
      const many = Array.from({ length: 4097 }, () => ({ block, alpha: 1, logit: false }));
      expect(() => ctx.setSegments(many)).toThrow(/segments hold 16781312 tokens together; at most 16777216 can be injected/);
      // The same limit before anything is copied (Model checks it before setSegments).
      expect(() => ctx.reserveSegments(16781312)).toThrow(/segments hold 16781312 tokens together; at most 16777216 can be injected/);
      expect(() => ctx.reserveSegments(-1)).toThrow(/tokens must be an integer from 0 to 2147483647/);
      ctx.reserveSegments(16777216); // the limit itself: nothing to allocate on the CPU
      // A shift must be an integer, and the block's shifted start within the position limit.
      const one = (shift: unknown) => [{ block, alpha: 1, logit: false, shift } as unknown as NativeSegment];
      expect(() => ctx.setSegments(one(0.5))).toThrow(/segment\.shift must be an integer from -1073741824 to 1073741824/);
      expect(() => ctx.setSegments(one("3"))).toThrow(/segment\.shift must be an integer/);
      expect(() => ctx.setSegments(one(2 ** 30 + 1))).toThrow(/segment\.shift must be an integer/);
      expect(() => ctx.setSegments(one(2 ** 29 + 1))).toThrow(/a segment shifted to position 536870913 is outside ±536870912/);
      ctx.setSegments(one(-(2 ** 29)));
      ctx.setSegments([]);
      block.dispose();
    } finally {
      ctx.dispose();
    }
  });

  test("the limits the TypeScript loaders check files against are the addon's", () => {
    const { vocabSize, hiddenSize, intermediateSize, numLayers, numHeads, numKvHeads, headDim, headsTimesHeadDim } = addon.limits;
    expect(SHAPE_LIMITS).toEqual({ vocabSize, hiddenSize, intermediateSize, numLayers, numHeads, numKvHeads, headDim });
    expect(HEADS_TIMES_HEAD_DIM_LIMIT).toBe(headsTimesHeadDim);
  });

  test("limits.deviceIndex is the GPU index the addon refuses beyond (Model.load's check uses it)", () => {
    const max = addon.limits.deviceIndex;
    expect(max).toBe(1023);
    // A CPU build refuses any GPU index, and a GPU build one the machine lacks, but for another reason.
    const refusal = (i: number) => {
      try {
        addon.kvPoolBytes(i);
        return "";
      } catch (e) {
        return (e as Error).message;
      }
    };
    expect(refusal(max)).not.toMatch(/deviceIndex must be/);
    expect(refusal(max + 1)).toMatch(new RegExp(`deviceIndex must be an integer from 0 to ${max}, got ${max + 1}`));
  });

  test("model shapes whose products would overflow are refused at load", async () => {
    const config = { ...spec.config, numHeads: 65536, headDim: 65536 };
    await expect(addon.loadModel({ ...spec, config })).rejects.toThrow(/num_attention_heads must be from 1 to 1024, got 65536/);
    await expect(addon.loadModel({ ...spec, config: { ...spec.config, numHeads: 1024, numKvHeads: 1024, headDim: 512 } })).rejects.toThrow(
      /num_attention_heads × head_dim = 524288 is over 262144/,
    );
  });

  test("file locks: a held lock is EWOULDBLOCK (a second open in this process too), other failures carry their errno's name; unlockFile closes only descriptors lockFile gave", () => {
    const path = join(tempDir(), "lock");
    const fd = addon.lockFile(path);
    const codeOf = (f: () => unknown) => {
      try {
        f();
      } catch (e) {
        return (e as NodeJS.ErrnoException).code;
      }
      return "no error";
    };
    expect(codeOf(() => addon.lockFile(path))).toBe("EWOULDBLOCK");
    expect(codeOf(() => addon.lockFile(join(path, "under-a-file")))).toBe("ENOTDIR");
    expect(() => addon.lockFile("a\0b")).toThrow(TypeError);
    // 0-2 are stdio: closing one of those, or a descriptor of Node's own, would break it far from here.
    expect(() => addon.unlockFile(2)).toThrow(/descriptor 2 is not a lock lockFile took/);
    addon.unlockFile(fd);
    expect(() => addon.unlockFile(fd)).toThrow(/is not a lock lockFile took on this thread \(or was already let go of\)/);
    addon.unlockFile(addon.lockFile(path)); // let go of: free again
  });

  test("file locks: a worker thread that ends without unlockFile lets go of its locks; another thread cannot unlock them", async () => {
    const path = join(tempDir(), "lock");
    const addonPath = join(repoRoot, "build", "Release", "dki_native.node");
    const code = `const { parentPort } = require("node:worker_threads");
      parentPort.postMessage(require(${JSON.stringify(addonPath)}).lockFile(${JSON.stringify(path)}));
      setInterval(() => {}, 60000);`;
    const worker = new Worker(code, { eval: true });
    const [fd] = (await once(worker, "message")) as [number];
    expect(() => addon.lockFile(path)).toThrow(/locked by another open file/);
    expect(() => addon.unlockFile(fd)).toThrow(/is not a lock lockFile took on this thread/);
    await worker.terminate();
    addon.unlockFile(addon.lockFile(path));
  });
});
