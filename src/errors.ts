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
