// The attention budget analyser (seed 003 §8 step 1.5) and the per-stage latency of a turn.
//
// RAG puts the n_m memory tokens into the prompt: it pays n_m + n_u tokens of the context window
// and (n_m + n_u)² attention scores in the prefill. DKI injects them as K/V: the window holds
// only the n_u prompt tokens, and each of them attends to n_m + n_u keys, n_u·(n_m + n_u) scores.
import { performance } from "node:perf_hooks";

export interface BudgetFigures {
  /** Context-window tokens used. */
  tokens: number;
  /** Attention scores computed by the prefill. */
  attention: number;
}

export interface BudgetAnalysis {
  /** n_u: the prompt's own tokens (system prompt, history, query, template). */
  userTokens: number;
  /** n_m: injected memory tokens (preferences and memories). */
  memoryTokens: number;
  rag: BudgetFigures;
  dki: BudgetFigures;
  /** Context-window tokens DKI saves (= n_m). */
  tokensSaved: number;
  /** dki.attention / rag.attention = n_u / (n_m + n_u) (1 when both are 0). */
  attentionRatio: number;
}

export function analyzeBudget(userTokens: number, memoryTokens: number): BudgetAnalysis {
  for (const [name, v] of [["userTokens", userTokens], ["memoryTokens", memoryTokens]] as const) {
    if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`${name} must be a non-negative integer, got ${v}`);
  }
  const total = userTokens + memoryTokens;
  const rag = { tokens: total, attention: total * total };
  const dki = { tokens: userTokens, attention: userTokens * total };
  return { userTokens, memoryTokens, rag, dki, tokensSaved: memoryTokens, attentionRatio: rag.attention === 0 ? 1 : dki.attention / rag.attention };
}

/** Milliseconds per stage of one turn. */
export interface LatencyBreakdown {
  /** Waiting behind other turns: the same session's earlier turns, then the model's queue. */
  queueMs: number;
  /** Memory search (the router). */
  routingMs: number;
  /** Preferences and history read from the store, history formatted, prompt rendered and tokenised. */
  promptMs: number;
  /** The gating decision, the entropy probe included. */
  gatingMs: number;
  /** Of gatingMs: the entropy probe's prefill of the bare query (0 when it was not needed). */
  entropyProbeMs: number;
  /** K/V blocks restored, by the tier that served them (summed over blocks). */
  kvLoadMs: { L1: number; L2: number; L3: number };
  /** K/V blocks computed now (L4). */
  kvComputeMs: number;
  prefillMs: number;
  decodeMs: number;
  /** From the chat() call to the first streamed token (to the first sampled one when nothing was streamed). */
  ttftMs: number;
  /** Writing the turn (user row, assistant row, audit row). */
  recordMs: number;
  totalMs: number;
}

export function emptyLatency(): LatencyBreakdown {
  return { queueMs: 0, routingMs: 0, promptMs: 0, gatingMs: 0, entropyProbeMs: 0, kvLoadMs: { L1: 0, L2: 0, L3: 0 }, kvComputeMs: 0, prefillMs: 0, decodeMs: 0, ttftMs: 0, recordMs: 0, totalMs: 0 };
}

/** Adds each stage of `l` to `into`'s. */
export function addLatency(into: LatencyBreakdown, l: LatencyBreakdown): void {
  for (const key of Object.keys(into) as (keyof LatencyBreakdown)[]) {
    if (key === "kvLoadMs") for (const t of ["L1", "L2", "L3"] as const) into.kvLoadMs[t] += l.kvLoadMs[t];
    else into[key] += l[key];
  }
}

/** Each stage's mean over `turns` turns whose stages add up to `sum` (all 0 for no turn). */
export function meanLatency(sum: LatencyBreakdown, turns: number): LatencyBreakdown {
  const mean = emptyLatency();
  if (turns === 0) return mean;
  for (const key of Object.keys(mean) as (keyof LatencyBreakdown)[]) {
    if (key === "kvLoadMs") for (const t of ["L1", "L2", "L3"] as const) mean.kvLoadMs[t] = sum.kvLoadMs[t] / turns;
    else mean[key] = sum[key] / turns;
  }
  return mean;
}

/** Each block's load time to its stage: kvComputeMs when computed now (L4), else kvLoadMs of the tier that served it. */
export function addBlockLoads(lat: LatencyBreakdown, blocks: readonly { tier: "L1" | "L2" | "L3" | "L4"; loadMs: number }[]): void {
  for (const b of blocks) {
    if (b.tier === "L4") lat.kvComputeMs += b.loadMs;
    else lat.kvLoadMs[b.tier] += b.loadMs;
  }
}

/** Times `fn`, adding its duration to the stage through `add`. */
export async function timed<T>(add: (ms: number) => void, fn: () => Promise<T>): Promise<T> {
  const t0 = performance.now();
  try {
    return await fn();
  } finally {
    add(performance.now() - t0);
  }
}

/**
 * The layer's own cost of a turn: everything but the engine's prefill and decode, the K/V
 * computes, the queue and the entropy probe (a prefill of its own) — routing, gating logic, cache
 * lookups, prompt assembly and the turn's record.
 */
export function layerCostMs(l: LatencyBreakdown): number {
  return l.totalMs - l.prefillMs - l.decodeMs - l.kvComputeMs - l.queueMs - l.entropyProbeMs;
}
