// Combining the retrieval signals of each candidate into one score in [0, 1].
//   rrf       reciprocal rank fusion: Σ w / (k + rank) over the signals that found the candidate,
//             divided by its largest possible value (rank 1 everywhere). Robust to the signals'
//             scales, which differ wildly (cosine vs. BM25).
//   weighted  Σ w · signal / Σ w over the signals normalised to [0, 1].
// A weight of 0 switches a signal off: { dense: 1, bm25: 0 } is dense-only retrieval.

export interface FusionWeights {
  dense: number;
  bm25: number;
  recency: number;
}

export type Fusion = { method: "rrf"; k?: number; weights?: Partial<FusionWeights> } | { method: "weighted"; weights?: Partial<FusionWeights> };

export const DEFAULT_WEIGHTS: FusionWeights = { dense: 1, bm25: 1, recency: 0 };
export const DEFAULT_FUSION: Fusion = { method: "rrf", k: 60 };

/** A candidate's signals, each in [0, 1], 0 meaning the signal did not find it. */
export interface Signals {
  dense: number;
  bm25: number;
  recency: number;
}

const SIGNALS = ["dense", "bm25", "recency"] as const;

/** The weights a fusion uses, checked: finite, non-negative, not all zero. */
export function fusionWeights(fusion: Fusion): FusionWeights {
  const w = { ...DEFAULT_WEIGHTS, ...fusion.weights };
  for (const s of SIGNALS) if (!Number.isFinite(w[s]) || w[s] < 0) throw new RangeError(`fusion weight ${s} must be a finite number >= 0, got ${w[s]}`);
  if (w.dense + w.bm25 + w.recency === 0) throw new RangeError("fusion weights are all 0: at least one signal must count");
  if (fusion.method === "rrf" && fusion.k !== undefined && !(Number.isFinite(fusion.k) && fusion.k >= 0)) throw new RangeError(`fusion k must be a finite number >= 0, got ${fusion.k}`);
  return w;
}

/** The fused score of every candidate, in the order given. */
export function fuse(candidates: readonly Signals[], fusion: Fusion): number[] {
  const w = fusionWeights(fusion);
  if (fusion.method === "weighted") {
    const total = w.dense + w.bm25 + w.recency;
    return candidates.map((c) => (w.dense * c.dense + w.bm25 * c.bm25 + w.recency * c.recency) / total);
  }
  const k = fusion.k ?? 60;
  const ranks = SIGNALS.map((s) => rankBy(candidates, s));
  const best = SIGNALS.reduce((sum, s) => sum + w[s] / (k + 1), 0);
  return candidates.map((c, i) => SIGNALS.reduce((sum, s, j) => (c[s] > 0 ? sum + w[s] / (k + ranks[j][i]) : sum), 0) / best);
}

/** 1-based rank of each candidate by one signal, highest first; ties share the better rank. */
function rankBy(candidates: readonly Signals[], s: keyof Signals): number[] {
  const order = candidates.map((_, i) => i).sort((a, b) => candidates[b][s] - candidates[a][s]);
  const rank = new Array<number>(candidates.length);
  order.forEach((idx, pos) => {
    const prev = order[pos - 1];
    rank[idx] = pos > 0 && candidates[prev][s] === candidates[idx][s] ? rank[prev] : pos + 1;
  });
  return rank;
}

/** Exponential decay by age: 1 now, 0.5 after one half-life. */
export function recency(at: number, now: number, halfLifeMs: number): number {
  return Math.pow(0.5, Math.max(0, now - at) / halfLifeMs);
}
