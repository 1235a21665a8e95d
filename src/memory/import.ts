// Conversation import: real dialogue corpora in their published formats become memories, one user
// per conversation and one memory per turn, so benchmarks run on real data at real scale; or, as
// "history", the user's conversation sessions (one message per turn), which Recall v4 searches.
//
//   LoCoMo       a list of samples (or one sample) with conversation: { speaker_a, speaker_b,
//                session_<n>: [{ speaker, dia_id, text, blip_caption? }], session_<n>_date_time }
//                (some copies put the session_* keys at the sample's top level) and qa: [...].
//                User: sample_id, else conv-<index>. turnId: dia_id.
//   LongMemEval  a list of { question_id, haystack_session_ids, haystack_dates,
//                haystack_sessions: [[{ role, content }]] }. User: question_id.
//                turnId: <session id>:<turn index>.
// Each memory's text is "Speaker: text" (a LoCoMo image turn adds " [image: <caption>]", since the
// caption is often what a question asks about) and its metadata { turnId, speaker, sessionId, date }.
// As history, each turn is a message with that text and metadata, in its session, in file order;
// its role is the LongMemEval role, or for LoCoMo "user" for speaker_a and "assistant" for the
// other speaker (both are people: the text keeps their names).
//
// The whole file is checked before anything is written, and a shape error names the path inside
// the file ("[3].conversation.session_2[5].text"). Users that already exist are refused, so an
// import is never doubled; each user's memories are written in one transaction.
import { readFile, stat } from "node:fs/promises";
import { decodeUtf8 } from "../util/utf8.js";
import { ImportFormatError } from "./errors.js";
import type { Metadata, Role } from "./types.js";

export type ImportFormat = "locomo" | "longmemeval" | "auto";
/** What each turn becomes: a memory, or a message of the user's conversation history. */
export type ImportAs = "memories" | "history";

export interface ImportOptions {
  format?: ImportFormat;
  as?: ImportAs;
  onProgress?: (done: number, total: number) => void;
}

// V8's longest string is 2^29 - 24 UTF-16 units; a file read whole must decode into one.
const MAX_FILE_BYTES = 512 * 2 ** 20;

export interface ImportResult {
  format: "locomo" | "longmemeval";
  as: ImportAs;
  /** Per user, the memories or the history messages written (the other count is 0). */
  users: { userId: string; memories: number; messages: number }[];
  memories: number;
  messages: number;
  /** Characters of the file that were not UTF-8, read as U+FFFD (the CLI warns when there are any). */
  invalidUtf8: number;
}

export interface ImportedTurn {
  /** Where the turn is in the file, for errors. */
  at: string;
  text: string;
  sessionId: string;
  /** Its role as a history message. */
  role: Role;
  metadata: Metadata;
}

export interface ImportedConversation {
  userId: string;
  turns: ImportedTurn[];
}

/** What import needs of the store. */
export interface ImportTarget {
  readonly maxTextChars: number;
  listUsers(): string[];
  insertTurns(userId: string, turns: ImportedTurn[]): Promise<number>;
  insertHistory(userId: string, turns: ImportedTurn[]): Promise<number>;
}

/** Reads and checks a whole file; throws ImportFormatError naming the path of the first problem. */
export async function parseConversations(file: string, format: ImportFormat = "auto"): Promise<{ format: "locomo" | "longmemeval"; conversations: ImportedConversation[]; invalidUtf8: number }> {
  let data: unknown;
  let invalidUtf8 = 0;
  try {
    const size = (await stat(file)).size;
    if (size > MAX_FILE_BYTES) {
      throw new ImportFormatError(file, "$", `${(size / 2 ** 20).toFixed(0)} MiB; a file is parsed whole, and above ${MAX_FILE_BYTES / 2 ** 20} MiB its text would not fit in one JavaScript string (split it, e.g. LongMemEval-M by question)`);
    }
    const decoded = decodeUtf8(await readFile(file));
    invalidUtf8 = decoded.replaced;
    data = JSON.parse(decoded.text);
  } catch (e) {
    if (e instanceof ImportFormatError) throw e;
    if (e instanceof SyntaxError) throw new ImportFormatError(file, "$", `not JSON: ${e.message}`);
    throw new ImportFormatError(file, "$", `cannot read it: ${(e as Error).message}`);
  }
  const kind = format === "auto" ? detect(file, data) : format;
  if (kind !== "locomo" && kind !== "longmemeval") throw new ImportFormatError(file, "$", `unknown format ${JSON.stringify(format)} (expected locomo, longmemeval or auto)`);
  const conversations = kind === "locomo" ? parseLocomo(file, data) : parseLongMemEval(file, data);
  const seen = new Map<string, number>();
  conversations.forEach((c, i) => {
    const earlier = seen.get(c.userId);
    if (earlier !== undefined) throw new ImportFormatError(file, `[${i}]`, `user id ${JSON.stringify(c.userId)} is also that of [${earlier}]`);
    seen.set(c.userId, i);
  });
  return { format: kind, conversations, invalidUtf8 };
}

