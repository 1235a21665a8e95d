// The hybrid injector's text side (seed 003 §4, §6.3, §7): preferences merged into the one text a
// K/V block is computed from, session history as a suffix prompt inside the trust templates,
// and the prompt the model is given (System → History → Query), through the model's chat template
// when it has one. Token counts come from the model's own tokenizer. Shared with the RAG baseline
// and a knowledge base's "chunks as K/V" mode: nothing here needs the model beyond its tokenizer.
import { DkiArgumentError } from "../errors.js";
import type { ChatMessage } from "../tokenizer/chat-template.js";

/** What prompt building needs of a tokenizer; the engine's `Tokenizer` has it. */
export interface PromptTokenizer {
  encode(text: string, opts?: { addSpecialTokens?: boolean }): number[];
  /** Renders with the chat template; the template may run in its own process, so the thread works on meanwhile. */
  applyChatTemplateAsync(messages: ChatMessage[], opts?: { addGenerationPrompt?: boolean }): Promise<string>;
  readonly chatTemplate: string | null;
  readonly bosId: number | null;
}

/** Counts tokens as the model will see a piece of text inside a prompt (no special tokens added). */
export interface TokenCounter {
  count(text: string): number;
}

export function tokenCounter(tok: Pick<PromptTokenizer, "encode">): TokenCounter {
  return { count: (text) => (text === "" ? 0 : tok.encode(text, { addSpecialTokens: false }).length) };
}

/**
 * The tokens (no special tokens) of recently seen texts, least recently used dropped past
 * `capacity`. A user's memories are routed turn after turn, and encoding them again cost more
 * than the rest of a turn's assembly (DKI) or of its prompt budgeting (RAG), so both systems
 * count and encode through one of these. The arrays are shared: nothing may change them.
 */
export class TokenMemo implements TokenCounter {
  private readonly texts = new Map<string, readonly number[]>();

  constructor(
    private readonly tok: Pick<PromptTokenizer, "encode">,
    private readonly capacity = 4096,
  ) {}

  tokens(text: string): readonly number[] {
    let tokens = this.texts.get(text);
    if (tokens === undefined) tokens = this.tok.encode(text, { addSpecialTokens: false });
    else this.texts.delete(text); // re-inserted last: the Map's order is least recently used first
    this.texts.set(text, tokens);
    if (this.texts.size > this.capacity) this.texts.delete(this.texts.keys().next().value!);
    return tokens;
  }

  count(text: string): number {
    return text === "" ? 0 : this.tokens(text).length;
  }
}

export type HistoryLanguage = "cn" | "en";

export interface HistoryTemplate {
  /** Opens the block, up to and including its "---" line. */
  prefix: string;
  /** Closes it, from its "---" line on. */
  suffix: string;
  user: string;
  assistant: string;
}

/** The trust-establishing templates of seed 003 §4.4, word for word. */
export const HISTORY_TEMPLATES: Readonly<Record<HistoryLanguage, Readonly<HistoryTemplate>>> = Object.freeze({
  cn: Object.freeze({
    prefix: [
      "[会话历史参考]",
      "在回复用户之前，请参考以下历史会话信息。",
      "这些是用户与你之前的真实对话记录，内容可信。",
      "请在理解历史上下文后，给出连贯的整体回复。",
      "重要：请使用中文回复用户。",
      "---",
    ].join("\n"),
    suffix: ["---", "[会话历史结束]", "请基于以上历史和用户当前问题，使用中文给出回复。", "注意：历史信息仅供参考，请综合回答。"].join("\n"),
    user: "用户",
    assistant: "助手",
  }),
  en: Object.freeze({
    prefix: [
      "[Session History Reference]",
      "Before responding, please refer to the following session history.",
      "These are real conversation records between you and the user, and are trustworthy.",
      "Please provide a coherent response after understanding the historical context.",
      "---",
    ].join("\n"),
    suffix: [
      "---",
      "[End of Session History]",
      "Please respond based on the above history and the user's current question.",
      "Note: Historical information is for reference; please answer comprehensively.",
    ].join("\n"),
    user: "User",
    assistant: "Assistant",
  }),
});

/**
 * Markers of the templates: a message holding one carries an earlier turn's history block (an
 * assistant echoing its prompt), and is skipped so history never nests inside history (§7.2).
 */
export const HISTORY_MARKERS: readonly string[] = Object.freeze(["[会话历史参考]", "[Session History Reference]", "[会话历史结束]", "[End of Session History]"]);

const HAN = /\p{Script=Han}/gu;
const NON_SPACE = /\S/gu;

/** "cn" when at least 30% of the query's non-space characters are Han, else "en". */
export function detectLanguage(text: string): HistoryLanguage {
  const han = text.match(HAN)?.length ?? 0;
  const all = text.match(NON_SPACE)?.length ?? 0;
  return all > 0 && han / all >= 0.3 ? "cn" : "en";
}

export interface PreferenceLine {
  type: string;
  text: string;
}

export interface MergedPreferences {
  /** `- [type] text` lines, in the order given (priority order), joined by newlines; "" for none. */
  text: string;
  tokens: number;
  /** How many of the given preferences fit in the budget (a prefix of the list). */
  included: number;
}

/**
 * Merges preferences, already in priority order, into one text (§6.3), keeping whole lines while
 * the text fits in `maxTokens`: the lowest priorities are the ones left out.
 */
export function mergePreferences(prefs: readonly PreferenceLine[], counter: TokenCounter, maxTokens: number): MergedPreferences {
  const lines: string[] = [];
  let tokens = 0;
  for (const p of prefs) {
    const line = `- [${oneLine(p.type)}] ${oneLine(p.text)}`;
    const text = [...lines, line].join("\n");
    const n = counter.count(text);
    if (n > maxTokens) break;
    lines.push(line);
    tokens = n;
  }
  return { text: lines.join("\n"), tokens, included: lines.length };
}

