// The memory-QA harness: every question of a LoCoMo / LongMemEval / synthetic file answered by one
// model in each selected mode, scored, one JSONL row per (question, mode).
//
//   none       the question alone
//   full       the whole conversation as prompt text (full-context.ts), oldest turns dropped to fit
//   rag        RAGSystem: the routed memories as numbered prompt text
//   dki        DKISystem: the routed memories as K/V blocks, one per memory (α forced or gated)
//   dki-joint  DKISystem with memoryEncoding "joint": the same memories as one block
//
// Every mode gets ANSWER_INSTRUCTION as its system prompt and the question unchanged as the user's
// query, in a session of its own (no history), decoded greedily. none and full render their prompt
// with the same function DKISystem does (renderPrompt), so none is exactly dki's prompt without
// the injection. rag and dki* route with the same call (routeMemories) and top-k.
//
// Work folder (--out): results.jsonl (the rows), run.json (the settings the rows were made with),
// store/ (the memory store, one user per conversation, imported by the memory layer's importer) and
// kv-cache/. A rerun with the same settings skips the (question, mode) rows already there; a run
// that finishes rewrites the file in question order, modes in the order given.
import { appendFileSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { performance } from "node:perf_hooks";
import { Model, type LoadOptions } from "../engine/model.js";
import { native } from "../engine/native.js";
import { DkiArgumentError } from "../errors.js";
import { DKISystem, type DKIResponse } from "../dki/system.js";
import type { DKIConfigInput } from "../dki/config.js";
import type { MemoryRerank, RoutedMemory } from "../dki/routing.js";
import { detectLanguage, renderPrompt } from "../dki/prompt.js";
import { RAGSystem, type RAGResponse } from "../rag/rag-system.js";
import { MemoryStore } from "../memory/memory-store.js";
import { importConversations, type ImportedConversation, type ImportedTurn } from "../memory/import.js";
import type { Embedder, MemoryStoreApi } from "../memory/types.js";
import { loadQADataset, type QADataset, type QAQuestion } from "./data.js";
import { fullContextQuery, renderConversation, type ConversationTurn } from "./full-context.js";
import { ANSWER_INSTRUCTION } from "./instruction.js";
import { judgePrompt, judgeVerdict, scoreLocomo, scoreLongMemEval } from "./scoring.js";

export const MODES = ["none", "full", "rag", "dki", "dki-joint"] as const;
export type Mode = (typeof MODES)[number];

export interface MemoryQAOptions {
  /** HF folder or GGUF file. */
  model: string;
  data: string;
  /** Work folder: results.jsonl, run.json, store/, kv-cache/. */
  out: string;
  modes?: Mode[];
  /** Questions answered at most (after ordering). */
  limit?: number;
  /** Shuffles the question order with this seed (default: the file's order). */
  seed?: number;
  /** Only these conversations (store user ids: LoCoMo sample_id or conv-<i>, LongMemEval question_id). */
  conversations?: string[];
  /** Memories routed per question for rag and dki* (DKIConfig.maxMemories). Default 3. */
  topK?: number;
  /** α forced for dki*, bypassing the relevance gate; undefined: gated. */
  alpha?: number;
  /** Default 24. */
  maxAnswerTokens?: number;
  /** Memory tokens dki* inject per question at most (DKIConfig.memoryMaxTokens; default DKI's, 1024). */
  memoryMaxTokens?: number;
  /**
   * DKIConfig for the dki* modes over the harness's defaults (positions, encoding prefix, block
   * fixes, α scaling: what bench/memory-sweeps.js varies). A key the harness sets itself (top-k,
   * instruction, memory encoding, ...) must agree with it; run.json records the object.
   */
  dkiConfig?: DKIConfigInput;
  device?: "cpu" | "cuda";
  threads?: number;
  /** Own-token window (LoadOptions.contextSize); full drops oldest turns to fit it. */
  contextSize?: number;
  /** A judge model (HF folder or GGUF) for LongMemEval's yes/no verdicts. */
  judge?: string;
  embedder?: Embedder;
  /** A reranker that routing (rag and dki*, the same call) applies to the search's candidates before it keeps the top-k. */
  memoryRerank?: MemoryRerank;
  /** After each row: rows done and to do this run. */
  onProgress?: (done: number, total: number, mode: Mode) => void;
}

/** One (question, mode): what was asked, answered and measured. */
export interface QARow {
  id: string;
  conversation: string;
  /** LoCoMo category ("1".."5") or LongMemEval question_type. */
  category: string;
  answerable: boolean;
  question: string;
  answer: string;
  mode: Mode;
  prediction: string;
  finishReason: string;
  f1: number;
  em: number;
  /** The judge's verdict (1 yes, 0 no, null: no judge or an unreadable reply). */
  judge: number | null;
  /** The judge's reply as it gave it (null: no judge). */
  judgeReply: string | null;
  /** Evidence turn ids of the question. */
  evidence: string[];
  /** Turn ids of the memories routed (rag, dki*), or of the turns kept in the prompt (full). */
  routed: string[];
  /** Share of the evidence among `routed`; null when the mode reads no memory or the question has no evidence. */
  evidenceRecall: number | null;
  /** Store ids of the memories that reached the model (rag, dki*). */
  memoryIds: string[];
  /** Memory tokens reaching the model: injected (dki*) or in the prompt (rag: context lines, full: the conversation). */
  memoryTokens: number;
  /** Tokens prefilled as the prompt (for dki*, the prompt alone: the memory is K/V). */
  promptTokens: number;
  /** K/V blocks injected (dki*). */
  blocks: number;
  /** α of the injected memories (dki*; 0 when the gate let nothing in), else null. */
  alpha: number | null;
  ttftMs: number;
  turnMs: number;
  /** Routed memories that did not reach the model (rag, dki*), or turns dropped to fit the window (full). */
  leftOut: number;
}

export interface RunSettings {
  model: string;
  data: string;
  modes: Mode[];
  topK: number;
  alpha: number | null;
  maxAnswerTokens: number;
  memoryMaxTokens: number | null;
  contextSize: number | null;
  judge: string | null;
  embedder: string;
  /** The routing's reranker and its depth (null: the search's order). */
  rerank: { reranker: string; depth: number | null } | null;
  device: "cpu" | "cuda";
  dkiConfig: DKIConfigInput | null;
}

export interface MemoryQAResult {
  settings: RunSettings;
  format: "locomo" | "longmemeval";
  /** The rows of this run's questions and modes (answered now or before), in question order, modes in the order given. */
  rows: QARow[];
  /** Rows answered by this run (the others were there already). */
  answered: number;
  /** The engine's threads during this run's answers (null: nothing was answered). */
  threads: number | null;
  resultsFile: string;
}

const END_OF_TURN = ["<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "</s>"];

export async function runMemoryQA(o: MemoryQAOptions): Promise<MemoryQAResult> {
  const modes = o.modes ?? [...MODES];
  for (const m of modes) if (!(MODES as readonly string[]).includes(m)) throw new DkiArgumentError(`unknown mode ${JSON.stringify(m)} (expected ${MODES.join(", ")})`);
  if (new Set(modes).size !== modes.length) throw new DkiArgumentError(`a mode is listed twice: ${modes.join(",")}`);
  const topK = o.topK ?? 3;
  if (!Number.isInteger(topK) || topK < 1) throw new DkiArgumentError(`topK must be an integer >= 1, got ${topK}`);
  const maxAnswerTokens = o.maxAnswerTokens ?? 24;
  if (!Number.isInteger(maxAnswerTokens) || maxAnswerTokens < 1) throw new DkiArgumentError(`maxAnswerTokens must be an integer >= 1, got ${maxAnswerTokens}`);
  if (o.alpha !== undefined && !(Number.isFinite(o.alpha) && o.alpha >= 0 && o.alpha <= 1)) throw new DkiArgumentError(`alpha must be in [0, 1], got ${o.alpha}`);
  if (o.memoryMaxTokens !== undefined && !(Number.isInteger(o.memoryMaxTokens) && o.memoryMaxTokens >= 1)) throw new DkiArgumentError(`memoryMaxTokens must be an integer >= 1, got ${o.memoryMaxTokens}`);
  if (o.limit !== undefined && !(Number.isInteger(o.limit) && o.limit >= 1)) throw new DkiArgumentError(`limit must be an integer >= 1, got ${o.limit}`);

  // Before anything loads: a conflicting dkiConfig is the caller's mistake, not a failed run.
  const probe = { topK, maxAnswerTokens, memoryMaxTokens: o.memoryMaxTokens, dkiConfig: o.dkiConfig };
  for (const m of modes) if (m === "dki" || m === "dki-joint") dkiModeConfig(probe, m);

  const data = await loadQADataset(o.data);
  if (o.judge !== undefined && data.format !== "longmemeval") throw new DkiArgumentError(`--judge asks LongMemEval's per-type questions; ${o.data} is a ${data.format} file (scored by its own rules)`);
  const questions = selectQuestions(data, o);
  const out = resolve(o.out);
  mkdirSync(out, { recursive: true });
  const settings: RunSettings = {
    model: resolve(o.model),
    data: resolve(o.data),
    modes,
    topK,
    alpha: o.alpha ?? null,
    maxAnswerTokens,
    memoryMaxTokens: o.memoryMaxTokens ?? null,
    contextSize: o.contextSize ?? null,
    judge: o.judge === undefined ? null : resolve(o.judge),
    embedder: o.embedder?.id ?? "hashing (default)",
    rerank: o.memoryRerank === undefined ? null : { reranker: o.memoryRerank.reranker.id, depth: o.memoryRerank.depth ?? null },
    device: o.device ?? "cpu",
    dkiConfig: o.dkiConfig ?? null,
  };
  const saveSettings = checkSettings(join(out, "run.json"), settings);
  const resultsFile = join(out, "results.jsonl");
  const done = readRows(resultsFile);
  const key = (id: string, mode: Mode) => `${id}\u0000${mode}`;
  const have = new Map(done.map((r) => [key(r.id, r.mode), r]));

  const todo = modes.flatMap((mode) => questions.filter((q) => !have.has(key(q.id, mode))).map((q) => ({ q, mode })));
  const storeDir = join(out, "store");

  let answered = 0;
  let threads: number | null = null;
  if (todo.length > 0) {
    const load: LoadOptions = { device: o.device ?? "cpu", ...(o.threads === undefined ? {} : { threads: o.threads }), ...(o.contextSize === undefined ? {} : { contextSize: o.contextSize }) };
    const model = await Model.load(o.model, load);
    threads = native().getThreads();
    let judge: Model | null = null;
    try {
      judge = o.judge !== undefined ? await Model.load(o.judge, { device: load.device, threads: load.threads }) : null;
      // After the models load, so a bad model path or device fails before anything is imported.
      await importNeeded(storeDir, o.data, new Set(questions.map((q) => q.userId)), o.embedder);
      // One throwaway answer first: the first call of a process pays for the threads and caches
      // warming up, which would otherwise land in one question's TTFT.
      await model.generate({ tokens: await renderQuery(model, "Hello?") }, { maxNewTokens: 2 });
      const ctx: RunContext = { model, judge, data, topK, alpha: o.alpha, maxAnswerTokens, memoryMaxTokens: o.memoryMaxTokens, dkiConfig: o.dkiConfig, storeDir, cacheDir: join(out, "kv-cache"), embedder: o.embedder, memoryRerank: o.memoryRerank };
      const byUser = new Map(data.conversations.map((c) => [c.userId, c]));
      for (const mode of modes) {
        const mine = todo.filter((t) => t.mode === mode);
        if (mine.length === 0) continue;
        const answerer = await openMode(mode, ctx);
        try {
          for (const { q } of mine) {
            const row = await answerer(q, byUser.get(q.userId)!);
            if (answered === 0) saveSettings();
            if (judge !== null) Object.assign(row, await judgeRow(judge, q, row.prediction));
            appendFileSync(resultsFile, JSON.stringify(row) + "\n");
            have.set(key(q.id, mode), row);
            answered++;
            o.onProgress?.(answered, todo.length, mode);
          }
        } finally {
          await answerer.close();
        }
      }
    } finally {
      judge?.dispose();
      model.dispose();
    }
  }
  // Question order, modes in the order given: the same file however many runs it took.
  const order = new Map(questions.map((q, i) => [q.id, i]));
  const modeOrder = (m: Mode) => (modes.includes(m) ? modes.indexOf(m) : modes.length + MODES.indexOf(m));
  const rows = [...have.values()].sort((a, b) => (order.get(a.id) ?? Infinity) - (order.get(b.id) ?? Infinity) || modeOrder(a.mode) - modeOrder(b.mode));
  if (rows.length > 0) saveSettings();
  const tmp = `${resultsFile}.tmp`;
  writeFileSync(tmp, rows.map((r) => JSON.stringify(r) + "\n").join(""));
  renameSync(tmp, resultsFile);
  // The file keeps every row the folder has; the result (and the report) this run's selection.
  const selected = rows.filter((r) => order.has(r.id) && modes.includes(r.mode));
  return { settings, format: data.format, rows: selected, answered, threads, resultsFile };
}

/** The questions of the chosen conversations, in the file's order or shuffled by the seed, at most `limit`. */
export function selectQuestions(data: QADataset, o: Pick<MemoryQAOptions, "conversations" | "seed" | "limit">): QAQuestion[] {
  let qs = data.questions;
  if (o.conversations !== undefined) {
    const users = new Set(data.conversations.map((c) => c.userId));
    const unknown = o.conversations.filter((c) => !users.has(c));
    if (unknown.length > 0) throw new DkiArgumentError(`no conversation ${unknown.map((u) => JSON.stringify(u)).join(", ")} in the file (it has ${[...users].slice(0, 5).join(", ")}${users.size > 5 ? ", …" : ""})`);
    const wanted = new Set(o.conversations);
    qs = qs.filter((q) => wanted.has(q.userId));
  }
  if (qs.length === 0) throw new DkiArgumentError(o.conversations === undefined ? "the file has no questions (LoCoMo: qa lists)" : "the conversations chosen have no questions");
  if (o.seed !== undefined) qs = shuffled(qs, o.seed);
  return o.limit === undefined ? qs : qs.slice(0, o.limit);
}

/** Fisher–Yates with mulberry32: the same order for the same seed on every machine. */
function shuffled<T>(items: readonly T[], seed: number): T[] {
  let s = seed >>> 0;
  const next = () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const a = [...items];
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a;
}

/**
 * run.json: the settings the folder's rows were made with. A rerun with other settings is refused
 * (its rows would not compare); modes may be added. Returns the write, done once rows exist, so a
 * run that fails before its first row (a wrong model path) leaves nothing to be refused later.
 */
function checkSettings(file: string, s: RunSettings): () => void {
  const before = existsSync(file) ? (JSON.parse(readFileSync(file, "utf8")) as Partial<RunSettings>) : null;
  if (before !== null) {
    const differ = (Object.keys(s) as (keyof RunSettings)[]).filter((k) => k !== "modes" && JSON.stringify(before[k] ?? null) !== JSON.stringify(s[k]));
    if (differ.length > 0) {
      throw new DkiArgumentError(`${file} holds a run with other settings (${differ.map((k) => `${k}: ${JSON.stringify(before[k])} then, ${JSON.stringify(s[k])} now`).join("; ")}); use another --out folder`);
    }
  }
  return () => writeFileSync(file, JSON.stringify({ ...s, modes: [...new Set([...(before?.modes ?? []), ...s.modes])] }, null, 2) + "\n");
}

/** The rows already written; a last line cut short by a killed run is dropped (its row is answered again). */
function readRows(file: string): QARow[] {
  if (!existsSync(file)) return [];
  const lines = readFileSync(file, "utf8").split("\n");
  const rows: QARow[] = [];
  lines.forEach((line, i) => {
    if (line.trim() === "") return;
    try {
      rows.push(JSON.parse(line) as QARow);
    } catch {
      const last = lines.slice(i + 1).every((l) => l.trim() === "");
      if (!last) throw new DkiArgumentError(`${file}: line ${i + 1} is not JSON; the file is damaged (delete the line or use another --out folder)`);
    }
  });
  return rows;
}

/** Imports, through the memory layer's importer, the conversations the questions need that the store lacks. */
async function importNeeded(storeDir: string, file: string, users: Set<string>, embedder: Embedder | undefined): Promise<void> {
  const store = await MemoryStore.open({ dir: storeDir, embedder });
  try {
    const present = new Set(store.listUsers());
    if ([...users].every((u) => present.has(u))) return;
    // Only the needed users, and none twice: the importer checks and reads the whole file, the
    // target takes the turns of the users still missing (each user's in one transaction).
    await importConversations(
      {
        maxTextChars: store.maxTextChars,
        listUsers: () => [],
        insertTurns: async (userId: string, turns: ImportedTurn[]) => (users.has(userId) && !present.has(userId) ? store.insertTurns(userId, turns) : 0),
        insertHistory: async (userId: string, turns: ImportedTurn[]) => (users.has(userId) && !present.has(userId) ? store.insertHistory(userId, turns) : 0),
      },
      file,
    );
  } finally {
    await store.close();
  }
}

interface RunContext {
  model: Model;
  judge: Model | null;
  data: QADataset;
  topK: number;
  alpha: number | undefined;
  maxAnswerTokens: number;
  memoryMaxTokens: number | undefined;
  dkiConfig: DKIConfigInput | undefined;
  storeDir: string;
  cacheDir: string;
  embedder: Embedder | undefined;
  memoryRerank: MemoryRerank | undefined;
}

type Answerer = ((q: QAQuestion, conversation: ImportedConversation) => Promise<QARow>) & { close(): Promise<void> };

function answerer(fn: (q: QAQuestion, c: ImportedConversation) => Promise<QARow>, close: () => Promise<void> = async () => {}): Answerer {
  return Object.assign(fn, { close });
}

/**
 * The settings rag and dki* share: top-k, the instruction, no history, no preferences, and the
 * answer's room as the generation reserve (as full leaves it), so RAG's context budget is half of
 * the window less the answer rather than less DKI's chat default of 512.
 */
function systemConfig(ctx: Pick<RunContext, "topK" | "maxAnswerTokens" | "memoryMaxTokens">, extra: DKIConfigInput = {}): DKIConfigInput {
  return {
    maxMemories: ctx.topK,
    systemPrompt: ANSWER_INSTRUCTION,
    historyEnabled: false,
    preferenceEnabled: false,
    generationReserve: ctx.maxAnswerTokens,
    ...(ctx.memoryMaxTokens === undefined ? {} : { memoryMaxTokens: ctx.memoryMaxTokens }),
    ...extra,
  };
}

/** A dki* mode's config: the caller's dkiConfig under the harness's own settings, which it may repeat but not change. */
function dkiModeConfig(ctx: Pick<RunContext, "topK" | "maxAnswerTokens" | "memoryMaxTokens" | "dkiConfig">, mode: "dki" | "dki-joint"): DKIConfigInput {
  const own: Record<string, unknown> = systemConfig(ctx, { memoryEncoding: mode === "dki" ? "separate" : "joint" });
  const theirs: Record<string, unknown> = { ...ctx.dkiConfig };
  for (const [k, v] of Object.entries(theirs)) {
    if (k in own && JSON.stringify(own[k]) !== JSON.stringify(v)) {
      throw new DkiArgumentError(`dkiConfig.${k} is ${JSON.stringify(v)} but the ${mode} mode runs with ${JSON.stringify(own[k])} (the harness sets it: top-k, instruction, answer room and memory encoding are options of the run, and the joint encoding is the dki-joint mode)`);
    }
  }
  return { ...theirs, ...own } as DKIConfigInput;
}

async function openMode(mode: Mode, ctx: RunContext): Promise<Answerer> {
  const gen = { maxNewTokens: ctx.maxAnswerTokens, sampling: { temperature: 0 }, stop: END_OF_TURN };
  const session = (q: QAQuestion) => `eval:${mode}:${q.id}`;
  switch (mode) {
    case "none":
      return answerer(async (q) => {
        const t0 = performance.now();
        const r = await promptAnswer(ctx.model, q.question, gen, t0);
        return row(ctx, q, mode, { ...r, routed: [], evidenceRecall: null, memoryIds: [], memoryTokens: 0, blocks: 0, alpha: null, leftOut: 0 });
      });
    case "full":
      return answerer(async (q, conversation) => {
        const t0 = performance.now();
        const fit = await fitConversation(ctx.model, conversation.turns, q.question, ctx.maxAnswerTokens);
        const r = await promptAnswer(ctx.model, fit.tokens, gen, t0);
        const kept = conversation.turns.slice(fit.dropped).map((t) => String(t.metadata.turnId));
        return row(ctx, q, mode, { ...r, routed: kept, evidenceRecall: recall(q.evidence, kept), memoryIds: [], memoryTokens: fit.conversationTokens, blocks: 0, alpha: null, leftOut: fit.dropped });
      });
    case "rag": {
      const rag = await RAGSystem.open({ model: ctx.model, dataDir: ctx.storeDir, cacheDir: ctx.cacheDir, embedder: ctx.embedder, memoryRerank: ctx.memoryRerank, config: systemConfig(ctx) });
      const turnIds = new TurnIds(rag.store);
      return answerer(
        async (q) => {
          const r = await rag.chat(q.question, { userId: q.userId, sessionId: session(q), ...gen });
          return row(ctx, q, mode, { ...(await turnFields(turnIds, q, r)), memoryTokens: r.metadata.contextTokens, blocks: 0, alpha: null });
        },
        () => rag.close(),
      );
    }
    case "dki":
    case "dki-joint": {
      const dki = await DKISystem.open({ model: ctx.model, dataDir: ctx.storeDir, cacheDir: ctx.cacheDir, embedder: ctx.embedder, memoryRerank: ctx.memoryRerank, config: dkiModeConfig(ctx, mode) });
      const turnIds = new TurnIds(dki.store);
      return answerer(
        async (q) => {
          const r = await dki.chat(q.question, { userId: q.userId, sessionId: session(q), forceAlpha: ctx.alpha, ...gen });
          return row(ctx, q, mode, { ...(await turnFields(turnIds, q, r)), memoryTokens: r.budget.memoryTokens, blocks: r.cache.tiers.length, alpha: r.gating.alpha });
        },
        () => dki.close(),
      );
    }
  }
}

/** What a DKI or RAG turn's response gives a row alike: the answer, its timing, what was routed and what reached the model. */
async function turnFields(
  turnIds: TurnIds,
  q: QAQuestion,
  r: Pick<DKIResponse | RAGResponse, "text" | "finishReason" | "inputTokens" | "latency" | "memoriesUsed"> & { metadata: { routed: RoutedMemory[] } },
): Promise<Answered & Pick<QARow, "routed" | "evidenceRecall" | "memoryIds" | "leftOut">> {
  return {
    prediction: cleanAnswer(r.text),
    finishReason: r.finishReason,
    promptTokens: r.inputTokens,
    ttftMs: r.latency.ttftMs,
    turnMs: r.latency.totalMs,
    ...(await routedFields(turnIds, q, r.metadata.routed)),
    memoryIds: r.memoriesUsed.map((m) => m.id),
    leftOut: r.metadata.routed.length - r.memoriesUsed.length,
  };
}

interface Answered {
  prediction: string;
  finishReason: string;
  promptTokens: number;
  ttftMs: number;
  turnMs: number;
}

/** The instruction and `query` (or its prompt, already rendered) through DKISystem's prompt renderer, answered greedily; timed from t0. */
async function promptAnswer(model: Model, query: string | number[], gen: { maxNewTokens: number; sampling: { temperature: number }; stop: string[] }, t0: number): Promise<Answered> {
  const prompt = typeof query === "string" ? await renderQuery(model, query) : query;
  let first = 0;
  const r = await model.generate({ tokens: prompt }, { ...gen, onToken: () => (first ||= performance.now()) });
  const end = performance.now();
  return { prediction: cleanAnswer(r.text), finishReason: r.finishReason, promptTokens: prompt.length, ttftMs: (first || end) - t0, turnMs: end - t0 };
}

async function renderQuery(model: Model, query: string): Promise<number[]> {
  const tok = model.tokenizer;
  return (await renderPrompt(tok, { query, systemPrompt: ANSWER_INSTRUCTION, language: detectLanguage(query) }, tok.chatTemplate !== null)).tokens;
}

/** Turns as full-context.ts writes them: the speaker and the text after the importer's "Speaker: " prefix. */
export function conversationTurns(turns: readonly ImportedTurn[]): ConversationTurn[] {
  return turns.map((t) => {
    const speaker = String(t.metadata.speaker);
    // The importer writes "Speaker: text" (LongMemEval capitalises the role); keep its spelling.
    const shown = t.text.slice(0, speaker.length + 2).toLowerCase() === `${speaker.toLowerCase()}: ` ? t.text.slice(0, speaker.length) : speaker;
    return { speaker: shown, text: t.text.slice(shown.length + 2) };
  });
}

export interface FittedConversation {
  /** The user message: the kept turns, a blank line, the question. */
  query: string;
  /** Oldest turns left out. */
  dropped: number;
  /** Tokens of the kept conversation text. */
  conversationTokens: number;
  /** The whole prompt, rendered (the instruction and the query through the chat template). */
  tokens: number[];
  /** Tokens of the whole prompt. */
  promptTokens: number;
}

/**
 * The `full` prompt for a question: the fewest oldest turns dropped so that the rendered prompt
 * leaves `answerTokens` of the model's window free (binary search: the prompt only shrinks as
 * turns go). Refused when even the question alone does not fit.
 */
export async function fitConversation(model: Model, turns: readonly ImportedTurn[], question: string, answerTokens: number): Promise<FittedConversation> {
  const all = conversationTurns(turns);
  const limit = model.contextSize - answerTokens;
  const query = (from: number) => (from >= all.length ? question : fullContextQuery(renderConversation(all.slice(from)), question));
  const rendered = new Map<number, number[]>();
  const prompt = async (from: number) => {
    let t = rendered.get(from);
    if (t === undefined) rendered.set(from, (t = await renderQuery(model, query(from))));
    return t;
  };
  const fits = async (from: number) => (await prompt(from)).length <= limit;
  let keepFrom = 0;
  if (!(await fits(0))) {
    const bare = (await prompt(all.length)).length;
    if (bare > limit) throw new DkiArgumentError(`the question alone makes a ${bare}-token prompt; the model's window of ${model.contextSize} less ${answerTokens} answer tokens leaves ${limit}`);
    let lo = 0; // does not fit
    let hi = all.length; // fits
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (await fits(mid)) hi = mid;
      else lo = mid;
    }
    keepFrom = hi;
  }
  const text = keepFrom >= all.length ? "" : renderConversation(all.slice(keepFrom));
  const tokens = await prompt(keepFrom);
  return { query: query(keepFrom), tokens, dropped: keepFrom, conversationTokens: text === "" ? 0 : model.tokenizer.encode(text, { addSpecialTokens: false }).length, promptTokens: tokens.length };
}

/**
 * The routed memories as the conversation's turn ids (the importer's metadata.turnId; a memory
 * without one by its own id), and the share of the question's evidence among them. The turn's
 * response lists what it routed; each user's turn ids are read from the store once.
 */
async function routedFields(turnIds: TurnIds, q: QAQuestion, routed: readonly RoutedMemory[]): Promise<Pick<QARow, "routed" | "evidenceRecall">> {
  const of = await turnIds.of(q.userId);
  const ids = routed.map((r) => of.get(r.id) ?? r.id);
  return { routed: ids, evidenceRecall: recall(q.evidence, ids) };
}

/** Memory id → turn id of each user, read from the store on a user's first question. */
class TurnIds {
  private readonly byUser = new Map<string, Promise<Map<string, string>>>();
  constructor(private readonly store: Pick<MemoryStoreApi, "memories">) {}

  of(userId: string): Promise<Map<string, string>> {
    let m = this.byUser.get(userId);
    if (m === undefined) {
      m = this.store.memories.getAll({ userId }).then((all) => new Map(all.flatMap((x) => (x.metadata.turnId === undefined ? [] : [[x.id, String(x.metadata.turnId)] as const]))));
      this.byUser.set(userId, m);
    }
    return m;
  }
}

function recall(evidence: readonly string[], found: readonly string[]): number | null {
  if (evidence.length === 0) return null;
  const set = new Set(found);
  return evidence.filter((e) => set.has(e)).length / evidence.length;
}

/** The generated text up to the end of the turn, trimmed. */
export function cleanAnswer(text: string): string {
  let t = text;
  for (const m of END_OF_TURN) {
    const i = t.indexOf(m);
    if (i >= 0) t = t.slice(0, i);
  }
  return t.trim();
}

function row(ctx: RunContext, q: QAQuestion, mode: Mode, r: Answered & Pick<QARow, "routed" | "evidenceRecall" | "memoryIds" | "memoryTokens" | "blocks" | "alpha" | "leftOut">): QARow {
  const s = q.category !== null ? scoreLocomo(r.prediction, q.answer, q.category) : scoreLongMemEval(r.prediction, q.answer, q.id);
  return {
    id: q.id,
    conversation: q.userId,
    category: q.category !== null ? String(q.category) : (q.questionType ?? ""),
    answerable: q.answerable,
    question: q.question,
    answer: q.answer,
    mode,
    prediction: r.prediction,
    finishReason: r.finishReason,
    f1: s.f1,
    em: s.em,
    judge: null,
    judgeReply: null,
    evidence: q.evidence,
    routed: r.routed,
    evidenceRecall: r.evidenceRecall,
    memoryIds: r.memoryIds,
    memoryTokens: r.memoryTokens,
    promptTokens: r.promptTokens,
    blocks: r.blocks,
    alpha: r.alpha,
    ttftMs: r.ttftMs,
    turnMs: r.turnMs,
    leftOut: r.leftOut,
  };
}

/** The judge's yes/no on a LongMemEval answer (greedy, a few tokens). */
async function judgeRow(judge: Model, q: QAQuestion, prediction: string): Promise<Pick<QARow, "judge" | "judgeReply">> {
  const prompt = judgePrompt(q.questionType ?? "", q.id, q.question, q.answer, prediction);
  const tokens = (await renderPrompt(judge.tokenizer, { query: prompt, language: "en" }, judge.tokenizer.chatTemplate !== null)).tokens;
  const r = await judge.generate({ tokens }, { maxNewTokens: 4, sampling: { temperature: 0 }, stop: END_OF_TURN });
  const reply = cleanAnswer(r.text);
  return { judge: judgeVerdict(reply), judgeReply: reply };
}
