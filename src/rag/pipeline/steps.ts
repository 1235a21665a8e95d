// The LLM steps of the query pipeline (rewrite, decompose, step-back, refine a hop, grade, judge):
// each one a prompt to a backend, its raw output parsed into the shape the step expects, and a
// record of all three for the response's metadata. A step never fails the turn: output that does
// not parse, a backend error or a step timeout leaves the step's fallback (a failed rewrite keeps
// the query) and says why in the record. Only the caller's own abort propagates.
//
// Backends: the engine model (the loaded one by default, or another loaded from a path) through
// ModelStepBackend, or any object with `complete` (tests script one to drive the decision logic).
// Where a step's answer is one of a few words (yes/no, a query class), a backend with `choose`
// decodes under that constraint: ModelStepBackend scores every option's tokens after the prompt
// with the model's log-probabilities and returns the best, so the output is always well formed.
// Free-form shapes (a JSON list of sub-queries) are parsed strictly, with the fallback.
import { performance } from "node:perf_hooks";
import type { Model } from "../../engine/model.js";
import { DkiArgumentError } from "../../errors.js";
import { withTimeout } from "../../util/either-signal.js";

export interface CompleteOptions {
  maxNewTokens: number;
  signal?: AbortSignal;
}

export interface ChoiceResult {
  /** Index of the chosen option. */
  index: number;
  /** Log-probability of each option's tokens after the prompt (what the choice was made on). */
  scores: number[];
}

/** What the LLM steps go through. */
export interface StepBackend {
  /** A continuation of the prompt (a user turn of the chat template where the model has one). */
  complete(prompt: string, o: CompleteOptions): Promise<string>;
  /** Optional constrained decoding: the most likely of `options` as the answer to the prompt. */
  choose?(prompt: string, options: readonly string[], o: { signal?: AbortSignal }): Promise<ChoiceResult>;
}

/** Runs a model call in the caller's turn (RAGSystem's fair queue), or directly. */
export type Schedule = <T>(fn: () => Promise<T>, signal?: AbortSignal) => Promise<T>;

const direct: Schedule = (fn) => fn();

/** The engine model as a step backend: greedy generation, and choices scored by log-probability. */
export class ModelStepBackend implements StepBackend {
  constructor(
    readonly model: Model,
    private readonly schedule: Schedule = direct,
  ) {}

  async complete(prompt: string, o: CompleteOptions): Promise<string> {
    const r = await this.schedule(() => this.model.generate(this.input(prompt), { maxNewTokens: o.maxNewTokens, signal: o.signal }), o.signal);
    return r.text;
  }

  /**
   * Each option's summed log-probability after the prompt (Model.scoreContinuations: one prefill
   * of the prompt, then the option's tokens on top of it). The sum favours short options a little;
   * the steps' options are single words, so their lengths barely differ.
   */
  async choose(prompt: string, options: readonly string[], o: { signal?: AbortSignal } = {}): Promise<ChoiceResult> {
    const tok = this.model.tokenizer;
    const ids = options.map((option) => {
      // The option as the model would write it right after the prompt: with a leading space in
      // the plain layout ("Answer: yes"), as the first word of the turn in the chat layout.
      const t = tok.encode(tok.chatTemplate !== null ? option : ` ${option}`, { addSpecialTokens: false });
      if (t.length === 0) throw new DkiArgumentError(`choice option ${JSON.stringify(option)} has no tokens`);
      return t;
    });
    const scores = await this.schedule(() => this.model.scoreContinuations(this.input(prompt), ids, { signal: o.signal }), o.signal);
    let index = 0;
    for (let i = 1; i < scores.length; i++) if (scores[i]! > scores[index]!) index = i;
    return { index, scores };
  }

  private input(prompt: string): string | { messages: { role: "user"; content: string }[] } {
    return this.model.tokenizer.chatTemplate !== null ? { messages: [{ role: "user", content: prompt }] } : prompt;
  }
}

/** One step as the response's metadata shows it. */
export interface StepRecord {
  /** The step's name: "rewrite", "decompose", "step_back", "refine", … */
  step: string;
  prompt: string;
  /** The backend's output as it came ("" when the call failed). */
  raw: string;
  /** What the step went on with: the parsed output, or the fallback. */
  parsed: unknown;
  /** true when `parsed` is the fallback: the output did not parse, the call failed or timed out. */
  fellBack: boolean;
  /** Why it fell back. */
  error?: string;
  /** true when the output was decoded under a constraint (a choice among options). */
  constrained: boolean;
  /** A constrained choice's log-probability per option. */
  scores?: number[];
  ms: number;
}

