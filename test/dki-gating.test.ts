// Dual-factor gating (the decision alone; the system-level effects are in dki-system.test.ts) and
// the fair queue that turns of many users share a model through.
import { describe, expect, test } from "vitest";
import { decideGating, DEFAULT_GATING, FairQueue, gateAlpha, resolveConfig, type GatingConfig } from "../src/dki/index.js";
import { prng } from "./support/prng.js";

// τ = 0.3 here (the default comes from the embedder, 0.25 without one) so the hand-computed points read easily.
const cfg: GatingConfig = { ...DEFAULT_GATING, relevanceThreshold: 0.3 };
const sigmoid = (x: number) => 1 / (1 + Math.exp(-x));

describe("α = clamp(σ(w_H·(Ĥ − ½) + w_r·(s₁ − τ) + w_m·(s₁ − s₂)), α_min, α_max)", () => {
  test("the formula at hand-computed points", () => {
    // Neutral entropy, s₁ = τ, no margin: σ(0) = ½.
    expect(gateAlpha(cfg, { relevance: cfg.relevanceThreshold, margin: 0, entropy: 0.5 })).toBeCloseTo(0.5, 12);
    const z = 2 * (0.9 - 0.5) + 6 * (0.7 - 0.3) + 2 * 0.25;
    expect(gateAlpha(cfg, { relevance: 0.7, margin: 0.25, entropy: 0.9 })).toBeCloseTo(sigmoid(z), 12);
    expect(gateAlpha({ ...cfg, alphaMax: 0.8 }, { relevance: 1, margin: 1, entropy: 1 })).toBe(0.8);
    expect(gateAlpha({ ...cfg, alphaMin: 0.3 }, { relevance: 0, margin: 0, entropy: 0 })).toBe(0.3);
  });

  test("monotone (non-decreasing) in relevance and in entropy, over random configurations and points", () => {
    const rnd = prng(29);
    for (let i = 0; i < 2000; i++) {
      const c: GatingConfig = { ...cfg, entropyWeight: rnd() * 8, relevanceWeight: rnd() * 8, marginWeight: rnd() * 8, relevanceThreshold: rnd() };
      const p = { relevance: rnd(), margin: rnd() * 0.5, entropy: rnd() };
      const a = gateAlpha(c, p);
      const dr = rnd() * 0.3, dh = rnd() * 0.3;
      expect(gateAlpha(c, { ...p, relevance: p.relevance + dr })).toBeGreaterThanOrEqual(a);
      expect(gateAlpha(c, { ...p, entropy: Math.min(1, p.entropy + dh) })).toBeGreaterThanOrEqual(a);
    }
    // Strictly where nothing clamps: more uncertainty, more memory.
    expect(gateAlpha(cfg, { relevance: 0.5, margin: 0.1, entropy: 0.8 })).toBeGreaterThan(gateAlpha(cfg, { relevance: 0.5, margin: 0.1, entropy: 0.2 }));
    expect(gateAlpha(cfg, { relevance: 0.6, margin: 0.1, entropy: 0.5 })).toBeGreaterThan(gateAlpha(cfg, { relevance: 0.4, margin: 0.1, entropy: 0.5 }));
  });
});

