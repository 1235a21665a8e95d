// Choosing where a model runs. Everywhere: "cpu" is the default, "auto" falls back to the CPU
// without a usable GPU, and "cuda" without one is a clear error, never a crash. The CUDA
// arithmetic itself is checked by cuda.test.ts on a machine with a GPU.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model, nativeConfig, resolveDevice } from "../src/engine/model.js";
import { native } from "../src/engine/native.js";
import { readHfFolder } from "../src/formats/hf-folder.js";
import { KVBlock } from "../src/kv/kv-block.js";
import { hfLlamaTiny } from "./support/paths.js";

const cuda = native().cuda();

test("the addon says whether it has the CUDA backend and which GPUs it sees", () => {
  expect(typeof cuda.built).toBe("boolean");
  expect(cuda.devices).toBeGreaterThanOrEqual(0);
  expect(cuda.names).toHaveLength(cuda.devices);
  if (cuda.devices === 0) expect(cuda.reason.length).toBeGreaterThan(0);
});

test("kvPoolBytes(deviceIndex) reports a GPU's pool of freed block buffers, in CUDA builds only", () => {
  if (cuda.built) expect(native().kvPoolBytes(0)).toBeGreaterThanOrEqual(0);
  else expect(() => native().kvPoolBytes(0)).toThrow(/kvPoolBytes: this addon was built without the CUDA backend/);
  expect(() => native().kvPoolBytes("0" as unknown as number)).toThrow(/kvPoolBytes\(deviceIndex\?: number\)/);
});

test("a device name that is not cpu, cuda or auto is refused", () => {
  expect(() => resolveDevice("tpu" as "cpu")).toThrow(/device must be "cpu", "cuda" or "auto", got "tpu"/);
});

test("models load on the CPU by default", async () => {
  const m = await Model.load(hfLlamaTiny, { contextSize: 16 });
  expect(m.info.device).toBe("cpu");
  expect(m.info.deviceBytes).toBe(0);
  m.dispose();
});

describe.skipIf(cuda.devices > 0)("without a usable GPU", () => {
  let spec: Parameters<ReturnType<typeof native>["loadModel"]>[0];
  beforeAll(async () => {
    const f = await readHfFolder(hfLlamaTiny);
    spec = {
      config: nativeConfig(f.config),
      tensors: f.tensors,
    };
  });

  test('"auto" runs on the CPU', async () => {
    expect(resolveDevice("auto")).toBe("cpu");
    const m = await Model.load(hfLlamaTiny, { contextSize: 16, device: "auto" });
    expect(m.info.device).toBe("cpu");
    m.dispose();
  });

  test('"cuda" is an error that says why', async () => {
    await expect(Model.load(hfLlamaTiny, { device: "cuda" })).rejects.toThrow(`device "cuda" was asked for but no GPU is usable: ${cuda.reason}`);
  });

  test("the addon itself refuses a CUDA load with the reason, not a crash", async () => {
    const attempt = async () => native().loadModel({ ...spec, device: "cuda" });
    if (cuda.built) await expect(attempt()).rejects.toThrow(/CUDA was asked for but no device is usable/);
    else await expect(attempt()).rejects.toThrow(/this build of dki-engine has no CUDA backend/);
  });

  test("an unknown device string is a TypeError from the addon", async () => {
    await expect(async () => native().loadModel({ ...spec, device: "tpu" as "cpu" })).rejects.toThrow(/device must be "cpu" or "cuda", got "tpu"/);
  });
});

describe("K/V block residence on a CPU model", () => {
  let m: Model;
  beforeAll(async () => {
    m = await Model.load(hfLlamaTiny, { contextSize: 32 });
  });
  afterAll(() => m.dispose());

  test("blocks live in host memory, and toHost() gives a new block over the same data", async () => {
    const b = await m.computeBlock([5, 9, 14, 2]);
    expect(b.device).toBeNull();
    expect(b.deviceBytes).toBe(0);
    expect(b.byteSize).toBe(2 * 4 * b.nLayers * b.nKvHeads * b.nTokens * b.headDim);
    const h = await b.toHost();
    expect(h).not.toBe(b);
    const keys = b.keys();
    b.dispose(); // the copy holds its own reference
    expect(h.keys()).toEqual(keys);
    h.dispose();
  });

  test("a CPU context has no CUDA stage profile, even with DKI_CUDA_PROFILE=1", async () => {
    process.env.DKI_CUDA_PROFILE = "1";
    const ctx = m.createContext(8);
    try {
      await ctx.eval(Int32Array.of(5, 9), 1);
      expect(ctx.cudaProfile()).toBeNull();
    } finally {
      ctx.dispose();
      delete process.env.DKI_CUDA_PROFILE;
    }
  });

  test("asking for a GPU copy is an error that says why", async () => {
    const b = await m.computeBlock([5, 9, 14, 2]);
    await expect(b.toDevice()).rejects.toThrow(/toDevice: the model runs on the CPU/);
    await expect(m.computeBlock([5, 9], { onDevice: true })).rejects.toThrow(/onDevice: the model runs on the CPU/);
    const ctx = m.createContext(8);
    try {
      await ctx.eval(Int32Array.of(5, 9, 14), 0);
      expect(() => ctx.exportBlock(0, 2, true)).toThrow(/this context runs on the CPU/);
    } finally {
      ctx.dispose();
    }
    const bytes = await b.serialize("int8");
    await expect(KVBlock.deserialize(m.nativeHandle(), bytes, { onDevice: true })).rejects.toThrow(/deserialize: onDevice needs a model loaded with device "cuda"/);
    if (!cuda.built) {
      expect(() => b.nativeHandle().toDevice(0)).toThrow(/built without the CUDA backend/);
      await expect(native().deserializeBlock(m.nativeHandle(), bytes, 0)).rejects.toThrow(/built without CUDA: a K\/V block cannot be restored into GPU memory/);
    }
    // Corrupt bytes are refused as such. (A restore onto a GPU computes the checksum as it stages
    // the payload for upload and drops the block when it fails: cuda.test.ts checks that there.)
    bytes[bytes.length - 1] ^= 1;
    await expect(native().deserializeBlock(m.nativeHandle(), bytes)).rejects.toThrow(/checksum mismatch/);
    await expect(native().deserializeBlock(m.nativeHandle(), bytes, 0)).rejects.toThrow(
      cuda.devices > 0 ? /checksum mismatch/ : cuda.built ? /there is no GPU cuda:0 \(.+\)/ : /built without CUDA/,
    );
    b.dispose();
  });
});
