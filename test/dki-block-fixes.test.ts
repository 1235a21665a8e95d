// The training-free fixes for separately encoded memories (DKIConfig.blockFix) on a generated
// model: each is exact where it claims to be. Recomputing everything (EPIC with k ≥ a block's
// length, CacheBlend with ratio 1) gives the joint encoding of the blocks behind their prefix, as
// computeBlock makes it; recomputing nothing gives the separate encoding bit for bit; CacheBlend's
// selection is checked against the deviations computed here from the joint and separate blocks;
// APE's temperature against the float64 reference forward.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { KVBlock } from "../src/kv/kv-block.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { DEFAULT_BUDGETS, DKISystem, applyBlockFix, resolveConfig, type Assembly, type DKIConfigInput } from "../src/dki/index.js";
import { TieredKVCache } from "../src/cache/tiered-cache.js";
import { native, type NativeSegment } from "../src/engine/native.js";
import { loadRefWeights, refForward, refSegment, type RefWeights } from "./reference/forward.js";
import { maxAbsDiff, tempDir } from "./support/paths.js";

let model: Model;
let ref: RefWeights;
const maxRowDiff = (a: ArrayLike<number>[], b: ArrayLike<number>[]) => Math.max(...a.map((row, i) => maxAbsDiff(row, b[i]!)));
const sameRows = (a: Float32Array[], b: Float32Array[]) => a.length === b.length && a.every((r, i) => maxAbsDiff(r, b[i]!) === 0);

// Three memories of different lengths and a prefix ([BOS]-like: any token works for the identities).
const mems = [
  [3, 1200, 77, 4501, 9, 18000],
  [256, 31, 40000, 12, 600, 7, 88, 2000, 5],
  [301, 46000, 17, 9021, 44, 12000, 450],
];
const prefix = [1, 90];
const P = prefix.length;
const all = mems.flat();
const prompt = [1, 450, 3000, 17, 9021, 44, 12000];

beforeAll(async () => {
  const dir = tempDir();
  // Four layers: CacheBlend selects at layer 1 and recomputes the selected tokens at layers 2 and 3.
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 11, overrides: { numLayers: 4, numHeads: 4, numKvHeads: 2, headDim: 16 } });
  model = await Model.load(dir, { contextSize: 256 });
  ref = await loadRefWeights(dir);
});
afterAll(() => model.dispose());

/** Each memory encoded on its own right after the prefix (where DKISystem computes its blocks). */
const separate = () => Promise.all(mems.map((m) => model.computeBlock(m, { prefix, startPos: P })));
/** All memories encoded together behind the prefix. */
const joint = () => model.computeBlock(all, { prefix, startPos: P });

/** Per layer, the rows (tokens) of a block's K or V, each [nKvHeads·headDim] (heads side by side). */
function rows(b: KVBlock, which: "keys" | "values", layer: number): Float32Array[] {
  const t = which === "keys" ? b.keys() : b.values();
  const per = b.nKvHeads * b.nTokens * b.headDim;
  return Array.from({ length: b.nTokens }, (_, i) => {
    const r = new Float32Array(b.nKvHeads * b.headDim);
    for (let h = 0; h < b.nKvHeads; h++) r.set(t.subarray(layer * per + (h * b.nTokens + i) * b.headDim, layer * per + (h * b.nTokens + i + 1) * b.headDim), h * b.headDim);
    return r;
  });
}

function maxBlockDiff(a: KVBlock, b: KVBlock): number {
  return Math.max(maxAbsDiff(a.keys(), b.keys()), maxAbsDiff(a.values(), b.values()));
}

