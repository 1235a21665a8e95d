// `dki recall`: Recall v4 without generating. Which of the user's past messages a turn with this
// query would get (id, session, score, signals, summarised or not) and the suffix itself, as text
// or JSON with snake_case keys. The model gives the tokenizer the budget is counted with.
import type { Command } from "commander";
import { DKISystem } from "../dki/index.js";
import type { RecallScope } from "../recall/config.js";
import { choiceOption, EMBEDDER_HELP, embedderOption, intOption, snippet } from "./options.js";
import { snakeKeys } from "./output.js";
import { checkModelPath, checkStoreExists } from "./paths.js";

interface RecallFlags {
  model: string;
  data: string;
  embedder?: string;
  user: string;
  session?: string;
  query: string;
  contextSize?: number;
  scope: RecallScope;
  format: "text" | "json";
}

async function recall(flags: RecallFlags): Promise<void> {
  if (flags.user.trim() === "") throw new Error("--user must not be empty");
  if (flags.query.trim() === "") throw new Error("--query must not be empty");
  if (flags.scope === "session" && flags.session === undefined) throw new Error("--scope session needs --session (or use --scope user)");
  checkStoreExists(flags.data);
  await checkModelPath(flags.model, "--model");
  const embedder = await embedderOption(flags.embedder);
  const system = await DKISystem.open({ model: flags.model, loadOptions: { contextSize: flags.contextSize }, dataDir: flags.data, embedder, config: { recall: { enabled: true, scope: flags.scope } } });
  try {
    // A session id is needed by the API; with --scope user and no --session none is filtered on.
    const out = await system.recall(flags.query, { userId: flags.user, sessionId: flags.session ?? "-", contextSize: flags.contextSize });
    if (flags.format === "json") {
      process.stdout.write(`${JSON.stringify(snakeKeys({ query: flags.query, keywords: out.recall.keywords, reference: out.recall.reference, searched: out.recall.searched, messages: out.included, suffix: out.suffix }), null, 2)}\n`);
      return;
    }
    const s = out.suffix;
    process.stdout.write(`recalled ${out.included.length} of ${out.recall.searched} messages (${s.summaryCount} summarised), ${s.tokens} of ${s.available} tokens; keywords: ${out.recall.keywords.join(", ") || "-"}${out.recall.reference ? `; reference "${out.recall.reference.phrase}" (${out.recall.reference.kind})` : ""}\n`);
    for (const m of out.included) {
      const sig = m.signals;
      process.stdout.write(`${m.id}  ${m.role.padEnd(9)} ${m.score.toFixed(3)}  kw ${sig.keyword.toFixed(2)} bm25 ${sig.bm25.toFixed(2)} vec ${sig.vector.toFixed(2)} rec ${sig.recency.toFixed(2)}  ${m.reason}${m.summarized ? " summarised" : ""}  ${snippet(m.content, 60)}\n`);
    }
    process.stdout.write(`\n${s.text}\n`);
  } finally {
    await system.close();
  }
}

export function registerRecallCommand(program: Command): void {
  program
    .command("recall")
    .description("Recall v4 without generating: the past messages a turn with this query would recall, and its history suffix")
    .requiredOption("-m, --model <path>", "the model (its tokenizer counts the budget; its context window is the default --context-size)")
    .requiredOption("--data <dir>", "the memory store's folder")
    .option("--embedder <dir>", EMBEDDER_HELP)
    .requiredOption("--user <id>", "user id")
    .option("--session <id>", "the session whose messages are searched (with --scope session)")
    .requiredOption("-q, --query <text>", "the query")
    .option("--context-size <n>", "context window in tokens the suffix is budgeted from (default: the model's)", intOption("--context-size", 1))
    .option("--scope <scope>", "session (that session's messages) or user (all the user's sessions)", choiceOption("--scope", ["session", "user"] as const), "session")
    .option("--format <format>", "text or json", choiceOption("--format", ["text", "json"] as const), "text")
    .action((flags: RecallFlags) => recall(flags));
}
