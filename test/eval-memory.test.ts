// The memory-QA harness end to end on a generated random-weight model: a LoCoMo-format and a
// LongMemEval-format file written here run through every mode, giving one row per (question,
// mode) and a report; rag and dki* route the same memories; dki-joint injects one block of all
// of them; none's prompt is dki's without the injection; full drops the fewest oldest turns that
// make the prompt fit; a rerun (after a limit, or a run killed mid-line) answers only what is
// missing and ends with the same file.
import { appendFileSync, existsSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Model } from "../src/engine/model.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { fitConversation, MODES, runMemoryQA, type MemoryQAResult, type QARow } from "../src/eval/memory-qa.js";
import { reportName, writeMemoryQAReport } from "../src/eval/report.js";
import { ANSWER_INSTRUCTION } from "../src/eval/instruction.js";
import { parseConversations } from "../src/memory/import.js";
import { judgePrompt, judgeVerdict, scoreLocomo, scoreLongMemEval } from "../src/eval/scoring.js";
import { dki } from "./support/dki-bin.js";
import { repoRoot, tempDir } from "./support/paths.js";

let modelDir: string;
let model: Model;
let locomoFile: string;
let lmeFile: string;

// Two LoCoMo samples: facts amid small talk, questions of every category with evidence.
const LOCOMO = [
  {
    sample_id: "ann",
    conversation: {
      speaker_a: "Ann",
      speaker_b: "Bob",
      session_1_date_time: "1:00 pm on 8 May, 2023",
      session_1: [
        { speaker: "Ann", dia_id: "D1:1", text: "I moved to Lisbon last spring." },
        { speaker: "Bob", dia_id: "D1:2", text: "How is the weather in Lisbon?" },
        { speaker: "Ann", dia_id: "D1:3", text: "Sunny. My cat Miso sleeps on the balcony all day.", blip_caption: "a cat on a balcony" },
      ],
      session_2_date_time: "2:00 pm on 20 May, 2023",
      session_2: [
        { speaker: "Ann", dia_id: "D2:1", text: "I started a job at Acme Robotics as an engineer." },
        { speaker: "Bob", dia_id: "D2:2", text: "Congratulations! Do you still paint?" },
        { speaker: "Ann", dia_id: "D2:3", text: "Yes, I paint and go hiking on weekends." },
      ],
    },
    qa: [
      { question: "Where does Ann live?", answer: "Lisbon", evidence: ["D1:1"], category: 4 },
      { question: "What are Ann's hobbies?", answer: "painting, hiking", evidence: ["D2:3"], category: 1 },
      { question: "When did Ann start at Acme Robotics?", answer: "May 2023", evidence: ["D2:1"], category: 2 },
      { question: "Would Ann enjoy a beach holiday?", answer: "Likely yes; she likes sun", evidence: ["D1:3"], category: 3 },
      { question: "What is the name of Ann's dog?", adversarial_answer: "Miso", evidence: ["D1:3"], category: 5 },
    ],
  },
  {
    sample_id: "li",
    conversation: {
      speaker_a: "Li",
      speaker_b: "Wei",
      session_1: [
        { speaker: "Li", dia_id: "D1:1", text: "我对花生过敏。" },
        { speaker: "Wei", dia_id: "D1:2", text: "那你平时吃什么零食？" },
        { speaker: "Li", dia_id: "D1:3", text: "我喜欢吃苹果，住在北京。" },
      ],
    },
    qa: [
      { question: "Li对什么过敏？", answer: "花生", evidence: ["D1:1"], category: 4 },
      { question: "Li住在哪里？", answer: "北京", evidence: ["D1:3"], category: 4 },
    ],
  },
];

