// The DKI system's settings: every constant of gating, injection, prompt building and routing,
// with defaults, checked once when a system opens so a bad value fails there, named, and not
// halfway through a turn.
import { DkiArgumentError } from "../errors.js";
import type { PositionStrategy } from "../engine/model.js";
import type { Embedder } from "../memory/types.js";
import { resolveRecallConfig, type RecallConfig, type RecallConfigInput } from "../recall/config.js";

/** What each memory block is encoded behind (part of its cache key). */
export type EncodingPrefix = "none" | "bos" | "bos+system";

/** Order of the memory blocks after the preference block: "score" (most relevant first) or "time" (oldest first). */
export type MemoryOrder = "score" | "time";

export type HistoryLanguageSetting = "auto" | "cn" | "en";

/**
 * Which score of a search result gating reads as relevance. "dense" (default): the cosine
 * similarity of query and memory, an absolute measure. "fused": the store's fused score, which
 * under its default RRF fusion is rank-based (the top hit scores about 1 whatever the query), so
 * it orders memories well but cannot say whether any is relevant; use it with weighted fusion.
 */
export type RelevanceSignal = "dense" | "fused";

/**
 * Where gating's τ came from: "config" (the caller set gating.relevanceThreshold), "embedder" (the
 * embedder's calibrated Embedder.relevanceThreshold) or "default" (neither: the fallback 0.25).
 */
export type RelevanceThresholdSource = "config" | "embedder" | "default";

export interface GatingConfig {
  relevanceSignal: RelevanceSignal;
  /**
   * τ: the relevance a memory needs to be injected at all (the top one's decides whether any is).
   * Left out, it is the embedder's calibrated value (Embedder.relevanceThreshold; the hashing
   * embedder's is HASHING_RELEVANCE_THRESHOLD), else 0.25. A value given here always wins, 0 included.
   */
  relevanceThreshold: number;
  /** Where relevanceThreshold came from; set by resolveConfig, not by the caller. */
  relevanceThresholdSource: RelevanceThresholdSource;
  /** The top-1/top-2 margin needed besides (0: none). */
  minMargin: number;
  /** w_H: weight of the normalised entropy (Ĥ − ½). */
  entropyWeight: number;
  /** w_r: weight of (s₁ − τ). */
  relevanceWeight: number;
  /** w_m: weight of the margin (s₁ − s₂). */
  marginWeight: number;
  alphaMin: number;
  alphaMax: number;
  /**
   * Blocks with α below this are not injected (the engine's cut-off; the output is then the plain
   * model's); those with α ≥ it are, α = 0 included when it is 0.
   */
  alphaThreshold: number;
  /**
   * Measure Ĥ (a prefill of the bare query, n_u tokens) when relevance lets memories in (default
   * true). false: Ĥ is taken as ½ (neutral) and α follows relevance alone, saving that prefill,
   * which costs about as much as the prompt's own when the prompt is little more than the query.
   */
  entropyProbe: boolean;
}

export interface DKIConfig {
  gating: GatingConfig;
  /** Memories routed to a turn at most (the search's limit). */
  maxMemories: number;
  /** Memory tokens injected per turn at most; memories past it are left out, in routing order. */
  memoryMaxTokens: number;
  memoryOrder: MemoryOrder;
  positions: PositionStrategy;
  encodingPrefix: EncodingPrefix;
  preferenceEnabled: boolean;
  preferenceAlpha: number;
  /** Preference lines kept, in priority order, while their tokens fit in this. */
  preferenceMaxTokens: number;
  historyEnabled: boolean;
  historyMaxTokens: number;
  historyMaxMessages: number;
  historyLanguage: HistoryLanguageSetting;
  /** Tokens kept free for the answer: the history is dropped when the prompt would leave fewer. */
  generationReserve: number;
  /** "auto": the model's chat template when its tokenizer has one; "never": the plain `User: …` form. */
  chatTemplate: "auto" | "never";
  /** Default system prompt (a turn's own systemPrompt replaces it). */
  systemPrompt?: string;
  /** Recall v4 (seed 003 §5; src/recall/): when enabled, it replaces the flat history. */
  recall: RecallConfig;
}

export const DEFAULT_GATING: Readonly<GatingConfig> = Object.freeze({
  relevanceSignal: "dense",
  // The fallback for an embedder that has no calibrated τ (see GatingConfig.relevanceThreshold).
  relevanceThreshold: 0.25,
  relevanceThresholdSource: "default",
  minMargin: 0,
  entropyWeight: 2,
  relevanceWeight: 6,
  marginWeight: 2,
  alphaMin: 0,
  alphaMax: 1,
  alphaThreshold: 0.1,
  entropyProbe: true,
});

export const DEFAULT_CONFIG: Readonly<Omit<DKIConfig, "gating" | "recall">> = Object.freeze({
  maxMemories: 3,
  memoryMaxTokens: 1024,
  memoryOrder: "score",
  positions: "negative",
  encodingPrefix: "bos",
  preferenceEnabled: true,
  preferenceAlpha: 0.4,
  preferenceMaxTokens: 100,
  historyEnabled: true,
  historyMaxTokens: 500,
  historyMaxMessages: 10,
  historyLanguage: "auto",
  generationReserve: 512,
  chatTemplate: "auto",
});

/** A caller's partial settings: any field may be left out, gating's too. */
export type DKIConfigInput = Partial<Omit<DKIConfig, "gating" | "recall">> & { gating?: Partial<Omit<GatingConfig, "relevanceThresholdSource">>; recall?: RecallConfigInput };

