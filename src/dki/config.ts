// The DKI system's settings: every constant of gating, injection, prompt building and routing,
// with defaults, checked once when a system opens so a bad value fails there, named, and not
// halfway through a turn.
import { DkiArgumentError } from "../errors.js";
import type { PositionStrategy } from "../engine/model.js";
import type { Embedder } from "../memory/types.js";
import { resolveRecallConfig, unknownKeys, type RecallConfig, type RecallConfigInput } from "../recall/config.js";

/** What each memory block is encoded behind (part of its cache key). */
export type EncodingPrefix = "none" | "bos" | "bos+system";

/** Order of the memory blocks after the preference block: "score" (most relevant first) or "time" (oldest first). */
/**
 * The order of the memory blocks before the prompt: "score" most relevant first (farthest from the
 * prompt), "score-last" most relevant last (right before the prompt), "time" oldest first.
 */
export type MemoryOrder = "score" | "score-last" | "time";

/**
 * How the memories routed to a turn become K/V: "separate" (default), each its own block, computed
 * once and reused in any combination; "joint", all of them one block encoded together (the memories'
 * tokens in injection order behind the same prefix, at the same positions), so each memory sees
 * the ones before it. A joint block is reused only for the same memories in the same order: it is
 * the research control that measures what encoding memories apart costs.
 */
export type MemoryEncoding = "separate" | "joint";

export type HistoryLanguageSetting = "auto" | "cn" | "en";

/**
 * A training-free fix for memories encoded each as its own block (none of them saw the blocks
 * before it, unlike one joint encoding of [prefix, memory 1, …, memory k]):
 * - "none": the blocks as encoded (default);
 * - "epic" (EPIC): the first `recomputeTokens` tokens of every block after the first are computed
 *   again behind the prefix and all earlier blocks' tokens (cached in the tiered cache under what
 *   they depend on); the rest of each block stays as cached. k ≥ a block's length: its joint encoding;
 * - "cacheblend" (CacheBlend): the share `ratio` (default 0.15) of memory tokens whose layer-1 K/V
 *   deviate most from a joint encoding is recomputed at every later layer (Model.blendBlocks; not
 *   cached: it depends on every block of the turn). 1: the joint encoding. CPU only;
 * - "ape" (APE): the memory blocks' attention scores become score/temperature + ln(scale·α)
 *   (logit scaling: the memory blocks' α is then applied as ln α too, and the engine's
 *   alphaThreshold cut-off reads scale·α). CPU only.
 * EPIC and CacheBlend treat every injected block (the preference block first) as the sequence.
 */
export type BlockFix =
  | { kind: "none" }
  | { kind: "epic"; recomputeTokens: number }
  | { kind: "cacheblend"; ratio: number }
  | { kind: "ape"; temperature: number; scale: number };

/** CacheBlend's share of recomputed tokens when config.blockFix leaves it out (the paper's). */
export const CACHEBLEND_DEFAULT_RATIO = 0.15;

/**
 * Which score of a search result gating reads as relevance. "dense" (default): the cosine
 * similarity of query and memory, an absolute measure. "fused": the store's fused score, which
 * under its default RRF fusion is rank-based (the top hit scores about 1 whatever the query), so
 * it orders memories well but cannot say whether any is relevant; use it with weighted fusion.
 * "rerank": the score in [0, 1] of the routing reranker (memoryRerank), which reads query and memory
 * together; it needs memoryRerank and a relevanceThreshold of its own (the embedder's calibrated τ
 * is for cosines).
 */
export type RelevanceSignal = "dense" | "fused" | "rerank";

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
  memoryEncoding: MemoryEncoding;
  positions: PositionStrategy;
  encodingPrefix: EncodingPrefix;
  /** How the memory blocks' α acts: "value" (V ← α·V, default) or "logit" (ln α added to their scores). */
  alphaScaling: "value" | "logit";
  blockFix: BlockFix;
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
  memoryEncoding: "separate",
  positions: "negative",
  encodingPrefix: "bos",
  alphaScaling: "value",
  blockFix: Object.freeze({ kind: "none" }),
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

/** A block fix as a caller gives it: CacheBlend's ratio may be left out. */
export type BlockFixInput = Exclude<BlockFix, { kind: "cacheblend" }> | { kind: "cacheblend"; ratio?: number };

/** A caller's partial settings: any field may be left out, gating's too. */
export type DKIConfigInput = Partial<Omit<DKIConfig, "gating" | "blockFix" | "recall">> & {
  gating?: Partial<Omit<GatingConfig, "relevanceThresholdSource">>;
  blockFix?: BlockFixInput;
  recall?: RecallConfigInput;
};

/**
 * Defaults filled in and every value checked; throws a DkiArgumentError naming the first bad one.
 * Gating's τ, when `input` leaves it out, is `embedder`'s calibrated relevanceThreshold if it has
 * one (the embedder whose cosines gating reads), else DEFAULT_GATING's.
 */
