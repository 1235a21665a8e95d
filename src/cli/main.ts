// The `dki` command line. Its flags and JSON output are a stable surface: benchmarks and
// experiments script against them.
import { Command } from "commander";
import { registerGenerateCommands } from "./generate.js";
import { registerModelsCommand } from "./models.js";

const program = new Command();
program.name("dki").description("Dynamic KV Injection engine: generation, memory injection and model tools").showHelpAfterError();
registerGenerateCommands(program);
registerModelsCommand(program);

program.parseAsync(process.argv).catch((e: unknown) => {
  process.stderr.write(`dki: ${e instanceof Error ? e.message : String(e)}\n`);
  process.exitCode = 1;
});
