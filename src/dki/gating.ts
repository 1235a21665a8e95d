// Dual-factor gating: relevance decides *whether* memories are injected, the model's uncertainty
// on the user's query decides *how strongly*.
//
//   inject ⇔ s₁ ≥ τ and s₁ − s₂ ≥ minMargin
//   α = clamp(σ(w_H·(Ĥ − ½) + w_r·(s₁ − τ) + w_m·(s₁ − s₂)), α_min, α_max)
//
// s₁, s₂ are the top two relevance scores of the routed memories (s₂ = 0 with one result): by
// default their dense (cosine) signal, see RelevanceSignal in config.ts for why; Ĥ is the
// next-token entropy of the bare query divided by its maximum ln V, so Ĥ ∈ [0, 1] and Ĥ = ½ is
// neutral. (The reference system fed the fully templated prompt and normalised with σ(H/10), which
// is never below ½ and so always pushed α up.) The entropy is only measured when relevance has
// already said yes and α is not forced: it costs a prefill of the query's n_u tokens.
import { DkiArgumentError } from "../errors.js";
import type { GatingConfig } from "./config.js";

export interface GatingDecision {
  /**
   * Whether the memories are injected: the engine's rule, α ≥ alphaThreshold (false also when α
   * fell below it). α = 0 is injected when the threshold is 0: with value scaling the memory's
   * columns keep their softmax share with zero values, so the output is not the plain model's.
   */
  inject: boolean;
  /** α of the memories (0 when nothing is injected; may also be 0 when injected at threshold 0). */
  alpha: number;
  /** s₁: the top fused score (0 when nothing was routed). */
  relevance: number;
  /** s₁ − s₂. */
  margin: number;
  /** Ĥ, the normalised next-token entropy of the query; null when it was not needed. */
  entropy: number | null;
  /** Why, in words. */
  reason: string;
  /** α came from forceAlpha. */
  forced: boolean;
}

export interface GatingInput {
  /** Relevance of the routed memories, highest first. */
  scores: readonly number[];
  forceAlpha?: number;
  /** false: no K/V at all this turn. */
  allowInjection?: boolean;
}

const sigmoid = (x: number) => 1 / (1 + Math.exp(-x));
const f2 = (x: number) => x.toFixed(2);
// Relevance and τ to three places: a calibrated τ has three (0.162), and two would print a score
// just below it as equal to it.
const f3 = (x: number) => x.toFixed(3);

/** The α formula alone (no threshold, no relevance cut-off). */
export function gateAlpha(cfg: GatingConfig, s: { relevance: number; margin: number; entropy: number }): number {
  const z = cfg.entropyWeight * (s.entropy - 0.5) + cfg.relevanceWeight * (s.relevance - cfg.relevanceThreshold) + cfg.marginWeight * s.margin;
  return Math.min(cfg.alphaMax, Math.max(cfg.alphaMin, sigmoid(z)));
}

/** Checks a forceAlpha given by a caller: a finite number in [0, 1]. */
export function checkForceAlpha(v: unknown): asserts v is number | undefined {
  if (v === undefined) return;
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0 || v > 1) throw new DkiArgumentError(`forceAlpha must be a number in [0, 1], got ${typeof v === "string" ? JSON.stringify(v) : String(v)}`);
}

/**
 * The decision for one turn. `probeEntropy` returns Ĥ for the query; it is called at most once,
 * and only when relevance lets the memories in and α is not forced.
 */
export async function decideGating(cfg: GatingConfig, input: GatingInput, probeEntropy: () => Promise<number>): Promise<GatingDecision> {
  checkForceAlpha(input.forceAlpha);
  const s1 = input.scores[0] ?? 0;
  const s2 = input.scores[1] ?? 0;
  const base = { relevance: s1, margin: s1 - s2, entropy: null, forced: false };
  const no = (reason: string, extra: Partial<GatingDecision> = {}): GatingDecision => ({ ...base, inject: false, alpha: 0, reason, ...extra });
  if (input.allowInjection === false) return no("injection is off for this turn (allowInjection: false)");
  const n = input.scores.length;
  const routed = `${n} routed memor${n === 1 ? "y" : "ies"}`;
  if (input.forceAlpha !== undefined) {
    const a = input.forceAlpha;
    if (n === 0) return no(`α forced to ${f2(a)}, but no memory of this user matched the query`, { forced: true });
    if (a < cfg.alphaThreshold) return no(`α forced to ${f2(a)}, below the injection threshold ${f2(cfg.alphaThreshold)}: nothing injected`, { forced: true });
    return { ...base, inject: true, alpha: a, forced: true, reason: `α forced to ${f2(a)} for ${routed} (top relevance ${f3(s1)})` };
  }
  if (n === 0) return no("no memory of this user matched the query");
  if (s1 < cfg.relevanceThreshold) return no(`top relevance ${f3(s1)} is below the threshold ${f3(cfg.relevanceThreshold)}: no memory injected`);
  if (s1 - s2 < cfg.minMargin) return no(`top relevance ${f3(s1)} clears the threshold but its margin ${f2(s1 - s2)} over the next is below ${f2(cfg.minMargin)}: ambiguous, no memory injected`);
  const probed = cfg.entropyProbe ? await probeEntropy() : null;
  if (probed !== null && !Number.isFinite(probed)) return no(`the model's entropy on the query is not a number (${probed}): no memory injected`);
  const h = probed ?? 0.5;
  const alpha = gateAlpha(cfg, { relevance: s1, margin: s1 - s2, entropy: h });
  const uncertainty = probed === null ? "entropy probe off (Ĥ taken as 0.50)" : `model entropy ${f2(h)} of its maximum`;
  const why = `top relevance ${f3(s1)} ≥ ${f3(cfg.relevanceThreshold)} (margin ${f2(s1 - s2)}), ${uncertainty} → α = ${f2(alpha)}`;
  if (alpha < cfg.alphaThreshold) return no(`${why}, below the injection threshold ${f2(cfg.alphaThreshold)}: nothing injected`, { entropy: probed, alpha: 0 });
  return { ...base, entropy: probed, inject: true, alpha, reason: why };
}
