// Renders the memory-QA training and evaluation examples with the project's own code (over dist/,
// so `npx tsc -p tsconfig.json` first): the synthetic sets from src/eval/synthetic.ts, and every
// mode's prompt exactly as the harness builds it — the chat template through the engine's
// Tokenizer, the RAG prompt through buildRagPrompt, the DKI prompt through renderPrompt, memory
// blocks tokenised as DKISystem tokenises them behind its "bos" encoding prefix. train.py reads
// the token ids; it never renders a template itself, so training and inference cannot drift apart.
//
//   node models/memory-qa/export.mjs sets  --dir D --train N --heldout N --seed S
//       writes D/train.json, D/heldout.json (LoCoMo form) and D/corpus.txt (tokenizer training text)
//   node models/memory-qa/export.mjs encode --dir D --tokenizer FOLDER --seed S [--copies N]
//       writes D/train.jsonl and D/heldout.jsonl: one example a line,
//       { mode, conv, lang, category, answerText, prompt: ids, answer: ids, blocks?: [ids], prefix?: ids }
//       (conv: the conversation's index in its set; train.py packs one conversation's `full`
//       questions into one row)
//       (held-out rows also the texts: question, memories or conversation)
//       (`answer` ends with the end-of-turn id; `blocks`/`prefix` for mode "dki": the memories as
//       separate K/V blocks, each behind `prefix`, the prompt being the "none" prompt)
import { readFile, writeFile, mkdir } from "node:fs/promises";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { ATTRIBUTES, generateSynthetic, serializeSynthetic } from "../../dist/src/eval/synthetic.js";
import { prng } from "../../dist/src/util/prng.js";
import { ANSWER_INSTRUCTION } from "../../dist/src/eval/instruction.js";
import { fullContextQuery, renderConversation } from "../../dist/src/eval/full-context.js";
import { renderPrompt, detectLanguage } from "../../dist/src/dki/prompt.js";
import { buildRagPrompt } from "../../dist/src/rag/prompt-builder.js";
import { Tokenizer } from "../../dist/src/tokenizer/tokenizer.js";

const { positionals, values: a } = parseArgs({
  allowPositionals: true,
  options: {
    dir: { type: "string" }, tokenizer: { type: "string" }, seed: { type: "string", default: "1" },
    train: { type: "string", default: "3000" }, heldout: { type: "string", default: "100" }, copies: { type: "string", default: "1" },
    context: { type: "string", default: "2048" },
  },
});
const stage = positionals[0];
const dir = a.dir;
if (!dir || (stage !== "sets" && stage !== "encode")) throw new Error("usage: export.mjs sets|encode --dir D [...]");
const seed = Number(a.seed);

/** The turns of a LoCoMo sample, sessions in order, and each turn's memory text as the importer stores it. */
function turnsOf(sample) {
  const conv = sample.conversation;
  const keys = Object.keys(conv).filter((k) => /^session_\d+$/.test(k)).sort((x, y) => Number(x.slice(8)) - Number(y.slice(8)));
  return keys.flatMap((k) => conv[k].map((t) => ({ ...t, memory: `${t.speaker}: ${t.text}` })));
}

if (stage === "sets") {
  await mkdir(dir, { recursive: true });
  const train = generateSynthetic({ seed, split: "train", conversations: Number(a.train), languages: ["en", "zh"] });
  const heldout = generateSynthetic({ seed: seed + 1, split: "heldout", conversations: Number(a.heldout), languages: ["en", "zh"] });
  await writeFile(join(dir, "train.json"), serializeSynthetic(train));
  await writeFile(join(dir, "heldout.json"), serializeSynthetic(heldout));
  // The tokenizer learns from the train split only: held-out made-up values reach it as unseen words.
  const lines = [ANSWER_INSTRUCTION, "Relevant information:", "not mentioned"];
  for (const s of train) {
    for (const t of turnsOf(s)) lines.push(t.memory);
    for (const q of s.qa) lines.push(q.question, q.answer);
  }
  await writeFile(join(dir, "corpus.txt"), lines.join("\n") + "\n");
  console.log(`sets: ${train.length} train and ${heldout.length} held-out conversations`);
  process.exit(0);
}

const tok = await Tokenizer.fromFolder(a.tokenizer);
const eot = tok.eosIds[0];
const contextSize = Number(a.context);
const prefix = tok.bosId === null ? [] : [tok.bosId]; // DKISystem's default "bos" encoding prefix

// Which attribute a user turn talks about (own statement, update or a friend's), to pick the hard
// distractors a retriever would rank high: the same attribute's other turns.
const matchers = Object.entries(ATTRIBUTES).flatMap(([name, attr]) =>
  ["en", "zh"].flatMap((lang) => {
    const p = attr[lang];
    return [...p.state, ...(p.update ? [p.update] : []), p.friend].map((t) => ({
      name,
      re: new RegExp("^" + t.replace(/[.*+?^$()|[\]\\]/g, "\\$&").replace(/\{(\w+)\}/g, "(.+?)") + "$"),
    }));
  }),
);
const attributeOf = (text) => matchers.find((m) => m.re.test(text))?.name ?? null;

