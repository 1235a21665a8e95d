// The RAG prompt: retrieved context and session history as prompt text, inside the model's
// context window, with the priority allocation of the original RAG baseline (seed 000 §3.2, §5):
//   1. the fixed part (system prompt, query, footer) is always kept;
//   2. retrieved context takes at most `contextShare` (50%) of what remains after it;
//   3. history fills the rest, newest first, dropping the oldest;
//   4. `reserveForGeneration` (512) tokens stay free for the answer.
// Every count is the model's own tokenizer's. The parts are counted one by one, as the seed does,
// so the final prompt (whose token boundaries can differ at the joins) is counted again, and if it
// is still over budget the prompt falls back to the bare query with a warning (§4.4).
import { DkiArgumentError } from "../errors.js";
import { tokenCounter, type TokenCounter } from "../dki/prompt.js";
import type { Tokenizer } from "../tokenizer/tokenizer.js";

/** What the builder needs of a tokenizer: counts, and the chat template for the "chat" layout. */
export type PromptTokenizer = Pick<Tokenizer, "encode" | "applyChatTemplate">;

export interface HistoryMessage {
  role: "user" | "assistant";
  content: string;
}

/**
 * `seed`: the plain-text layout of seed 000 §4 (`System: …`, `Relevant information:`, `Previous
 * conversation:`, `User: …`, `AI:`). `chat`: the same parts as chat messages rendered with the model's
 * chat template (the system message carries the context; history turns are messages), the way a
 * chat-tuned model expects its input and the way the DKI system prompts it.
 */
export type PromptLayout = "seed" | "chat";

export interface RagPromptInput {
  query: string;
  systemPrompt?: string;
  /** Retrieved texts in rank order (memories or knowledge-base chunks); numbered [1]..[n] in the prompt. */
  contexts: string[];
  /** The session's earlier messages, oldest first. */
  history?: HistoryMessage[];
}

export interface RagBudget {
  /** The model's context window in tokens. */
  maxContext: number;
  /** Tokens kept free for the answer. Default 512. */
  reserveForGeneration?: number;
  /** The largest share of the tokens left after the fixed part that retrieved context may take. Default 0.5. */
  contextShare?: number;
  /**
   * A first retrieved context too long for the context share is cut to fit (ending in "…") instead
   * of dropped, so the best match still informs the answer (seed 001's fallback). Default false:
   * seed 000 drops it.
   */
  truncateFirstContext?: boolean;
  layout?: PromptLayout;
}

/** Seed 000 §2.1's RAGPromptInfo. */
export interface RagPromptInfo {
  originalQuery: string;
  systemPrompt: string;
  retrievedContext: string;
  historyText: string;
  historyMessages: HistoryMessage[];
  finalPrompt: string;
}

export interface RagPromptBuild {
  info: RagPromptInfo;
  /** The final prompt's token ids, as generation should be fed them. */
  tokens: number[];
  /** How many of `contexts` (the first ones) made it into the prompt. */
  contextsUsed: number;
  historyKept: number;
  historyTotal: number;
  forcedFallback: boolean;
  tokenCounts: {
    maxPrompt: number;
    fixed: number;
    /** Budget left after the fixed part, before context and history took theirs. */
    remaining: number;
    context: number;
    history: number;
    final: number;
  };
  /** What was cut and why, in the seed's words ("kept 20/50 history messages"). */
  log: string[];
  warnings: string[];
}

const CONTEXT_HEADER = "Relevant information:\n";
const HISTORY_HEADER = "Previous conversation:\n";

function roleLabel(role: HistoryMessage["role"]): string {
  return role === "user" ? "User" : "AI";
}

/** `[i] text`, the form a retrieved text takes in the prompt (1-based, as the citations that refer to it). */
export function contextLine(index: number, text: string): string {
  return `[${index + 1}] ${text}`;
}

export function historyLine(m: HistoryMessage): string {
  return `${roleLabel(m.role)}: ${m.content}`;
}

