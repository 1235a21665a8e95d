// The `dki` command line. Its flags and JSON output are a stable surface: benchmarks and
// experiments script against them.
import { Command } from "commander";
import { registerGenerateCommands } from "./generate.js";
import { registerModelsCommand } from "./models.js";

const program = new Command();
program
  .name("dki")
  .description("Dynamic KV Injection engine: generation, memory injection and model tools")
  // Usage errors are one line, like every other error: "dki: unknown option '--x' (see --help)".
  .configureOutput({ outputError: (text, write) => write(`dki: ${text.trim().replace(/^error: /, "")} (see --help)\n`) });
registerGenerateCommands(program);
registerModelsCommand(program);

// `dki generate ... | head` closes stdout early: that ends the command, quietly.
process.stdout.on("error", (e: NodeJS.ErrnoException) => {
  if (e.code === "EPIPE") process.exit(0);
  throw e;
});

program.parseAsync(process.argv).catch((e: unknown) => {
  process.stderr.write(`dki: ${e instanceof Error ? e.message : String(e)}\n`);
  process.exitCode = 1;
});
