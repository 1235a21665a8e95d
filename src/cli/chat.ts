// `dki chat`: the DKI system from the command line. With --query it answers once (text streamed,
// or the whole DKIResponse as JSON with snake_case keys, like the other commands' JSON); without
// it, an interactive session that streams each answer and shows, per turn, what was injected and
// why. Ctrl-C during an answer cancels that turn only.
import type { Command } from "commander";
import { DKISystem, type ChatOptions, type DKIResponse } from "../dki/index.js";
import { choiceOption, embedderOption, numberOption, rerankDepthOption, rerankModelOption, withMemoryRerank } from "./options.js";
import { checkModelPath } from "./paths.js";
import { ragCommand } from "./rag.js";
import { abortedSummary, answerOnce, baseTurnOptions, chatLoop, leftOutSummary, loadOptions, memoryLabel, outputOptions, prepareTurns, turnCommandOptions, turnConfig, type TurnControl, type TurnFlags } from "./turn.js";

/** `--mode rag`: the same turn through the RAG baseline (dki rag has its knowledge-base options). */
function chatAsRag(flags: ChatFlags): Promise<void> {
  if (flags.alpha !== undefined) throw new Error("--alpha applies to --mode dki only");
  if (flags.relevanceThreshold !== undefined) throw new Error("--relevance-threshold applies to --mode dki only");
  if (flags.recall) throw new Error("--recall applies to --mode dki only");
  // chat's --rerank-model routes the memories, in both modes; dki rag's reranks a collection's chunks.
  return ragCommand({ ...flags, rerankModel: undefined, rerankDepth: undefined, memoryRerank: { model: flags.rerankModel, depth: flags.rerankDepth } });
}

interface ChatFlags extends TurnFlags {
  alpha?: number;
  recall?: boolean;
  relevanceThreshold?: number;
  rerankModel?: string;
  rerankDepth?: number;
}

/** One line on what the turn injected, why and from where, and the session it went to. */
export function turnSummary(r: DKIResponse): string {
  const mems = r.memoriesUsed.length === 0 ? "none" : r.memoriesUsed.map(memoryLabel).join(", ");
  const tiers = r.cache.tiers.length === 0 ? "nothing injected" : r.cache.tiers.map((b) => `${b.kind === "preferences" ? "preferences" : b.id} ${b.tier}`).join(", ");
  const alpha = r.memoriesUsed.length > 0 ? r.gating.alpha.toFixed(2) : "-";
  const rv = r.metadata.recallV4;
  const recalled = rv ? ` | recalled ${r.metadata.hybridInjection.historyMessages.length} messages (${rv.summaryCount} summarised), fact calls ${rv.rounds}` : "";
  return `[memories: ${mems}${leftOutSummary(r.metadata.memoriesLeftOut)} | α ${alpha} | gate: ${r.gating.reason}${recalled} | cache: ${tiers} | ttft ${r.latency.ttftMs.toFixed(0)} ms, ${r.outputTokens} tokens${abortedSummary(r)} | session ${r.metadata.sessionId}]`;
}

async function chat(flags: ChatFlags): Promise<void> {
  if (flags.alpha !== undefined && !flags.memory) throw new Error("give at most one of --alpha and --no-memory");
  if (flags.relevanceThreshold !== undefined && (flags.alpha !== undefined || !flags.memory)) throw new Error("--relevance-threshold is the gate's: it does nothing with --alpha or --no-memory");
  const session = await prepareTurns(flags, "chat");
  const config = await turnConfig(flags, { ...(flags.relevanceThreshold === undefined ? {} : { gating: { relevanceThreshold: flags.relevanceThreshold } }), ...(flags.recall ? { recall: { enabled: true } } : {}) });
  await checkModelPath(flags.model, "--model");
  const embedder = await embedderOption(flags.embedder);
  await withMemoryRerank(flags.rerankModel, flags.rerankDepth, async (memoryRerank) => {
    const system = await DKISystem.open({ model: flags.model, loadOptions: loadOptions(flags), dataDir: flags.data, cacheDir: flags.cache, embedder, config, memoryRerank });
    try {
      const turnOptions = (c: TurnControl): ChatOptions => ({ ...baseTurnOptions(flags, session, c), forceAlpha: flags.alpha, allowInjection: flags.memory });
      if (flags.query !== undefined) {
        const query = flags.query;
        await answerOnce(flags.format, (c) => system.chat(query, turnOptions(c)), (r) => [turnSummary(r)]);
        return;
      }
      await chatLoop({
        prompt: "> ",
        greeting: `chatting as ${flags.user} in session ${session}; /memories, /forget ID, /remember TEXT, /pref [TYPE TEXT], /exit`,
        ask: async (line, c) => turnSummary(await system.chat(line, turnOptions(c))),
        command: (line, say) => sessionCommand(system, flags.user, session, line, say),
      });
    } finally {
      await system.close();
    }
  });
}