describe("decideGating", () => {
  const probeOf = (h: number) => {
    const calls = { n: 0 };
    return { calls, probe: async () => (calls.n++, h) };
  };

  test("relevance decides whether: below τ nothing is injected and the entropy is not measured", async () => {
    const { calls, probe } = probeOf(0.9);
    const d = await decideGating(cfg, { scores: [0.29, 0.1] }, probe);
    expect(d).toMatchObject({ inject: false, alpha: 0, relevance: 0.29, entropy: null, forced: false });
    expect(d.reason).toBe("top relevance 0.290 is below the threshold 0.300: no memory injected");
    expect(calls.n).toBe(0);
    const empty = await decideGating(cfg, { scores: [] }, probe);
    expect(empty.reason).toBe("no memory of this user matched the query");
    expect(calls.n).toBe(0);
  });

  test("above τ: the entropy is measured once and sets α; the reason gives every factor", async () => {
    const { calls, probe } = probeOf(0.8);
    const d = await decideGating(cfg, { scores: [0.7, 0.4] }, probe);
    const alpha = sigmoid(2 * 0.3 + 6 * 0.4 + 2 * 0.3);
    expect(d.inject).toBe(true);
    expect(d.alpha).toBeCloseTo(alpha, 12);
    expect(d.margin).toBeCloseTo(0.3, 12);
    expect(d.entropy).toBe(0.8);
    expect(d.reason).toBe(`top relevance 0.700 ≥ 0.300 (margin 0.30), model entropy 0.80 of its maximum → α = ${alpha.toFixed(2)}`);
    expect(calls.n).toBe(1);
  });

  test("an α below the injection threshold injects nothing, and says so", async () => {
    const c = { ...cfg, entropyWeight: 20, alphaThreshold: 0.1 };
    const d = await decideGating(c, { scores: [0.31] }, async () => 0);
    expect(d.inject).toBe(false);
    expect(d.alpha).toBe(0);
    expect(d.reason).toMatch(/→ α = 0\.00, below the injection threshold 0\.10: nothing injected$/);
  });

  test("a margin below minMargin is ambiguous: nothing injected", async () => {
    const d = await decideGating({ ...cfg, minMargin: 0.1 }, { scores: [0.8, 0.75] }, async () => 0.5);
    expect(d.inject).toBe(false);
    expect(d.reason).toMatch(/margin 0\.05 over the next is below 0\.10/);
  });

  test("forceAlpha and allowInjection are honoured without a probe", async () => {
    const { calls, probe } = probeOf(0.5);
    expect(await decideGating(cfg, { scores: [0.01], forceAlpha: 0.7 }, probe)).toMatchObject({ inject: true, alpha: 0.7, forced: true, reason: "α forced to 0.70 for 1 routed memory (top relevance 0.010)" });
    expect(await decideGating(cfg, { scores: [0.9], forceAlpha: 0.05 }, probe)).toMatchObject({ inject: false, alpha: 0, forced: true, reason: "α forced to 0.05, below the injection threshold 0.10: nothing injected" });
    expect(await decideGating(cfg, { scores: [], forceAlpha: 1 }, probe)).toMatchObject({ inject: false, reason: "α forced to 1.00, but no memory of this user matched the query" });
    expect(await decideGating(cfg, { scores: [0.99], forceAlpha: 1, allowInjection: false }, probe)).toMatchObject({ inject: false, alpha: 0, reason: "injection is off for this turn (allowInjection: false)" });
    expect(calls.n).toBe(0);
    for (const bad of [-0.1, 1.5, NaN, "0.5"]) {
      await expect(decideGating(cfg, { scores: [0.5], forceAlpha: bad as number }, probe)).rejects.toThrow(/forceAlpha must be a number in \[0, 1\]/);
    }
  });

  test("α = 0 follows the engine's rule: injected when alphaThreshold is 0 (forced or gated), left out at the default threshold", async () => {
    const { calls, probe } = probeOf(0.5);
    expect(await decideGating({ ...cfg, alphaThreshold: 0 }, { scores: [0.9], forceAlpha: 0 }, probe)).toMatchObject({ inject: true, alpha: 0, forced: true, reason: "α forced to 0.00 for 1 routed memory (top relevance 0.900)" });
    expect(await decideGating(cfg, { scores: [0.9], forceAlpha: 0 }, probe)).toMatchObject({ inject: false, alpha: 0, forced: true, reason: "α forced to 0.00, below the injection threshold 0.10: nothing injected" });
    expect(calls.n).toBe(0);
    // Gated: α_max 0 clamps the formula's α to 0, which threshold 0 still injects.
    const gated = await decideGating({ ...cfg, alphaMax: 0, alphaThreshold: 0 }, { scores: [0.9] }, probe);
    expect(gated).toMatchObject({ inject: true, alpha: 0, forced: false, entropy: 0.5 });
    expect((await decideGating({ ...cfg, alphaMax: 0 }, { scores: [0.9] }, probe)).inject).toBe(false);
    // What may not be configured stays refused.
    expect(() => resolveConfig({ gating: { alphaThreshold: -0.1 } })).toThrow("config.gating.alphaThreshold must be >= 0, got -0.1");
    expect(() => resolveConfig({ gating: { alphaThreshold: NaN } })).toThrow("config.gating.alphaThreshold must be a finite number, got NaN");
    expect(() => resolveConfig({ gating: { alphaMin: -0.1 } })).toThrow("config.gating.alphaMin must be in [0, 1], got -0.1");
    expect(() => resolveConfig({ preferenceAlpha: Infinity })).toThrow("config.preferenceAlpha must be a finite number, got Infinity");
    await expect(decideGating({ ...cfg, alphaThreshold: 0 }, { scores: [0.9], forceAlpha: -0.01 }, probe)).rejects.toThrow(/forceAlpha must be a number in \[0, 1\], got -0\.01/);
  });

  test("entropyProbe false: no probe, Ĥ taken as ½, α from relevance alone", async () => {
    const { calls, probe } = probeOf(0.9);
    const d = await decideGating({ ...cfg, entropyProbe: false }, { scores: [0.7, 0.4] }, probe);
    expect(calls.n).toBe(0);
    expect(d).toMatchObject({ inject: true, entropy: null });
    expect(d.alpha).toBeCloseTo(sigmoid(6 * 0.4 + 2 * 0.3), 12);
    expect(d.reason).toBe(`top relevance 0.700 ≥ 0.300 (margin 0.30), entropy probe off (Ĥ taken as 0.50) → α = ${sigmoid(6 * 0.4 + 2 * 0.3).toFixed(2)}`);
    expect(() => resolveConfig({ gating: { entropyProbe: "no" as unknown as boolean } })).toThrow('config.gating.entropyProbe must be true or false, got "no"');
  });

  test("a NaN entropy injects nothing rather than an undefined α", async () => {
    const d = await decideGating(cfg, { scores: [0.9] }, async () => NaN);
    expect(d.inject).toBe(false);
    expect(d.reason).toMatch(/entropy on the query is not a number/);
  });
});

