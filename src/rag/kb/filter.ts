// Metadata filters of knowledge-base search: the memory layer's `Filter` (eq, in, and, or), checked
// and evaluated by the memory layer's own code, plus one check of the knowledge base's: every
// field a filter names must be one the collection knows, so a typo in a field name is an error
// naming the field and the known ones, never a silently empty result.
import { DkiArgumentError } from "../../errors.js";
import { checkFilter as checkFilterShape, matches } from "../../memory/validate.js";
import type { Filter, Metadata } from "../../memory/types.js";

/** Fields every document has or may have; a collection also knows the custom keys its documents carry. */
export const DOCUMENT_FIELDS: readonly string[] = ["docId", "title", "docType", "category", "source", "chapter", "sessionId", "createdAt"];

function fieldsOf(filter: Filter, out: string[] = []): string[] {
  if ("eq" in filter) out.push(...Object.keys(filter.eq));
  else if ("in" in filter) out.push(...Object.keys(filter.in));
  else for (const f of "and" in filter ? filter.and : filter.or) fieldsOf(f, out);
  return out;
}

/** Throws a DkiArgumentError naming the first problem of a filter: its shape, an empty and/or, or an unknown field. */
export function checkFilter(filter: unknown, knownFields: ReadonlySet<string>): asserts filter is Filter {
  const f = checkFilterShape(filter);
  const empty = (x: Filter, path: string): void => {
    if ("and" in x || "or" in x) {
      const list = "and" in x ? x.and : x.or;
      if (list.length === 0) throw new DkiArgumentError(`${path}.${"and" in x ? "and" : "or"} must be a non-empty array of filters`);
      list.forEach((y, i) => empty(y, `${path}.${"and" in x ? "and" : "or"}[${i}]`));
    }
  };
  empty(f, "filter");
  for (const name of fieldsOf(f)) {
    if (!knownFields.has(name)) throw new DkiArgumentError(`filter: unknown field ${JSON.stringify(name)}; this collection's fields are ${[...knownFields].sort().join(", ")}`);
  }
}

/** Whether a document's fields satisfy a (checked) filter. */
export function matchesFilter(fields: Metadata, filter: Filter): boolean {
  return matches(filter, fields);
}