describe("Model.blendBlocks (CacheBlend)", () => {
  test("ratio 1 equals the joint encoding behind the prefix (≤ 1e-4), with and without a prefix", async () => {
    const blended = await model.blendBlocks(await separate(), { ratio: 1, prefix });
    const want = await joint();
    expect(blended.startPos).toBe(P);
    expect(blended.tokens).toEqual(all);
    expect(maxBlockDiff(blended, want)).toBeLessThan(1e-4);
    // The separate encoding is far from it: the identity is not met by accident.
    expect(maxBlockDiff(await KVBlock.concat(await separate()), want)).toBeGreaterThan(1e-2);

    const bare = await Promise.all(mems.map((m) => model.computeBlock(m)));
    const blendedBare = await model.blendBlocks(bare, { ratio: 1 });
    expect(maxBlockDiff(blendedBare, await model.computeBlock(all))).toBeLessThan(1e-4);
  });

  test("ratio 0 is the concatenation of the separate blocks, bit for bit", async () => {
    const blocks = await separate();
    const blended = await model.blendBlocks(blocks, { ratio: 0, prefix });
    const cat = await KVBlock.concat(blocks);
    expect(maxBlockDiff(blended, cat)).toBe(0);
  });

  test("ratio 0.3: the tokens whose layer-1 K/V deviate most take their joint K/V at layers 0–1, the others keep theirs at every layer", async () => {
    const blocks = await separate();
    const cat = await KVBlock.concat(blocks);
    const want = await joint();
    const blended = await model.blendBlocks(blocks, { ratio: 0.3, prefix });
    const N = all.length;
    const nSel = Math.ceil(0.3 * N);
    // The selection, computed here from the joint and the separate encodings.
    const dev = (l: number) =>
      rows(want, "keys", l).map((r, i) => {
        const c = rows(cat, "keys", l)[i]!, v = rows(want, "values", l)[i]!, cv = rows(cat, "values", l)[i]!;
        let d = 0;
        for (let j = 0; j < r.length; j++) d += (r[j]! - c[j]!) ** 2 + (v[j]! - cv[j]!) ** 2;
        return d;
      });
    const d1 = dev(1);
    const chosen = new Set([...d1.keys()].sort((a, b) => d1[b]! - d1[a]! || a - b).slice(0, nSel));
    for (let l = 0; l < model.config.numLayers; l++) {
      const got = rows(blended, "keys", l), gotV = rows(blended, "values", l);
      const sep = rows(cat, "keys", l), sepV = rows(cat, "values", l);
      const j = rows(want, "keys", l);
      for (let i = 0; i < N; i++) {
        if (!chosen.has(i)) {
          expect(maxAbsDiff(got[i]!, sep[i]!), `layer ${l} token ${i} (kept)`).toBe(0);
          expect(maxAbsDiff(gotV[i]!, sepV[i]!)).toBe(0);
        } else if (l <= 1) expect(maxAbsDiff(got[i]!, j[i]!), `layer ${l} token ${i} (joint)`).toBeLessThan(1e-4);
      }
    }
    // Recomputing the selected tokens brings the later layers' keys closer to the joint ones (in sum of squares).
    const dist = (b: KVBlock) => {
      const k = b.keys(), w = want.keys();
      let d = 0;
      for (let i = k.length / 2; i < k.length; i++) d += (k[i]! - w[i]!) ** 2;
      return d;
    };
    expect(dist(blended)).toBeLessThan(dist(cat));
  });

  test("selecting exactly the tokens after the first block gives the joint encoding: the selected tokens' attention reads the kept tokens' cached K/V", async () => {
    // The first block sits right behind the prefix, so its joint and separate K/V agree (only
    // rounding apart) and every later token deviates more: ratio (N − n₁)/N selects the later blocks.
    const N = all.length;
    const blended = await model.blendBlocks(await separate(), { ratio: (N - mems[0]!.length) / N, prefix });
    expect(maxBlockDiff(blended, await joint())).toBeLessThan(1e-4);
  });

  test("bad arguments are refused, naming the problem", async () => {
    const blocks = await separate();
    await expect(model.blendBlocks(blocks, { ratio: 1.5, prefix })).rejects.toThrow(/ratio must be a number in \[0, 1\], got 1\.5/);
    await expect(model.blendBlocks(blocks, { ratio: Number.NaN })).rejects.toThrow(/ratio must be a number in \[0, 1\]/);
    await expect(model.blendBlocks([], { ratio: 0.5 })).rejects.toThrow(/non-empty array of KVBlocks/);
    // A prefix that does not end where the blocks start.
    const farPrefix = await model.computeBlock(prefix, { startPos: 40 });
    await expect(model.blendBlocks(blocks, { ratio: 0.5, prefix: farPrefix })).rejects.toThrow(/the prefix sits at \[40, 42\) but the first block starts at 2/);
  });
});

