// The synthetic memory-QA set: reproducible from its seed, disjoint train/held-out values, evidence
// ids that point at the turn stating the (latest) answer, importable by the LoCoMo importer, both
// languages, and `--values` honoured through the CLI command.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Command } from "commander";
import { afterEach, expect, it } from "vitest";
import { registerEvalSynth } from "../src/cli/eval-synth.js";
import { ATTRIBUTE_NAMES, generateSynthetic, NOT_MENTIONED, serializeSynthetic, vocabulary, type SynthSample, type SynthTurn } from "../src/eval/synthetic.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { tempDir } from "./support/paths.js";

const open: MemoryStore[] = [];
afterEach(async () => {
  for (const s of open.splice(0)) await s.close();
});

function turns(s: SynthSample): SynthTurn[] {
  return Object.keys(s.conversation)
    .filter((k) => /^session_\d+$/.test(k))
    .sort((a, b) => Number(a.slice(8)) - Number(b.slice(8)))
    .flatMap((k) => s.conversation[k] as SynthTurn[]);
}

const HAN = /\p{Script=Han}/u;
const escape = (v: string) => v.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
/** Where `value` occurs in `text` as a whole word (Chinese has no word boundaries: any occurrence). */
function at(text: string, value: string): number {
  if (HAN.test(value)) return text.indexOf(value);
  const m = new RegExp(`(^|[^\\p{L}])${escape(value)}(?![\\p{L}])`, "u").exec(text);
  return m === null ? -1 : m.index + m[1]!.length;
}
const isFriendTurn = (t: SynthTurn) => t.text.startsWith("My friend ") || t.text.startsWith("我的朋友");

async function runCli(args: string[]): Promise<void> {
  const program = new Command().exitOverride().configureOutput({ writeErr: () => {}, writeOut: () => {} });
  registerEvalSynth(program.command("eval"));
  await program.parseAsync(["node", "dki", "eval", "synth", ...args]);
}

it("the same seed gives the same bytes, through the function and the CLI; another seed another set", async () => {
  const o = { seed: 7, split: "train" as const, conversations: 6, languages: ["en", "zh"] as const };
  expect(serializeSynthetic(generateSynthetic(o))).toBe(serializeSynthetic(generateSynthetic(o)));
  expect(serializeSynthetic(generateSynthetic({ ...o, seed: 8 }))).not.toBe(serializeSynthetic(generateSynthetic(o)));
  const dir = tempDir();
  await runCli(["--out", join(dir, "a.json"), "--seed", "7", "--split", "train", "--conversations", "6", "--lang", "en,zh"]);
  await runCli(["--out", join(dir, "b.json"), "--seed", "7", "--split", "train", "--conversations", "6", "--lang", "en,zh"]);
  const a = readFileSync(join(dir, "a.json"));
  expect(a.equals(readFileSync(join(dir, "b.json")))).toBe(true);
  expect(a.toString("utf8")).toBe(serializeSynthetic(generateSynthetic(o)));
});

it("train and held-out vocabularies are disjoint for every attribute and language, and the held-out answers come from the held-out half", () => {
  const v = vocabulary();
  for (const lang of ["en", "zh"] as const) {
    for (const a of ATTRIBUTE_NAMES) {
      const { train, heldout } = v[lang][a]!;
      expect(train.length, `${lang} ${a}`).toBeGreaterThanOrEqual(50);
      expect(heldout.length, `${lang} ${a}`).toBeGreaterThanOrEqual(50);
      const inTrain = new Set(train);
      expect(heldout.filter((x) => inTrain.has(x)), `${lang} ${a}`).toEqual([]);
    }
  }
  const train = generateSynthetic({ seed: 1, split: "train", conversations: 20, languages: ["en", "zh"] });
  const held = generateSynthetic({ seed: 1, split: "heldout", conversations: 20, languages: ["en", "zh"] });
  const answers = (set: SynthSample[]) => new Set(set.flatMap((s) => s.qa.filter((q) => q.category === 4).map((q) => q.answer)));
  const trainAnswers = answers(train);
  const heldAnswers = [...answers(held)];
  expect(heldAnswers.length).toBeGreaterThan(150);
  expect(heldAnswers.filter((x) => trainAnswers.has(x))).toEqual([]);
  // Made-up words: most held-out answers are in no real-value list (they cannot be known beforehand).
  expect(heldAnswers.filter((x) => /^[A-Z]?[a-z]+$/.test(x) && /(ka|lo|mi|zu|ber|tan|vel|qui|dro|nex)/.test(x.toLowerCase())).length).toBeGreaterThan(20);
});

