// Checks of everything a caller hands the memory store, each failing with a DkiArgumentError that
// names the argument (and, inside metadata or a filter, the path to the bad value).
import { DkiArgumentError } from "../errors.js";
import type { Filter, JsonValue, Metadata, Role } from "./types.js";

// In UTF-8 bytes: ids are parts of LMDB keys, which are bounded (1978 bytes here), and a key can
// hold three of them (user, session, turn).
const MAX_ID_BYTES = 256;
const MAX_METADATA_BYTES = 64 * 1024;
const MAX_DEPTH = 32;
// Ids become parts of LMDB keys and appear in CLI output: no control characters (which would also
// let one id be a prefix-with-separator of another).
const CONTROL = /\p{Cc}/u;

/** A user, session or record id: a non-empty string of at most 256 bytes (UTF-8) without control characters. */
export function checkId(name: string, value: unknown): string {
  if (typeof value !== "string" || value === "") throw new DkiArgumentError(`${name} must be a non-empty string, got ${describe(value)}`);
  const bytes = Buffer.byteLength(value, "utf8");
  if (bytes > MAX_ID_BYTES) throw new DkiArgumentError(`${name} is ${bytes} bytes long in UTF-8; at most ${MAX_ID_BYTES} are allowed`);
  if (CONTROL.test(value)) throw new DkiArgumentError(`${name} ${JSON.stringify(value)} contains a control character`);
  return value;
}

export function checkOptionalId(name: string, value: unknown): string | undefined {
  return value === undefined ? undefined : checkId(name, value);
}

/** A text to store or search: not empty or blank, at most `max` characters. */
export function checkText(name: string, value: unknown, max: number): string {
  if (typeof value !== "string") throw new DkiArgumentError(`${name} must be a string, got ${describe(value)}`);
  if (value.trim() === "") throw new DkiArgumentError(`${name} is empty`);
  if (value.length > max) throw new DkiArgumentError(`${name} is ${value.length} characters long; the maximum is ${max} (maxTextChars)`);
  return value;
}

export function checkRole(name: string, value: unknown): Role {
  if (value !== "user" && value !== "assistant" && value !== "system") throw new DkiArgumentError(`${name} must be "user", "assistant" or "system", got ${describe(value)}`);
  return value;
}

export function checkInteger(name: string, value: unknown, min: number, max: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) throw new DkiArgumentError(`${name} must be an integer in [${min}, ${max}], got ${describe(value)}`);
  return value;
}

export function checkNumber(name: string, value: unknown, min: number, max: number): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value < min || value > max) throw new DkiArgumentError(`${name} must be a number in [${min}, ${max}], got ${describe(value)}`);
  return value;
}

/** Metadata: a plain JSON object (finite numbers, no undefined, functions, class instances or cycles), at most 64 KiB as JSON. */
export function checkMetadata(value: unknown, name = "metadata"): Metadata {
  if (value === undefined) return {};
  if (!isPlainObject(value)) throw new DkiArgumentError(`${name} must be a JSON object, got ${describe(value)}`);
  checkJson(value, name, 0, new Set());
  const bytes = Buffer.byteLength(JSON.stringify(value));
  if (bytes > MAX_METADATA_BYTES) throw new DkiArgumentError(`${name} is ${bytes} bytes as JSON; at most ${MAX_METADATA_BYTES} are allowed`);
  // A copy, so a caller changing its object later cannot change what was validated.
  return JSON.parse(JSON.stringify(value)) as Metadata;
}

function checkJson(v: unknown, path: string, depth: number, seen: Set<object>): asserts v is JsonValue {
  if (depth > MAX_DEPTH) throw new DkiArgumentError(`${path}: nested more than ${MAX_DEPTH} levels deep`);
  if (v === null || typeof v === "string" || typeof v === "boolean") return;
  if (typeof v === "number") {
    if (!Number.isFinite(v)) throw new DkiArgumentError(`${path} is ${v}, which JSON cannot hold`);
    return;
  }
  if (typeof v !== "object") throw new DkiArgumentError(`${path} is ${describe(v)}, not a JSON value`);
  if (seen.has(v)) throw new DkiArgumentError(`${path} refers back to an enclosing object (a cycle), which JSON cannot hold`);
  seen.add(v);
  if (Array.isArray(v)) v.forEach((x, i) => checkJson(x, `${path}[${i}]`, depth + 1, seen));
  else if (isPlainObject(v)) for (const [k, x] of Object.entries(v)) checkJson(x, `${path}.${k}`, depth + 1, seen);
  else throw new DkiArgumentError(`${path} is a ${v.constructor?.name ?? "non-plain object"}, not a JSON value`);
  seen.delete(v);
}

/** A metadata filter (see types.ts), checked so a typo is an error rather than a filter that matches nothing. */
export function checkFilter(value: unknown, path = "filter"): Filter {
  if (!isPlainObject(value)) throw new DkiArgumentError(`${path} must be an object like { eq: { key: value } }, got ${describe(value)}`);
  const keys = Object.keys(value);
  if (keys.length !== 1) throw new DkiArgumentError(`${path} must have exactly one of eq, in, and, or; it has ${keys.length === 0 ? "none" : keys.join(", ")}`);
  const [op] = keys;
  const arg = value[op];
  if (op === "eq" || op === "in") {
    if (!isPlainObject(arg)) throw new DkiArgumentError(`${path}.${op} must be an object of metadata keys, got ${describe(arg)}`);
    for (const [k, x] of Object.entries(arg)) {
      if (op === "in" && !Array.isArray(x)) throw new DkiArgumentError(`${path}.in.${k} must be an array of values, got ${describe(x)}`);
      checkJson(x, `${path}.${op}.${k}`, 0, new Set());
    }
    return value as Filter;
  }
  if (op === "and" || op === "or") {
    if (!Array.isArray(arg)) throw new DkiArgumentError(`${path}.${op} must be an array of filters, got ${describe(arg)}`);
    arg.forEach((f, i) => checkFilter(f, `${path}.${op}[${i}]`));
    return value as Filter;
  }
  throw new DkiArgumentError(`${path}: unknown operator ${JSON.stringify(op)} (expected eq, in, and or or)`);
}

/** Whether metadata passes a (checked) filter. Values compare as JSON, so { a: [1] } equals [1]. */
export function matches(filter: Filter, metadata: Metadata): boolean {
  if ("eq" in filter) return Object.entries(filter.eq).every(([k, v]) => k in metadata && sameJson(metadata[k], v));
  if ("in" in filter) return Object.entries(filter.in).every(([k, vs]) => k in metadata && vs.some((v) => sameJson(metadata[k], v)));
  if ("and" in filter) return filter.and.every((f) => matches(f, metadata));
  return filter.or.some((f) => matches(f, metadata));
}

function sameJson(a: JsonValue, b: JsonValue): boolean {
  return a === b || (typeof a === "object" && typeof b === "object" && JSON.stringify(a) === JSON.stringify(b));
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (typeof v !== "object" || v === null || Array.isArray(v)) return false;
  const proto = Object.getPrototypeOf(v) as unknown;
  return proto === Object.prototype || proto === null;
}

function describe(v: unknown): string {
  if (v === undefined) return "undefined";
  if (v === null) return "null";
  if (typeof v === "string") return JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}…` : v);
  if (typeof v === "number" || typeof v === "boolean") return String(v);
  if (Array.isArray(v)) return "an array";
  return `a ${typeof v}`;
}
