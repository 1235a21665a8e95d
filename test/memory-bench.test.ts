// bench/memory-retrieval.js on a small LoCoMo-format file: it imports the conversations, searches
// every question with evidence, and writes recall@k per category and retrieval mode (results go
// to a temp folder through DKI_BENCH_RESULTS, not bench/results/).
import { execFile } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { expect, test } from "vitest";
import { locomoSample } from "./support/conversation-samples.js";
import { repoRoot, tempDir } from "./support/paths.js";

const run = promisify(execFile);

interface Row {
  category: string;
  questions: number;
  retrieval: string;
  "recall@1": number;
  "recall@5": number;
  "recall@10": number;
  "recall@25": number;
}

test("bench/memory-retrieval.js reports recall@1/5/10/25 per category for BM25, dense and hybrid", async () => {
  const file = join(tempDir(), "locomo-sample.json");
  writeFileSync(file, JSON.stringify(locomoSample()));
  const results = tempDir();
  const { stdout } = await run(process.execPath, [join(repoRoot, "bench", "memory-retrieval.js"), file], { env: { ...process.env, DKI_BENCH_RESULTS: results } });
  expect(stdout).toContain("# memory-retrieval-locomo-sample");
  const { rows, notes, machine } = JSON.parse(readFileSync(join(results, "memory-retrieval-locomo-sample.json"), "utf8")) as { rows: Row[]; notes: string[]; machine: { cpu: string } };
  expect(machine.cpu).toBeTruthy();
  // 7 questions have evidence (the adversarial one has none and is left out).
  expect(notes[0]).toMatch(/2 conversations, 10 turns imported .* 7 questions with evidence, 1 without/);
  const categories = [...new Set(rows.map((r) => r.category))];
  expect(categories).toEqual(["all", "multi-hop", "temporal", "single-hop"]);
  for (const c of categories) expect(rows.filter((r) => r.category === c).map((r) => r.retrieval)).toEqual(["bm25", "dense", "hybrid"]);
  expect(rows.find((r) => r.category === "all")!.questions).toBe(7);
  for (const r of rows) {
    const recalls = [r["recall@1"], r["recall@5"], r["recall@10"], r["recall@25"]];
    for (const x of recalls) expect(x >= 0 && x <= 1).toBe(true);
    for (let i = 1; i < recalls.length; i++) expect(recalls[i]).toBeGreaterThanOrEqual(recalls[i - 1]);
  }
  // Each question names its evidence in its own words; BM25 and hybrid find most at 5.
  const hybrid = rows.find((r) => r.category === "all" && r.retrieval === "hybrid")!;
  expect(hybrid["recall@5"]).toBeGreaterThan(0.7);
  expect(await run(process.execPath, [join(repoRoot, "bench", "memory-retrieval.js")]).catch((e: { stderr: string }) => e.stderr)).toMatch(/^usage: node bench\/memory-retrieval.js FILE/);
});