export interface StepRunnerOptions {
  /** Milliseconds one step may take before its fallback is used. Default 30000. */
  timeoutMs?: number;
  /** The turn's signal: its abort ends the turn (rethrown), not just the step. */
  signal?: AbortSignal;
}

export const DEFAULT_STEP_TIMEOUT_MS = 30_000;

/** Runs steps on one backend for one turn, keeping their records in order. */
export class StepRunner {
  readonly records: StepRecord[] = [];
  private readonly timeoutMs: number;

  constructor(
    readonly backend: StepBackend,
    private readonly o: StepRunnerOptions = {},
  ) {
    this.timeoutMs = o.timeoutMs ?? DEFAULT_STEP_TIMEOUT_MS;
    if (!Number.isInteger(this.timeoutMs) || this.timeoutMs < 1) throw new DkiArgumentError(`step timeoutMs must be a positive integer, got ${String(o.timeoutMs)}`);
  }

  /** Model calls made so far (a choice counts once). */
  get calls(): number {
    return this.records.length;
  }

  /** A free-form step: the output through `parse` (undefined: did not parse), else `fallback`. */
  async text<T>(step: string, prompt: string, maxNewTokens: number, parse: (raw: string) => T | undefined, fallback: T): Promise<T> {
    return this.run(step, prompt, fallback, false, async (signal) => {
      const raw = await this.backend.complete(prompt, { maxNewTokens, signal });
      const parsed = parse(raw);
      return parsed === undefined ? { raw, error: "the output did not parse" } : { raw, parsed };
    });
  }

  /**
   * A step whose answer is one of `options`: constrained where the backend can (`choose`), else
   * generated and parsed as the first option word in the output.
   */
  async choice<C extends string, F = C>(step: string, prompt: string, options: readonly C[], fallback: F): Promise<C | F> {
    const choose = this.backend.choose?.bind(this.backend);
    if (choose !== undefined) {
      return this.run<C | F>(step, prompt, fallback, true, async (signal) => {
        const r = await choose(prompt, options, { signal });
        return { raw: options[r.index]!, parsed: options[r.index]!, scores: r.scores };
      });
    }
    return this.text<C | F>(step, prompt, 8, (raw) => parseChoice(raw, options), fallback);
  }

  private async run<T>(step: string, prompt: string, fallback: T, constrained: boolean, call: (signal: AbortSignal) => Promise<{ raw: string; parsed?: T; error?: string; scores?: number[] }>): Promise<T> {
    const t = performance.now();
    const bounded = withTimeout(this.o.signal, this.timeoutMs, `the step took longer than ${this.timeoutMs} ms`);
    const record: StepRecord = { step, prompt, raw: "", parsed: fallback, fellBack: true, constrained, ms: 0 };
    try {
      const r = await call(bounded.signal);
      record.raw = r.raw;
      if (r.parsed !== undefined) {
        record.parsed = r.parsed;
        record.fellBack = false;
      } else record.error = r.error;
      if (r.scores !== undefined) record.scores = r.scores;
    } catch (e) {
      // The turn's own abort ends the turn; anything else (a timeout, a backend error) is this step's.
      if (this.o.signal?.aborted) throw e;
      record.error = bounded.timeout.aborted ? (bounded.timeout.reason as Error).message : e instanceof Error ? e.message : String(e);
    } finally {
      bounded.release();
      record.ms = performance.now() - t;
      this.records.push(record);
    }
    return record.parsed as T;
  }
}

/** The first of `options` that appears as a word in `raw` (case-insensitive), else undefined. */
export function parseChoice<C extends string>(raw: string, options: readonly C[]): C | undefined {
  const words = raw.toLowerCase().match(/[\p{L}\p{N}_-]+/gu) ?? [];
  for (const w of words) {
    const hit = options.find((o) => o.toLowerCase() === w);
    if (hit !== undefined) return hit;
  }
  return undefined;
}

/** P(yes) of a yes/no step: from the constrained choice's log-probabilities, else the parsed word; null when it fell back. */
export async function yesProbability(steps: StepRunner, step: string, prompt: string): Promise<number | null> {
  const before = steps.records.length;
  const v = await steps.choice(step, prompt, ["yes", "no"] as const, null);
  if (v === null) return null;
  const s = steps.records[before]!.scores;
  return s !== undefined && s.length === 2 ? 1 / (1 + Math.exp(s[1]! - s[0]!)) : v === "yes" ? 1 : 0;
}
