// How the newer commands write: JSON with snake_case keys, and a long command's progress bar on
// stderr, only when stderr is a terminal (nothing is drawn into a pipe or a log file).
import cliProgress from "cli-progress";

/** camelCase keys → snake_case, recursively; keys without a lower-case letter ("L1") stay. */
export function snakeKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(snakeKeys);
  if (v === null || typeof v !== "object") return typeof v === "number" && !Number.isInteger(v) ? Number(v.toFixed(4)) : v;
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v)) out[/[a-z]/.test(k) ? k.replace(/([a-z0-9])([A-Z])/g, "$1_$2").toLowerCase() : k] = snakeKeys(x);
  return out;
}

/** A bar with this format on a terminal's stderr; null when stderr is not a terminal. */
export function stderrBar(format: string): cliProgress.SingleBar | null {
  return process.stderr.isTTY ? new cliProgress.SingleBar({ stream: process.stderr, format, hideCursor: true, clearOnComplete: true }, cliProgress.Presets.shades_classic) : null;
}
