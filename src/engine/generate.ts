// The generation loop: prefill, then sample → decode one token at a time, streaming text,
// honouring stop strings, EOS, the token limit and an AbortSignal. Each native call runs off
// the main thread, so the event loop keeps turning between and during tokens.
import { DkiArgumentError, NonFiniteError } from "../errors.js";
import { isNativeNonFinite, LogitsMode, native, type NativeContextHandle } from "./native.js";
import type { Model } from "./model.js";

export interface SamplingOptions {
  /** 0 = greedy (default). */
  temperature?: number;
  topK?: number;
  topP?: number;
  repetitionPenalty?: number;
  /** How many recent tokens (prompt included) the repetition penalty looks at (default 64; 0: none). */
  repetitionWindow?: number;
  seed?: number;
}

/** Answer tokens when a call gives no maxNewTokens. */
export const DEFAULT_MAX_NEW_TOKENS = 128;

export interface GenerateOptions {
  maxNewTokens?: number;
  sampling?: SamplingOptions;
  /** Generation ends when the text contains one of these; the stop string is not returned. */
  stop?: string[];
  /** Stop on the model's EOS tokens (default true). */
  stopOnEos?: boolean;
  /** Called with each new piece of text (UTF-8 safe, stop strings held back) and the token id. */
  onToken?: (text: string, tokenId: number) => void;
  signal?: AbortSignal;
  /**
   * false (default): an abort rejects generate() with the signal's reason. true: an abort once
   * the first token has been sampled ends the generation like a stop string, and generate()
   * resolves with what was generated so far and finishReason "aborted" (a chat's stop button
   * keeps the partial answer). An abort before that (waiting for the model, or during or right
   * after the prompt's prefill) still rejects: there is nothing to return yet.
   */
  stopOnAbortSignal?: boolean;
}

export interface GenerationStats {
  promptTokens: number;
  segmentTokens: number;
  generatedTokens: number;
  prefillMs: number;
  prefillTokPerS: number;
  decodeMs: number;
  decodeTokPerS: number;
  timeToFirstTokenMs: number;
  /** Entropy (nats) of the first next-token distribution. */
  firstTokenEntropy: number;
}

export type FinishReason = "eos" | "stop" | "length" | "context" | "aborted";

export interface GenerateResult {
  /** The generated text as it continues the prompt (a leading space is kept). */
  text: string;
  tokens: number[];
  finishReason: FinishReason;
  stats: GenerationStats;
}

/** Prompt ids the stream decoder sees before the first generated one. */
const DECODER_CONTEXT_IDS = 8;

function isHighSurrogate(c: number): boolean {
  return c >= 0xd800 && c <= 0xdbff;
}

/**
 * Shannon entropy (nats) of softmax(logits); NaN if a logit is NaN or +∞, or none is finite
 * (softmax is undefined there). One exp a logit and no log:
 * with d = l − max and e = e^d, H = ln Σe − Σ(e·d) / Σe (three passes with a log each took 4 ms
 * for 49152 logits, as long as a whole decode step of a small model).
 */
export function entropy(logits: Float32Array): number {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i]! > max) max = logits[i]!;
  if (max === Infinity) return NaN;
  let z = 0;
  let ed = 0;
  for (let i = 0; i < logits.length; i++) {
    const d = logits[i]! - max;
    if (Number.isNaN(d)) return NaN;
    const e = Math.exp(d);
    if (e > 0) {
      // a -inf logit has e = 0 and d = -inf: its 0·ln 0 term is 0, not NaN
      z += e;
      ed += e * d;
    }
  }
  return Math.log(z) - ed / z;
}

