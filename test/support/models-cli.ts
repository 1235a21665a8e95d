// Runs `dki models ...` in-process through commander, capturing output and the exit status
// (commander's own usage errors throw under exitOverride and count as status 1).
import { Command } from "commander";
import { vi } from "vitest";
import { registerModelsCommand } from "../../src/cli/models.js";

export async function dki(...args: string[]): Promise<{ stdout: string; stderr: string; exitCode: number }> {
  let stdout = "";
  let stderr = "";
  const out = vi.spyOn(process.stdout, "write").mockImplementation((s: string | Uint8Array) => ((stdout += String(s)), true));
  const err = vi.spyOn(process.stderr, "write").mockImplementation((s: string | Uint8Array) => ((stderr += String(s)), true));
  const program = new Command().name("dki").exitOverride();
  registerModelsCommand(program);
  let exitCode = 0;
  try {
    await program.parseAsync(["node", "dki", ...args]);
    exitCode = Number(process.exitCode ?? 0);
  } catch {
    exitCode = 1; // commander's own usage errors (exitOverride throws instead of exiting)
  } finally {
    out.mockRestore();
    err.mockRestore();
    process.exitCode = undefined;
  }
  return { stdout, stderr, exitCode };
}
