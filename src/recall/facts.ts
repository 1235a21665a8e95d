// Fact calls (seed 003 §5.5): the model asks for a summarised message's original text with
// retrieve_fact(trace_id=…), the turn fetches it, appends it to the prompt and generates again.
//
//   detectFactCall  the generic text form `retrieve_fact(trace_id="…", offset=0, limit=500)` and
//                   the tool-call forms of the chat templates: ChatML / Qwen
//                   `<tool_call>{"name": "retrieve_fact", "arguments": {…}}</tool_call>` and
//                   Llama 3 `{"name": "retrieve_fact", "parameters": {…}}` (after <|python_tag|> or bare),
//                   DeepSeek `<｜tool▁call▁begin｜>function<｜tool▁sep｜>retrieve_fact` and its
//                   arguments in a ```json block, GLM-4 `retrieve_fact` on a line of its own and
//                   its arguments as JSON on the next
//   FactRetriever   the original text through the store, scoped to the turn's user (and session,
//                   by scope): another user's trace id reads as not found; long text in chunks
//   runFactCallLoop at most max_rounds rounds and max_fact_tokens fact tokens in all
import type { ConversationTurn, MemoryStoreApi } from "../memory/types.js";
import type { HistoryLanguage, TokenCounter } from "../dki/prompt.js";
import { DkiArgumentError } from "../errors.js";
import { clipToTokens } from "./summary.js";

export interface FactRequest {
  traceId: string;
  /** Characters into the message (default 0). */
  offset: number;
  /** Characters at most (default: the rest). */
  limit?: number;
  form: "generic" | "tool_call" | "json" | "deepseek" | "glm";
}

const GENERIC = /retrieve_fact\s*\(([^)]*)\)/u;
// The two forms that name the function first and give its arguments after it, as a JSON object.
const DEEPSEEK = /<｜tool▁call▁begin｜>[^<｜]*<｜tool▁sep｜>\s*retrieve_fact\b/u;
const GLM = /(?:^|\n)[ \t]*retrieve_fact[ \t]*\n\s*(?=\{)/u;
const ARG = /(\w+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^,\s)]+))/gu;

/** The first fact call in a model's output, or null. */
export function detectFactCall(output: string): FactRequest | null {
  const tool = /<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/u.exec(output);
  if (tool) {
    const r = fromJson(tool[1]!, "tool_call");
    if (r) return r;
  }
  for (const [pattern, form] of [[DEEPSEEK, "deepseek"], [GLM, "glm"]] as const) {
    const m = pattern.exec(output);
    const at = m ? output.indexOf("{", m.index + m[0].length) : -1;
    const json = at >= 0 ? balanced(output, at) : null;
    if (json === null) continue;
    const r = argumentsOf(json, form);
    if (r) return r;
  }
  for (let at = output.indexOf("{"); at >= 0; at = output.indexOf("{", at + 1)) {
    const json = balanced(output, at);
    if (json === null) continue;
    const r = fromJson(json, "json");
    if (r) return r;
  }
  const g = GENERIC.exec(output);
  if (g) {
    const args = new Map<string, string>();
    for (const a of g[1]!.matchAll(ARG)) args.set(a[1]!, a[2] ?? a[3] ?? a[4]!);
    // retrieve_fact("turn_x"): the trace id given positionally.
    const positional = /^\s*["']([^"']+)["']\s*(?:,|$)/u.exec(g[1]!)?.[1];
    return request(args.get("trace_id") ?? positional, args.get("offset"), args.get("limit"), "generic");
  }
  return null;
}

function fromJson(text: string, form: FactRequest["form"]): FactRequest | null {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return null;
  }
  if (v === null || typeof v !== "object") return null;
  const o = v as { name?: unknown; arguments?: unknown; parameters?: unknown };
  if (o.name !== "retrieve_fact") return null;
  let args = o.arguments ?? o.parameters;
  // Some templates carry the arguments as a JSON string.
  if (typeof args === "string") {
    try {
      args = JSON.parse(args);
    } catch {
      return null;
    }
  }
  if (args === null || typeof args !== "object") return null;
  const a = args as Record<string, unknown>;
  return request(a.trace_id, a.offset, a.limit, form);
}

/** A request from a JSON object of the arguments alone ({"trace_id": …, "offset": …}). */
function argumentsOf(json: string, form: FactRequest["form"]): FactRequest | null {
  try {
    const a: unknown = JSON.parse(json);
    if (a === null || typeof a !== "object" || Array.isArray(a)) return null;
    const o = a as Record<string, unknown>;
    return request(o.trace_id, o.offset, o.limit, form);
  } catch {
    return null;
  }
}

function request(traceId: unknown, offset: unknown, limit: unknown, form: FactRequest["form"]): FactRequest | null {
  if (typeof traceId !== "string" || traceId === "") return null;
  const int = (v: unknown) => (v === undefined ? undefined : Number(v));
  const o = int(offset) ?? 0;
  const l = int(limit);
  return {
    traceId,
    offset: Number.isSafeInteger(o) && o >= 0 ? o : 0,
    ...(l !== undefined && Number.isSafeInteger(l) && l > 0 ? { limit: l } : {}),
    form,
  };
}

/** The JSON object starting at `at`, braces balanced (strings respected), or null. */
function balanced(s: string, at: number): string | null {
  let depth = 0;
  let inString = false;
  for (let i = at; i < s.length; i++) {
    const ch = s[i];
    if (inString) {
      if (ch === "\\") i++;
      else if (ch === '"') inString = false;
    } else if (ch === '"') inString = true;
    else if (ch === "{") depth++;
    else if (ch === "}" && --depth === 0) return s.slice(at, i + 1);
  }
  return null;
}

