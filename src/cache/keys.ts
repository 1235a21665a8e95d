// Cache keys: one SHA-256 over everything that determines a block's content and who may see it.
// A changed memory (tokens, encoding prefix, position), another model, another compute dtype or
// another user gives another key, so an old entry can never be served for a new request, and a
// request can only ever name blocks cached for its own user.
import { createHash } from "node:crypto";
import { DkiArgumentError } from "../errors.js";

export interface KeyParts {
  userId: string;
  /** Fingerprint of the model that computes and consumes the block (hex). */
  fingerprint: string;
  /** Token ids of the block. */
  tokens: readonly number[];
  /** Position of the block's first token. */
  startPos: number;
  /** Tokens encoded before the block but not kept (BOS + system prompt): part of its identity. */
  prefix: readonly number[];
  /** Element type of the block the cache hands out (its compute dtype, "f32" on the CPU backend). */
  dtype: string;
}

/** Bumped if the encoding below ever changes: old keys then simply stop matching. */
const DOMAIN = "dki-kv-cache-key/v1";

/**
 * Hex SHA-256 of the parts. Every field is length-prefixed (strings as UTF-8 bytes, token lists
 * as little-endian int32), so no two different part lists encode to the same byte string.
 */
export function blockKey(p: KeyParts): string {
  const h = createHash("sha256");
  h.update(DOMAIN);
  for (const s of [p.userId, p.fingerprint, p.dtype]) str(h, s);
  const pos = Buffer.alloc(4);
  pos.writeInt32LE(p.startPos);
  h.update(pos);
  ints(h, p.prefix);
  ints(h, p.tokens);
  return h.digest("hex");
}

/**
 * A short, stable, non-reversible name for a user, used as the L3 folder of that user's entries
 * (so clear(userId) can find them after a restart without storing the id itself on disk).
 */
export function userHash(userId: string): string {
  return createHash("sha256").update("dki-kv-cache-user/v1\0").update(userId, "utf8").digest("hex").slice(0, 32);
}

export const KEY_PATTERN = /^[0-9a-f]{64}$/;
export const USER_HASH_PATTERN = /^[0-9a-f]{32}$/;

function str(h: ReturnType<typeof createHash>, s: string): void {
  const b = Buffer.from(s, "utf8");
  const n = Buffer.alloc(4);
  n.writeUInt32LE(b.length);
  h.update(n);
  h.update(b);
}

function ints(h: ReturnType<typeof createHash>, xs: readonly number[]): void {
  const b = Buffer.alloc(4 + 4 * xs.length);
  b.writeUInt32LE(xs.length, 0);
  for (let i = 0; i < xs.length; i++) b.writeInt32LE(xs[i], 4 + 4 * i);
  h.update(b);
}

/** Throws a DkiArgumentError unless `xs` is an array of int32 token ids (≥ 0). */
export function checkTokenList(name: string, xs: unknown, allowEmpty: boolean): asserts xs is number[] {
  if (!Array.isArray(xs)) throw new DkiArgumentError(`${name} must be an array of token ids`);
  if (!allowEmpty && xs.length === 0) throw new DkiArgumentError(`${name} is empty`);
  for (const t of xs) {
    if (!Number.isInteger(t) || t < 0 || t > 0x7fffffff) throw new DkiArgumentError(`${name} contains ${String(t)}, which is not a token id`);
  }
}
