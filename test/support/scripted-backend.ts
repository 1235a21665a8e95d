// A scripted LLM step backend for tests of the RAG pipeline's decision logic: each prompt is
// answered by the first rule whose pattern matches it; a prompt no rule matches fails the call
// (a step then falls back), so a test sees exactly which steps ran. Prompts are kept in order.
import type { StepBackend } from "../../src/rag/pipeline/steps.js";

export class ScriptedBackend implements StepBackend {
  readonly prompts: string[] = [];
  constructor(private readonly rules: [RegExp, string | ((prompt: string) => string)][]) {}
  async complete(prompt: string): Promise<string> {
    this.prompts.push(prompt);
    for (const [re, out] of this.rules) if (re.test(prompt)) return typeof out === "string" ? out : out(prompt);
    throw new Error(`the script has no answer for: ${prompt.slice(0, 80)}`);
  }
}