describe("the native calls check what they are given", () => {
  test("blendBlocks: argument types, ratio, a block of another model", async () => {
    const addon = native();
    const h = model.nativeHandle();
    const blocks = (await separate()).map((b) => b.nativeHandle());
    const call = (...args: unknown[]) => (addon.blendBlocks as (...a: unknown[]) => Promise<unknown>)(...args);
    expect(() => call(h, null, "blocks", 0.5)).toThrow(/blendBlocks\(model, prefix: NativeKVBlock \| null, blocks: NativeKVBlock\[\], ratio: number\)/);
    expect(() => call(h, null, blocks, "0.5")).toThrow(/blendBlocks\(model, prefix/);
    expect(() => call(h, null, blocks, Number.NaN)).toThrow(/ratio must be a number in \[0, 1\]/);
    expect(() => call(h, null, [blocks[0], {}], 0.5)).toThrow(/expected a NativeKVBlock/);
    expect(() => call(h, 7, blocks, 0.5)).toThrow(/expected a NativeKVBlock/);
    await expect(call(h, null, [], 0.5)).rejects.toThrow(/blendBlocks needs at least one block/);
    // A block of another model (another seed: other weights, other fingerprint).
    const dir = tempDir();
    await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: dir, seed: 12, overrides: { numLayers: 4, numHeads: 4, numKvHeads: 2, headDim: 16 } });
    const other = await Model.load(dir, { contextSize: 32 });
    try {
      const foreign = await other.computeBlock(mems[0]!);
      expect(() => call(h, null, [blocks[0], foreign.nativeHandle()], 0.5)).toThrow(/computed by another model/);
      await expect(model.blendBlocks([foreign], { ratio: 0.5 })).rejects.toThrow(/computed by another model/);
    } finally {
      other.dispose();
    }
  });

  test("setSegments: a temperature that is not a finite number > 0 is a RangeError", () => {
    const ctx = model.createContext(16);
    return separate().then((blocks) => {
      try {
        const seg = (temperature: unknown) => [{ block: blocks[0]!.nativeHandle(), alpha: 1, logit: false, temperature } as unknown as NativeSegment];
        for (const t of [0, -2, Number.NaN, Number.POSITIVE_INFINITY, 1e39, "2"]) expect(() => ctx.setSegments(seg(t))).toThrow(/segment\.temperature must be a finite number > 0/);
        // Positive but below float32's smallest: 0 once rounded.
        expect(() => ctx.setSegments(seg(1e-50))).toThrow(/segment temperature must be a finite number > 0/);
        ctx.setSegments(seg(0.5));
        ctx.setSegments([]);
      } finally {
        ctx.dispose();
      }
    });
  });
});


describe("segment temperature (APE)", () => {
  test("T = 1 is no temperature at all, bit for bit", async () => {
    const kv = await model.computeBlock(all, { startPos: -all.length });
    const plain = await model.logits(prompt, { segments: [{ kv, alpha: 1 }] });
    expect(sameRows(plain, await model.logits(prompt, { segments: [{ kv, alpha: 1, temperature: 1 }] }))).toBe(true);
    expect(sameRows(plain, await model.logits(prompt, { segments: [{ kv, alpha: 1, scaling: "logit", temperature: 1 }] }))).toBe(true);
  });

  test("score/T + ln s equals the float64 reference (T = 0.6, s = 1.7; and two segments with their own T)", async () => {
    const kv = await model.computeBlock(all, { startPos: -all.length });
    const got = await model.logits(prompt, { segments: [{ kv, alpha: 1.7, scaling: "logit", temperature: 0.6 }] });
    const want = refForward(ref, prompt, { startPos: 0, segments: [refSegment(kv, 1.7, "logit", 0.6)] }).logits;
    expect(maxRowDiff(want, got)).toBeLessThan(1e-4);
    // The temperature changes the output: the check above is not met by T being ignored.
    expect(maxRowDiff(want, await model.logits(prompt, { segments: [{ kv, alpha: 1.7, scaling: "logit" }] }))).toBeGreaterThan(1e-3);

    const a = await model.computeBlock(mems[0]!, { startPos: -all.length });
    const b = await model.computeBlock(mems.slice(1).flat(), { startPos: -all.length + mems[0]!.length });
    const two = await model.logits(prompt, { segments: [{ kv: a, alpha: 0.5, temperature: 2.5 }, { kv: b, alpha: 1.2, scaling: "logit", temperature: 0.8 }] });
    const twoRef = refForward(ref, prompt, { startPos: 0, segments: [refSegment(a, 0.5, "value", 2.5), refSegment(b, 1.2, "logit", 0.8)] }).logits;
    expect(maxRowDiff(twoRef, two)).toBeLessThan(1e-4);
  });

  test("a temperature that is not a finite number > 0 is refused, naming it", async () => {
    const kv = await model.computeBlock(mems[0]!);
    for (const t of [0, -1, Number.NaN, Number.POSITIVE_INFINITY, 1e39, "2" as unknown as number])
      await expect(model.logits(prompt, { segments: [{ kv, temperature: t }] })).rejects.toThrow(/segments\[0\]: temperature must be a finite number > 0/);
  });
});

