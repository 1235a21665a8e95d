// Gating's relevance threshold τ, calibrated per embedder: the calibration itself on score sets
// with a known answer; the hashing embedder's constant recomputed from the labelled corpus (so it
// cannot drift from the features unnoticed) and checked on the held-out half; and the DKI config's
// default following the embedder, a caller's own τ always winning.
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { Model } from "../src/engine/model.js";
import { DKISystem, DEFAULT_CONFIG, resolveConfig, routeMemories, type DKIConfigInput } from "../src/dki/index.js";
import { calibrateRelevance, chooseThreshold, thresholdRates, topDenseScores } from "../src/memory/calibrate.js";
import { HASHING_RELEVANCE_THRESHOLD, HashingEmbedder } from "../src/memory/embedders/hashing.js";
import { OnnxEmbedder } from "../src/memory/embedders/onnx.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { tinyModel } from "./support/cache.js";
import { GATE_SPLIT, MEMORIES, OFF_TOPIC } from "./support/memory-corpus.js";
import { tempDir } from "./support/paths.js";
import { writeTinyBertFolder } from "./support/tiny-bert.js";

describe("chooseThreshold", () => {
  test("separable groups: τ mid-gap, every relevant query in and every off-topic one out", () => {
    const c = chooseThreshold([0.7, 0.5, 0.6], [0.1, 0.3, 0.2]);
    expect(c.threshold).toBeCloseTo(0.4, 12);
    expect(c.gap).toEqual({ below: 0.3, above: 0.5 });
    expect(c).toMatchObject({ truePositiveRate: 1, falsePositiveRate: 0, balancedAccuracy: 1 });
    expect(c.relevant).toMatchObject({ count: 3, min: 0.5, median: 0.6, max: 0.7 });
    expect(c.offTopic.mean).toBeCloseTo(0.2, 12);
  });

  test("overlapping groups: of three cuts with the best balanced accuracy, the widest gap's midpoint", () => {
    // Highest first: .8R .7R | .65O .6R | .4O .3R | .2O .1O: J = ½ at each "|", the gaps 0.05, 0.2, 0.1.
    const c = chooseThreshold([0.3, 0.6, 0.7, 0.8], [0.1, 0.2, 0.4, 0.65]);
    expect(c.threshold).toBeCloseTo(0.5, 12);
    expect(c).toMatchObject({ truePositiveRate: 0.75, falsePositiveRate: 0.25, balancedAccuracy: 0.75 });
  });

  test("equally wide best gaps: the lower τ; equal scores are never split; no separation at all lets everything in", () => {
    // Cuts .875 | .625 and .375 | .125 both have J = ½ and width ¼ (exact in binary).
    expect(chooseThreshold([0.875, 0.375], [0.625, 0.125]).threshold).toBe(0.25);
    // The relevant 0.5s and the off-topic 0.5 fall on the same side of any τ.
    expect(chooseThreshold([0.5, 0.5], [0.5, 0.1])).toMatchObject({ threshold: 0.3, truePositiveRate: 1, falsePositiveRate: 0.5 });
    expect(chooseThreshold([0.2], [0.2])).toMatchObject({ threshold: 0.2, gap: { below: null, above: 0.2 }, balancedAccuracy: 0.5 });
  });

  test("thresholdRates counts a score equal to τ as let in; empty groups and non-finite scores are refused", () => {
    expect(thresholdRates(0.5, [0.5, 0.4], [0.5, 0.1, 0.2, 0.3])).toEqual({ threshold: 0.5, truePositiveRate: 0.5, falsePositiveRate: 0.25, balancedAccuracy: 0.625 });
    expect(() => chooseThreshold([], [0.1])).toThrow("calibration needs scores of both groups, got 0 relevant and 1 off-topic");
    expect(() => chooseThreshold([0.3, NaN], [0.1])).toThrow("calibration scores must be finite numbers, got NaN");
  });
});