// Three LongMemEval questions, each with its own haystack; one abstention.
const LME = [
  {
    question_id: "q_car",
    question_type: "single-session-user",
    question: "What car do I drive?",
    answer: "a red Toyota Corolla",
    question_date: "2023/06/01",
    haystack_session_ids: ["s_a", "s_b"],
    haystack_dates: ["2023/05/01", "2023/05/02"],
    haystack_sessions: [
      [
        { role: "user", content: "I just washed my red Toyota Corolla.", has_answer: true },
        { role: "assistant", content: "Nice, a clean car feels great." },
      ],
      [
        { role: "user", content: "Recommend a podcast about history." },
        { role: "assistant", content: "Try a long-form history podcast." },
      ],
    ],
    answer_session_ids: ["s_a"],
  },
  {
    question_id: "q_city",
    question_type: "knowledge-update",
    question: "Which city do I live in now?",
    answer: "Oslo",
    question_date: "2023/06/01",
    haystack_session_ids: ["s_c", "s_d"],
    haystack_dates: ["2023/05/01", "2023/05/20"],
    haystack_sessions: [
      [{ role: "user", content: "I live in Bergen." }, { role: "assistant", content: "Bergen is rainy." }],
      [{ role: "user", content: "I moved from Bergen to Oslo last week.", has_answer: true }, { role: "assistant", content: "Welcome to Oslo." }],
    ],
    answer_session_ids: ["s_d"],
  },
  {
    question_id: "q_pet_abs",
    question_type: "single-session-user",
    question: "What is my parrot's name?",
    answer: "You never mentioned a parrot.",
    question_date: "2023/06/01",
    haystack_session_ids: ["s_e"],
    haystack_dates: ["2023/05/01"],
    haystack_sessions: [[{ role: "user", content: "My dog Rex loves the park." }, { role: "assistant", content: "Dogs love parks." }]],
    answer_session_ids: [],
  },
];

beforeAll(async () => {
  modelDir = tempDir();
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: modelDir, seed: 11 });
  model = await Model.load(modelDir, { contextSize: 1024 });
  const dir = tempDir();
  locomoFile = join(dir, "locomo-sample.json");
  lmeFile = join(dir, "longmemeval-sample.json");
  writeFileSync(locomoFile, JSON.stringify(LOCOMO));
  writeFileSync(lmeFile, JSON.stringify(LME));
});
afterAll(() => model?.dispose());

const byMode = (rows: QARow[], mode: string) => rows.filter((r) => r.mode === mode);
/** What depends on the model and data only, not on timing or store ids. */
const stable = (r: QARow) => ({ ...r, ttftMs: 0, turnMs: 0, memoryIds: r.memoryIds.length });

/** Tokens of a turn's memory text as the importer writes it ("Speaker: text [image: …]"). */
async function memoryTokens(file: string): Promise<Map<string, Map<string, number>>> {
  const { conversations } = await parseConversations(file);
  return new Map(conversations.map((c) => [c.userId, new Map(c.turns.map((t) => [String(t.metadata.turnId), model.tokenizer.encode(t.text, { addSpecialTokens: false }).length]))]));
}