describe("applyBlockFix", () => {
  test("EPIC k = 3: every later block's first 3 tokens are the joint encoding's, placed where it puts them; the rest is its own encoding, bit for bit", async () => {
    const cache = await TieredKVCache.open({ model, dir: tempDir(), budgets: DEFAULT_BUDGETS });
    try {
      const blocks = await separate();
      const a: Assembly = { segments: blocks.map((kv, i) => ({ kv, alpha: 0.5 + i / 10, scaling: "value" })), blocks: [], tokens: all.length, fixKeys: [], release: () => {} };
      const fixed = await applyBlockFix(a, { kind: "epic", recomputeTokens: 3 }, { cache, model, userId: "u", prefix });
      expect(fixed.segments.map((s) => s.kv.nTokens)).toEqual([6, 3, 6, 3, 4]);
      expect(fixed.segments.map((s) => s.alpha)).toEqual([0.5, 0.6, 0.6, 0.7, 0.7]);
      expect(fixed.fixKeys).toHaveLength(2);
      const want = await joint();
      expect(fixed.segments[0]!.kv).toBe(blocks[0]);
      for (const [i, at] of [[1, 6], [2, 15]] as const) {
        const piece = fixed.segments[2 * i - 1]!.kv, rest = fixed.segments[2 * i]!.kv;
        expect(piece.startPos).toBe(P + at);
        expect(maxBlockDiff(piece, await want.slice(at, at + 3))).toBeLessThan(1e-4);
        expect(maxBlockDiff(rest, await blocks[i]!.slice(3, mems[i]!.length))).toBe(0);
      }
      fixed.release();
    } finally {
      await cache.close();
    }
  });
});

