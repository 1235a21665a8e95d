// The memory-QA scorers against hand-worked expectations (test/fixtures/eval/scoring-golden.json):
// Porter stems, LoCoMo's normalisation and per-category rules, LongMemEval's abstention rule, CJK
// tokens, the judge's verdict. Every expected number in the file was worked out by hand from the
// published rules, with the working beside it; the stemmer is also checked word for word against
// NLTK's PorterStemmer in its ORIGINAL_ALGORITHM mode (test/fixtures/eval/porter-nltk-original.json).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { porterStem } from "../src/eval/porter.js";
import { judgePrompt, judgeVerdict, normalizeAnswer, scoreLocomo, scoreLongMemEval, type LocomoCategory } from "../src/eval/scoring.js";
import { repoRoot } from "./support/paths.js";

interface Golden {
  stems: { word: string; stem: string }[];
  normalize: { text: string; normalized: string }[];
  locomo: { prediction: string; answer: string; category: LocomoCategory; f1: number; em: number; working: string }[];
  longmemeval: { prediction: string; answer: string; question_id: string; f1: number; em: number; working: string }[];
  judge: { reply: string; verdict: number | null }[];
}

const golden = JSON.parse(readFileSync(join(repoRoot, "test/fixtures/eval/scoring-golden.json"), "utf8")) as Golden;

describe("Porter stemmer (1980)", () => {
  test.each(golden.stems)("$word → $stem", ({ word, stem }) => {
    expect(porterStem(word)).toBe(stem);
  });
});

describe("Porter stemmer against NLTK's ORIGINAL_ALGORITHM mode", () => {
  const ref = JSON.parse(readFileSync(join(repoRoot, "test/fixtures/eval/porter-nltk-original.json"), "utf8")) as { stems: Record<string, string> };
  test("every word's stem equals NLTK's", () => {
    const words = Object.keys(ref.stems);
    expect(words.length).toBeGreaterThan(1000);
    const wrong = words.filter((w) => porterStem(w) !== ref.stems[w]).map((w) => `${w}: ${porterStem(w)} (NLTK ${ref.stems[w]})`);
    expect(wrong).toEqual([]);
  });
});

describe("LoCoMo normalisation", () => {
  test.each(golden.normalize)("$text", ({ text, normalized }) => {
    expect(normalizeAnswer(text)).toBe(normalized);
  });
});

describe("LoCoMo scoring", () => {
  test.each(golden.locomo)("cat $category: $prediction | $answer", ({ prediction, answer, category, f1, em }) => {
    const s = scoreLocomo(prediction, answer, category);
    expect(s.f1).toBeCloseTo(f1, 5);
    expect(s.em).toBe(em);
  });
});

describe("LongMemEval scoring", () => {
  test.each(golden.longmemeval)("$question_id: $prediction | $answer", ({ prediction, answer, question_id, f1, em }) => {
    const s = scoreLongMemEval(prediction, answer, question_id);
    expect(s.f1).toBeCloseTo(f1, 5);
    expect(s.em).toBe(em);
  });
});

describe("judge", () => {
  test.each(golden.judge)("verdict of $reply", ({ reply, verdict }) => {
    expect(judgeVerdict(reply)).toBe(verdict);
  });

  test("each question type gets its own rule, the question, the answer and the response", () => {
    const temporal = judgePrompt("temporal-reasoning", "t1", "How many days?", "18 days", "19 days");
    expect(temporal).toContain("off-by-one");
    expect(temporal).toMatch(/Question: How many days\?[\s\S]*Correct answer: 18 days[\s\S]*Model response: 19 days/);
    expect(judgePrompt("knowledge-update", "k1", "q", "a", "r")).toContain("updated answer");
    expect(judgePrompt("single-session-preference", "p1", "q", "likes jazz", "r")).toContain("Rubric: likes jazz");
    expect(judgePrompt("multi-session", "m1_abs", "q", "never said", "r")).toContain("unanswerable");
    const plain = judgePrompt("multi-session", "m1", "q", "a", "r");
    expect(plain).not.toContain("off-by-one");
    expect(plain).not.toContain("unanswerable");
  });
});