export async function importConversations(target: ImportTarget, file: string, options: ImportOptions = {}): Promise<ImportResult> {
  const as = options.as ?? "memories";
  if (as !== "memories" && as !== "history") throw new ImportFormatError(file, "$", `cannot import as ${JSON.stringify(as)} (expected "memories" or "history")`);
  const { format, conversations, invalidUtf8 } = await parseConversations(file, options.format ?? "auto");
  const existing = new Set(target.listUsers());
  const clash = conversations.find((c) => existing.has(c.userId));
  if (clash !== undefined) throw new ImportFormatError(file, "$", `user ${JSON.stringify(clash.userId)} already exists in the store; erase it first (dki user erase) or import into another folder`);
  for (const c of conversations) {
    const long = c.turns.find((t) => t.text.length > target.maxTextChars);
    if (long !== undefined) throw new ImportFormatError(file, long.at, `the turn is ${long.text.length} characters long as a ${as === "memories" ? "memory" : "message"}; the store's maximum is ${target.maxTextChars} (maxTextChars)`);
  }
  const users: ImportResult["users"] = [];
  options.onProgress?.(0, conversations.length);
  for (const c of conversations) {
    const n = c.turns.length === 0 ? 0 : as === "memories" ? await target.insertTurns(c.userId, c.turns) : await target.insertHistory(c.userId, c.turns);
    users.push({ userId: c.userId, memories: as === "memories" ? n : 0, messages: as === "history" ? n : 0 });
    options.onProgress?.(users.length, conversations.length);
  }
  const sum = (k: "memories" | "messages") => users.reduce((n, u) => n + u[k], 0);
  return { format, as, users, memories: sum("memories"), messages: sum("messages"), invalidUtf8 };
}

function detect(file: string, data: unknown): "locomo" | "longmemeval" {
  const first = Array.isArray(data) ? data[0] : data;
  if (isObject(first)) {
    if ("haystack_sessions" in first) return "longmemeval";
    if ("conversation" in first || Object.keys(first).some((k) => SESSION.test(k))) return "locomo";
  }
  if (Array.isArray(data) && data.length === 0) throw new ImportFormatError(file, "$", "an empty list: nothing to import");
  throw new ImportFormatError(file, Array.isArray(data) ? "[0]" : "$", "neither LoCoMo (conversation / session_<n>) nor LongMemEval (haystack_sessions); pass the format explicitly to see what is missing");
}

const SESSION = /^session_(\d+)$/;

