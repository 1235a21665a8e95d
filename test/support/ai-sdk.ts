// What the AI SDK provider's two test files share: alice's memory and question, the provider
// options of a turn, the `dki` provider metadata, and a stream aborted at its first text.
import { streamText, type LanguageModel } from "ai";
import { expect } from "vitest";

export const HIKING = "Alice loves hiking in the Alps and is allergic to peanuts.";
export const HIKING_Q = "Any tips for hiking in the Alps with a peanut allergy?";

/** A turn's provider options: whose memory, which session, and any other `dki` keys. */
export const as = (userId: string, sessionId: string, extra: Record<string, number> = {}) => ({ dki: { userId, sessionId, ...extra } });

/** The `dki` provider metadata of a result, as the SDK hands it over. */
export function meta(pm: Record<string, Record<string, unknown>> | undefined): Record<string, unknown> {
  expect(pm?.dki).toBeDefined();
  return pm!.dki!;
}

/** streamText of HIKING_Q for alice in `sessionId`, aborted at its first text delta: the part types the SDK streamed. */
export async function streamAbortedAtFirstText(model: LanguageModel, sessionId: string): Promise<string[]> {
  const ctl = new AbortController();
  const s = streamText({ model, prompt: HIKING_Q, maxOutputTokens: 800, abortSignal: ctl.signal, providerOptions: as("alice", sessionId) });
  const types: string[] = [];
  for await (const p of s.fullStream) {
    types.push(p.type);
    if (p.type === "text-delta") ctl.abort();
  }
  return types;
}
