// The JSON the CLI prints and the server answers with: snake_case keys, as OpenAI's API and the
// rest of the command line's output use.

/** camelCase keys → snake_case, recursively; keys without a lower-case letter ("L1") stay. */
export function snakeKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(snakeKeys);
  if (v === null || typeof v !== "object") return typeof v === "number" && !Number.isInteger(v) ? Number(v.toFixed(4)) : v;
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v)) out[/[a-z]/.test(k) ? k.replace(/([a-z0-9])([A-Z])/g, "$1_$2").toLowerCase() : k] = snakeKeys(x);
  return out;
}
