// The AI SDK's language model (specification v3) over one of the provider's systems. Each call is
// one turn: the answer, its usage and the turn's `dki` details in providerMetadata.
import type { LanguageModelV3, LanguageModelV3CallOptions, LanguageModelV3GenerateResult, LanguageModelV3StreamPart, LanguageModelV3StreamResult, SharedV3Warning } from "@ai-sdk/provider";
import { eitherSignal } from "../../util/either-signal.js";
import { readCall, type DkiCall, type DkiModelId } from "./call.js";
import type { TurnOutcome } from "./turn.js";

export const PROVIDER_NAME = "dki";

/**
 * Where a provider's turns run: an in-process DKISystem, or a `dki serve` over HTTP. The language
 * model is the same over either, so the SDK sees the same calls, parts and results.
 */
export interface DkiTurns {
  /** Warnings about the call that only the backend can tell (earlier messages the model will not see, settings it lacks). */
  warnings(call: DkiCall, signal: AbortSignal | undefined): Promise<SharedV3Warning[]>;
  /** Runs the call's turn; `onText` sees the answer as it streams. Rejects once `signal` is aborted, having recorded nothing. */
  run(call: DkiCall, signal: AbortSignal | undefined, onText?: (text: string) => void): Promise<TurnOutcome>;
}

export class DkiLanguageModel implements LanguageModelV3 {
  readonly specificationVersion = "v3";
  readonly provider = PROVIDER_NAME;
  // The engine reads text only: no URL is fetched by the model itself.
  readonly supportedUrls: Record<string, RegExp[]> = {};

  constructor(
    readonly modelId: DkiModelId,
    private readonly turns: DkiTurns,
  ) {}

  async doGenerate(o: LanguageModelV3CallOptions): Promise<LanguageModelV3GenerateResult> {
    const call = readCall(this.modelId, o);
    o.abortSignal?.throwIfAborted();
    const warnings = [...call.warnings, ...(await this.turns.warnings(call, o.abortSignal))];
    const timestamp = new Date();
    const r = await this.turns.run(call, o.abortSignal);
    return {
      content: [{ type: "text", text: r.text }],
      finishReason: r.finishReason,
      usage: r.usage,
      providerMetadata: { [PROVIDER_NAME]: r.metadata },
      response: { timestamp, modelId: this.modelId },
      warnings,
    };
  }

  /**
   * Parts in the specification's order: stream-start (with the warnings), response-metadata,
   * text-start, a text-delta per piece the engine streams, text-end, finish. An abort (the call's
   * signal, or the reader cancelling the stream) stops the turn, which records nothing, and
   * errors the stream with the signal's reason, which the SDK reports as an abort; any other
   * failure is an error part followed by a finish with reason "error".
   */
  async doStream(o: LanguageModelV3CallOptions): Promise<LanguageModelV3StreamResult> {
    const call = readCall(this.modelId, o);
    o.abortSignal?.throwIfAborted();
    const turns = this.turns;
    const warnings = [...call.warnings, ...(await turns.warnings(call, o.abortSignal))];
    const cancel = new AbortController();
    const { signal, release } = eitherSignal(o.abortSignal === undefined ? [cancel.signal] : [o.abortSignal, cancel.signal]);
    const textId = "0";
    const modelId = this.modelId;
    const stream = new ReadableStream<LanguageModelV3StreamPart>({
      start(controller) {
        controller.enqueue({ type: "stream-start", warnings });
        controller.enqueue({ type: "response-metadata", timestamp: new Date(), modelId });
        let started = false;
        const onText = (delta: string) => {
          if (signal.aborted) return;
          if (!started) controller.enqueue({ type: "text-start", id: textId });
          started = true;
          controller.enqueue({ type: "text-delta", id: textId, delta });
        };
        // Not awaited by start(): the stream is handed to the SDK at once and fills as tokens come.
        void turns.run(call, signal, onText).then(
          (r) => {
            release();
            if (!started) controller.enqueue({ type: "text-start", id: textId });
            controller.enqueue({ type: "text-end", id: textId });
            controller.enqueue({ type: "finish", finishReason: r.finishReason, usage: r.usage, providerMetadata: { [PROVIDER_NAME]: r.metadata } });
            controller.close();
          },
          (e: unknown) => {
            release();
            if (cancel.signal.aborted) return; // the reader is gone
            if (signal.aborted) {
              controller.error(signal.reason);
              return;
            }
            if (started) controller.enqueue({ type: "text-end", id: textId });
            controller.enqueue({ type: "error", error: e });
            controller.enqueue({
              type: "finish",
              finishReason: { unified: "error", raw: undefined },
              // The turn failed: nothing is known about its tokens, so nothing is claimed.
              usage: { inputTokens: { total: undefined, noCache: undefined, cacheRead: undefined, cacheWrite: undefined }, outputTokens: { total: undefined, text: undefined, reasoning: undefined } },
            });
            controller.close();
          },
        );
      },
      cancel(reason) {
        cancel.abort(reason);
      },
    });
    return { stream };
  }
}
