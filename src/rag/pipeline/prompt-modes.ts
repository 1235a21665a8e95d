// Prompt modes (seed 001): how strictly the model is told to keep to the retrieved context. The
// mode's instruction follows the system prompt (or is the system prompt when there is none), so the
// seed 000 layout and budget stay as they are; the numbered blocks [1]..[n] are what it refers to.
//
//   simple    answer from the context, briefly
//   advanced  combine several blocks, cite each one used with its [n], reason step by step
//   precise   only what the context states, every sentence cited, "I don't know" otherwise
import { DkiArgumentError } from "../../errors.js";

export type PromptMode = "simple" | "advanced" | "precise";
export const PROMPT_MODES: readonly PromptMode[] = ["simple", "advanced", "precise"];

export const PROMPT_MODE_INSTRUCTIONS: Readonly<Record<PromptMode, string>> = Object.freeze({
  simple: "Answer the question briefly using the numbered relevant information provided.",
  advanced:
    "Answer the question using the numbered relevant information provided. Combine facts from several numbered blocks where needed, think step by step, and cite each block you use with its number in brackets, e.g. [1].",
  precise:
    "Answer only with facts stated in the numbered relevant information provided, and cite the block of every sentence with its number in brackets, e.g. [2]. If the information does not contain the answer, say that you do not know; never guess.",
});

export function checkPromptMode(m: unknown): asserts m is PromptMode | undefined {
  if (m !== undefined && !PROMPT_MODES.includes(m as PromptMode)) throw new DkiArgumentError(`promptMode must be "simple", "advanced" or "precise", got ${JSON.stringify(m)}`);
}

/** The system prompt with the mode's instruction after it; unchanged without a mode. */
export function withPromptMode(systemPrompt: string | undefined, mode: PromptMode | undefined): string | undefined {
  if (mode === undefined) return systemPrompt;
  const instruction = PROMPT_MODE_INSTRUCTIONS[mode];
  return systemPrompt === undefined || systemPrompt === "" ? instruction : `${systemPrompt}\n\n${instruction}`;
}