describe("LoCoMo file, every mode", () => {
  let result: MemoryQAResult;
  let out: string;
  beforeAll(async () => {
    out = tempDir();
    result = await runMemoryQA({ model: modelDir, data: locomoFile, out, alpha: 1, maxAnswerTokens: 3, threads: 1 });
  }, 120_000);

  test("one row per (question, mode), scored by the category's rule", () => {
    expect(result.format).toBe("locomo");
    expect(result.answered).toBe(7 * MODES.length);
    expect(result.rows).toHaveLength(7 * MODES.length);
    expect(new Set(result.rows.map((r) => `${r.id}|${r.mode}`)).size).toBe(result.rows.length);
    // Question order, modes in the order given.
    expect(result.rows.slice(0, 5).map((r) => [r.id, r.mode])).toEqual(MODES.map((m) => ["ann:0", m]));
    const file = readFileSync(result.resultsFile, "utf8").trim().split("\n").map((l) => JSON.parse(l) as QARow);
    expect(file).toEqual(result.rows);
    for (const r of result.rows) {
      const q = LOCOMO.flatMap((s) => s.qa.map((x, j) => ({ ...x, id: `${s.sample_id}:${j}` }))).find((x) => x.id === r.id)!;
      expect(r.category).toBe(String(q.category));
      expect(r.answerable).toBe(q.category !== 5);
      expect(r.evidence).toEqual(q.evidence);
      const want = scoreLocomo(r.prediction, q.answer ?? q.adversarial_answer ?? "", q.category as 1 | 2 | 3 | 4 | 5);
      expect({ f1: r.f1, em: r.em }).toEqual(want);
      expect(r.prediction).toBe(r.prediction.trim());
      expect(r.ttftMs).toBeGreaterThan(0);
      expect(r.turnMs).toBeGreaterThanOrEqual(r.ttftMs);
      expect(r.promptTokens).toBeGreaterThan(0);
    }
  });

  test("rag, dki and dki-joint route the same memories; with α forced every routed memory reaches the model", () => {
    for (const id of new Set(result.rows.map((r) => r.id))) {
      const [rag, dkiRow, joint] = ["rag", "dki", "dki-joint"].map((m) => result.rows.find((r) => r.id === id && r.mode === m)!);
      expect(rag.routed.length).toBeGreaterThan(0);
      expect(rag.routed.length).toBeLessThanOrEqual(3);
      expect(dkiRow.routed).toEqual(rag.routed);
      expect(joint.routed).toEqual(rag.routed);
      expect(dkiRow.memoryIds).toEqual(rag.memoryIds);
      expect(joint.memoryIds).toEqual(rag.memoryIds);
      expect(dkiRow.memoryIds).toHaveLength(rag.routed.length);
      expect([dkiRow.alpha, joint.alpha]).toEqual([1, 1]);
      expect(dkiRow.leftOut + joint.leftOut + rag.leftOut).toBe(0);
      // Evidence recall: the share of evidence turns among the routed ones.
      const ev = rag.evidence;
      expect(rag.evidenceRecall).toBe(ev.filter((e) => rag.routed.includes(e)).length / ev.length);
    }
  });

  test("dki injects one block per routed memory, dki-joint exactly one holding all their tokens; dki's prompt is none's", async () => {
    const tokens = await memoryTokens(locomoFile);
    for (const joint of byMode(result.rows, "dki-joint")) {
      const sep = result.rows.find((r) => r.id === joint.id && r.mode === "dki")!;
      const none = result.rows.find((r) => r.id === joint.id && r.mode === "none")!;
      const sum = joint.routed.reduce((n, t) => n + tokens.get(joint.conversation)!.get(t)!, 0);
      expect(joint.blocks).toBe(1);
      expect(joint.memoryTokens).toBe(sum);
      expect(sep.blocks).toBe(joint.routed.length);
      expect(sep.memoryTokens).toBe(sum);
      expect(sep.promptTokens).toBe(none.promptTokens);
      expect(joint.promptTokens).toBe(none.promptTokens);
    }
    // rag puts the memories into the prompt; none has none of them.
    for (const rag of byMode(result.rows, "rag")) {
      const none = result.rows.find((r) => r.id === rag.id && r.mode === "none")!;
      expect(rag.promptTokens).toBeGreaterThan(none.promptTokens + rag.memoryTokens - 1);
      expect(none.memoryTokens).toBe(0);
      expect(none.routed).toEqual([]);
      expect(none.evidenceRecall).toBeNull();
    }
  });

  test("full holds the whole conversation (nothing dropped in a 1024-token window)", async () => {
    const { conversations } = await parseConversations(locomoFile);
    for (const full of byMode(result.rows, "full")) {
      const turns = conversations.find((c) => c.userId === full.conversation)!.turns;
      expect(full.leftOut).toBe(0);
      expect(full.routed).toEqual(turns.map((t) => t.metadata.turnId));
      expect(full.evidenceRecall).toBe(1);
      const text = turns.map((t) => t.text).join("\n");
      expect(full.memoryTokens).toBe(model.tokenizer.encode(text, { addSpecialTokens: false }).length);
    }
  });

  test("the report: a row per mode and category with the right counts, JSON beside it, two plots", async () => {
    const base = join(out, "report", reportName(modelDir, locomoFile));
    const report = await writeMemoryQAReport(result, base);
    expect(report.modes.map((m) => [m.mode, m.n, m.nAnswerable])).toEqual(MODES.map((m) => [m, 7, 6]));
    const cat4 = report.categories.filter((c) => c.category === "4");
    expect(cat4.map((c) => c.n)).toEqual(MODES.map(() => 3));
    const rag = report.modes.find((m) => m.mode === "rag")!;
    const ragRows = byMode(result.rows, "rag");
    expect(rag.f1).toBeCloseTo(ragRows.reduce((a, r) => a + r.f1, 0) / 7, 12);
    expect(rag.memoryTokens).toBeCloseTo(ragRows.reduce((a, r) => a + r.memoryTokens, 0) / 7, 12);
    // "evidence in": the answerable rows whose every evidence turn was routed, and their EM.
    const routedAll = ragRows.filter((r) => r.answerable && r.evidenceRecall === 1);
    expect(rag.nEvidenceIn).toBe(routedAll.length);
    expect(rag.emEvidenceIn).toEqual(routedAll.length === 0 ? null : routedAll.reduce((a, r) => a + r.em, 0) / routedAll.length);
    expect(report.modes.find((m) => m.mode === "none")!.emEvidenceIn).toBeNull();
    const md = readFileSync(`${base}.md`, "utf8");
    for (const m of MODES) expect(md).toMatch(new RegExp(`^\\| ${m} \\| 7 \\|`, "m"));
    expect(md).toContain("| 5 adversarial |");
    expect(JSON.parse(readFileSync(`${base}.json`, "utf8")).modes).toHaveLength(5);
    expect(report.plots).toHaveLength(2);
    for (const p of report.plots) expect(statSync(p.png).size).toBeGreaterThan(1000);
  });
});