/**
 * Defaults filled in and every value checked; throws a DkiArgumentError naming the first bad one.
 * Gating's τ, when `input` leaves it out, is `embedder`'s calibrated relevanceThreshold if it has
 * one (the embedder whose cosines gating reads), else DEFAULT_GATING's.
 */
export function resolveConfig(input: DKIConfigInput = {}, embedder?: Pick<Embedder, "id" | "relevanceThreshold">): DKIConfig {
  if (input === null || typeof input !== "object") throw new DkiArgumentError(`config must be an object, got ${String(input)}`);
  const c: DKIConfig = { ...DEFAULT_CONFIG, ...input, gating: { ...DEFAULT_GATING, ...(input.gating ?? {}), ...relevanceThreshold(input, embedder) }, recall: resolveRecallConfig(input.recall ?? {}) };
  const g = c.gating;
  const finite = (name: string, v: unknown) => {
    if (typeof v !== "number" || !Number.isFinite(v)) throw new DkiArgumentError(`config.${name} must be a finite number, got ${shown(v)}`);
  };
  const unit = (name: string, v: unknown) => {
    finite(name, v);
    if ((v as number) < 0 || (v as number) > 1) throw new DkiArgumentError(`config.${name} must be in [0, 1], got ${shown(v)}`);
  };
  const count = (name: string, v: unknown, min = 0) => {
    if (!Number.isSafeInteger(v) || (v as number) < min) throw new DkiArgumentError(`config.${name} must be an integer >= ${min}, got ${shown(v)}`);
  };
  const choice = (name: string, v: unknown, choices: readonly string[]) => {
    if (!choices.includes(v as string)) throw new DkiArgumentError(`config.${name} must be one of ${choices.map((x) => JSON.stringify(x)).join(", ")}, got ${shown(v)}`);
  };
  choice("gating.relevanceSignal", g.relevanceSignal, ["dense", "fused"]);
  for (const k of ["relevanceThreshold", "minMargin", "entropyWeight", "relevanceWeight", "marginWeight"] as const) finite(`gating.${k}`, g[k]);
  unit("gating.alphaMin", g.alphaMin);
  unit("gating.alphaMax", g.alphaMax);
  if (g.alphaMin > g.alphaMax) throw new DkiArgumentError(`config.gating.alphaMin (${g.alphaMin}) is above config.gating.alphaMax (${g.alphaMax})`);
  finite("gating.alphaThreshold", g.alphaThreshold);
  if (g.alphaThreshold < 0) throw new DkiArgumentError(`config.gating.alphaThreshold must be >= 0, got ${g.alphaThreshold}`);
  if (typeof g.entropyProbe !== "boolean") throw new DkiArgumentError(`config.gating.entropyProbe must be true or false, got ${shown(g.entropyProbe)}`);
  count("maxMemories", c.maxMemories);
  count("memoryMaxTokens", c.memoryMaxTokens);
  choice("memoryOrder", c.memoryOrder, ["score", "time"]);
  choice("positions", c.positions, ["negative", "prefix"]);
  choice("encodingPrefix", c.encodingPrefix, ["none", "bos", "bos+system"]);
  if (typeof c.preferenceEnabled !== "boolean") throw new DkiArgumentError(`config.preferenceEnabled must be true or false, got ${shown(c.preferenceEnabled)}`);
  finite("preferenceAlpha", c.preferenceAlpha);
  if (c.preferenceAlpha < 0) throw new DkiArgumentError(`config.preferenceAlpha must be >= 0, got ${c.preferenceAlpha}`);
  count("preferenceMaxTokens", c.preferenceMaxTokens);
  if (typeof c.historyEnabled !== "boolean") throw new DkiArgumentError(`config.historyEnabled must be true or false, got ${shown(c.historyEnabled)}`);
  count("historyMaxTokens", c.historyMaxTokens);
  count("historyMaxMessages", c.historyMaxMessages);
  choice("historyLanguage", c.historyLanguage, ["auto", "cn", "en"]);
  count("generationReserve", c.generationReserve);
  choice("chatTemplate", c.chatTemplate, ["auto", "never"]);
  if (c.systemPrompt !== undefined && typeof c.systemPrompt !== "string") throw new DkiArgumentError(`config.systemPrompt must be a string, got ${shown(c.systemPrompt)}`);
  return c;
}

/** τ and its source: the caller's (even 0), else the embedder's calibrated one, else the fallback. */
function relevanceThreshold(input: DKIConfigInput, embedder?: Pick<Embedder, "id" | "relevanceThreshold">): Pick<GatingConfig, "relevanceThreshold" | "relevanceThresholdSource"> {
  const given = input.gating?.relevanceThreshold;
  if (given !== undefined) return { relevanceThreshold: given, relevanceThresholdSource: "config" };
  if (embedder?.relevanceThreshold === undefined) return { relevanceThreshold: DEFAULT_GATING.relevanceThreshold, relevanceThresholdSource: "default" };
  const own: unknown = embedder.relevanceThreshold;
  if (typeof own !== "number" || !Number.isFinite(own)) throw new DkiArgumentError(`embedder ${embedder.id}'s relevanceThreshold must be a finite number, got ${shown(own)}`);
  return { relevanceThreshold: own, relevanceThresholdSource: "embedder" };
}

function shown(v: unknown): string {
  return typeof v === "string" ? JSON.stringify(v) : String(v);
}
