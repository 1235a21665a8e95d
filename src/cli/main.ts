// The `dki` command line. Its flags and JSON output are a stable surface: benchmarks and
// experiments script against them.
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
import { registerMcpCommand } from "./mcp.js";
import { packageVersion } from "./version.js";

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
registerMcpCommand(program);

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
