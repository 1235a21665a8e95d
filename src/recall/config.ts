// Recall v4's settings (seed 003 §5.6). The keys keep the seed's snake_case, nested as there, so a
// config written for the seed reads unchanged; `scope`, `signals.weights` and
// `signals.recency_half_life` are this implementation's additions. Checked once, with errors that
// name the key.
import { PROMPT_FORMATTERS, type PromptFormatterName } from "./formatters.js";
import { DkiArgumentError } from "../errors.js";

export type RecallScope = "session" | "user";

export interface RecallSignalWeights {
  keyword: number;
  bm25: number;
  vector: number;
  recency: number;
}

export interface RecallConfig {
  /** Recall v4 replaces the flat history (off by default here: the seed's default is on). */
  enabled: boolean;
  strategy: "summary_with_fact_call" | "flat_history";
  /** Which messages are searched: the turn's session (the seed) or all the user's sessions. */
  scope: RecallScope;
  signals: {
    keyword_enabled: boolean;
    keyword_topk: number;
    keyword_method: "tfidf";
    vector_enabled: boolean;
    vector_top_k: number;
    vector_threshold: number;
    reference_enabled: boolean;
    /** Fusion weights; keyword must weigh at least as much as vector (the seed's w1 ≥ w2). */
    weights: RecallSignalWeights;
    /** Messages after which the recency signal halves. */
    recency_half_life: number;
  };
  budget: {
    generation_reserve: number;
    instruction_reserve: number;
    min_recent_turns: number;
    max_recent_turns: number;
  };
  summary: {
    per_message_threshold: number;
    max_tokens_per_summary: number;
    strategy: "extractive";
  };
  fact_call: {
    enabled: boolean;
    max_rounds: number;
    max_fact_tokens: number;
    batch_size: number;
  };
  /** How a Recall v4 turn's prompt is framed (formatters.ts). */
  prompt_formatter: PromptFormatterName;
}

export const DEFAULT_RECALL: Readonly<RecallConfig> = Object.freeze({
  enabled: false,
  strategy: "summary_with_fact_call",
  scope: "session",
  signals: {
    keyword_enabled: true,
    keyword_topk: 5,
    keyword_method: "tfidf",
    vector_enabled: true,
    vector_top_k: 10,
    vector_threshold: 0.5,
    reference_enabled: true,
    weights: { keyword: 0.4, bm25: 0.3, vector: 0.2, recency: 0.1 },
    recency_half_life: 40,
  },
  budget: { generation_reserve: 512, instruction_reserve: 150, min_recent_turns: 2, max_recent_turns: 5 },
  summary: { per_message_threshold: 200, max_tokens_per_summary: 150, strategy: "extractive" },
  fact_call: { enabled: true, max_rounds: 3, max_fact_tokens: 800, batch_size: 5 },
  prompt_formatter: "auto",
}) as RecallConfig;

type DeepPartial<T> = { [K in keyof T]?: T[K] extends object ? DeepPartial<T[K]> : T[K] };
export type RecallConfigInput = DeepPartial<RecallConfig>;

const SECTIONS = ["signals", "budget", "summary", "fact_call"] as const;