describe("the hashing embedder's τ on the labelled corpus", () => {
  const hashing = new HashingEmbedder();
  const pct = (x: number) => `${(x * 100).toFixed(1)}%`;

  test(`the calibration half reproduces HASHING_RELEVANCE_THRESHOLD (${HASHING_RELEVANCE_THRESHOLD}) to 2 decimals`, async () => {
    expect(OFF_TOPIC.length).toBeGreaterThanOrEqual(40);
    const c = await calibrateRelevance(hashing, { memories: MEMORIES, ...GATE_SPLIT.calibration });
    expect(hashing.relevanceThreshold).toBe(HASHING_RELEVANCE_THRESHOLD);
    expect(c.threshold).toBeCloseTo(HASHING_RELEVANCE_THRESHOLD, 2);
    // Stronger than 2 decimals: the constant cuts the calibration half exactly where τ does.
    expect(HASHING_RELEVANCE_THRESHOLD).toBeGreaterThan(c.gap.below!);
    expect(HASHING_RELEVANCE_THRESHOLD).toBeLessThanOrEqual(c.gap.above);
    console.log(
      `hashing-v1-d512 calibration half (${c.relevant.count} relevant, ${c.offTopic.count} off-topic): τ ${c.threshold.toFixed(4)} in the gap ${c.gap.below!.toFixed(4)}–${c.gap.above.toFixed(4)}, ` +
        `TPR ${pct(c.truePositiveRate)}, FPR ${pct(c.falsePositiveRate)}, balanced accuracy ${pct(c.balancedAccuracy)}; ` +
        `s₁ median relevant ${c.relevant.median.toFixed(3)}, off-topic ${c.offTopic.median.toFixed(3)}`,
    );
  });

  test("on the held-out half the constant keeps a balanced accuracy of at least 90%", async () => {
    const { relevant, offTopic } = GATE_SPLIT.heldOut;
    const [r, o] = await Promise.all([topDenseScores(hashing, MEMORIES, relevant), topDenseScores(hashing, MEMORIES, offTopic)]);
    const held = thresholdRates(HASHING_RELEVANCE_THRESHOLD, r, o);
    console.log(`hashing-v1-d512 held-out half (${r.length} relevant, ${o.length} off-topic) at τ ${HASHING_RELEVANCE_THRESHOLD}: TPR ${pct(held.truePositiveRate)}, FPR ${pct(held.falsePositiveRate)}, balanced accuracy ${pct(held.balancedAccuracy)}`);
    // Measured: TPR 85.2%, FPR 0.0%, balanced accuracy 92.6%; one off-topic query sits at 0.160,
    // just under τ, so the floor leaves room for it and no more.
    expect(held.balancedAccuracy).toBeGreaterThanOrEqual(0.9);
  });

  test("what the gate really sees (the top dense score among the routed memories) is never above the best dense score, puts every query on the same side of τ, and gives the same τ", async () => {
    const store = await MemoryStore.open({ dir: join(tempDir(), "store") });
    try {
      await store.memories.add(MEMORIES.map((content) => ({ role: "user" as const, content })), { userId: "u" });
      const routedS1 = async (queries: string[]) => {
        const s: number[] = [];
        for (const q of queries) s.push(Math.max(...(await routeMemories(store, q, { userId: "u", limit: DEFAULT_CONFIG.maxMemories })).map((r) => r.signals.dense)));
        return s;
      };
      const { calibration, heldOut } = GATE_SPLIT;
      const queries = [calibration.relevant, calibration.offTopic, heldOut.relevant, heldOut.offTopic].flat();
      const routed = await routedS1(queries);
      const dense = await topDenseScores(hashing, MEMORIES, queries);
      // Routing fuses dense with BM25 and keeps the top 3, so it can pass over the best dense hit
      // (it does for about a quarter of these queries), but only for queries below τ anyway.
      routed.forEach((s, i) => {
        expect(s).toBeLessThanOrEqual(dense[i]! + 1e-6);
        expect([queries[i], s >= HASHING_RELEVANCE_THRESHOLD]).toEqual([queries[i], dense[i]! >= HASHING_RELEVANCE_THRESHOLD]);
      });
      const nR = calibration.relevant.length;
      expect(chooseThreshold(routed.slice(0, nR), routed.slice(nR, nR + calibration.offTopic.length)).threshold).toBeCloseTo(HASHING_RELEVANCE_THRESHOLD, 2);
    } finally {
      await store.close();
    }
  });
});

