// The questions of a memory-QA file, beside the conversations the memory layer's importer reads
// from it (src/memory/import.ts: its format detection and shape checks run first, so a file the
// importer refuses is refused here with the same error).
//
//   LoCoMo       every sample's qa: [{ question, answer, evidence: ["D1:3", …], category }];
//                category 5 (adversarial) may carry adversarial_answer instead of answer. Id
//                <sample user>:<index in qa>. The synthetic set (part 2) is written in this form.
//   LongMemEval  one question per item, its haystack the item's own conversation; evidence: the
//                turns marked has_answer. Id: question_id; type: question_type.
import { readFile } from "node:fs/promises";
import { ImportFormatError } from "../memory/errors.js";
import { parseConversations, type ImportedConversation } from "../memory/import.js";
import type { LocomoCategory } from "./scoring.js";

export interface QAQuestion {
  id: string;
  /** The store user (one per conversation) the question is asked of. */
  userId: string;
  question: string;
  /** The gold answer as text ("" when the file gives none, as for some adversarial questions). */
  answer: string;
  /** LoCoMo category, or null for LongMemEval. */
  category: LocomoCategory | null;
  /** LongMemEval question_type, or null for LoCoMo. */
  questionType: string | null;
  /** Turn ids (the imported memories' metadata.turnId) that hold the answer. */
  evidence: string[];
  /** false for questions whose right answer is that it was never said (LoCoMo category 5, LongMemEval "_abs"). */
  answerable: boolean;
}

export interface QADataset {
  format: "locomo" | "longmemeval";
  conversations: ImportedConversation[];
  questions: QAQuestion[];
}

export async function loadQADataset(file: string): Promise<QADataset> {
  const { format, conversations } = await parseConversations(file);
  // parseConversations read and checked the file; read again for the questions it does not keep.
  const data = JSON.parse(await readFile(file, "utf8")) as unknown;
  const questions = format === "locomo" ? locomoQuestions(file, data, conversations) : longMemEvalQuestions(file, data as unknown[]);
  const ids = new Set<string>();
  for (const q of questions) {
    if (ids.has(q.id)) throw new ImportFormatError(file, "$", `question id ${JSON.stringify(q.id)} appears twice`);
    ids.add(q.id);
  }
  return { format, conversations, questions };
}

function locomoQuestions(file: string, data: unknown, conversations: ImportedConversation[]): QAQuestion[] {
  const samples = Array.isArray(data) ? data : [data];
  const prefix = Array.isArray(data) ? (i: number) => `[${i}]` : () => "$";
  return samples.flatMap((sample, i) => {
    const s = sample as Record<string, unknown>;
    const userId = conversations[i].userId;
    if (s.qa === undefined) return [];
    if (!Array.isArray(s.qa)) throw new ImportFormatError(file, `${prefix(i)}.qa`, `expected a list of questions, got ${kind(s.qa)}`);
    return s.qa.map((item, j): QAQuestion => {
      const at = `${prefix(i)}.qa[${j}]`;
      const q = object(file, at, item);
      const category = q.category;
      if (category !== 1 && category !== 2 && category !== 3 && category !== 4 && category !== 5) throw new ImportFormatError(file, `${at}.category`, `expected 1 to 5, got ${JSON.stringify(category)}`);
      const answer = q.answer ?? (category === 5 ? (q.adversarial_answer ?? "") : undefined);
      return {
        id: `${userId}:${j}`,
        userId,
        question: text(file, `${at}.question`, q.question),
        answer: answerText(file, `${at}.answer`, answer),
        category,
        questionType: null,
        evidence: evidenceIds(file, `${at}.evidence`, q.evidence),
        answerable: category !== 5,
      };
    });
  });
}

function longMemEvalQuestions(file: string, data: unknown[]): QAQuestion[] {
  return data.map((item, i): QAQuestion => {
    const at = `[${i}]`;
    const q = item as Record<string, unknown>;
    const id = q.question_id as string; // checked by the importer
    const sessionIds = q.haystack_session_ids as string[];
    const evidence: string[] = [];
    (q.haystack_sessions as Record<string, unknown>[][]).forEach((session, s) => session.forEach((turn, t) => {
      if (turn.has_answer === true) evidence.push(`${sessionIds[s]}:${t}`);
    }));
    return {
      id,
      userId: id,
      question: text(file, `${at}.question`, q.question),
      answer: answerText(file, `${at}.answer`, q.answer),
      category: null,
      questionType: text(file, `${at}.question_type`, q.question_type),
      evidence,
      answerable: !id.endsWith("_abs"),
    };
  });
}

function object(file: string, at: string, v: unknown): Record<string, unknown> {
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw new ImportFormatError(file, at, `expected an object, got ${kind(v)}`);
  return v as Record<string, unknown>;
}

function text(file: string, at: string, v: unknown): string {
  if (typeof v !== "string" || v.trim() === "") throw new ImportFormatError(file, at, `expected a non-empty string, got ${kind(v)}`);
  return v;
}

/** Answers are text, though some files write a year or a count as a number. */
function answerText(file: string, at: string, v: unknown): string {
  if (typeof v === "string") return v;
  if (typeof v === "number" && Number.isFinite(v)) return String(v);
  throw new ImportFormatError(file, at, `expected the answer as a string or number, got ${kind(v)}`);
}

/** LoCoMo's evidence ids; a few copies pack two in one string ("D8:6; D9:17"). */
function evidenceIds(file: string, at: string, v: unknown): string[] {
  if (v === undefined) return [];
  if (!Array.isArray(v)) throw new ImportFormatError(file, at, `expected a list of dialogue ids, got ${kind(v)}`);
  return v.flatMap((e, i) => {
    if (typeof e !== "string") throw new ImportFormatError(file, `${at}[${i}]`, `expected a dialogue id string, got ${kind(e)}`);
    return e.split(/[;,\s]+/).filter((x) => x !== "");
  });
}

function kind(v: unknown): string {
  if (v === null) return "null";
  if (v === undefined) return "nothing (missing)";
  if (Array.isArray(v)) return "a list";
  return typeof v === "object" ? "an object" : `${typeof v} ${JSON.stringify(v)}`.slice(0, 60);
}