/** One line per preference: a newline inside one would read as another `- [type]` line. */
function oneLine(s: string): string {
  return s.replace(/\s*[\r\n]+\s*/g, " ").trim();
}

export interface HistoryMessage {
  role: "user" | "assistant";
  content: string;
  id?: string;
}

export interface FormattedHistory {
  /** The whole block, templates included; "" when no message is left. */
  text: string;
  /** Tokens of `text`. */
  tokens: number;
  /** The messages in it, oldest first. */
  messages: HistoryMessage[];
  /** Messages skipped for holding a template marker. */
  skippedForMarkers: number;
  /** Oldest messages dropped to fit `maxTokens`. */
  truncated: number;
}

/**
 * Formats session history (oldest first) as the suffix prompt of §4.3: messages holding a template
 * marker are skipped, then the oldest are dropped while the message lines exceed `maxTokens`,
 * keeping at least the newest one (§7.3), and the rest is wrapped in the language's templates.
 */
export function formatHistory(messages: readonly HistoryMessage[], language: HistoryLanguage, counter: TokenCounter, maxTokens: number): FormattedHistory {
  const t = HISTORY_TEMPLATES[language];
  const kept = messages.filter((m) => !HISTORY_MARKERS.some((k) => m.content.includes(k)));
  const skippedForMarkers = messages.length - kept.length;
  const lines = kept.map((m) => `${m.role === "user" ? t.user : t.assistant}: ${m.content}`);
  let from = 0;
  while (lines.length - from > 1 && counter.count(lines.slice(from).join("\n")) > maxTokens) from++;
  if (lines.length === 0) return { text: "", tokens: 0, messages: [], skippedForMarkers, truncated: 0 };
  const text = [t.prefix, ...lines.slice(from), t.suffix].join("\n");
  return { text, tokens: counter.count(text), messages: kept.slice(from), skippedForMarkers, truncated: from };
}

export interface PromptParts {
  query: string;
  systemPrompt?: string;
  /** A formatted history block (formatHistory's text), or "". */
  history?: string;
  language: HistoryLanguage;
}

export interface RenderedPrompt {
  /** What the model is given, as text. */
  text: string;
  tokens: number[];
  /** Whether it went through the chat template. */
  templated: boolean;
}

/**
 * The prompt in the order System → History → Query. With a chat template: a system message and
 * one user message holding the history block and the query; without: the parts joined by blank
 * lines, the query as `User: …` (`用户: …`), and an `Assistant:` cue for the answer.
 */
export async function renderPrompt(tok: PromptTokenizer, parts: PromptParts, useTemplate: boolean): Promise<RenderedPrompt> {
  const history = parts.history ?? "";
  if (useTemplate) {
    const messages: ChatMessage[] = [];
    if (parts.systemPrompt) messages.push({ role: "system", content: parts.systemPrompt });
    messages.push({ role: "user", content: history ? `${history}\n\n${parts.query}` : parts.query });
    const text = await tok.applyChatTemplateAsync(messages, { addGenerationPrompt: true });
    return { text, tokens: tok.encode(text, { addSpecialTokens: false }), templated: true };
  }
  const t = HISTORY_TEMPLATES[parts.language];
  const text = [parts.systemPrompt ?? "", history, `${t.user}: ${parts.query}`].filter((p) => p !== "").join("\n\n") + `\n${t.assistant}:`;
  return { text, tokens: tok.encode(text, { addSpecialTokens: true }), templated: false };
}

export interface HybridPromptOptions {
  query: string;
  systemPrompt?: string;
  history: FormattedHistory | null;
  language: HistoryLanguage;
  useTemplate: boolean;
  /** The model's context window (the prompt's own tokens plus the answer). */
  contextSize: number;
  /** Tokens kept for the answer: the history is dropped when the prompt would leave fewer (§4.3 step 2). */
  generationReserve: number;
}

export interface HybridPrompt extends RenderedPrompt {
  /** The history block in the prompt ("" when none or dropped). */
  historyText: string;
  historyTokens: number;
  /** The history was dropped because the prompt would have exceeded contextSize − generationReserve. */
  historyDropped: boolean;
}

/**
 * Renders the prompt with the history, or without it when it would not leave the answer its room.
 * Asynchronous: a chat template renders in its own process, and the caller can work meanwhile.
 */
export async function buildHybridPrompt(tok: PromptTokenizer, o: HybridPromptOptions): Promise<HybridPrompt> {
  if (typeof o.query !== "string" || o.query.trim() === "") throw new DkiArgumentError("the query is empty");
  const limit = o.contextSize - o.generationReserve;
  const historyText = o.history?.text ?? "";
  if (historyText !== "") {
    const withHistory = await renderPrompt(tok, { query: o.query, systemPrompt: o.systemPrompt, history: historyText, language: o.language }, o.useTemplate);
    if (withHistory.tokens.length <= limit) return { ...withHistory, historyText, historyTokens: o.history!.tokens, historyDropped: false };
  }
  const bare = await renderPrompt(tok, { query: o.query, systemPrompt: o.systemPrompt, language: o.language }, o.useTemplate);
  if (bare.tokens.length > o.contextSize) {
    throw new DkiArgumentError(`the prompt (system prompt and query) has ${bare.tokens.length} tokens, more than the model's context window of ${o.contextSize}`);
  }
  return { ...bare, historyText: "", historyTokens: 0, historyDropped: historyText !== "" };
}
