// Answer scoring as the memory benchmarks define it.
//
// LoCoMo (its evaluation.py): normalise (lower-case, drop commas and punctuation, remove the words
// a/an/the/and, collapse spaces), Porter-stem each word, token F1 over the multisets of stems.
//   category 1 (multi-hop)    prediction and answer split on ","; each answer part's best F1 over
//                             the prediction parts, averaged over the answer parts
//   category 3 (open-domain)  the answer up to its first ";"
//   category 2, 4             plain token F1
//   category 5 (adversarial)  1 when the prediction says "no information available" or
//                             "not mentioned" (after normalisation), else 0
// Exact match besides: the normalised prediction equals the normalised answer (category 5: the
// same 0/1 as its F1).
// LongMemEval: exact match and token F1 the same way; an abstention question (its id ends in
// "_abs") scores 1 on both when the prediction abstains (the two phrases above), else 0.
//
// Two extensions for non-English text, neither of which changes an ASCII answer's score: Unicode
// punctuation (，。“” ’) is dropped with ASCII's, "，" splits category 1 parts like ",", and every
// CJK character is a token of its own (Chinese is written without spaces, so a sentence would be
// one "word" otherwise); CJK characters are not stemmed.
import { porterStem } from "./porter.js";

export type LocomoCategory = 1 | 2 | 3 | 4 | 5;

export interface AnswerScore {
  f1: number;
  em: number;
}

// Python's string.punctuation, plus Unicode punctuation.
const PUNCTUATION = /[!"#$%&'()*+,\-./:;<=>?@[\\\]^_`{|}~]|\p{P}/gu;
const ARTICLES = /(?<![\p{L}\p{N}_])(?:a|an|the|and)(?![\p{L}\p{N}_])/gu;
const CJK = /[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}]/u;
const CJK_SPLIT = /([\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}])/u;

/** LoCoMo's normalize_answer: lower case, no punctuation, no a/an/the/and, single spaces. */
export function normalizeAnswer(s: string): string {
  return s.toLowerCase().replace(PUNCTUATION, "").replace(ARTICLES, " ").split(/\s+/).filter((w) => w !== "").join(" ");
}

/** The stemmed tokens F1 compares: words stemmed, CJK characters one token each. */
export function answerTokens(s: string): string[] {
  const out: string[] = [];
  for (const word of normalizeAnswer(s).split(" ")) {
    for (const piece of word.split(CJK_SPLIT)) {
      if (piece === "") continue;
      out.push(CJK.test(piece) ? piece : porterStem(piece));
    }
  }
  return out;
}

/** Token F1 of two texts (LoCoMo's f1_score): 0 when they share no token. */
export function tokenF1(prediction: string, answer: string): number {
  const p = answerTokens(prediction);
  const a = answerTokens(answer);
  const counts = new Map<string, number>();
  for (const t of a) counts.set(t, (counts.get(t) ?? 0) + 1);
  let same = 0;
  for (const t of p) {
    const n = counts.get(t) ?? 0;
    if (n > 0) {
      same++;
      counts.set(t, n - 1);
    }
  }
  if (same === 0) return 0;
  const precision = same / p.length;
  const recall = same / a.length;
  return (2 * precision * recall) / (precision + recall);
}

/** LoCoMo's multi-answer F1 (category 1): each answer part's best F1 over the prediction's parts, averaged. */
export function multiAnswerF1(prediction: string, answer: string): number {
  const parts = (s: string) => s.split(/[,，]/).map((x) => x.trim());
  const preds = parts(prediction);
  const golds = parts(answer);
  return golds.reduce((sum, g) => sum + Math.max(...preds.map((p) => tokenF1(p, g))), 0) / golds.length;
}

export function exactMatch(prediction: string, answer: string): number {
  return normalizeAnswer(prediction) === normalizeAnswer(answer) ? 1 : 0;
}

/** The prediction declines to answer: it says "not mentioned" or "no information available". */
export function abstains(prediction: string): boolean {
  const n = normalizeAnswer(prediction);
  return n.includes("not mentioned") || n.includes("no information available");
}