function samplingParams(s: SamplingOptions = {}) {
  const p = {
    temperature: s.temperature ?? 0,
    topK: s.topK ?? 0,
    topP: s.topP ?? 1,
    repetitionPenalty: s.repetitionPenalty ?? 1,
    seed: s.seed ?? 0,
  };
  // The native sampler takes these as 32-bit floats and k as a 32-bit int: each is checked as it
  // will arrive there (1e308 would be infinite, a topP of 1e-50 zero).
  const f32 = (v: number) => (typeof v === "number" ? Math.fround(v) : NaN);
  if (!(f32(p.temperature) >= 0) || !Number.isFinite(f32(p.temperature))) throw new DkiArgumentError(`temperature must be a finite number >= 0 (as a 32-bit float), got ${String(p.temperature)}`);
  if (!Number.isInteger(p.topK) || p.topK < 0 || p.topK > 0x7fffffff) throw new DkiArgumentError(`topK must be an integer from 0 to 2147483647, got ${String(p.topK)}`);
  if (!(f32(p.topP) > 0 && f32(p.topP) <= 1)) throw new DkiArgumentError(`topP must be in (0, 1] (as a 32-bit float), got ${String(p.topP)}`);
  if (!(f32(p.repetitionPenalty) > 0) || !Number.isFinite(f32(p.repetitionPenalty))) throw new DkiArgumentError(`repetitionPenalty must be a finite number > 0 (as a 32-bit float), got ${String(p.repetitionPenalty)}`);
  if (!Number.isSafeInteger(p.seed) || p.seed < 0) throw new DkiArgumentError(`seed must be a non-negative integer, got ${p.seed}`);
  return p;
}

function abortError(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("generation aborted", "AbortError");
}

/** Evaluates tokens, cancelling the native work if the signal fires meanwhile. */
async function evalAbortable(ctx: NativeContextHandle, tokens: number[], mode: LogitsMode, signal?: AbortSignal, out?: Float32Array): Promise<Float32Array | null> {
  if (signal?.aborted) throw abortError(signal);
  const onAbort = () => ctx.cancel();
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    return await ctx.eval(Int32Array.from(tokens), mode, out);
  } catch (e) {
    if (signal?.aborted) throw abortError(signal);
    throw e;
  } finally {
    signal?.removeEventListener("abort", onAbort);
  }
}

/**
 * A native NaN/inf rejection as a NonFiniteError naming the generation step whose logits it
 * concerns (0: the prompt's prefill, k: the k-th decode step); a segment's own fault is named
 * by the segment, not a step. Other errors pass through.
 */
function atStep(e: unknown, step: number): unknown {
  if (!isNativeNonFinite(e)) return e;
  if (e.segment >= 0) return new NonFiniteError(`generate: ${e.message}`, undefined, e.segment);
  const where = step === 0 ? "step 0 (the prompt's prefill)" : `step ${step} (decode)`;
  return new NonFiniteError(`generate, ${where}: ${e.message}; stopped rather than sample from them`, step, undefined);
}

/**
 * Runs a generation in a context whose position base and segments the caller has set
 * (`ctx.reset(posBase)` / `ctx.setSegments`); the prompt goes in after any tokens already cached.
 * `signal` cancels the work: the caller's own (opts.signal) or another reason (the model's
 * disposal); only the caller's ends a generation with "aborted" under opts.stopOnAbortSignal.
 */