const none = async (question) => (await renderPrompt(tok, { query: question, systemPrompt: ANSWER_INSTRUCTION, language: detectLanguage(question) }, true)).tokens;
// A value that begins with a Latin letter or digit is answered after a space: its tokens are then
// those it has inside the memory's sentence ("… in Dalbrimi" → "ĠDal", "brimi"), so the answer is a
// copy of them. The harness trims the answer.
const answerIds = (answer) => [...tok.encode(/^[A-Za-z0-9]/.test(answer) ? ` ${answer}` : answer, { addSpecialTokens: false }), eot];

/** What a top-k retriever could return: the evidence (if any), the same attribute's other turns first, then any turns. */
function retrieve(r, turns, q, k) {
  const evid = new Set(q.evidence);
  const picked = turns.filter((t) => evid.has(t.dia_id));
  const rest = turns.filter((t) => !evid.has(t.dia_id));
  const same = rest.filter((t) => t.attribute === q.attribute);
  const pool = [...same.sort(() => r() - 0.5).slice(0, r() < 0.7 ? 2 : 1), ...rest.sort(() => r() - 0.5)];
  for (const t of pool) {
    if (picked.length >= k) break;
    if (!picked.includes(t)) picked.push(t);
  }
  return picked.sort(() => r() - 0.5).map((t) => t.memory);
}

async function examples(samples, r, copies, modes, withTexts) {
  const out = [];
  for (const [conv, s] of samples.entries()) {
    const turns = turnsOf(s).map((t) => ({ ...t, attribute: t.speaker === s.conversation.speaker_a ? attributeOf(t.text) : null }));
    const lang = s.conversation.speaker_a === "User" ? "en" : "zh";
    const conversation = renderConversation(turns);
    for (const q of s.qa) {
      const answer = answerIds(q.answer);
      const base = { conv, lang, category: q.category, answerText: q.answer, ...(withTexts ? { question: q.question } : {}) };
      const bare = await none(q.question);
      for (let c = 0; c < copies; c++) {
        if (modes.none && r() < modes.none) out.push({ ...base, mode: "none", prompt: bare, answer: answerIds("not mentioned"), answerText: "not mentioned" });
        if (modes.full && r() < modes.full) {
          const query = fullContextQuery(conversation, q.question);
          const p = await renderPrompt(tok, { query, systemPrompt: ANSWER_INSTRUCTION, language: detectLanguage(q.question) }, true);
          out.push({ ...base, mode: "full", prompt: p.tokens, answer, ...(withTexts ? { conversation } : {}) });
        }
        const k = () => (r() < 0.75 ? 3 : 1 + Math.floor(r() * 2));
        if (modes.rag && r() < modes.rag) {
          const memories = retrieve(r, turns, q, k());
          const b = buildRagPrompt(tok, { query: q.question, systemPrompt: ANSWER_INSTRUCTION, contexts: memories }, { maxContext: contextSize, layout: "chat" });
          out.push({ ...base, mode: "rag", prompt: b.tokens, answer, ...(withTexts ? { memories } : {}) });
        }
        if (modes.dki && r() < modes.dki) {
          const memories = retrieve(r, turns, q, k());
          const blocks = memories.map((m) => tok.encode(m, { addSpecialTokens: false }));
          out.push({ ...base, mode: "dki", prompt: bare, answer, blocks, prefix, ...(withTexts ? { memories } : {}) });
        }
      }
    }
  }
  return out;
}

const r = prng(seed);
const train = JSON.parse(await readFile(join(dir, "train.json"), "utf8"));
const heldout = JSON.parse(await readFile(join(dir, "heldout.json"), "utf8"));
const write = (file, rows) => writeFile(join(dir, file), rows.map((x) => JSON.stringify(x)).join("\n") + "\n");
const trainRows = await examples(train, r, Number(a.copies), { none: 0.08, full: 1, rag: 1, dki: 1 }, false);
await write("train.jsonl", trainRows);
// Held-out rows keep the texts they were rendered from (golden.py passes them to the engine test).
const heldRows = await examples(heldout, prng(seed + 7), 1, { none: 1, full: 1, rag: 1, dki: 1 }, true);
await write("heldout.jsonl", heldRows);
const count = (rows) => Object.entries(rows.reduce((m, x) => ((m[x.mode] = (m[x.mode] ?? 0) + 1), m), {})).map(([k, v]) => `${k} ${v}`).join(", ");
console.log(`encode: train ${trainRows.length} (${count(trainRows)}); held-out ${heldRows.length} (${count(heldRows)})`);
process.exit(0);
