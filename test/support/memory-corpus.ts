// A labelled retrieval corpus: one user's memories (English and Chinese), questions each answered
// by one memory, and off-topic queries that none of them answers. Used by memory-retrieval.test.ts
// (the questions) and by the relevance calibration of gating's τ (relevance-calibration.test.ts and
// bench/calibrate-relevance.js, which reads the same data: it lives in memory-corpus.json because
// the bench runs on plain Node over dist/, and test files are not compiled there).
//
// Memories share many words on purpose (family members, days, places recur), and questions are
// phrased differently from their memory: other word forms ("swimming" for "swim"), partial overlap,
// or only a rare name in common. The off-topic queries (25 English, 25 Chinese) are general
// knowledge, how-to and personal questions on subjects no memory mentions, worded like the
// questions ("my", "how", "什么", "怎么"), and avoiding the memories' names and places, so the only
// overlap is the everyday wording a real off-topic turn shares with a user's memories.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { repoRoot } from "./paths.js";

interface CorpusFile {
  memories: string[];
  /** [question, index of the memory that answers it] */
  questions: [string, number][];
  offTopic: string[];
}

const corpus = JSON.parse(readFileSync(join(repoRoot, "test", "support", "memory-corpus.json"), "utf8")) as CorpusFile;

export const MEMORIES: string[] = corpus.memories;

/** [question, index of the memory that answers it] */
export const QUESTIONS: [string, number][] = corpus.questions;

/** Queries that none of MEMORIES answers. */
export const OFF_TOPIC: string[] = corpus.offTopic;

/** One half of the gate's labelled queries. */
export interface GateQueries {
  relevant: string[];
  offTopic: string[];
}

/**
 * The two halves gating's τ is calibrated on and checked on. Questions go by the memory that
 * answers them (even index: calibration), so two questions about one memory never sit on both
 * sides; off-topic queries alternate. bench/calibrate-relevance.js splits the same way.
 */
export const GATE_SPLIT: { calibration: GateQueries; heldOut: GateQueries } = {
  calibration: { relevant: QUESTIONS.filter(([, m]) => m % 2 === 0).map(([q]) => q), offTopic: OFF_TOPIC.filter((_, i) => i % 2 === 0) },
  heldOut: { relevant: QUESTIONS.filter(([, m]) => m % 2 === 1).map(([q]) => q), offTopic: OFF_TOPIC.filter((_, i) => i % 2 === 1) },
};