export function resolveConfig(input: DKIConfigInput = {}, embedder?: Pick<Embedder, "id" | "relevanceThreshold">): DKIConfig {
  if (input === null || typeof input !== "object") throw new DkiArgumentError(`config must be an object, got ${String(input)}`);
  // A misspelt key would otherwise be ignored without a word (a config file's typo).
  unknownKeys("", input, { ...DEFAULT_CONFIG, gating: null, recall: null, systemPrompt: null });
  if (input.gating !== undefined) {
    if (input.gating === null || typeof input.gating !== "object" || Array.isArray(input.gating)) throw new DkiArgumentError(`config.gating must be an object, got ${shown(input.gating)}`);
    unknownKeys("gating", input.gating, DEFAULT_GATING);
  }
  const c: DKIConfig = {
    ...DEFAULT_CONFIG,
    ...input,
    gating: { ...DEFAULT_GATING, ...(input.gating ?? {}), ...relevanceThreshold(input, embedder) },
    blockFix: resolveBlockFix(input.blockFix),
    recall: resolveRecallConfig(input.recall ?? {}),
  };
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
  choice("gating.relevanceSignal", g.relevanceSignal, ["dense", "fused", "rerank"]);
  if (g.relevanceSignal === "rerank" && g.relevanceThresholdSource !== "config") {
    throw new DkiArgumentError("config.gating.relevanceSignal \"rerank\" needs config.gating.relevanceThreshold: the reranker's scores are not the embedder's cosines its calibrated τ is for");
  }
  for (const k of ["relevanceThreshold", "minMargin", "entropyWeight", "relevanceWeight", "marginWeight"] as const) finite(`gating.${k}`, g[k]);
  unit("gating.alphaMin", g.alphaMin);
  unit("gating.alphaMax", g.alphaMax);
  if (g.alphaMin > g.alphaMax) throw new DkiArgumentError(`config.gating.alphaMin (${g.alphaMin}) is above config.gating.alphaMax (${g.alphaMax})`);
  finite("gating.alphaThreshold", g.alphaThreshold);
  if (g.alphaThreshold < 0) throw new DkiArgumentError(`config.gating.alphaThreshold must be >= 0, got ${g.alphaThreshold}`);
  if (typeof g.entropyProbe !== "boolean") throw new DkiArgumentError(`config.gating.entropyProbe must be true or false, got ${shown(g.entropyProbe)}`);
  count("maxMemories", c.maxMemories);
  count("memoryMaxTokens", c.memoryMaxTokens);
  choice("memoryOrder", c.memoryOrder, ["score", "score-last", "time"]);
  choice("memoryEncoding", c.memoryEncoding, ["separate", "joint"]);
  choice("positions", c.positions, ["negative", "prefix"]);
  choice("encodingPrefix", c.encodingPrefix, ["none", "bos", "bos+system"]);
  choice("alphaScaling", c.alphaScaling, ["value", "logit"]);
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

/** The block fix with CacheBlend's default ratio filled in; a DkiArgumentError names a bad kind, field or value. */
function resolveBlockFix(input: BlockFixInput | undefined): BlockFix {
  if (input === undefined) return DEFAULT_CONFIG.blockFix;
  const where = "config.blockFix";
  if (input === null || typeof input !== "object") throw new DkiArgumentError(`${where} must be an object such as { kind: "epic", recomputeTokens: 16 }, got ${shown(input)}`);
  const fields: Record<BlockFix["kind"], string[]> = { none: [], epic: ["recomputeTokens"], cacheblend: ["ratio"], ape: ["temperature", "scale"] };
  const kind = input.kind;
  if (!Object.hasOwn(fields, kind)) throw new DkiArgumentError(`${where}.kind must be one of "none", "epic", "cacheblend", "ape", got ${shown(kind)}`);
  for (const key of Object.keys(input))
    if (key !== "kind" && !fields[kind].includes(key)) throw new DkiArgumentError(`${where}.${key} is not an option of kind ${JSON.stringify(kind)} (it takes ${fields[kind].join(", ") || "none"})`);
  const positive = (name: string, v: unknown): number => {
    if (typeof v !== "number" || !Number.isFinite(Math.fround(v)) || !(Math.fround(v) > 0)) throw new DkiArgumentError(`${where}.${name} must be a finite number > 0, got ${shown(v)}`);
    return v;
  };
  switch (input.kind) {
    case "none":
      return { kind: "none" };
    case "epic": {
      const k = input.recomputeTokens;
      if (!Number.isSafeInteger(k) || k < 0) throw new DkiArgumentError(`${where}.recomputeTokens must be an integer >= 0, got ${shown(k)}`);
      return { kind: "epic", recomputeTokens: k };
    }
    case "cacheblend": {
      const r = input.ratio ?? CACHEBLEND_DEFAULT_RATIO;
      if (typeof r !== "number" || !(r >= 0 && r <= 1)) throw new DkiArgumentError(`${where}.ratio must be a number in [0, 1], got ${shown(r)}`);
      return { kind: "cacheblend", ratio: r };
    }
    case "ape":
      return { kind: "ape", temperature: positive("temperature", input.temperature), scale: positive("scale", input.scale) };
  }
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