describe("LongMemEval file, every mode; resumable", () => {
  test("a limited run, then a killed line, then the rest: no duplicate rows, and the same file as one run", async () => {
    const once = await runMemoryQA({ model: modelDir, data: lmeFile, out: tempDir(), alpha: 1, maxAnswerTokens: 3, threads: 1 });
    expect(once.format).toBe("longmemeval");
    expect(once.rows).toHaveLength(3 * MODES.length);
    const abs = once.rows.filter((r) => r.id === "q_pet_abs");
    expect(abs.every((r) => !r.answerable && r.category === "single-session-user" && r.evidence.length === 0)).toBe(true);
    for (const r of once.rows) {
      const q = LME.find((x) => x.question_id === r.id)!;
      expect({ f1: r.f1, em: r.em }).toEqual(scoreLongMemEval(r.prediction, q.answer, q.question_id));
    }
    expect(once.rows.find((r) => r.id === "q_city" && r.mode === "rag")!.evidence).toEqual(["s_d:0"]);

    const out = tempDir();
    const first = await runMemoryQA({ model: modelDir, data: lmeFile, out, alpha: 1, maxAnswerTokens: 3, threads: 1, limit: 1 });
    expect(first.answered).toBe(MODES.length);
    // A run killed while writing a row leaves half a line.
    appendFileSync(first.resultsFile, '{"id":"q_city","mode":"no');
    const second = await runMemoryQA({ model: modelDir, data: lmeFile, out, alpha: 1, maxAnswerTokens: 3, threads: 1 });
    expect(second.answered).toBe(2 * MODES.length);
    const third = await runMemoryQA({ model: modelDir, data: lmeFile, out, alpha: 1, maxAnswerTokens: 3, threads: 1 });
    expect(third.answered).toBe(0);
    const lines = readFileSync(third.resultsFile, "utf8").trim().split("\n").map((l) => JSON.parse(l) as QARow);
    expect(lines.map(stable)).toEqual(once.rows.map(stable));
    // A narrower rerun reports its own selection; the file keeps every row.
    const narrow = await runMemoryQA({ model: modelDir, data: lmeFile, out, alpha: 1, maxAnswerTokens: 3, threads: 1, limit: 1, modes: ["rag"] });
    expect(narrow.rows.map((r) => [r.id, r.mode])).toEqual([["q_car", "rag"]]);
    expect(readFileSync(third.resultsFile, "utf8").trim().split("\n")).toHaveLength(3 * MODES.length);
  }, 120_000);

  test("--judge: each LongMemEval row carries the judge model's verdict on the paper's per-type question", async () => {
    const r = await runMemoryQA({ model: modelDir, data: lmeFile, out: tempDir(), modes: ["none"], maxAnswerTokens: 3, judge: modelDir });
    expect(r.settings.judge).toBe(modelDir);
    for (const row of r.rows) {
      const q = LME.find((x) => x.question_id === row.id)!;
      // The reference: the same judge model asked the same question through the engine's chat path.
      const prompt = judgePrompt(q.question_type, q.question_id, q.question, q.answer, row.prediction);
      const reply = await model.generate({ messages: [{ role: "user", content: prompt }] }, { maxNewTokens: 4, sampling: { temperature: 0 }, stop: ["<|im_end|>"] });
      const want = reply.text.replace(/<\|im_end\|>.*/s, "").trim();
      expect(want).not.toBe("");
      expect(row.judgeReply).toBe(want);
      expect(row.judge).toBe(judgeVerdict(want));
    }
  });

  test("a rerun with other settings into the same folder is refused", async () => {
    const out = tempDir();
    await runMemoryQA({ model: modelDir, data: lmeFile, out, modes: ["none"], maxAnswerTokens: 2, limit: 1 });
    await expect(runMemoryQA({ model: modelDir, data: lmeFile, out, modes: ["none"], maxAnswerTokens: 3, limit: 1 })).rejects.toThrow(/run\.json holds a run with other settings \(maxAnswerTokens: 2 then, 3 now\)/);
    // A run that fails before its first row (a wrong model path) does not pin the folder's settings.
    const fresh = tempDir();
    await expect(runMemoryQA({ model: join(fresh, "no-model"), data: lmeFile, out: fresh, modes: ["none"], limit: 1 })).rejects.toThrow(/no-model/);
    expect((await runMemoryQA({ model: modelDir, data: lmeFile, out: fresh, modes: ["none"], maxAnswerTokens: 1, limit: 1 })).answered).toBe(1);
    // A file without questions is refused, not reported empty.
    const noQa = join(fresh, "no-qa.json");
    writeFileSync(noQa, JSON.stringify([{ sample_id: "x", conversation: LOCOMO[0].conversation }]));
    await expect(runMemoryQA({ model: modelDir, data: noQa, out: tempDir() })).rejects.toThrow(/the file has no questions/);
  });
});

