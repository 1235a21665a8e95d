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
  return {
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