it("every evidence id names the user's turn that states the answer, the latest one when the fact was updated; unanswerable questions are never stated", () => {
  const samples = generateSynthetic({ seed: 3, split: "heldout", conversations: 40, languages: ["en", "zh"] });
  const v = vocabulary();
  let updates = 0;
  let unanswerable = 0;
  for (const s of samples) {
    const all = turns(s);
    const lang = s.conversation.speaker_a === "User" ? "en" : "zh";
    expect(all.length, s.sample_id).toBeGreaterThanOrEqual(20);
    expect(new Set(all.map((t) => t.dia_id)).size).toBe(all.length);
    const user = s.conversation.speaker_a as string;
    for (const q of s.qa) {
      const pool = v[lang][q.attribute]!.heldout;
      // The user's own statements of this attribute: user turns, not about a friend, naming one of its values.
      const own = all.filter((t) => t.speaker === user && !isFriendTurn(t) && pool.some((x) => at(t.text, x) >= 0));
      if (q.category === 5) {
        unanswerable++;
        expect(q.answer).toBe(NOT_MENTIONED);
        expect(q.evidence).toEqual([]);
        expect(typeof q.adversarial_answer).toBe("string");
        expect(own.map((t) => t.text), `${s.sample_id} ${q.question}`).toEqual([]);
        continue;
      }
      expect(q.category).toBe(4);
      expect(q.evidence).toHaveLength(1);
      const ev = all.find((t) => t.dia_id === q.evidence[0]);
      expect(ev, `${s.sample_id} ${q.evidence[0]}`).toBeDefined();
      expect(ev!.speaker).toBe(user);
      expect(at(ev!.text, q.answer), `${ev!.text} / ${q.answer}`).toBeGreaterThanOrEqual(0);
      // The evidence is the last of the user's own statements of the attribute.
      expect(own[own.length - 1], `${s.sample_id} ${q.question}`).toBe(ev);
      // An update names the old value first and the answer after it ("I moved from X to Y").
      const named = pool.filter((x) => at(ev!.text, x) >= 0 && x !== q.answer && !q.answer.includes(x));
      if (named.length > 0 && own.length > 1) {
        updates++;
        for (const old of named) expect(at(ev!.text, old)).toBeLessThan(at(ev!.text, q.answer));
        expect(own.slice(0, -1).some((t) => named.some((old) => at(t.text, old) >= 0))).toBe(true);
      }
    }
  }
  expect(updates).toBeGreaterThan(20);
  expect(unanswerable).toBeGreaterThan(40);
});

it("the file imports through the LoCoMo importer: one user per conversation, one memory per turn, both languages", async () => {
  const samples = generateSynthetic({ seed: 5, split: "train", conversations: 4, languages: ["en", "zh"] });
  expect(samples.some((s) => turns(s).some((t) => HAN.test(t.text)) && s.qa.every((q) => HAN.test(q.question)))).toBe(true);
  expect(samples.some((s) => turns(s).every((t) => !HAN.test(t.text)))).toBe(true);
  const file = join(tempDir(), "synth.json");
  writeFileSync(file, serializeSynthetic(samples));
  const store = await MemoryStore.open({ dir: tempDir(), durability: "commit" });
  open.push(store);
  const result = await store.importConversations(file);
  expect(result.format).toBe("locomo");
  expect(result.users).toEqual(samples.map((s) => ({ userId: s.sample_id, memories: turns(s).length, messages: 0 })));
  const first = turns(samples[1]!);
  const stored = await store.memories.getAll({ userId: samples[1]!.sample_id });
  expect(stored.map((m) => m.text)).toEqual(first.map((t) => `${t.speaker}: ${t.text}`));
  expect(stored.map((m) => m.metadata.turnId)).toEqual(first.map((t) => t.dia_id));
});

