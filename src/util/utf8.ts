// UTF-8 input that is not valid UTF-8 is read with U+FFFD in place of each bad sequence, as every
// decoder does, but never silently: the callers warn with the count, naming the input.

const REPLACEMENT = "\uFFFD";
const REPLACEMENT_BYTES = Buffer.from(REPLACEMENT, "utf8");

/** Occurrences of `needle` in `hay`. */
function countBytes(hay: Uint8Array, needle: Uint8Array): number {
  const buf = Buffer.from(hay.buffer, hay.byteOffset, hay.byteLength);
  let n = 0;
  for (let i = buf.indexOf(needle); i >= 0; i = buf.indexOf(needle, i + needle.length)) n++;
  return n;
}

/**
 * The text of UTF-8 bytes and how many characters the decoder replaced with U+FFFD because the
 * bytes there were not UTF-8 (U+FFFD characters the input itself held, validly encoded, are not
 * counted).
 */
export function decodeUtf8(bytes: Uint8Array): { text: string; replaced: number } {
  const text = new TextDecoder("utf-8").decode(bytes);
  const all = text.split(REPLACEMENT).length - 1;
  return { text, replaced: all === 0 ? 0 : all - countBytes(bytes, REPLACEMENT_BYTES) };
}

/** U+FFFD characters in a text: in a command-line argument, where Node put them for bytes that were not UTF-8. */
export function replacementCharacters(text: string): number {
  return text.split(REPLACEMENT).length - 1;
}
