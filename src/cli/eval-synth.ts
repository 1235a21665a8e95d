// `dki eval synth`: writes the synthetic memory-QA set (src/eval/synthetic.ts) in LoCoMo's form.
import { writeFile } from "node:fs/promises";
import { InvalidArgumentError, type Command } from "commander";
import { checkValues, generateSynthetic, serializeSynthetic, type SynthLanguage, type SynthSplit } from "../eval/synthetic.js";
import { readJsonObject } from "../formats/json-file.js";
import { choiceOption, intOption } from "./options.js";

function languagesOption(v: string): SynthLanguage[] {
  const items = v.split(",").map((s) => s.trim());
  if (items.length === 0 || items.some((s) => s !== "en" && s !== "zh")) throw new InvalidArgumentError(`--lang must be a comma-separated list of en and zh, got "${v}"`);
  return [...new Set(items as SynthLanguage[])];
}

interface SynthFlags {
  out: string;
  seed: number;
  split: SynthSplit;
  conversations: number;
  lang: SynthLanguage[];
  values?: string;
  smallTalk?: number;
  friendFacts?: number;
}

export function registerEvalSynth(group: Command): void {
  group
    .command("synth")
    .description("write a synthetic memory-QA set (LoCoMo form): a user's facts amid small talk, distractors, updates, questions with evidence ids")
    .requiredOption("--out <file>", "the JSON file to write")
    .option("--seed <n>", "seed of the dialogues (the vocabularies are fixed)", intOption("--seed", 0), 1)
    .option("--split <split>", "which vocabulary half the values come from: train or heldout", choiceOption("--split", ["train", "heldout"] as const), "heldout")
    .option("--conversations <n>", "conversations (store users) to write", intOption("--conversations", 1, 1_000_000), 20)
    .option("--lang <list>", "languages, comma-separated, taken in turn per conversation: en, zh", languagesOption, ["en", "zh"] as SynthLanguage[])
    .option("--values <file>", "JSON object attribute → list of values, replacing the built-in vocabulary of those attributes")
    .option("--small-talk <n>", "small-talk exchanges a conversation (default 4-7 at random): more give users with long memories", intOption("--small-talk", 0, 10_000))
    .option("--friend-facts <n>", "extra facts about friends a conversation (distractors, each its own text; default 0)", intOption("--friend-facts", 0, 10_000))
    .action(async (f: SynthFlags) => {
      const values = f.values === undefined ? undefined : checkValues(await readJsonObject(f.values), f.values);
      const samples = generateSynthetic({ seed: f.seed, split: f.split, conversations: f.conversations, languages: f.lang, values, smallTalk: f.smallTalk, friendFacts: f.friendFacts });
      await writeFile(f.out, serializeSynthetic(samples));
      const questions = samples.reduce((n, s) => n + s.qa.length, 0);
      process.stderr.write(`dki: wrote ${samples.length} conversations, ${questions} questions to ${f.out}\n`);
    });
}