/** The interactive session's commands (a line starting with "/"); false: the line is a query. */
async function sessionCommand(system: DKISystem, user: string, session: string, line: string, say: (s: string) => void): Promise<boolean> {
  if (!line.startsWith("/")) return false;
  if (line === "/memories") {
    const all = await system.memories.getAll({ userId: user });
    say(all.length === 0 ? "(no memories)" : all.map((m) => `${m.id}  ${m.text}`).join("\n"));
  } else if (line.startsWith("/forget")) {
    const id = line.slice("/forget".length).trim();
    if (!id) say("usage: /forget ID");
    else {
      await system.memories.delete(id, { userId: user });
      say(`forgot ${id}`);
    }
  } else if (line.startsWith("/remember")) {
    const text = line.slice("/remember".length).trim();
    if (!text) say("usage: /remember TEXT");
    else say(`remembered ${(await system.memories.add(text, { userId: user, sessionId: session })).map((m) => m.id).join(", ")}`);
  } else if (line.startsWith("/pref")) {
    const rest = line.slice("/pref".length).trim();
    if (rest === "") {
      const prefs = await system.preferences.list({ userId: user });
      say(prefs.length === 0 ? "(no preferences)" : prefs.map((p) => `${p.id}  [${p.type}] ${p.text} (priority ${p.priority})`).join("\n"));
    } else {
      const space = rest.indexOf(" ");
      if (space < 0) say("usage: /pref TYPE TEXT");
      else say(`added preference ${(await system.preferences.add(rest.slice(space + 1).trim(), { userId: user, type: rest.slice(0, space) })).id}`);
    }
  } else {
    say(`unknown command ${line.split(/\s/)[0]}; /memories, /forget ID, /remember TEXT, /pref [TYPE TEXT], /exit`);
  }
  return true;
}

export function registerChatCommand(program: Command): void {
  outputOptions(
    turnCommandOptions(program.command("chat").description("chat through the DKI system: memories and preferences injected as K/V, history as text"), "the K/V cache's folder (default <data>.kv-cache, beside the store)")
      .option("--alpha <a>", "force α for the memories routed to the turn, in [0, 1]", numberOption("--alpha", { min: 0, max: 1 }))
      .option("--no-memory", "inject nothing (no memories, no preferences)")
      .option("--relevance-threshold <t>", "the gate's τ, in [0, 1] (default: the embedder's calibrated one, 0.162 for the hashing embedder; 0.25 for an ONNX model)", numberOption("--relevance-threshold", { min: 0, max: 1 })),
  )
    .option("--recall", "history through Recall v4 (recall.enabled): the messages that matter for the query, summaries with trace ids, fact calls")
    .option(...rerankModelOption)
    .option(...rerankDepthOption("max memories"))
    .option("--mode <mode>", "dki (memory as K/V) or rag (memory as prompt text: the RAG baseline, see dki rag)", choiceOption("--mode", ["dki", "rag"] as const), "dki")
    .action((flags: ChatFlags & { mode: "dki" | "rag" }) => (flags.mode === "rag" ? chatAsRag(flags) : chat(flags)));
}