describe("the DKI config's τ follows the embedder", () => {
  let model: Model;
  beforeAll(async () => {
    model = await tinyModel(11);
  });
  afterAll(() => model.dispose());

  const HIKING = "The user loves hiking in the Alps.";
  const open = async (config?: DKIConfigInput) => {
    const sys = await DKISystem.open({ model, dataDir: tempDir(), config });
    await sys.memories.add(HIKING, { userId: "u" });
    return sys;
  };
  // Routed (it shares "the" with the memory) but off-topic: s₁ 0.08.
  const OFF = "What is the capital of Australia?";
  const injected = async (sys: DKISystem, query: string) => (await sys.chat(query, { userId: "u", sessionId: "s", maxNewTokens: 1 })).memoriesUsed.map((m) => m.text);

  test("default config: the hashing embedder's τ, so a hiking question gets the hiking memory and an off-topic one gets nothing", async () => {
    const sys = await open();
    try {
      expect(sys.config.gating).toMatchObject({ relevanceThreshold: HASHING_RELEVANCE_THRESHOLD, relevanceThresholdSource: "embedder" });
      // s₁ 0.19 here: below the old uncalibrated default of 0.25, which injected nothing.
      expect(await injected(sys, "Where should I go hiking?")).toEqual([HIKING]);
      expect(await injected(sys, OFF)).toEqual([]);
    } finally {
      await sys.close();
    }
  });

  test("a τ set in the config wins over the embedder's, 0 included", async () => {
    const strict = await open({ gating: { relevanceThreshold: 0.9 } });
    try {
      expect(strict.config.gating).toMatchObject({ relevanceThreshold: 0.9, relevanceThresholdSource: "config" });
      expect(await injected(strict, "Where should I go hiking?")).toEqual([]);
    } finally {
      await strict.close();
    }
    const open0 = await open({ gating: { relevanceThreshold: 0 } });
    try {
      expect(open0.config.gating).toMatchObject({ relevanceThreshold: 0, relevanceThresholdSource: "config" });
      expect(await injected(open0, OFF)).toEqual([HIKING]);
    } finally {
      await open0.close();
    }
  });

  test("resolveConfig: the embedder's τ, else the fallback 0.25; a bad one is refused naming the embedder", () => {
    expect(resolveConfig({}, { id: "e", relevanceThreshold: 0.4 }).gating).toMatchObject({ relevanceThreshold: 0.4, relevanceThresholdSource: "embedder" });
    expect(resolveConfig({ gating: { relevanceThreshold: 0 } }, { id: "e", relevanceThreshold: 0.4 }).gating).toMatchObject({ relevanceThreshold: 0, relevanceThresholdSource: "config" });
    // Uncalibrated: the hashing embedder at a dimension other than 512, or no embedder at all.
    expect(resolveConfig({}, new HashingEmbedder({ dim: 256 })).gating).toMatchObject({ relevanceThreshold: 0.25, relevanceThresholdSource: "default" });
    expect(resolveConfig().gating).toMatchObject({ relevanceThreshold: 0.25, relevanceThresholdSource: "default" });
    expect(() => resolveConfig({}, { id: "e", relevanceThreshold: NaN })).toThrow("embedder e's relevanceThreshold must be a finite number, got NaN");
  });

  test("OnnxEmbedder: no τ unless the caller passes one, which the config then follows", async () => {
    await expect(OnnxEmbedder.load(tempDir(), { relevanceThreshold: 1.5 })).rejects.toThrow("OnnxEmbedder.load: relevanceThreshold must be a number in [0, 1], got 1.5");
    const dir = writeTinyBertFolder(join(tempDir("dki-onnx-"), "bert"), 3);
    const plain = await OnnxEmbedder.load(dir, { threads: 1 });
    const calibrated = await OnnxEmbedder.load(dir, { threads: 1, relevanceThreshold: 0.42 });
    try {
      expect(plain.relevanceThreshold).toBeUndefined();
      expect(resolveConfig({}, calibrated).gating).toMatchObject({ relevanceThreshold: 0.42, relevanceThresholdSource: "embedder" });
    } finally {
      await plain.close();
      await calibrated.close();
    }
  });
});