describe("config", () => {
  test("defaults, and every bad value named", () => {
    const c = resolveConfig();
    expect(c.preferenceAlpha).toBe(0.4);
    expect(c.positions).toBe("negative");
    expect(c.memoryOrder).toBe("score");
    expect(c.gating.alphaThreshold).toBe(0.1);
    expect(resolveConfig({ gating: { alphaMax: 0.7 } }).gating).toEqual({ ...DEFAULT_GATING, alphaMax: 0.7 });
    expect(() => resolveConfig({ gating: { alphaMin: 0.8, alphaMax: 0.5 } })).toThrow("config.gating.alphaMin (0.8) is above config.gating.alphaMax (0.5)");
    expect(() => resolveConfig({ gating: { entropyWeight: Infinity } })).toThrow("config.gating.entropyWeight must be a finite number, got Infinity");
    expect(() => resolveConfig({ positions: "middle" as "prefix" })).toThrow(`config.positions must be one of "negative", "prefix", got "middle"`);
    expect(() => resolveConfig({ historyMaxTokens: -1 })).toThrow("config.historyMaxTokens must be an integer >= 0, got -1");
    expect(() => resolveConfig({ encodingPrefix: "system" as "bos" })).toThrow(/config.encodingPrefix must be one of "none", "bos", "bos\+system"/);
    expect(() => resolveConfig({ preferenceAlpha: -0.2 })).toThrow("config.preferenceAlpha must be >= 0, got -0.2");
  });
});

describe("FairQueue", () => {
  const tick = () => new Promise((r) => setTimeout(r, 1));

  test("one at a time, round-robin over keys: a key with many turns waiting delays another's single turn by one", async () => {
    const q = new FairQueue();
    const order: string[] = [];
    let running = 0;
    let most = 0;
    const job = (key: string, i: number) =>
      q.run(key, async () => {
        most = Math.max(most, ++running);
        await tick();
        order.push(`${key}${i}`);
        running--;
      });
    const all = [job("a", 1), job("a", 2), job("a", 3), job("a", 4), job("b", 1), job("c", 1), job("b", 2)];
    expect(q.size).toBe(6);
    await Promise.all(all);
    expect(most).toBe(1);
    // a1 was running; then a, b, c take turns in the order they first queued.
    expect(order).toEqual(["a1", "a2", "b1", "c1", "a3", "b2", "a4"]);
    expect(q.size).toBe(0);
  });

  test("an abort removes only its own waiting turn; the others run in order; an error frees the queue", async () => {
    const q = new FairQueue();
    const order: string[] = [];
    const ctl = new AbortController();
    const first = q.run("a", async () => {
      await tick();
      throw new Error("boom");
    });
    const second = q.run("b", async () => void order.push("b"), ctl.signal);
    const third = q.run("c", async () => void order.push("c"));
    ctl.abort(new Error("user left"));
    await expect(second).rejects.toThrow("user left");
    await expect(first).rejects.toThrow("boom");
    await third;
    expect(order).toEqual(["c"]);
    const pre = new AbortController();
    pre.abort(new Error("already"));
    await expect(q.run("d", async () => 1, pre.signal)).rejects.toThrow("already");
    expect(await q.run("e", async () => 7)).toBe(7);
  });
});