function checkInput(input: RagPromptInput, budget: RagBudget): void {
  if (typeof input.query !== "string" || input.query.trim() === "") throw new DkiArgumentError("the query must be a non-empty string");
  if (input.systemPrompt !== undefined && typeof input.systemPrompt !== "string") throw new DkiArgumentError("systemPrompt must be a string");
  if (!Array.isArray(input.contexts) || input.contexts.some((c) => typeof c !== "string")) throw new DkiArgumentError("contexts must be an array of strings");
  if (input.history !== undefined) {
    if (!Array.isArray(input.history)) throw new DkiArgumentError("history must be an array of messages");
    input.history.forEach((m, i) => {
      if (m === null || typeof m !== "object" || (m.role !== "user" && m.role !== "assistant") || typeof m.content !== "string") {
        throw new DkiArgumentError(`history message ${i} must be { role: "user" | "assistant", content: string }`);
      }
    });
  }
  const reserve = budget.reserveForGeneration ?? 512;
  if (!Number.isInteger(budget.maxContext) || budget.maxContext < 1) throw new DkiArgumentError(`maxContext must be a positive integer, got ${budget.maxContext}`);
  if (!Number.isInteger(reserve) || reserve < 0) throw new DkiArgumentError(`reserveForGeneration must be a non-negative integer, got ${reserve}`);
  if (reserve >= budget.maxContext) throw new DkiArgumentError(`reserveForGeneration (${reserve}) leaves no room for a prompt in a ${budget.maxContext}-token context`);
  const share = budget.contextShare ?? 0.5;
  if (!(share >= 0 && share <= 1)) throw new DkiArgumentError(`contextShare must be in [0, 1], got ${share}`);
  if (budget.layout !== undefined && budget.layout !== "seed" && budget.layout !== "chat") throw new DkiArgumentError(`layout must be "seed" or "chat", got ${JSON.stringify(budget.layout)}`);
}

/**
 * Lines in order, each kept while the running total (starting at the header's count) stays within
 * `limit`; stops at the first that does not fit (seed 000 §5.2). Returns the kept indices.
 */
function fill(lines: string[], header: string, limit: number, count: (s: string) => number): { kept: number[]; tokens: number } {
  const kept: number[] = [];
  let used = count(header);
  for (let i = 0; i < lines.length; i++) {
    const t = count(lines[i]);
    if (used + t > limit) break;
    kept.push(i);
    used += t;
  }
  return kept.length === 0 ? { kept, tokens: 0 } : { kept, tokens: used };
}

/**
 * The longest prefix of `line` (cut at a word boundary where there is one, "…" appended) that
 * `fits`; null when not even its first word does. Binary search on the length: a count is
 * monotonic in the prefix length up to a token or two of merging, and the result is checked.
 */
function truncateToFit(line: string, fits: (s: string) => boolean): string | null {
  const cutAt = (n: number) => {
    const head = line.slice(0, n);
    const space = head.lastIndexOf(" ");
    return `${space > n / 2 ? head.slice(0, space) : head}…`;
  };
  let lo = 0;
  let hi = line.length;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (fits(cutAt(mid))) lo = mid;
    else hi = mid - 1;
  }
  // "[1] …" alone is no context: at least one word of the passage must fit.
  if (lo <= line.indexOf(" ") + 1) return null;
  const out = cutAt(lo);
  return fits(out) ? out : null;
}

/**
 * Builds the RAG prompt within the budget; throws only when even the bare query cannot fit.
 * `counter` counts the context and history lines (a TokenMemo remembers them across turns).
 */
