// The logits Hugging Face transformers computed for the llama-tiny fixture (test/fixtures/hf/README.md):
// plain, full-text and injected runs of one memory and one prompt, and greedy continuations.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { hfLlamaTiny } from "./paths.js";

export interface LlamaTinyRefs {
  mem_ids: number[];
  prompt_ids: number[];
  /** [memory ; prompt] as one sequence, the prompt's rows. */
  full: number[][];
  /** The prompt alone. */
  none: number[][];
  /** The memory's K/V injected before the prompt, α = 1, α = 0.5 on values, at negative positions, ln 0.5 on scores. */
  inject_a1: number[][];
  inject_v05: number[][];
  inject_neg: number[][];
  logit_a05: number[][];
  greedy_mem: number[];
  greedy_none: number[];
}

export const llamaTinyRefs = JSON.parse(readFileSync(join(hfLlamaTiny, "refs.json"), "utf8")) as LlamaTinyRefs;