function parseLocomo(file: string, data: unknown): ImportedConversation[] {
  const samples = Array.isArray(data) ? data : [data];
  const prefix = Array.isArray(data) ? (i: number) => `[${i}]` : () => "$";
  return samples.map((sample, i) => {
    const at = prefix(i);
    const s = object(file, at, sample);
    const userId = s.sample_id === undefined ? `conv-${i}` : str(file, `${at}.sample_id`, s.sample_id);
    const [conv, convAt] = s.conversation === undefined ? [s, at] : [object(file, `${at}.conversation`, s.conversation), `${at}.conversation`];
    const sessions = Object.keys(conv)
      .map((k) => SESSION.exec(k))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => ({ key: m[0], n: Number(m[1]) }))
      .sort((a, b) => a.n - b.n);
    if (sessions.length === 0) throw new ImportFormatError(file, convAt, "no session_<n> keys: not a LoCoMo conversation");
    // The user's side of the history: speaker_a, else whoever speaks first.
    let speakerA = conv.speaker_a === undefined ? undefined : str(file, `${convAt}.speaker_a`, conv.speaker_a);
    const turns: ImportedTurn[] = [];
    for (const { key } of sessions) {
      const list = conv[key];
      const sAt = `${convAt}.${key}`;
      if (!Array.isArray(list)) throw new ImportFormatError(file, sAt, `expected a list of turns, got ${kind(list)}`);
      const dateValue = conv[`${key}_date_time`];
      const date = dateValue === undefined ? null : str(file, `${convAt}.${key}_date_time`, dateValue);
      list.forEach((turn, j) => {
        const tAt = `${sAt}[${j}]`;
        const t = object(file, tAt, turn);
        const speaker = str(file, `${tAt}.speaker`, t.speaker);
        speakerA ??= speaker;
        const diaId = str(file, `${tAt}.dia_id`, t.dia_id);
        const text = str(file, `${tAt}.text`, t.text, true);
        const caption = t.blip_caption === undefined || t.blip_caption === null ? "" : str(file, `${tAt}.blip_caption`, t.blip_caption, true);
        const role: Role = speaker === speakerA ? "user" : "assistant";
        turns.push({ at: tAt, text: `${speaker}: ${text}${caption === "" ? "" : ` [image: ${caption}]`}`, sessionId: key, role, metadata: { turnId: diaId, speaker, sessionId: key, date } });
      });
    }
    return { userId, turns };
  });
}

function parseLongMemEval(file: string, data: unknown): ImportedConversation[] {
  if (!Array.isArray(data)) throw new ImportFormatError(file, "$", `expected a list of LongMemEval questions, got ${kind(data)}`);
  return data.map((item, i) => {
    const at = `[${i}]`;
    const q = object(file, at, item);
    const userId = str(file, `${at}.question_id`, q.question_id);
    const ids = strList(file, `${at}.haystack_session_ids`, q.haystack_session_ids);
    const dates = strList(file, `${at}.haystack_dates`, q.haystack_dates);
    const sessions = q.haystack_sessions;
    if (!Array.isArray(sessions)) throw new ImportFormatError(file, `${at}.haystack_sessions`, `expected a list of sessions, got ${kind(sessions)}`);
    if (sessions.length !== ids.length || dates.length !== ids.length) {
      throw new ImportFormatError(file, at, `haystack_sessions (${sessions.length}), haystack_session_ids (${ids.length}) and haystack_dates (${dates.length}) differ in length`);
    }
    const turns: ImportedTurn[] = [];
    sessions.forEach((session, s) => {
      const sAt = `${at}.haystack_sessions[${s}]`;
      if (!Array.isArray(session)) throw new ImportFormatError(file, sAt, `expected a list of turns, got ${kind(session)}`);
      session.forEach((turn, j) => {
        const tAt = `${sAt}[${j}]`;
        const t = object(file, tAt, turn);
        const role = str(file, `${tAt}.role`, t.role);
        if (role !== "user" && role !== "assistant" && role !== "system") throw new ImportFormatError(file, `${tAt}.role`, `expected "user", "assistant" or "system", got ${JSON.stringify(role)}`);
        const content = str(file, `${tAt}.content`, t.content, true);
        const speaker = role.charAt(0).toUpperCase() + role.slice(1);
        turns.push({ at: tAt, text: `${speaker}: ${content}`, sessionId: ids[s], role, metadata: { turnId: `${ids[s]}:${j}`, speaker: role, sessionId: ids[s], date: dates[s] } });
      });
    });
    return { userId, turns };
  });
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function object(file: string, at: string, v: unknown): Record<string, unknown> {
  if (!isObject(v)) throw new ImportFormatError(file, at, `expected an object, got ${kind(v)}`);
  return v;
}

function str(file: string, at: string, v: unknown, allowEmpty = false): string {
  if (typeof v !== "string") throw new ImportFormatError(file, at, `expected a string, got ${kind(v)}`);
  if (!allowEmpty && v.trim() === "") throw new ImportFormatError(file, at, "is empty");
  return v;
}

function strList(file: string, at: string, v: unknown): string[] {
  if (!Array.isArray(v)) throw new ImportFormatError(file, at, `expected a list of strings, got ${kind(v)}`);
  return v.map((x, i) => str(file, `${at}[${i}]`, x));
}

function kind(v: unknown): string {
  if (v === null) return "null";
  if (v === undefined) return "nothing (missing)";
  if (Array.isArray(v)) return "a list";
  return typeof v === "object" ? "an object" : `a ${typeof v}`;
}