describe("DKIConfig.blockFix in a turn", () => {
  // Exact-identity settings: [BOS] prefix, no template, no history, α forced to 1.
  const base: DKIConfigInput = { encodingPrefix: "bos", chatTemplate: "never", historyEnabled: false, preferenceEnabled: false, generationReserve: 64, memoryOrder: "time" };
  const texts = ["Alice keeps a parrot named Kiwi at home.", "Alice works as a nurse in Lyon hospital.", "Alice drives a green Volvo to Lyon."];
  const query = "Where does Alice work, what car does Alice drive, and what is the parrot's name?";

  /** The turn's logits for `config`, with the memories stored in order (oldest first) and α forced to 1. */
  async function turn(config: DKIConfigInput, sys?: DKISystem) {
    const s = sys ?? (await DKISystem.open({ model, dataDir: tempDir(), config: { ...base, ...config } }));
    try {
      if (!sys) for (const t of texts) await s.memories.add(t, { userId: "alice" });
      const r = await s.logits(query, { userId: "alice", sessionId: "s", forceAlpha: 1 });
      expect(r.memoriesUsed.map((m) => m.text)).toEqual(texts);
      return r;
    } finally {
      if (!sys) await s.close();
    }
  }

  /** The same prompt with the memories encoded together behind [BOS] as one block. */
  async function jointTurn(promptTokens: number[]) {
    const bos = [model.tokenizer.bosId!];
    const tokens = texts.flatMap((t) => model.tokenizer.encode(t, { addSpecialTokens: false }));
    const kv = await model.computeBlock(tokens, { prefix: bos, startPos: bos.length });
    return model.logits(promptTokens, { segments: [{ kv, alpha: 1 }], positions: "negative" });
  }

  test("EPIC with k ≥ every block's length and CacheBlend with ratio 1 give the jointly encoded block's logits (≤ 1e-4); the plain turn does not", async () => {
    expect(model.tokenizer.bosId).not.toBeNull();
    const plain = await turn({});
    const want = await jointTurn(plain.promptTokens);
    expect(maxRowDiff(plain.logits, want)).toBeGreaterThan(1e-3);
    const epic = await turn({ blockFix: { kind: "epic", recomputeTokens: 1000 } });
    expect(maxRowDiff(epic.logits, want)).toBeLessThan(1e-4);
    const blend = await turn({ blockFix: { kind: "cacheblend", ratio: 1 } });
    expect(maxRowDiff(blend.logits, want)).toBeLessThan(1e-4);
    // Partial fixes land in between.
    const epic4 = await turn({ blockFix: { kind: "epic", recomputeTokens: 4 } });
    expect(maxRowDiff(epic4.logits, want)).toBeGreaterThan(0);
    expect(maxRowDiff(epic4.logits, plain.logits)).toBeGreaterThan(0);
  });

  test("EPIC k = 0, CacheBlend ratio 0 and APE T = 1, s = 1 are the separate encoding, bit for bit", async () => {
    const plain = await turn({});
    for (const blockFix of [{ kind: "epic", recomputeTokens: 0 }, { kind: "cacheblend", ratio: 0 }, { kind: "ape", temperature: 1, scale: 1 }] as const)
      expect(sameRows(plain.logits, (await turn({ blockFix })).logits), blockFix.kind).toBe(true);
    // APE away from 1 changes the output, as the engine's temperature and ln s would.
    expect(maxRowDiff(plain.logits, (await turn({ blockFix: { kind: "ape", temperature: 0.5, scale: 2 } })).logits)).toBeGreaterThan(1e-3);
  });

  test("EPIC's recomputed pieces come from the cache on the next turn, and clearSessionCache drops them with the blocks", async () => {
    const sys = await DKISystem.open({ model, dataDir: tempDir(), config: { ...base, blockFix: { kind: "epic", recomputeTokens: 3 } } });
    try {
      for (const t of texts) await sys.memories.add(t, { userId: "alice" });
      const first = await sys.chat(query, { userId: "alice", sessionId: "s", forceAlpha: 1, maxNewTokens: 1 });
      expect(first.metadata.blockFix).toEqual({ kind: "epic", recomputeTokens: 3 });
      // Three memory blocks and two pieces (the first block has nothing before it to recompute behind).
      expect(sys.stats().cache.L4.hits).toBe(3 + 2);
      const l1 = sys.stats().cache.L1.hits;
      await turn({}, sys);
      expect(sys.stats().cache.L4.hits).toBe(3 + 2);
      expect(sys.stats().cache.L1.hits).toBe(l1 + 3 + 2);
      expect(await sys.clearSessionCache("s")).toBe(3 + 2);
    } finally {
      await sys.close();
    }
  });

  test("alphaScaling 'logit' adds ln α to the memory columns instead of scaling V", async () => {
    const value = await turn({ gating: { alphaThreshold: 0 } });
    const half = (c: DKIConfigInput) => DKISystem.open({ model, dataDir: tempDir(), config: { ...base, ...c } });
    const outs: Float32Array[][] = [];
    for (const alphaScaling of ["value", "logit"] as const) {
      const s = await half({ alphaScaling });
      try {
        for (const t of texts) await s.memories.add(t, { userId: "alice" });
        outs.push((await s.logits(query, { userId: "alice", sessionId: "s", forceAlpha: 0.5 })).logits);
      } finally {
        await s.close();
      }
    }
    expect(maxRowDiff(outs[0]!, outs[1]!)).toBeGreaterThan(1e-4);
    expect(maxRowDiff(outs[0]!, value.logits)).toBeGreaterThan(1e-4);
  });

  test("bad block fixes are refused by name", () => {
    const bad: [unknown, RegExp][] = [
      ["epic", /config\.blockFix must be an object/],
      [{ kind: "recompute" }, /config\.blockFix\.kind must be one of "none", "epic", "cacheblend", "ape", got "recompute"/],
      [{ kind: "epic" }, /config\.blockFix\.recomputeTokens must be an integer >= 0, got undefined/],
      [{ kind: "epic", recomputeTokens: -1 }, /recomputeTokens must be an integer >= 0, got -1/],
      [{ kind: "epic", recomputeTokens: 2.5 }, /recomputeTokens must be an integer >= 0, got 2\.5/],
      [{ kind: "epic", recomputeTokens: 4, ratio: 0.2 }, /config\.blockFix\.ratio is not an option of kind "epic" \(it takes recomputeTokens\)/],
      [{ kind: "cacheblend", ratio: 1.5 }, /config\.blockFix\.ratio must be a number in \[0, 1\], got 1\.5/],
      [{ kind: "cacheblend", ratio: "0.1" }, /config\.blockFix\.ratio must be a number in \[0, 1\], got "0\.1"/],
      [{ kind: "ape", temperature: 0, scale: 1 }, /config\.blockFix\.temperature must be a finite number > 0, got 0/],
      [{ kind: "ape", temperature: 1 }, /config\.blockFix\.scale must be a finite number > 0, got undefined/],
      [{ kind: "ape", temperature: Number.POSITIVE_INFINITY, scale: 1 }, /temperature must be a finite number > 0, got Infinity/],
    ];
    for (const [blockFix, message] of bad) expect(() => resolveConfig({ blockFix } as DKIConfigInput)).toThrow(message);
    expect(() => resolveConfig({ alphaScaling: "log" as "logit" })).toThrow(/config\.alphaScaling must be one of "value", "logit", got "log"/);
    expect(resolveConfig({ blockFix: { kind: "cacheblend" } }).blockFix).toEqual({ kind: "cacheblend", ratio: 0.15 });
    expect(resolveConfig({}).blockFix).toEqual({ kind: "none" });
  });
});
