// Hugging Face config.json → the engine's normalised ModelConfig.
// Accepts the field spellings seen across transformers versions (rope_theta at the top level or
// inside rope_parameters; rope_scaling of type llama3; head_dim given or derived).
import { FormatError } from "../errors.js";

export type Arch = "llama" | "mistral" | "qwen2";

export interface Llama3RopeScaling {
  type: "llama3";
  factor: number;
  lowFreqFactor: number;
  highFreqFactor: number;
  originalMaxPositionEmbeddings: number;
}

/** A decoder's shape: what sizes its tensors, whatever the format or backend. */
export interface ModelShape {
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
}

export interface ModelConfig extends ModelShape {
  arch: Arch;
  rmsNormEps: number;
  ropeTheta: number;
  ropeScaling: Llama3RopeScaling | null;
  maxPositionEmbeddings: number;
  tieWordEmbeddings: boolean;
  /** q/k/v projections carry a bias (Qwen2 always; Llama when attention_bias is true). */
  attentionBias: boolean;
  bosTokenId: number | null;
  eosTokenIds: number[];
  /**
   * Rotary pairs are (2i, 2i+1) instead of Hugging Face's rotate-half (i, i + headDim/2). Set for
   * llama GGUF files, whose q/k rows llama.cpp's converter permuted for that layout; default false.
   */
  ropeInterleaved?: boolean;
}

type Json = Record<string, unknown>;

export function parseHfConfig(raw: unknown, file = "config.json"): ModelConfig {
  const fail = (msg: string): never => { throw new FormatError(file, msg); };
  if (typeof raw !== "object" || raw === null) return fail("not a JSON object");
  const c = raw as Json;
  const modelType = c.model_type;
  if (modelType !== "llama" && modelType !== "mistral" && modelType !== "qwen2") {
    return fail(`model_type ${JSON.stringify(modelType)} is not supported (llama, mistral, qwen2)`);
  }
  const int = (key: string, dflt?: number): number => {
    const v = c[key] ?? dflt;
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v <= 0) return fail(`${key} must be a positive integer, got ${JSON.stringify(c[key])}`);
    return v;
  };
  const num = (v: unknown, key: string): number => {
    if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) return fail(`${key} must be a positive number, got ${JSON.stringify(v)}`);
    return v;
  };
  const hiddenSize = int("hidden_size");
  const numHeads = int("num_attention_heads");
  const numKvHeads = int("num_key_value_heads", numHeads);
  if (numHeads % numKvHeads !== 0) fail(`num_attention_heads ${numHeads} is not a multiple of num_key_value_heads ${numKvHeads}`);
  const headDim = c.head_dim == null ? hiddenSize / numHeads : int("head_dim");
  if (!Number.isInteger(headDim) || headDim % 2 !== 0) fail(`head_dim ${headDim} must be an even integer`);

  const ropeParams = (c.rope_parameters ?? null) as Json | null;
  const ropeTheta = num(ropeParams?.rope_theta ?? c.rope_theta ?? 10000, "rope_theta");
  const scalingRaw = (c.rope_scaling ?? (ropeParams && ropeParams.rope_type !== "default" ? ropeParams : null)) as Json | null;
  let ropeScaling: Llama3RopeScaling | null = null;
  if (scalingRaw) {
    const type = scalingRaw.rope_type ?? scalingRaw.type;
    if (type === "llama3") {
      ropeScaling = {
        type: "llama3",
        factor: num(scalingRaw.factor, "rope_scaling.factor"),
        lowFreqFactor: num(scalingRaw.low_freq_factor, "rope_scaling.low_freq_factor"),
        highFreqFactor: num(scalingRaw.high_freq_factor, "rope_scaling.high_freq_factor"),
        originalMaxPositionEmbeddings: num(scalingRaw.original_max_position_embeddings, "rope_scaling.original_max_position_embeddings"),
      };
    } else if (type !== "default" && type != null) {
      fail(`rope scaling type ${JSON.stringify(type)} is not supported (llama3 only)`);
    }
  }
  const eos = c.eos_token_id;
  const eosTokenIds = Array.isArray(eos) ? eos.filter((x): x is number => typeof x === "number") : typeof eos === "number" ? [eos] : [];
  const hidden = c.hidden_act ?? "silu";
  if (hidden !== "silu") fail(`hidden_act ${JSON.stringify(hidden)} is not supported (silu)`);
  const config: ModelConfig = {
    arch: modelType,
    vocabSize: int("vocab_size"),
    hiddenSize,
    intermediateSize: int("intermediate_size"),
    numLayers: int("num_hidden_layers"),
    numHeads,
    numKvHeads,
    headDim,
    rmsNormEps: num(c.rms_norm_eps ?? 1e-6, "rms_norm_eps"),
    ropeTheta,
    ropeScaling,
    maxPositionEmbeddings: int("max_position_embeddings", 4096),
    tieWordEmbeddings: c.tie_word_embeddings === true,
    attentionBias: modelType === "qwen2" ? true : c.attention_bias === true,
    bosTokenId: typeof c.bos_token_id === "number" ? c.bos_token_id : null,
    eosTokenIds,
  };
  checkConfigLimits(config, fail);
  return config;
}

