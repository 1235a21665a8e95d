// The package's version, for --version and for what the MCP server reports to its clients.
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/**
 * The version in package.json, read when asked rather than copied in at build time so it cannot
 * go stale. Found by walking up from this file: it runs from src/cli under tests and from
 * dist/src/cli once built.
 */
export function packageVersion(): string {
  for (let dir = dirname(fileURLToPath(import.meta.url)); ; dir = dirname(dir)) {
    const file = join(dir, "package.json");
    if (existsSync(file)) return (JSON.parse(readFileSync(file, "utf8")) as { version: string }).version;
    if (dirname(dir) === dir) throw new Error("cannot find package.json to read the version from");
  }
}
