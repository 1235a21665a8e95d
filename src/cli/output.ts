// How the newer commands write: JSON with snake_case keys, and a long command's progress bar on
// stderr, only when stderr is a terminal (nothing is drawn into a pipe or a log file).
import cliProgress from "cli-progress";

export { snakeKeys } from "../util/snake-keys.js";

/** A bar with this format on a terminal's stderr; null when stderr is not a terminal. */
export function stderrBar(format: string): cliProgress.SingleBar | null {
  return process.stderr.isTTY ? new cliProgress.SingleBar({ stream: process.stderr, format, hideCursor: true, clearOnComplete: true }, cliProgress.Presets.shades_classic) : null;
}
