// Calibrating gating's relevance threshold τ for an embedder. DKI injects a user's memories only
// when s₁, the dense (cosine) relevance of the top routed memory, is at least τ; what cosine a
// relevant memory reaches depends entirely on the embedder (a lexical hashing embedder scores a
// paraphrase far lower than a sentence model does), so τ has to be measured per embedder.
//
// The measurement: memories, queries that one of them answers (relevant) and queries that none of
// them touches (off-topic); each query's s₁ is its best cosine over the memories, clamped at 0 as
// the store's dense signal is (SearchSignals.dense), and τ is the cut that best tells the two
// groups apart by balanced accuracy, ½·(TPR + 1 − FPR). Balanced accuracy and not plain accuracy,
// so the group sizes do not decide the answer; it is Youden's J = TPR − FPR rescaled.
//
// The dense side of the store searches a user's memories with an exact scan (FlatIndex) until the
// user has 1000 of them, so these are the scores the gate sees for the top dense hit. Routing
// fuses dense with BM25 and keeps the top few, so it can pass over the top dense memory, and the
// gate then sees a lower s₁ than measured here: on the test corpus with the hashing embedder that
// happens to a quarter of the queries, all of them below τ already (relevance-calibration.test.ts
// checks that no query changes side), so calibrating on the top dense score loses nothing there.
import { DkiArgumentError } from "../errors.js";
import { FlatIndex } from "./retrieval/flat-index.js";
import type { Embedder } from "./types.js";

/** A score distribution in brief. */
export interface ScoreSummary {
  count: number;
  min: number;
  /** 10th percentile (nearest rank). */
  p10: number;
  median: number;
  mean: number;
  /** 90th percentile (nearest rank). */
  p90: number;
  max: number;
}

/** How a threshold separates the two groups of queries (a query is let in when s₁ ≥ τ). */
export interface ThresholdRates {
  threshold: number;
  /** Relevant queries let in. */
  truePositiveRate: number;
  /** Off-topic queries let in. */
  falsePositiveRate: number;
  /** ½·(TPR + 1 − FPR). */
  balancedAccuracy: number;
}

export interface Calibration extends ThresholdRates {
  /**
   * The scores on either side of τ: the highest left out and the lowest let in (null when all are
   * let in). τ is their midpoint, as far from both as the data allow.
   */
  gap: { below: number | null; above: number };
  relevant: ScoreSummary;
  offTopic: ScoreSummary;
}

/** The labelled set a calibration runs on. */
export interface CalibrationSet {
  memories: readonly string[];
  /** Queries that one of the memories answers: gating should let these in. */
  relevant: readonly string[];
  /** Queries that none of the memories answers: gating should keep these out. */
  offTopic: readonly string[];
}

/**
 * s₁ of each query as the gate sees it: the best cosine similarity to any of the memories,
 * negative taken as 0 (the store's dense signal). Embeds the memories and the queries once.
 */
export async function topDenseScores(embedder: Embedder, memories: readonly string[], queries: readonly string[]): Promise<number[]> {
  if (memories.length === 0) throw new DkiArgumentError("topDenseScores: there are no memories to score the queries against");
  const index = new FlatIndex(embedder.dim);
  (await embedder.embed([...memories])).forEach((v, i) => index.add(String(i), v));
  const vectors = queries.length === 0 ? [] : await embedder.embed([...queries]);
  return vectors.map((q) => Math.max(0, index.search(q, 1)[0]!.similarity));
}

/** The rates of a given threshold on two groups of scores (e.g. held-out queries). */
export function thresholdRates(threshold: number, relevant: readonly number[], offTopic: readonly number[]): ThresholdRates {
  checkScores(relevant, offTopic);
  const tpr = relevant.filter((s) => s >= threshold).length / relevant.length;
  const fpr = offTopic.filter((s) => s >= threshold).length / offTopic.length;
  return { threshold, truePositiveRate: tpr, falsePositiveRate: fpr, balancedAccuracy: (tpr + 1 - fpr) / 2 };
}

/**
 * The τ that maximises balanced accuracy between relevant and off-topic scores. Balanced accuracy
 * only changes where τ crosses a score, so every cut between two neighbouring distinct scores is
 * tried, τ at the cut's midpoint (and, for "let everything in", the lowest score). Among cuts that
 * tie, the widest gap wins (the most room on both sides for scores not seen here), then the lower τ.
 */
export function chooseThreshold(relevant: readonly number[], offTopic: readonly number[]): Calibration {
  checkScores(relevant, offTopic);
  const nR = relevant.length;
  const nO = offTopic.length;
  // Every score with its group, highest first; walking down, a cut below position i lets in the
  // first i + 1 scores.
  const all = [...relevant.map((s) => ({ s, relevant: true })), ...offTopic.map((s) => ({ s, relevant: false }))].sort((a, b) => b.s - a.s);
  let tp = 0;
  let fp = 0;
  // Compared exactly as integers: J·nR·nO = tp·nO − fp·nR, so ties are ties and not rounding.
  let best: { j: number; width: number; below: number | null; above: number } | null = null;
  for (let i = 0; i < all.length; i++) {
    if (all[i]!.relevant) tp++;
    else fp++;
    const next = all[i + 1];
    if (next !== undefined && next.s === all[i]!.s) continue; // not a cut: equal scores go together
    const j = tp * nO - fp * nR;
    const width = next === undefined ? 0 : all[i]!.s - next.s;
    if (best === null || j > best.j || (j === best.j && width >= best.width)) {
      // >= on width: walking down, an equally wide gap found later is the lower τ.
      best = { j, width, below: next?.s ?? null, above: all[i]!.s };
    }
  }
  const { below, above } = best!;
  const threshold = below === null ? above : (below + above) / 2;
  return { ...thresholdRates(threshold, relevant, offTopic), gap: { below, above }, relevant: summarizeScores(relevant), offTopic: summarizeScores(offTopic) };
}

/** τ for `embedder` from a labelled set: the s₁ of every query, then chooseThreshold. */
export async function calibrateRelevance(embedder: Embedder, set: CalibrationSet): Promise<Calibration> {
  const scores = await topDenseScores(embedder, set.memories, [...set.relevant, ...set.offTopic]);
  return chooseThreshold(scores.slice(0, set.relevant.length), scores.slice(set.relevant.length));
}

export function summarizeScores(scores: readonly number[]): ScoreSummary {
  if (scores.length === 0) throw new DkiArgumentError("summarizeScores: no scores");
  const s = [...scores].sort((a, b) => a - b);
  const rank = (p: number) => s[Math.min(s.length - 1, Math.max(0, Math.ceil(p * s.length) - 1))]!;
  return { count: s.length, min: s[0]!, p10: rank(0.1), median: rank(0.5), mean: s.reduce((a, b) => a + b, 0) / s.length, p90: rank(0.9), max: s[s.length - 1]! };
}

function checkScores(relevant: readonly number[], offTopic: readonly number[]): void {
  if (relevant.length === 0 || offTopic.length === 0) throw new DkiArgumentError(`calibration needs scores of both groups, got ${relevant.length} relevant and ${offTopic.length} off-topic`);
  for (const s of [...relevant, ...offTopic]) if (!Number.isFinite(s)) throw new DkiArgumentError(`calibration scores must be finite numbers, got ${s}`);
}
