/** A model, tokenizer or data file whose content is malformed; the message names the file. */
export class FormatError extends Error {
  constructor(readonly file: string, detail: string) {
    super(`${file}: ${detail}`);
    this.name = "FormatError";
  }
}

/** Arguments that cannot be honoured (bad α, oversized prompt, unknown option). */
export class DkiArgumentError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "DkiArgumentError";
  }
}

/**
 * A NaN or ±inf where a finite number was needed: logits that went non-finite (a damaged weight,
 * an overflow), an injected segment holding one, or an α whose scaled values overflow float32.
 * The message names the generation step or position and, when one is at fault or injected, the
 * segment (its index in the call's `segments`).
 */
export class NonFiniteError extends Error {
  constructor(
    message: string,
    /** The generation step (0: the prompt's prefill), or the position for `logits`; undefined when not about logits. */
    readonly step?: number,
    /** Index in the call's `segments` of the segment at fault, when one is. */
    readonly segment?: number,
  ) {
    super(message);
    this.name = "NonFiniteError";
  }
}