/**
 * The largest shapes the engine takes (native/model.h `limits`, which the addon exports; a test
 * keeps the two equal; far above any released model): a file claiming more is refused before any
 * work sized by them, such as the list of expected tensors (a 390-byte GGUF claiming 2^31 layers
 * used to take 2.6 GB and 45 s). Kept here so that reading a file needs no addon.
 */
export const SHAPE_LIMITS: Readonly<Record<keyof ModelShape, number>> = {
  vocabSize: 1 << 24,
  hiddenSize: 1 << 17,
  intermediateSize: 1 << 19,
  numLayers: 1024,
  numHeads: 1024,
  numKvHeads: 1024,
  headDim: 1024,
};
/** Heads × head size at most. */
export const HEADS_TIMES_HEAD_DIM_LIMIT = 1 << 18;
const SHAPE_NAMES: Readonly<Record<keyof ModelShape, string>> = {
  vocabSize: "vocabulary size",
  hiddenSize: "hidden size",
  intermediateSize: "MLP width",
  numLayers: "layer count",
  numHeads: "attention head count",
  numKvHeads: "K/V head count",
  headDim: "head size",
};
const FLOAT32_MAX = 3.4028234663852886e38;
const FLOAT32_MIN_NORMAL = 1.1754943508222875e-38;

/** Refuses a config the engine cannot run, naming the field; `fail` raises the file's FormatError. */
export function checkConfigLimits(cfg: ModelConfig, fail: (msg: string) => never): void {
  for (const [key, max] of Object.entries(SHAPE_LIMITS) as [keyof ModelShape, number][]) {
    if (cfg[key] > max) fail(`${SHAPE_NAMES[key]} ${cfg[key]} is more than the engine takes (${max})`);
  }
  if (cfg.numHeads * cfg.headDim > HEADS_TIMES_HEAD_DIM_LIMIT) {
    fail(`heads × head size = ${cfg.numHeads * cfg.headDim} is more than the engine takes (${HEADS_TIMES_HEAD_DIM_LIMIT})`);
  }
  // Both go to the engine as float32: they must stay positive and finite there.
  if (!(cfg.rmsNormEps >= FLOAT32_MIN_NORMAL && cfg.rmsNormEps <= 1)) fail(`rms_norm_eps ${cfg.rmsNormEps} must be from ${FLOAT32_MIN_NORMAL} to 1`);
  if (!(cfg.ropeTheta <= FLOAT32_MAX)) fail(`rope_theta ${cfg.ropeTheta} is not a finite float32`);
  if (cfg.maxPositionEmbeddings > 2 ** 32 - 1) fail(`max_position_embeddings ${cfg.maxPositionEmbeddings} does not fit 32 bits`);
}

/** Expected HF tensor names and shapes for a config; the loader checks the files against this. */
export function expectedTensors(cfg: ModelConfig): Map<string, number[]> {
  const m = new Map<string, number[]>();
  const q = cfg.numHeads * cfg.headDim;
  const kv = cfg.numKvHeads * cfg.headDim;
  m.set("model.embed_tokens.weight", [cfg.vocabSize, cfg.hiddenSize]);
  for (let l = 0; l < cfg.numLayers; l++) {
    const p = `model.layers.${l}.`;
    m.set(p + "input_layernorm.weight", [cfg.hiddenSize]);
    m.set(p + "self_attn.q_proj.weight", [q, cfg.hiddenSize]);
    m.set(p + "self_attn.k_proj.weight", [kv, cfg.hiddenSize]);
    m.set(p + "self_attn.v_proj.weight", [kv, cfg.hiddenSize]);
    if (cfg.attentionBias) {
      m.set(p + "self_attn.q_proj.bias", [q]);
      m.set(p + "self_attn.k_proj.bias", [kv]);
      m.set(p + "self_attn.v_proj.bias", [kv]);
    }
    m.set(p + "self_attn.o_proj.weight", [cfg.hiddenSize, q]);
    m.set(p + "post_attention_layernorm.weight", [cfg.hiddenSize]);
    m.set(p + "mlp.gate_proj.weight", [cfg.intermediateSize, cfg.hiddenSize]);
    m.set(p + "mlp.up_proj.weight", [cfg.intermediateSize, cfg.hiddenSize]);
    m.set(p + "mlp.down_proj.weight", [cfg.hiddenSize, cfg.intermediateSize]);
  }
  m.set("model.norm.weight", [cfg.hiddenSize]);
  if (!cfg.tieWordEmbeddings) m.set("lm_head.weight", [cfg.vocabSize, cfg.hiddenSize]);
  return m;
}
