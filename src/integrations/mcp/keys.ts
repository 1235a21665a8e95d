// The key file of `dki mcp --port`: which user each API key speaks for. Over HTTP the user comes
// from the key a request authenticated with, and from nothing the request says about itself.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";

/** Keys shorter than this are refused: a key is all that stands between a client and a user's memories. */
export const MIN_KEY_LENGTH = 16;

export class KeyTable {
  // By the key's hash: a lookup then takes the same time whatever prefix of a key a caller guessed.
  private readonly users = new Map<string, string>();

  constructor(entries: Record<string, string>) {
    for (const [key, user] of Object.entries(entries)) this.users.set(hash(key), user);
  }

  /** The user a key speaks for, or undefined for a key not in the file. */
  userFor(key: string): string | undefined {
    return this.users.get(hash(key));
  }

  get size(): number {
    return this.users.size;
  }
}

const hash = (key: string) => createHash("sha256").update(key, "utf8").digest("hex");

/** Reads and checks a key file: a JSON object of key → user id. Errors name the file and the entry. */
export function readKeyFile(path: string): KeyTable {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new Error(`--keys ${path}: cannot read it (${(e as Error).message})`);
  }
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    throw new Error(`--keys ${path} is not valid JSON: ${(e as Error).message}`);
  }
  return checkKeys(v, `--keys ${path}`);
}

export function checkKeys(v: unknown, what: string): KeyTable {
  if (v === null || typeof v !== "object" || Array.isArray(v)) throw new Error(`${what} must be a JSON object of API key → user id, e.g. {"<key>": "alice"}`);
  const entries = Object.entries(v as Record<string, unknown>);
  if (entries.length === 0) throw new Error(`${what} holds no keys: no client could connect`);
  const out: Record<string, string> = {};
  entries.forEach(([key, user], i) => {
    if (key.length < MIN_KEY_LENGTH || /\s/.test(key)) throw new Error(`${what}: key ${i + 1} must be at least ${MIN_KEY_LENGTH} characters without spaces (a long random string)`);
    if (typeof user !== "string" || user.trim() === "") throw new Error(`${what}: key ${i + 1} must map to a non-empty user id, got ${JSON.stringify(user)}`);
    out[key] = user;
  });
  return new KeyTable(out);
}
