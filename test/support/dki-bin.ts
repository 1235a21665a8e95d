// Runs the `dki` command line as a user runs it: node bin/dki.js, in a child process (built by
// npm test's tsc step; run `npx tsc -p tsconfig.json` first when running a test file alone).
// support/models-cli.ts runs `dki models` in-process instead.
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { expect } from "vitest";
import { repoRoot } from "./paths.js";

const run = promisify(execFile);

/** The script the `dki` command runs. */
export const dkiBin = join(repoRoot, "bin", "dki.js");

/** `dki ...args`: its stdout and stderr; rejects when it exits with a non-zero status. */
export function dki(args: string[]): Promise<{ stdout: string; stderr: string }> {
  return run(process.execPath, [dkiBin, ...args], { maxBuffer: 64 * 1024 * 1024 });
}

/** The stderr of `dki ...args`, which must fail with exit status 1. */
export async function dkiFails(args: string[]): Promise<string> {
  try {
    await dki(args);
  } catch (e) {
    const { stderr, code } = e as { stderr: string; code: number };
    expect(code).toBe(1);
    return stderr;
  }
  throw new Error(`dki ${args.join(" ")} succeeded but should have failed`);
}