export async function runGeneration(
  model: Model,
  ctx: NativeContextHandle,
  prompt: number[],
  opts: GenerateOptions,
  segmentTokens: number,
  signal: AbortSignal | undefined = opts.signal,
): Promise<GenerateResult> {
  const maxNew = opts.maxNewTokens ?? DEFAULT_MAX_NEW_TOKENS;
  if (!Number.isInteger(maxNew) || maxNew < 0) throw new DkiArgumentError(`maxNewTokens must be a non-negative integer, got ${maxNew}`);
  const stops = opts.stop ?? [];
  // An empty stop string would match before any text: refused rather than silently dropped.
  if (!Array.isArray(stops) || stops.some((s) => typeof s !== "string" || s.length === 0))
    throw new DkiArgumentError(`stop must be an array of non-empty strings, got ${JSON.stringify(opts.stop)}`);
  const eos = new Set(opts.stopOnEos === false ? [] : [...model.tokenizer.eosIds, ...model.config.eosTokenIds]);
  const sampler = new (native().NativeSampler)(samplingParams(opts.sampling));
  const window = opts.sampling?.repetitionWindow ?? 64;
  if (!Number.isInteger(window) || window < 0) throw new DkiArgumentError(`repetitionWindow must be a non-negative integer, got ${window}`);
  const recent = (history: number[]) => Int32Array.from(window === 0 ? [] : history.slice(-window));
  const undecodable = model.tokenizer.undecodableIds(model.config.vocabSize);
  if (ctx.nPast + prompt.length > ctx.maxTokens) {
    throw new DkiArgumentError(`the prompt has ${prompt.length} tokens, more than the ${ctx.maxTokens - ctx.nPast} free positions of the context window`);
  }

  const t0 = performance.now();
  // One logits buffer for the whole generation: each step overwrites the last one's.
  const logits = new Float32Array(model.config.vocabSize);
  try {
    await evalAbortable(ctx, prompt, LogitsMode.Last, signal, logits);
  } catch (e) {
    throw atStep(e, 0);
  }
  // An abort that came as the prefill finished: still before the first token.
  if (signal?.aborted) throw abortError(signal);
  const prefillMs = performance.now() - t0;
  // The model's own distribution, before the ids that cannot become text are masked below.
  let firstTokenEntropy = maxNew === 0 ? entropy(logits) : 0;

  const history = [...prompt];
  const tokens: number[] = [];
  // The text continues the prompt: with the prompt's last ids as context, a SentencePiece
  // decoder keeps the first generated token's leading space (" Paris" after "The capital is",
  // as llama.cpp streams it), where decoding the new ids alone would strip it.
  // Ids the tokenizer cannot decode (padded vocabulary rows) end the context where they occur.
  let contextStart = Math.max(0, prompt.length - DECODER_CONTEXT_IDS);
  for (let i = contextStart; i < prompt.length; i++) if (undecodable.includes(prompt[i])) contextStart = i + 1;
  const decoder = model.tokenizer.createStreamDecoder({ context: prompt.slice(contextStart) });
  let text = "";
  let emitted = 0; // characters of `text` already passed to onToken
  const holdBack = stops.reduce((m, s) => Math.max(m, s.length - 1), 0);
  let finishReason: FinishReason = "length";
  let ttft = 0;
  const tDecode = performance.now();

  const emit = (upTo: number, id: number) => {
    if (upTo > emitted) {
      opts.onToken?.(text.slice(emitted, upTo), id);
      emitted = upTo;
    }
  };

  let decodeEvals = 0;
  for (let i = 0; i < maxNew; i++) {
    const firstLogits = i === 0 ? logits.slice() : null;
    for (const u of undecodable) logits[u] = -Infinity;
    const id = sampler.sample(logits, recent(history));
    if (i === 0) {
      ttft = performance.now() - t0;
      firstTokenEntropy = entropy(firstLogits!); // after the clock: not part of the time to first token
    }
    if (eos.has(id)) {
      finishReason = "eos";
      break;
    }
    tokens.push(id);
    history.push(id);
    text += decoder.push(id);
    const hit = stops.map((s) => text.indexOf(s)).filter((p) => p >= 0);
    if (hit.length > 0) {
      text = text.slice(0, Math.min(...hit));
      emit(text.length, id);
      finishReason = "stop";
      break;
    }
    // Held back for stop strings; never half of a surrogate pair (an emoji), which a terminal
    // would print as two replacement characters.
    let upTo = Math.max(emitted, text.length - holdBack);
    if (upTo > emitted && upTo < text.length && isHighSurrogate(text.charCodeAt(upTo - 1))) upTo--;
    emit(upTo, id);
    if (i === maxNew - 1) break;
    if (ctx.nPast >= ctx.maxTokens) {
      finishReason = "context";
      break;
    }
    try {
      await evalAbortable(ctx, [id], LogitsMode.Last, signal, logits);
    } catch (e) {
      if (opts.stopOnAbortSignal === true && opts.signal?.aborted) {
        finishReason = "aborted";
        break;
      }
      throw atStep(e, i + 1);
    }
    decodeEvals++;
  }
  if (finishReason !== "stop") {
    text += decoder.flush();
    emit(text.length, tokens[tokens.length - 1] ?? -1);
  }
  const decodeMs = performance.now() - tDecode;
  return {
    text,
    tokens,
    finishReason,
    stats: {
      promptTokens: prompt.length,
      segmentTokens,
      generatedTokens: tokens.length,
      prefillMs,
      prefillTokPerS: prompt.length / (prefillMs / 1000),
      decodeMs,
      decodeTokPerS: decodeEvals > 0 ? decodeEvals / (decodeMs / 1000) : 0,
      timeToFirstTokenMs: ttft,
      firstTokenEntropy,
    },
  };
}
