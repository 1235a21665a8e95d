// Runs the `dki` command line as a user runs it: node bin/dki.js, in a child process (built by
// npm test's tsc step; run `npx tsc -p tsconfig.json` first when running a test file alone).
// support/models-cli.ts runs `dki models` in-process instead.
import { execFile, spawn } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { expect, test } from "vitest";
import { repoRoot } from "./paths.js";

const run = promisify(execFile);

/** The script the `dki` command runs. */
export const dkiBin = join(repoRoot, "bin", "dki.js");

/** `dki ...args` (in `cwd`, default this process's): its stdout and stderr; rejects when it exits with a non-zero status. */
export function dki(args: string[], o: { cwd?: string } = {}): Promise<{ stdout: string; stderr: string }> {
  return run(process.execPath, [dkiBin, ...args], { maxBuffer: 64 * 1024 * 1024, cwd: o.cwd });
}

export interface DkiRun {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/**
 * Starts `dki ...args` with `input` on its stdin (closed after it; none: an empty stdin);
 * `onStdout` sees each chunk of its output with the child, to signal it.
 */
export function dkiSpawn(args: string[], o: { input?: string | Buffer; onStdout?: (chunk: string, child: ReturnType<typeof spawn>) => void } = {}) {
  const child = spawn(process.execPath, [dkiBin, ...args], { stdio: ["pipe", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d: Buffer) => {
    stdout += d.toString();
    o.onStdout?.(d.toString(), child);
  });
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  child.stdin.end(o.input ?? "");
  const done = new Promise<DkiRun>((resolve) => child.on("close", (code, signal) => resolve({ code, signal, stdout, stderr })));
  return { child, done };
}

/**
 * `dki ...args` (a one-shot turn that would write for long) stopped by a real SIGINT. Text
 * (`json` false): sent at its first output, once the answer streams. JSON prints nothing before
 * the end, so it is sent after a delay, longer each try, until a run was stopped while answering
 * (not killed during the model load, where Node's default applies, nor stopped before the first
 * token). Returns that run.
 */
export async function dkiInterrupted(args: string[], json: boolean): Promise<DkiRun> {
  if (!json) {
    let sent = false;
    return dkiSpawn(args, {
      onStdout: (_chunk, child) => {
        if (!sent) child.kill("SIGINT");
        sent = true;
      },
    }).done;
  }
  for (const delayMs of [500, 1000, 2000, 4000, 8000]) {
    const { child, done } = dkiSpawn(args);
    setTimeout(() => child.kill("SIGINT"), delayMs);
    const r = await done;
    if (r.signal === "SIGINT") continue;
    if (r.stderr === "dki: interrupted before the first token\n") {
      expect(r.code).toBe(130);
      expect(r.stdout).toBe("");
      continue;
    }
    return r;
  }
  throw new Error("the answer never started within 8 s");
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

/**
 * The two Ctrl-C checks of a one-shot turn (`chat -q`, `rag -q`): a real SIGINT mid-answer gives
 * the answer so far with its summary saying aborted, or (JSON) the response so far, and exit 130.
 * `endless`: the command's arguments for an answer only Ctrl-C ends.
 */
export function ctrlCTests(command: "chat" | "rag", endless: () => string[]): void {
  test(`Ctrl-C (a real SIGINT) in ${command} -q: the answer so far, its summary saying aborted, exit 130`, async () => {
    const r = await dkiInterrupted(endless(), false);
    expect(r.code, r.stderr).toBe(130);
    expect(r.stdout.length).toBeGreaterThan(1);
    expect(r.stdout.endsWith("\n")).toBe(true);
    expect(r.stderr).toMatch(new RegExp(`^\\[memories: .* \\| ttft \\d+ ms, \\d+ tokens \\| aborted \\| session ${command}-\\S+\\]\\n$`));
  });

  test(`Ctrl-C (a real SIGINT) in ${command} -q --format json: the response so far (finish_reason aborted), exit 130`, async () => {
    const r = await dkiInterrupted([...endless(), "--format", "json"], true);
    expect(r.code, r.stderr).toBe(130);
    expect(r.stderr).toBe("");
    const j = JSON.parse(r.stdout);
    expect(j.finish_reason).toBe("aborted");
    expect(j.output_tokens).toBeGreaterThan(0);
    expect(j.text.length).toBeGreaterThan(0);
  });
}