describe("modes against each other", () => {
  test("with α below the injection threshold dki injects nothing and answers exactly as none", async () => {
    const r = await runMemoryQA({ model: modelDir, data: locomoFile, out: tempDir(), modes: ["none", "dki"], alpha: 0, maxAnswerTokens: 4, limit: 4, seed: 3 });
    expect(r.rows).toHaveLength(8);
    for (const d of byMode(r.rows, "dki")) {
      const n = r.rows.find((x) => x.id === d.id && x.mode === "none")!;
      expect(d.blocks).toBe(0);
      expect(d.prediction).toBe(n.prediction);
      expect(d.promptTokens).toBe(n.promptTokens);
    }
    // --seed orders the questions; the same seed, the same order.
    const again = await runMemoryQA({ model: modelDir, data: locomoFile, out: tempDir(), modes: ["none"], maxAnswerTokens: 1, limit: 4, seed: 3 });
    expect(again.rows.map((x) => x.id)).toEqual(byMode(r.rows, "none").map((x) => x.id));
  });

  test("--memory-max-tokens caps what dki injects; the memories past it are counted as left out", async () => {
    const r = await runMemoryQA({ model: modelDir, data: locomoFile, out: tempDir(), modes: ["dki"], alpha: 1, maxAnswerTokens: 1, memoryMaxTokens: 16, conversations: ["ann"] });
    expect(r.rows.some((x) => x.leftOut > 0)).toBe(true);
    for (const x of r.rows) {
      expect(x.memoryTokens).toBeLessThanOrEqual(16);
      expect(x.memoryIds.length + x.leftOut).toBe(x.routed.length);
    }
  });

  test("dkiConfig reaches the dki modes' DKISystem: EPIC recomputing every token answers as dki-joint; run.json records it", async () => {
    const out = tempDir();
    const dkiConfig = { blockFix: { kind: "epic" as const, recomputeTokens: 1_000_000 } };
    const fixed = await runMemoryQA({ model: modelDir, data: locomoFile, out, modes: ["dki"], alpha: 1, maxAnswerTokens: 3, limit: 4, seed: 2, dkiConfig });
    const joint = await runMemoryQA({ model: modelDir, data: locomoFile, out: tempDir(), modes: ["dki-joint"], alpha: 1, maxAnswerTokens: 3, limit: 4, seed: 2 });
    expect(fixed.settings.dkiConfig).toEqual(dkiConfig);
    expect(JSON.parse(readFileSync(join(out, "run.json"), "utf8")).dkiConfig).toEqual(dkiConfig);
    expect(fixed.rows.map((x) => x.prediction)).toEqual(joint.rows.map((x) => x.prediction));
    // The separate encoding without the fix answers otherwise somewhere (else this test shows nothing).
    const plain = await runMemoryQA({ model: modelDir, data: locomoFile, out: tempDir(), modes: ["dki"], alpha: 1, maxAnswerTokens: 3, limit: 4, seed: 2 });
    expect(plain.rows.map((x) => x.prediction)).not.toEqual(joint.rows.map((x) => x.prediction));
    // DKISystem checks what it is given; a setting the harness owns may be repeated, not changed.
    await expect(runMemoryQA({ model: modelDir, data: locomoFile, out: tempDir(), modes: ["dki"], limit: 1, dkiConfig: { encodingPrefix: "bogus" as never } })).rejects.toThrow(/encodingPrefix/);
    expect((await runMemoryQA({ model: modelDir, data: locomoFile, out: tempDir(), modes: ["dki"], limit: 1, maxAnswerTokens: 1, dkiConfig: { maxMemories: 3 } })).answered).toBe(1);
    await expect(runMemoryQA({ model: join(tempDir(), "never-loaded"), data: locomoFile, out: tempDir(), modes: ["dki-joint"], dkiConfig: { maxMemories: 5 } })).rejects.toThrow(/dkiConfig\.maxMemories is 5 but the dki-joint mode runs with 3/);
    await expect(runMemoryQA({ model: modelDir, data: locomoFile, out: tempDir(), modes: ["dki"], dkiConfig: { memoryEncoding: "joint" } })).rejects.toThrow(/dkiConfig\.memoryEncoding is "joint" but the dki mode runs with "separate"/);
  });

  test("--conversations keeps those users' questions; an unknown one is named", async () => {
    const r = await runMemoryQA({ model: modelDir, data: locomoFile, out: tempDir(), modes: ["none"], maxAnswerTokens: 1, conversations: ["li"] });
    expect(r.rows.map((x) => x.id)).toEqual(["li:0", "li:1"]);
    await expect(runMemoryQA({ model: modelDir, data: locomoFile, out: tempDir(), modes: ["none"], conversations: ["zed"] })).rejects.toThrow(/no conversation "zed" in the file/);
  });
});