export interface FactChunk {
  traceId: string;
  sessionId: string;
  role: ConversationTurn["role"];
  createdAt: number;
  text: string;
  offset: number;
  totalChars: number;
  hasMore: boolean;
}

export interface FactScope {
  userId: string;
  /** Given: only this session's turns resolve. */
  sessionId?: string;
}

export class FactRetriever {
  constructor(private readonly store: Pick<MemoryStoreApi, "conversations">) {}

  /** A chunk of the traced message's text (characters offset … offset + limit), or undefined when the scope holds no such message. */
  async retrieve(traceId: string, scope: FactScope, range: { offset?: number; limit?: number } = {}): Promise<FactChunk | undefined> {
    const offset = range.offset ?? 0;
    if (!Number.isSafeInteger(offset) || offset < 0) throw new DkiArgumentError(`retrieve_fact: offset must be an integer >= 0, got ${offset}`);
    if (range.limit !== undefined && (!Number.isSafeInteger(range.limit) || range.limit < 1)) throw new DkiArgumentError(`retrieve_fact: limit must be an integer >= 1, got ${range.limit}`);
    const turn = await this.store.conversations.get(traceId, scope);
    if (turn === undefined || turn.userId !== scope.userId) return undefined;
    const chars = Array.from(turn.content);
    const end = range.limit === undefined ? chars.length : Math.min(chars.length, offset + range.limit);
    return {
      traceId,
      sessionId: turn.sessionId,
      role: turn.role,
      createdAt: turn.createdAt,
      text: chars.slice(Math.min(offset, chars.length), end).join(""),
      offset,
      totalChars: chars.length,
      hasMore: end < chars.length,
    };
  }
}

/** A fact segment as the prompt gets it. */
export function formatFact(chunk: FactChunk): string {
  const more = chunk.hasMore ? `, has_more: true, next offset ${chunk.offset + Array.from(chunk.text).length}` : "";
  return `[FACT trace_id: ${chunk.traceId}${more}]\n${chunk.text}\n[/FACT]`;
}

const ANSWER_FROM_FACTS: Readonly<Record<HistoryLanguage, string>> = Object.freeze({
  cn: "请基于以上补充事实回答用户问题。",
  en: "Please answer the user's question based on the facts above.",
});

export interface GenerationOutput {
  text: string;
}

/** What the loop needs of a model: generate again with fact segments appended to the prompt. */
export interface FactCallBackend<O extends GenerationOutput> {
  generateWithFacts(factText: string): Promise<O>;
}

export interface FactCallRound {
  traceId: string;
  form: FactRequest["form"];
  found: boolean;
  tokens: number;
}

export interface FactLoopResult<O> {
  output: O;
  /** Rounds that generated again. */
  rounds: number;
  calls: FactCallRound[];
  factTokens: number;
  stoppedBy: "no_call" | "not_found" | "max_rounds" | "max_fact_tokens";
}

export interface FactLoopOptions {
  retrieve(req: FactRequest): Promise<FactChunk | undefined>;
  counter: TokenCounter;
  maxRounds: number;
  maxFactTokens: number;
  language: HistoryLanguage;
}

/**
 * Runs fact calls until the output has none, a trace id does not resolve, max_rounds rounds have
 * generated again or the facts have used max_fact_tokens (a fact is cut to what is left, and the
 * segment says has_more).
 */
export async function runFactCallLoop<O extends GenerationOutput>(first: O, backend: FactCallBackend<O>, o: FactLoopOptions): Promise<FactLoopResult<O>> {
  let output = first;
  const calls: FactCallRound[] = [];
  const segments: string[] = [];
  let factTokens = 0;
  for (let round = 0; ; round++) {
    const req = detectFactCall(output.text);
    if (req === null) return { output, rounds: round, calls, factTokens, stoppedBy: "no_call" };
    if (round >= o.maxRounds) return { output, rounds: round, calls, factTokens, stoppedBy: "max_rounds" };
    const chunk = await o.retrieve(req);
    if (chunk === undefined) {
      calls.push({ traceId: req.traceId, form: req.form, found: false, tokens: 0 });
      return { output, rounds: round, calls, factTokens, stoppedBy: "not_found" };
    }
    const left = o.maxFactTokens - factTokens;
    let segment = formatFact(chunk);
    let tokens = o.counter.count(segment);
    if (tokens > left) {
      // Cut the fact's text to what is left (its frame counted), and say there is more.
      const frame = o.counter.count(formatFact({ ...chunk, text: "", hasMore: true }));
      // clipToTokens marks the cut with "…", which is not part of the message: dropped, so the next offset is right.
      const text = left > frame ? clipToTokens(chunk.text, o.counter, left - frame - 1).replace(/…$/u, "") : "";
      if (text === "") {
        calls.push({ traceId: req.traceId, form: req.form, found: true, tokens: 0 });
        return { output, rounds: round, calls, factTokens, stoppedBy: "max_fact_tokens" };
      }
      segment = formatFact({ ...chunk, text, hasMore: true });
      tokens = o.counter.count(segment);
      if (tokens > left) return { output, rounds: round, calls, factTokens, stoppedBy: "max_fact_tokens" };
    }
    factTokens += tokens;
    calls.push({ traceId: req.traceId, form: req.form, found: true, tokens });
    segments.push(segment);
    output = await backend.generateWithFacts(`${segments.join("\n\n")}\n\n${ANSWER_FROM_FACTS[o.language]}`);
  }
}