/** Defaults filled in, unknown keys and bad values refused with a DkiArgumentError naming the key. */
export function resolveRecallConfig(input: RecallConfigInput = {}): RecallConfig {
  if (input === null || typeof input !== "object" || Array.isArray(input)) throw new DkiArgumentError(`config.recall must be an object, got ${shown(input)}`);
  unknownKeys("recall", input, DEFAULT_RECALL);
  const d = DEFAULT_RECALL;
  const section = <K extends (typeof SECTIONS)[number]>(k: K): RecallConfig[K] => {
    const given: unknown = input[k];
    if (given === undefined) return structuredClone(d[k]);
    if (given === null || typeof given !== "object" || Array.isArray(given)) throw new DkiArgumentError(`config.recall.${k} must be an object, got ${shown(given)}`);
    unknownKeys(`recall.${k}`, given as object, d[k]);
    return { ...structuredClone(d[k]), ...(given as object) } as RecallConfig[K];
  };
  const c: RecallConfig = { ...d, ...input, signals: section("signals"), budget: section("budget"), summary: section("summary"), fact_call: section("fact_call") } as RecallConfig;
  const w: unknown = (input.signals as { weights?: unknown } | undefined)?.weights;
  if (w !== undefined) {
    if (w === null || typeof w !== "object" || Array.isArray(w)) throw new DkiArgumentError(`config.recall.signals.weights must be an object, got ${shown(w)}`);
    unknownKeys("recall.signals.weights", w, d.signals.weights);
    c.signals.weights = { ...d.signals.weights, ...(w as Partial<RecallSignalWeights>) };
  }

  const bool = (name: string, v: unknown) => {
    if (typeof v !== "boolean") throw new DkiArgumentError(`config.recall.${name} must be true or false, got ${shown(v)}`);
  };
  const count = (name: string, v: unknown, min: number) => {
    if (!Number.isSafeInteger(v) || (v as number) < min) throw new DkiArgumentError(`config.recall.${name} must be an integer >= ${min}, got ${shown(v)}`);
  };
  const choice = (name: string, v: unknown, choices: readonly string[], later: readonly string[] = []) => {
    if (later.includes(v as string)) throw new DkiArgumentError(`config.recall.${name} ${shown(v)} is not implemented; use one of ${choices.map((x) => JSON.stringify(x)).join(", ")}`);
    if (!choices.includes(v as string)) throw new DkiArgumentError(`config.recall.${name} must be one of ${choices.map((x) => JSON.stringify(x)).join(", ")}, got ${shown(v)}`);
  };
  const unit = (name: string, v: unknown) => {
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0 || v > 1) throw new DkiArgumentError(`config.recall.${name} must be a number in [0, 1], got ${shown(v)}`);
  };

  bool("enabled", c.enabled);
  choice("strategy", c.strategy, ["summary_with_fact_call", "flat_history"]);
  choice("scope", c.scope, ["session", "user"]);
  const s = c.signals;
  bool("signals.keyword_enabled", s.keyword_enabled);
  count("signals.keyword_topk", s.keyword_topk, 1);
  choice("signals.keyword_method", s.keyword_method, ["tfidf"], ["textrank"]);
  bool("signals.vector_enabled", s.vector_enabled);
  count("signals.vector_top_k", s.vector_top_k, 1);
  if (typeof s.vector_threshold !== "number" || !(s.vector_threshold >= -1 && s.vector_threshold <= 1)) throw new DkiArgumentError(`config.recall.signals.vector_threshold must be a cosine in [-1, 1], got ${shown(s.vector_threshold)}`);
  bool("signals.reference_enabled", s.reference_enabled);
  for (const k of ["keyword", "bm25", "vector", "recency"] as const) unit(`signals.weights.${k}`, s.weights[k]);
  if (s.weights.keyword + s.weights.bm25 + s.weights.vector + s.weights.recency === 0) throw new DkiArgumentError("config.recall.signals.weights are all 0: at least one signal must count");
  if (s.weights.keyword < s.weights.vector) throw new DkiArgumentError(`config.recall.signals.weights.keyword (${s.weights.keyword}) must be >= weights.vector (${s.weights.vector}): keywords keep facts exact (seed 003 §5.3)`);
  if (typeof s.recency_half_life !== "number" || !(s.recency_half_life > 0) || !Number.isFinite(s.recency_half_life)) throw new DkiArgumentError(`config.recall.signals.recency_half_life must be a number > 0 (messages), got ${shown(s.recency_half_life)}`);
  const b = c.budget;
  count("budget.generation_reserve", b.generation_reserve, 0);
  count("budget.instruction_reserve", b.instruction_reserve, 0);
  count("budget.min_recent_turns", b.min_recent_turns, 0);
  count("budget.max_recent_turns", b.max_recent_turns, 0);
  if (b.min_recent_turns > b.max_recent_turns) throw new DkiArgumentError(`config.recall.budget.min_recent_turns (${b.min_recent_turns}) is above max_recent_turns (${b.max_recent_turns})`);
  count("summary.per_message_threshold", c.summary.per_message_threshold, 1);
  count("summary.max_tokens_per_summary", c.summary.max_tokens_per_summary, 1);
  choice("summary.strategy", c.summary.strategy, ["extractive"], ["llm"]);
  bool("fact_call.enabled", c.fact_call.enabled);
  count("fact_call.max_rounds", c.fact_call.max_rounds, 0);
  count("fact_call.max_fact_tokens", c.fact_call.max_fact_tokens, 1);
  count("fact_call.batch_size", c.fact_call.batch_size, 1);
  choice("prompt_formatter", c.prompt_formatter, PROMPT_FORMATTERS);
  // It frames Recall v4's turns only: set without them it would change nothing, without a word.
  if (c.prompt_formatter !== "auto" && (!c.enabled || c.strategy !== "summary_with_fact_call"))
    throw new DkiArgumentError(`config.recall.prompt_formatter ${shown(c.prompt_formatter)} frames Recall v4's turns: set recall.enabled (strategy "summary_with_fact_call") with it, or leave it "auto"`);
  return c;
}

/** Refuses a key of `given` that `known` lacks, naming it and the keys there are ("" where: the top level). */
export function unknownKeys(where: string, given: object, known: object): void {
  const at = where === "" ? "config" : `config.${where}`;
  for (const k of Object.keys(given)) if (!Object.hasOwn(known, k)) throw new DkiArgumentError(`${at} has no key ${JSON.stringify(k)} (known: ${Object.keys(known).join(", ")})`);
}

function shown(v: unknown): string {
  return typeof v === "string" ? JSON.stringify(v) : v === null ? "null" : typeof v === "object" ? JSON.stringify(v) : String(v);
}