describe("full: the oldest turns dropped to fit the window", () => {
  test("the fewest oldest turns go: the prompt fits with them gone and would not with one more kept", async () => {
    const small = await Model.load(modelDir, { contextSize: 100 });
    try {
      const { conversations } = await parseConversations(locomoFile);
      const turns = conversations[0].turns;
      const question = "Where does Ann live?";
      const answer = 8;
      const fit = await fitConversation(small, turns, question, answer);
      expect(fit.dropped).toBeGreaterThan(0);
      expect(fit.dropped).toBeLessThan(turns.length);
      // The reference: the engine's own chat path over the instruction and the hand-built message.
      const message = (from: number) => `${turns.slice(from).map((t) => t.text).join("\n")}\n\n${question}`;
      const size = (from: number) => small.encodePrompt({ messages: [{ role: "system", content: ANSWER_INSTRUCTION }, { role: "user", content: message(from) }] }).length;
      expect(fit.query).toBe(message(fit.dropped));
      expect(size(fit.dropped)).toBe(fit.promptTokens);
      expect(size(fit.dropped)).toBeLessThanOrEqual(100 - answer);
      expect(size(fit.dropped - 1)).toBeGreaterThan(100 - answer);
      // A window the question alone does not fit is refused, naming the sizes.
      await expect(fitConversation(small, turns, question, 90)).rejects.toThrow(/the question alone makes a \d+-token prompt; the model's window of 100 less 90 answer tokens leaves 10/);
    } finally {
      small.dispose();
    }
  });

  test("a run with a small window reports the drop per question", async () => {
    const r = await runMemoryQA({ model: modelDir, data: locomoFile, out: tempDir(), modes: ["full"], contextSize: 100, maxAnswerTokens: 8, conversations: ["ann"], limit: 2 });
    for (const row of r.rows) {
      expect(row.leftOut).toBeGreaterThan(0);
      expect(row.routed).toHaveLength(6 - row.leftOut);
      expect(row.promptTokens).toBeLessThanOrEqual(92);
    }
  });
});

describe("dki eval memory (the command line)", () => {
  test("writes the rows and the report where --report says, and prints the per-mode table", async () => {
    const out = tempDir();
    const report = join(tempDir(), "memory-qa-cli");
    const { stdout } = await dki(["eval", "memory", "--model", modelDir, "--data", lmeFile, "--out", out, "--report", report, "--modes", "none,dki-joint", "--limit", "2", "--max-answer-tokens", "2", "--alpha", "1", "--threads", "1"]);
    const printed = JSON.parse(stdout) as { report: string; modes: { mode: string; n: number }[] };
    expect(printed.report).toBe(`${report}.md`);
    expect(printed.modes.map((m) => [m.mode, m.n])).toEqual([["none", 2], ["dki-joint", 2]]);
    expect(existsSync(`${report}.md`) && existsSync(`${report}-ttft.png`)).toBe(true);
    expect(readFileSync(join(out, "results.jsonl"), "utf8").trim().split("\n")).toHaveLength(4);
  });

  test("--rerank-model routes through the cross-encoder and --config reaches the dki modes, both recorded in run.json and the report; --rerank-depth alone is refused", async () => {
    const out = tempDir();
    const report = join(tempDir(), "memory-qa-rerank");
    const config = join(tempDir(), "dki.yaml");
    writeFileSync(config, "memoryOrder: score-last\n");
    const reranker = join(repoRoot, "models", "memory-qa-reranker");
    await dki(["eval", "memory", "--model", modelDir, "--data", locomoFile, "--out", out, "--report", report, "--modes", "rag,dki", "--limit", "2", "--max-answer-tokens", "2", "--alpha", "1", "--threads", "1", "--rerank-model", reranker, "--rerank-depth", "30", "--config", config]);
    const run = JSON.parse(readFileSync(join(out, "run.json"), "utf8")) as { rerank: { reranker: string; depth: number }; dkiConfig: unknown };
    expect(run.rerank.reranker).toMatch(/^onnx-cross-encoder:memory-qa-reranker:[0-9a-f]{12}$/);
    expect(run.rerank.depth).toBe(30);
    expect(run.dkiConfig).toEqual({ memoryOrder: "score-last" });
    const md = readFileSync(`${report}.md`, "utf8");
    expect(md).toContain(`the search's best 30 reranked by ${run.rerank.reranker}`);
    expect(md).toContain('{"memoryOrder":"score-last"}');
    await expect(dki(["eval", "memory", "--model", modelDir, "--data", locomoFile, "--out", tempDir(), "--rerank-depth", "5"])).rejects.toThrow(/--rerank-depth needs --rerank-model/);
  });
});
