// Child process of cuda.test.ts: moves K/V blocks to and from the GPU (toDevice, toHost, serialize
// and deserialize in every storage, injected segments uploaded from host memory) under the
// DKI_CUDA_STAGING_CHUNK this process was started with, and prints what it found as JSON. Usage:
//   node staged-restore.mjs <dist folder> <model folder> <memory length>
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [dist, modelDir, length] = process.argv.slice(2);
const load = (path) => import(pathToFileURL(join(dist, path)).href);
const { Model } = await load("src/engine/model.js");
const { KVBlock } = await load("src/kv/kv-block.js");

const same = (a, b) => a.length === b.length && a.every((x, i) => Object.is(x, b[i]));
const refusal = async (bytes) => {
  try {
    (await KVBlock.deserialize(model.nativeHandle(), bytes, { onDevice: true })).dispose();
    return null;
  } catch (e) {
    return String(e.message);
  }
};

const model = await Model.load(modelDir, { contextSize: Number(length) + 16, device: "cuda" });
const memory = Array.from({ length: Number(length) }, (_, i) => (i * 7919 + 11) % 49152);
const host = await model.computeBlock(memory, { startPos: 3 });
const out = { storages: {}, corrupt: {} };
let dev;
try {
  dev = await host.toDevice();
  const back = await dev.toHost();
  out.toDevice = same(back.keys(), host.keys()) && same(back.values(), host.values());
} catch (e) {
  out.error = String(e.message);
}
if (!out.error) {
  for (const storage of ["f32", "f16", "bf16", "int8"]) {
    // Down (encoded on the GPU, staged out) and up (staged in, decoded on the GPU).
    const bytes = await host.serialize(storage);
    const encoded = same(await dev.serialize(storage), bytes);
    const onHost = await KVBlock.deserialize(model.nativeHandle(), bytes);
    // Disposed at once: the next storage's block reuses its memory from the GPU's pool.
    const onGpu = await KVBlock.deserialize(model.nativeHandle(), bytes, { onDevice: true });
    const back = await onGpu.toHost();
    onGpu.dispose();
    out.storages[storage] = { bytes: bytes.length, encoded, decoded: same(back.keys(), onHost.keys()) && same(back.values(), onHost.values()) };
  }
  // Segments from host memory go up row by row (layer, K/V head) into the context's segment
  // tensor, where the second block's rows start mid-row; from GPU memory they are copied on the
  // device. At "prefix" positions the blocks are used as computed (no remap), so both runs see
  // the same K/V and must give the same logits.
  const small = await model.computeBlock(memory.slice(0, 3));
  const smallDev = await small.toDevice();
  const prompt = [5, 17, 29, 41, 53];
  const run = (a, b) => model.logits(prompt, { segments: [{ kv: a, alpha: 1 }, { kv: b, alpha: 0.5 }], positions: "prefix" });
  const fromHost = await run(small, host), fromDevice = await run(smallDev, dev);
  out.segmentsMaxDiff = 0;
  fromHost.forEach((row, i) => row.forEach((x, j) => (out.segmentsMaxDiff = Math.max(out.segmentsMaxDiff, Math.abs(x - fromDevice[i][j])))));
  smallDev.dispose();
  // A flipped bit in the first and in the last payload byte: each lies in a different chunk.
  const bytes = await host.serialize("f16");
  for (const [name, at] of [["first", 64 + 4 * memory.length], ["last", bytes.length - 1]]) {
    const bad = Uint8Array.from(bytes);
    bad[at] ^= 1;
    out.corrupt[name] = await refusal(bad);
  }
}
model.dispose();
console.log(JSON.stringify(out));
