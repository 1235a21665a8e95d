// API keys: who a request is, and which memory users it may act for. The user a request names
// (OpenAI's `user`, a memory route's `user_id`) is only ever accepted after the key was checked
// against it here: caller-supplied fields never widen a key's scope.
//
// The key file is JSON:
//   { "keys": [ { "key": "…", "name": "team-a", "users": ["alice"], "userPrefix": "team-a/", "admin": false } ] }
// A key may act for the users listed and for every user id starting with userPrefix; an admin key
// for every user, and only an admin key may list users.
import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { ApiError } from "./errors.js";

/** Who made a request. */
export interface Principal {
  /** The key's name (for logs and metrics; never the key itself). */
  readonly name: string;
  readonly admin: boolean;
  mayActFor(userId: string): boolean;
  /** The user a request acts for when it names none: the key's one listed user, if it has exactly one. */
  readonly defaultUser: string | undefined;
}

/** With no key file: the server is on loopback, and anyone who can reach it acts for any user. */
export const OPEN_PRINCIPAL: Principal = { name: "open", admin: true, mayActFor: () => true, defaultUser: undefined };

/** A request to a public route (health, metrics) on a server with keys: it acts for no one. */
export const NO_ONE: Principal = { name: "public", admin: false, mayActFor: () => false, defaultUser: undefined };

interface KeyEntry {
  key: string;
  name?: string;
  users?: string[];
  userPrefix?: string;
  admin?: boolean;
}

/** Shortest key accepted: a guessable key is no key. */
export const MIN_KEY_LENGTH = 16;

const digest = (key: string) => createHash("sha256").update(key, "utf8").digest("hex");

/** The keys of a key file, looked up by their SHA-256 (the keys themselves are not kept). */
export class ApiKeys {
  private constructor(private readonly byDigest: ReadonlyMap<string, Principal>) {}

  get size(): number {
    return this.byDigest.size;
  }

  /** Reads and checks a key file; every problem is named with its place in the file. */
  static async load(file: string): Promise<ApiKeys> {
    let text: string;
    try {
      text = await readFile(file, "utf8");
    } catch (e) {
      throw new Error(`--api-key-file ${file}: ${(e as Error).message}`);
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (e) {
      throw new Error(`--api-key-file ${file} is not valid JSON: ${(e as Error).message}`);
    }
    return ApiKeys.fromJson(parsed, file);
  }

  static fromJson(parsed: unknown, where = "the key file"): ApiKeys {
    const fail = (path: string, what: string): never => {
      throw new Error(`${where}: ${path} ${what}`);
    };
    if (parsed === null || typeof parsed !== "object" || !Array.isArray((parsed as { keys?: unknown }).keys)) fail("the file", 'must be a JSON object { "keys": [ … ] }');
    const entries = (parsed as { keys: unknown[] }).keys;
    if (entries.length === 0) fail("keys", "is empty: give at least one key, or leave out --api-key-file");
    const byDigest = new Map<string, Principal>();
    entries.forEach((raw, i) => {
      const at = `keys[${i}]`;
      if (raw === null || typeof raw !== "object" || Array.isArray(raw)) fail(at, "must be an object");
      const e = raw as Record<string, unknown>;
      for (const k of Object.keys(e)) if (!["key", "name", "users", "userPrefix", "admin"].includes(k)) fail(`${at}.${k}`, "is not a known field (key, name, users, userPrefix, admin)");
      if (typeof e.key !== "string" || e.key.length < MIN_KEY_LENGTH) fail(`${at}.key`, `must be a string of at least ${MIN_KEY_LENGTH} characters`);
      if (e.name !== undefined && (typeof e.name !== "string" || e.name === "")) fail(`${at}.name`, "must be a non-empty string");
      if (e.users !== undefined && (!Array.isArray(e.users) || e.users.some((u) => typeof u !== "string" || u === ""))) fail(`${at}.users`, "must be an array of non-empty user ids");
      if (e.userPrefix !== undefined && (typeof e.userPrefix !== "string" || e.userPrefix === "")) fail(`${at}.userPrefix`, "must be a non-empty string");
      if (e.admin !== undefined && typeof e.admin !== "boolean") fail(`${at}.admin`, "must be true or false");
      const entry = e as unknown as KeyEntry;
      if (!entry.admin && (entry.users ?? []).length === 0 && entry.userPrefix === undefined) fail(at, "may act for no user: give users, userPrefix or admin: true");
      const d = digest(entry.key);
      if (byDigest.has(d)) fail(`${at}.key`, "repeats an earlier key");
      byDigest.set(d, principalOf(entry, i));
    });
    return new ApiKeys(byDigest);
  }

  /** The principal of a request's Authorization header (`Bearer KEY`); 401 when it has no valid key. */
  identify(authorization: string | undefined): Principal {
    if (authorization === undefined || authorization === "") throw new ApiError(401, "authentication_error", "no API key: send the header Authorization: Bearer YOUR_KEY", null, "missing_api_key");
    const m = /^Bearer\s+(\S+)\s*$/i.exec(authorization);
    if (!m) throw new ApiError(401, "authentication_error", "the Authorization header must be: Bearer YOUR_KEY", null, "invalid_api_key");
    const p = this.byDigest.get(digest(m[1]));
    if (p === undefined) throw new ApiError(401, "authentication_error", "the API key is not valid", null, "invalid_api_key");
    return p;
  }
}

function principalOf(e: KeyEntry, index: number): Principal {
  const users = new Set(e.users ?? []);
  const admin = e.admin === true;
  const prefix = e.userPrefix;
  return {
    name: e.name ?? `key ${index + 1}`,
    admin,
    mayActFor: (u) => admin || users.has(u) || (prefix !== undefined && u.startsWith(prefix) && u.length > prefix.length),
    defaultUser: users.size === 1 && prefix === undefined ? [...users][0] : undefined,
  };
}