it("--values replaces the named attributes' values; a bad values file is refused naming the problem", async () => {
  const dir = tempDir();
  const values = join(dir, "values.json");
  writeFileSync(values, JSON.stringify({ city: ["Zemblaville", "Quorthan"], pet_name: ["Blipsy", "Fromble", "Gax"] }));
  const out = join(dir, "set.json");
  await runCli(["--out", out, "--values", values, "--seed", "2", "--conversations", "30", "--lang", "en"]);
  const samples = JSON.parse(readFileSync(out, "utf8")) as SynthSample[];
  const asked = (attr: string) => samples.flatMap((s) => s.qa.filter((q) => q.attribute === attr && q.category === 4).map((q) => q.answer));
  expect(asked("city").length).toBeGreaterThan(5);
  expect(new Set(asked("city"))).toEqual(new Set(["Zemblaville", "Quorthan"]));
  expect(asked("pet_name").every((x) => ["Blipsy", "Fromble", "Gax"].includes(x))).toBe(true);
  expect(asked("car").some((x) => vocabulary().en.car!.heldout.includes(x))).toBe(true);

  writeFileSync(values, JSON.stringify({ cty: ["a", "b"] }));
  await expect(runCli(["--out", out, "--values", values])).rejects.toThrow(/unknown attribute "cty"/);
  writeFileSync(values, JSON.stringify({ city: ["Oslo"] }));
  await expect(runCli(["--out", out, "--values", values])).rejects.toThrow(/city needs at least two distinct values/);
  await expect(runCli(["--out", out, "--lang", "en,fr"])).rejects.toThrow(/--lang must be a comma-separated list of en and zh/);
});

it("--small-talk sets the small-talk exchanges: longer conversations with the same facts and questions; a bad count is refused", async () => {
  const base = generateSynthetic({ seed: 4, split: "heldout", conversations: 3, languages: ["en", "zh"] });
  const long = generateSynthetic({ seed: 4, split: "heldout", conversations: 3, languages: ["en", "zh"], smallTalk: 40 });
  for (const [i, s] of long.entries()) {
    // Every user turn is a fact, a friend's fact or small talk; with 40 small-talk exchanges the
    // conversation has its facts' turns plus exactly 40 exchanges (80 turns).
    const facts = s.qa.filter((q) => q.category === 4).length;
    expect(turns(s).length).toBeGreaterThanOrEqual(2 * (facts + 40));
    expect(turns(s).length).toBeGreaterThan(turns(base[i]!).length + 40);
    for (const q of s.qa.filter((x) => x.category === 4)) expect(turns(s).some((t) => t.dia_id === q.evidence[0] && at(t.text, q.answer) >= 0)).toBe(true);
  }
  const out = join(tempDir(), "long.json");
  await runCli(["--out", out, "--seed", "4", "--conversations", "3", "--small-talk", "40"]);
  expect(readFileSync(out, "utf8")).toBe(serializeSynthetic(long));
  expect(() => generateSynthetic({ seed: 4, split: "heldout", conversations: 1, languages: ["en"], smallTalk: -1 })).toThrow(/smallTalk must be an integer in \[0, 10000\], got -1/);
  await expect(runCli(["--out", out, "--small-talk", "x"])).rejects.toThrow(/--small-talk/);
});

it("--friend-facts adds that many distinct friends' facts: distractors that never change an answer", async () => {
  const many = generateSynthetic({ seed: 5, split: "heldout", conversations: 2, languages: ["en", "zh"], friendFacts: 50 });
  for (const s of many) {
    const friends = turns(s).filter(isFriendTurn);
    expect(friends.length).toBeGreaterThanOrEqual(50);
    // The conversation's own friend facts (the unanswerable questions' bait) are there besides.
    expect(friends.length).toBeGreaterThan(50);
    // Mostly their own texts (a repeat needs the same friend, attribute and value).
    expect(new Set(friends.map((t) => t.text)).size).toBeGreaterThan(45);
    // Every answerable question's evidence is still the user's own turn stating the answer.
    for (const q of s.qa.filter((x) => x.category === 4)) {
      const t = turns(s).find((x) => x.dia_id === q.evidence[0])!;
      expect(isFriendTurn(t)).toBe(false);
      expect(at(t.text, q.answer)).toBeGreaterThanOrEqual(0);
    }
  }
  const out = join(tempDir(), "friends.json");
  await runCli(["--out", out, "--seed", "5", "--conversations", "2", "--friend-facts", "50"]);
  expect(readFileSync(out, "utf8")).toBe(serializeSynthetic(many));
  expect(() => generateSynthetic({ seed: 5, split: "heldout", conversations: 1, languages: ["en"], friendFacts: 1.5 })).toThrow(/friendFacts must be an integer in \[0, 10000\], got 1.5/);
});
