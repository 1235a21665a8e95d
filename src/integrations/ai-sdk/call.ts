// What one AI SDK call asks of a DKI turn: the query and system prompt out of the SDK's message
// list, the user and session out of providerOptions.dki, and the SDK's settings as the engine's.
// Everything is checked before the system is touched, and a setting the engine has no equivalent
// for is a warning in the result, never silently dropped.
import { InvalidArgumentError, InvalidPromptError, UnsupportedFunctionalityError, type LanguageModelV3CallOptions, type LanguageModelV3Prompt, type SharedV3Warning } from "@ai-sdk/provider";
import { z } from "zod";
import type { SamplingOptions } from "../../engine/generate.js";

/** The language models a provider serves: memory as K/V, memory as prompt text, no memory. */
export type DkiModelId = "dki" | "rag" | "none";
export const DKI_MODEL_IDS: readonly DkiModelId[] = ["dki", "rag", "none"];

// Strict: a misspelt key ("userID") would otherwise run the turn for no user at all.
const dkiOptionsSchema = z.strictObject({
  userId: z.string().trim().min(1, "must be a non-empty string"),
  sessionId: z.string().trim().min(1, "must be a non-empty string"),
  /** α for the routed memories, whatever the gate says ("dki" only). */
  alpha: z.number().min(0).max(1).optional(),
});

export type DkiCallOptions = z.infer<typeof dkiOptionsSchema>;

/** One message of the conversation before the query, as text. */
export interface PriorMessage {
  role: "user" | "assistant";
  text: string;
}

export interface DkiCall {
  modelId: DkiModelId;
  dki: DkiCallOptions;
  query: string;
  /** The system messages joined; undefined: the system's configured prompt. */
  systemPrompt: string | undefined;
  /** The messages before the query (the system reads the session's own record of them). */
  prior: PriorMessage[];
  maxNewTokens: number | undefined;
  sampling: SamplingOptions | undefined;
  stop: string[] | undefined;
  warnings: SharedV3Warning[];
}

/** Checks an SDK call and turns it into a turn's inputs. Throws the SDK's own error types. */
export function readCall(modelId: DkiModelId, o: LanguageModelV3CallOptions): DkiCall {
  const dki = readDkiOptions(o.providerOptions?.dki);
  if (dki.alpha !== undefined && modelId !== "dki") {
    throw new InvalidArgumentError({ argument: "providerOptions.dki.alpha", message: `providerOptions.dki.alpha sets the injection's α: it applies to the "dki" model only, not "${modelId}"` });
  }
  const { query, systemPrompt, prior } = readPrompt(o.prompt);
  const warnings: SharedV3Warning[] = [];
  const unsupported = (feature: string, details: string) => warnings.push({ type: "unsupported", feature, details });
  if (o.tools !== undefined && o.tools.length > 0) unsupported("tools", "the DKI engine does not call tools; the tools were not shown to the model");
  if (o.responseFormat?.type === "json") unsupported("responseFormat", "JSON output is not enforced; the model answers as text");
  if (o.presencePenalty !== undefined) unsupported("presencePenalty", "not applied");
  if (o.frequencyPenalty !== undefined) unsupported("frequencyPenalty", "not applied");

  const sampling: SamplingOptions = {};
  if (o.temperature !== undefined) sampling.temperature = o.temperature;
  if (o.topP !== undefined) sampling.topP = o.topP;
  if (o.topK !== undefined) sampling.topK = o.topK;
  if (o.seed !== undefined) sampling.seed = o.seed;
  return {
    modelId,
    dki,
    query,
    systemPrompt,
    prior,
    maxNewTokens: o.maxOutputTokens,
    sampling: Object.keys(sampling).length > 0 ? sampling : undefined,
    stop: o.stopSequences !== undefined && o.stopSequences.length > 0 ? o.stopSequences : undefined,
    warnings,
  };
}

function readDkiOptions(raw: unknown): DkiCallOptions {
  if (raw === undefined) {
    throw new InvalidArgumentError({ argument: "providerOptions.dki", message: "providerOptions.dki is missing: a DKI turn needs { userId, sessionId } (whose memories, which conversation)" });
  }
  const parsed = dkiOptionsSchema.safeParse(raw);
  if (!parsed.success) {
    const problems = parsed.error.issues.map((i) => `providerOptions.dki${i.path.map((p) => `.${String(p)}`).join("")}: ${i.message}`);
    throw new InvalidArgumentError({ argument: "providerOptions.dki", message: problems.join("; ") });
  }
  return parsed.data;
}

/**
 * The query is the last message, a user's, as text. System messages become the turn's system
 * prompt. Earlier user and assistant messages are returned as `prior`: a DKI turn reads its
 * history from the session's record in the store, not from the caller, so the language model
 * compares them with that record and warns where they differ.
 */
function readPrompt(prompt: LanguageModelV3Prompt): { query: string; systemPrompt: string | undefined; prior: PriorMessage[] } {
  const last = prompt.at(-1);
  if (last === undefined || last.role !== "user") {
    throw new InvalidPromptError({ prompt, message: `the last message must be the user's query; it is ${last === undefined ? "missing (empty prompt)" : `a ${last.role} message`}` });
  }
  const system: string[] = [];
  const prior: PriorMessage[] = [];
  for (const m of prompt.slice(0, -1)) {
    if (m.role === "system") system.push(m.content);
    else if (m.role === "tool") throw new UnsupportedFunctionalityError({ functionality: "tool messages (the DKI engine does not call tools)" });
    else prior.push({ role: m.role, text: textOf(m.content, prompt) });
  }
  const query = textOf(last.content, prompt);
  if (query.trim() === "") throw new InvalidPromptError({ prompt, message: "the user's query has no text" });
  return { query, systemPrompt: system.length > 0 ? system.join("\n\n") : undefined, prior };
}

type Part = LanguageModelV3Prompt[number]["content"] extends infer C ? (C extends readonly (infer P)[] ? P : never) : never;

/** A message's text parts, joined; files and tool parts are refused, reasoning is left out. */
function textOf(content: readonly Part[], prompt: LanguageModelV3Prompt): string {
  const texts: string[] = [];
  for (const p of content) {
    if (p.type === "text") texts.push(p.text);
    else if (p.type === "file") throw new UnsupportedFunctionalityError({ functionality: `file parts (${p.mediaType}): the DKI engine reads text only` });
    else if (p.type === "tool-call" || p.type === "tool-result" || p.type === "tool-approval-response") {
      throw new UnsupportedFunctionalityError({ functionality: "tool calls and results (the DKI engine does not call tools)" });
    } else if (p.type !== "reasoning") throw new InvalidPromptError({ prompt, message: `unknown message part ${JSON.stringify((p as { type: unknown }).type)}` });
  }
  return texts.join("");
}
