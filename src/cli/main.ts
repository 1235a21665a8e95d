// The `dki` command line. Its flags and JSON output are a stable surface: benchmarks and
// experiments script against them.
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Command } from "commander";
import { registerGenerateCommands } from "./generate.js";
import { registerModelsCommand } from "./models.js";
import { registerChatCommand } from "./chat.js";
import { registerKbCommand } from "./kb.js";
import { registerRagCommand } from "./rag.js";
import { registerMemoryCommands } from "./memory.js";
import { registerEval } from "./eval.js";
import { registerEvalSynth } from "./eval-synth.js";
import { registerRecallCommand } from "./recall.js";
import { registerServeCommand } from "./serve.js";

/**
 * The version in package.json, read when asked rather than copied in at build time so it cannot
 * go stale. Found by walking up from this file: it runs from src/cli under tests and from
 * dist/src/cli once built.
 */
function packageVersion(): string {
  for (let dir = dirname(fileURLToPath(import.meta.url)); ; dir = dirname(dir)) {
    const file = join(dir, "package.json");
    if (existsSync(file)) return (JSON.parse(readFileSync(file, "utf8")) as { version: string }).version;
    if (dirname(dir) === dir) throw new Error("cannot find package.json to read the version from");
  }
}

const program = new Command();
program
  .name("dki")
  .version(packageVersion(), "-V, --version", "print the version")
  .description("Dynamic KV Injection engine: generation, memory injection and model tools")
  // Usage errors are one line, like every other error: "dki: unknown option '--x' (see --help)".
  .configureOutput({ outputError: (text, write) => write(`dki: ${text.trim().replace(/^error: /, "")} (see --help)\n`) });
registerGenerateCommands(program);
registerModelsCommand(program);
registerChatCommand(program);
registerKbCommand(program);
registerRagCommand(program);
registerMemoryCommands(program);
registerEvalSynth(registerEval(program));
registerRecallCommand(program);
registerServeCommand(program);

// `dki generate ... | head` closes stdout early: that ends the command, quietly. Any other
// write error (a full disk) ends it too, as one line: nothing more can be written.
process.stdout.on("error", (e: NodeJS.ErrnoException) => {
  if (e.code === "EPIPE") process.exit(0);
  process.stderr.write(`dki: cannot write the output: ${e.message}\n`);
  process.exit(1);
});

program.parseAsync(process.argv).catch((e: unknown) => {
  process.stderr.write(`dki: ${e instanceof Error ? e.message : String(e)}\n`);
  process.exitCode = 1;
});