/** A LoCoMo question's scores under its category's rule. */
export function scoreLocomo(prediction: string, answer: string, category: LocomoCategory): AnswerScore {
  if (category === 5) {
    const s = abstains(prediction) ? 1 : 0;
    return { f1: s, em: s };
  }
  const gold = category === 3 ? answer.split(";")[0].trim() : answer;
  return { f1: category === 1 ? multiAnswerF1(prediction, gold) : tokenF1(prediction, gold), em: exactMatch(prediction, gold) };
}

/** A LongMemEval question's scores; an abstention question (id ending in "_abs") scores whether the prediction abstains. */
export function scoreLongMemEval(prediction: string, answer: string, questionId: string): AnswerScore {
  if (isAbstention(questionId)) {
    const s = abstains(prediction) ? 1 : 0;
    return { f1: s, em: s };
  }
  return { f1: tokenF1(prediction, answer), em: exactMatch(prediction, answer) };
}

export function isAbstention(questionId: string): boolean {
  return questionId.endsWith("_abs");
}

/**
 * The yes/no question a judge model is asked about a LongMemEval answer, per question type, after
 * the LongMemEval paper's evaluation: does the response hold the correct answer (all of it, or the
 * steps to it); temporal reasoning forgives an off-by-one count of days, weeks or months; a
 * knowledge update may mention the old value as long as the answer is the updated one; a
 * preference question gives a rubric, met when the response uses the user's information
 * correctly; an abstention question is correct when the response says it cannot be answered.
 */
export function judgePrompt(questionType: string, questionId: string, question: string, answer: string, response: string): string {
  if (isAbstention(questionId)) {
    return [
      "I will give you a question that cannot be answered from the conversation, an explanation of why, and a response from a model.",
      "Answer yes if the response correctly says the question cannot be answered: it may say the information is missing or incomplete, or that other information was given but not the information asked for. Otherwise answer no.",
      "",
      `Question: ${question}`,
      "",
      `Explanation: ${answer}`,
      "",
      `Model response: ${response}`,
      "",
      "Does the response correctly identify the question as unanswerable? Answer yes or no only.",
    ].join("\n");
  }
  if (questionType === "single-session-preference") {
    return [
      "I will give you a question, a rubric describing the personalised response wanted, and a response from a model.",
      "Answer yes if the response satisfies the rubric, otherwise answer no. The response need not cover every point of the rubric: it is correct as long as it recalls and uses the user's personal information correctly.",
      "",
      `Question: ${question}`,
      "",
      `Rubric: ${answer}`,
      "",
      `Model response: ${response}`,
      "",
      "Is the response correct? Answer yes or no only.",
    ].join("\n");
  }
  const extra: Record<string, string> = {
    "temporal-reasoning":
      " Do not penalise off-by-one errors in a number of days, weeks or months: if the question asks for such a count and the response is off by one (19 days where the answer is 18), the response is still correct.",
    "knowledge-update":
      " If the response mentions earlier information together with the updated answer, it is correct as long as the updated answer is the one asked for.",
  };
  return [
    "I will give you a question, the correct answer and a response from a model.",
    "Answer yes if the response contains the correct answer, otherwise answer no. If the response is equivalent to the correct answer, or contains all the intermediate steps to reach it, answer yes. If it contains only part of the information the answer needs, answer no." +
      (extra[questionType] ?? ""),
    "",
    `Question: ${question}`,
    "",
    `Correct answer: ${answer}`,
    "",
    `Model response: ${response}`,
    "",
    "Is the response correct? Answer yes or no only.",
  ].join("\n");
}

/** A judge's verdict from its reply: 1 when its first word is "yes", 0 when "no", null otherwise. */
export function judgeVerdict(reply: string): number | null {
  const first = normalizeAnswer(reply).split(" ")[0];
  return first === "yes" ? 1 : first === "no" ? 0 : null;
}