export function buildRagPrompt(tokenizer: PromptTokenizer, input: RagPromptInput, budget: RagBudget, counter: TokenCounter = tokenCounter(tokenizer)): RagPromptBuild {
  checkInput(input, budget);
  const layout = budget.layout ?? "seed";
  const reserve = budget.reserveForGeneration ?? 512;
  const share = budget.contextShare ?? 0.5;
  const system = input.systemPrompt ?? "";
  const history = input.history ?? [];
  const maxPrompt = budget.maxContext - reserve;
  const countPart = (text: string) => counter.count(text);
  const log: string[] = [];
  const warnings: string[] = [];

  // The seed layout's text and its tokens; the chat layout's, rendered by the template.
  const assemble = (contextText: string, historyKept: HistoryMessage[], historyText: string): { text: string; tokens: number[] } => {
    if (layout === "seed") {
      let text = "";
      if (system !== "") text += `System: ${system}\n\n`;
      if (contextText !== "") text += `${contextText}\n\n`;
      if (historyText !== "") text += `${historyText}\n\n`;
      text += `User: ${input.query}\n\nAI:`;
      return { text, tokens: tokenizer.encode(text, { addSpecialTokens: true }) };
    }
    const systemContent = [system, contextText].filter((s) => s !== "").join("\n\n");
    const messages = [
      ...(systemContent !== "" ? [{ role: "system" as const, content: systemContent }] : []),
      ...historyKept.map((m) => ({ role: m.role, content: m.content })),
      { role: "user" as const, content: input.query },
    ];
    const text = tokenizer.applyChatTemplate(messages, { addGenerationPrompt: true });
    return { text, tokens: tokenizer.encode(text, { addSpecialTokens: false }) };
  };

  // Step 1: the fixed part, counted as it appears in the layout (with the template's own tokens in "chat").
  const fixed = assemble("", [], "").tokens.length;
  const remaining = maxPrompt - fixed;

  // Step 2: retrieved context, at most `share` of what remains.
  const ctxLines = input.contexts.map((c, i) => contextLine(i, c));
  const ctxLimit = Math.floor(remaining * share);
  let ctx = remaining > 0 ? fill(ctxLines, CONTEXT_HEADER, ctxLimit, countPart) : { kept: [], tokens: 0 };
  if (budget.truncateFirstContext === true && ctx.kept.length === 0 && ctxLines.length > 0 && remaining > 0) {
    const cut = truncateToFit(ctxLines[0], (line) => countPart(CONTEXT_HEADER) + countPart(line) <= ctxLimit);
    if (cut !== null) {
      ctxLines[0] = cut;
      ctx = fill(ctxLines, CONTEXT_HEADER, ctxLimit, countPart);
      warnings.push(`the first retrieved context was cut to ${cut.length} of ${contextLine(0, input.contexts[0]).length} characters to fit the ${ctxLimit}-token context share`);
    }
  }
  const contextText = ctx.kept.length === 0 ? "" : CONTEXT_HEADER + ctx.kept.map((i) => ctxLines[i]).join("\n");
  if (ctx.kept.length < input.contexts.length) log.push(`kept ${ctx.kept.length}/${input.contexts.length} retrieved contexts`);
  const afterContext = remaining - ctx.tokens;

  // Step 3: history, newest first, until the rest is full.
  const newestFirst = history.map((_, i) => history.length - 1 - i);
  const histLinesNewestFirst = newestFirst.map((i) => historyLine(history[i]));
  const hist = afterContext > 0 ? fill(histLinesNewestFirst, HISTORY_HEADER, afterContext, countPart) : { kept: [], tokens: 0 };
  const keptIdx = hist.kept.map((k) => newestFirst[k]).reverse();
  const historyMessages = keptIdx.map((i) => history[i]);
  const historyText = historyMessages.length === 0 ? "" : HISTORY_HEADER + historyMessages.map(historyLine).join("\n");
  if (historyMessages.length < history.length) log.push(`kept ${historyMessages.length}/${history.length} history messages`);

  // Steps 4 and 5: assemble, count the whole, fall back to the bare query if still over.
  let built = assemble(contextText, historyMessages, historyText);
  let forcedFallback = false;
  let info: RagPromptInfo = {
    originalQuery: input.query,
    systemPrompt: system,
    retrievedContext: contextText,
    historyText,
    historyMessages,
    finalPrompt: built.text,
  };
  if (built.tokens.length > maxPrompt) {
    forcedFallback = true;
    const text = layout === "seed" ? `User: ${input.query}\nAI:` : tokenizer.applyChatTemplate([{ role: "user", content: input.query }], { addGenerationPrompt: true });
    const tokens = tokenizer.encode(text, { addSpecialTokens: layout === "seed" });
    warnings.push(`prompt of ${built.tokens.length} tokens exceeds the ${maxPrompt}-token prompt budget (context ${budget.maxContext} - ${reserve} reserved): forced fallback to the bare query, dropping the system prompt, ${ctx.kept.length} retrieved contexts and ${historyMessages.length} history messages`);
    built = { text, tokens };
    info = { originalQuery: input.query, systemPrompt: "", retrievedContext: "", historyText: "", historyMessages: [], finalPrompt: text };
    if (tokens.length > maxPrompt) {
      throw new DkiArgumentError(`the query alone is ${tokens.length} tokens as a prompt, over the ${maxPrompt}-token prompt budget (context ${budget.maxContext} - ${reserve} reserved for generation)`);
    }
  }
  return {
    info,
    tokens: built.tokens,
    contextsUsed: forcedFallback ? 0 : ctx.kept.length,
    historyKept: forcedFallback ? 0 : historyMessages.length,
    historyTotal: history.length,
    forcedFallback,
    tokenCounts: { maxPrompt, fixed, remaining, context: forcedFallback ? 0 : ctx.tokens, history: forcedFallback ? 0 : hist.tokens, final: built.tokens.length },
    log,
    warnings,
  };
}
