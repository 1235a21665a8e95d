// Metadata filters of knowledge-base search (the memory layer's `Filter`: eq, in, and, or).
// A filter is checked against the collection's known fields before any search runs, so a typo in
// a field name is an error naming the field and the known ones, never a silently empty result.
import { DkiArgumentError } from "../../errors.js";
import type { Filter, JsonValue, Metadata } from "../../memory/types.js";

/** Fields every document has or may have; a collection also knows the custom keys its documents carry. */
export const DOCUMENT_FIELDS: readonly string[] = ["docId", "title", "docType", "category", "source", "chapter", "sessionId", "createdAt"];

function describe(v: unknown): string {
  return v === null ? "null" : Array.isArray(v) ? "an array" : typeof v;
}

function isScalar(v: unknown): v is string | number | boolean | null {
  return v === null || typeof v === "string" || typeof v === "number" || typeof v === "boolean";
}

/** Throws a DkiArgumentError naming the first problem of a filter (shape, operator, unknown field). */
export function checkFilter(filter: unknown, knownFields: ReadonlySet<string>, path = "filter"): asserts filter is Filter {
  if (filter === null || typeof filter !== "object" || Array.isArray(filter)) throw new DkiArgumentError(`${path} must be an object like {"eq": {"category": "faq"}}, got ${describe(filter)}`);
  const keys = Object.keys(filter);
  if (keys.length !== 1) throw new DkiArgumentError(`${path} must have exactly one operator (eq, in, and, or), got ${keys.length === 0 ? "none" : keys.join(", ")}`);
  const op = keys[0];
  const arg = (filter as Record<string, unknown>)[op];
  const field = (name: string): void => {
    if (!knownFields.has(name)) throw new DkiArgumentError(`${path}: unknown field ${JSON.stringify(name)}; this collection's fields are ${[...knownFields].sort().join(", ")}`);
  };
  switch (op) {
    case "eq":
    case "in": {
      if (arg === null || typeof arg !== "object" || Array.isArray(arg) || Object.keys(arg).length === 0) throw new DkiArgumentError(`${path}.${op} must be a non-empty object of field: ${op === "eq" ? "value" : "[values]"}`);
      for (const [k, v] of Object.entries(arg)) {
        field(k);
        if (op === "eq" && !isScalar(v)) throw new DkiArgumentError(`${path}.eq.${k} must be a string, number, boolean or null, got ${describe(v)}`);
        if (op === "in" && (!Array.isArray(v) || !v.every(isScalar))) throw new DkiArgumentError(`${path}.in.${k} must be an array of strings, numbers, booleans or nulls`);
      }
      return;
    }
    case "and":
    case "or":
      if (!Array.isArray(arg) || arg.length === 0) throw new DkiArgumentError(`${path}.${op} must be a non-empty array of filters`);
      arg.forEach((f, i) => checkFilter(f, knownFields, `${path}.${op}[${i}]`));
      return;
    default:
      throw new DkiArgumentError(`${path}: unknown operator ${JSON.stringify(op)}; use eq, in, and, or`);
  }
}

/** A field equals a value; a field holding an array matches when one of its elements does. */
function fieldMatches(actual: JsonValue | undefined, want: JsonValue): boolean {
  if (actual === undefined) return false;
  if (Array.isArray(actual)) return actual.some((a) => a === want);
  return actual === want;
}

/** Whether a document's fields satisfy a filter (checked beforehand by checkFilter). */
export function matchesFilter(fields: Metadata, filter: Filter): boolean {
  if ("eq" in filter) return Object.entries(filter.eq).every(([k, v]) => fieldMatches(fields[k], v));
  if ("in" in filter) return Object.entries(filter.in).every(([k, vs]) => vs.some((v) => fieldMatches(fields[k], v)));
  if ("and" in filter) return filter.and.every((f) => matchesFilter(fields, f));
  return filter.or.some((f) => matchesFilter(fields, f));
}
