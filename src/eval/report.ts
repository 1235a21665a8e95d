// The memory-QA report: <base>.md and <base>.json from a run's rows, with two plots beside them
// (<base>-by-category.png: F1 by mode and category; <base>-ttft.png: F1 against mean TTFT).
//
//   per mode             n, EM, F1, EM on the answerable questions (all of them, and those whose
//                        evidence all reached the model: what the mode does with the memory,
//                        retrieval's misses aside), abstention accuracy on the
//                        others, judge (when one ran), mean and median TTFT, mean turn latency,
//                        mean prompt tokens, memory tokens, evidence recall, left out / dropped
//   category × mode      EM / F1 (n) per LoCoMo category or LongMemEval question type
import { cpus, loadavg, totalmem } from "node:os";
import { mkdirSync, writeFileSync } from "node:fs";
import { basename, dirname, extname } from "node:path";
import { renderVegaLite, type PlotFiles } from "../util/plot.js";
import type { MemoryQAResult, Mode, QARow } from "./memory-qa.js";

export interface ModeSummary {
  mode: Mode;
  n: number;
  em: number;
  f1: number;
  /** EM over the answerable questions (null when there are none). */
  emAnswerable: number | null;
  nAnswerable: number;
  /** EM over the answerable questions whose evidence all reached the model (rag, dki*: routed; full: kept in the window); null when none did or the mode reads no memory. */
  emEvidenceIn: number | null;
  nEvidenceIn: number;
  /** Share of the unanswerable questions answered "not mentioned" (null when there are none). */
  abstention: number | null;
  /** Mean judge verdict over the rows judged (null when none was). */
  judge: number | null;
  ttftMs: number;
  ttftMedianMs: number;
  turnMs: number;
  promptTokens: number;
  memoryTokens: number;
  /** Mean over the rows with evidence (null: the mode reads no memory, or no question has evidence). */
  evidenceRecall: number | null;
  /** Mean routed memories left out (rag, dki*) or turns dropped to fit the window (full). */
  leftOut: number;
  /** Rows where the window dropped turns (full). */
  rowsWithDrops: number;
}

export interface CategorySummary {
  category: string;
  mode: Mode;
  n: number;
  em: number;
  f1: number;
}

export interface MemoryQAReport {
  title: string;
  settings: MemoryQAResult["settings"];
  format: MemoryQAResult["format"];
  machine: { cpu: string; cores: number; memoryGiB: number; loadAverage: number[]; node: string; date: string; threads: number | null };
  modes: ModeSummary[];
  categories: CategorySummary[];
  plots: PlotFiles[];
  notes: string[];
}

/** `memory-qa-<model>-<data>`: the model folder's (or GGUF file's) name and the data file's. */
export function reportName(model: string, data: string): string {
  const stem = (p: string) => basename(p.replace(/[\\/]+$/, ""), extname(p)).replace(/[^\w.-]+/g, "_");
  return `memory-qa-${stem(model)}-${stem(data)}`;
}

const mean = (xs: number[]) => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length);
const meanOrNull = (xs: number[]) => (xs.length === 0 ? null : mean(xs));
function median(xs: number[]): number {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 === 1 ? s[m] : (s[m - 1] + s[m]) / 2;
}

export function summarizeModes(rows: readonly QARow[], modes: readonly Mode[]): ModeSummary[] {
  return modes.map((mode) => {
    const r = rows.filter((x) => x.mode === mode);
    const answerable = r.filter((x) => x.answerable);
    const other = r.filter((x) => !x.answerable);
    const evidenceIn = answerable.filter((x) => x.evidenceRecall === 1);
    return {
      mode,
      n: r.length,
      em: mean(r.map((x) => x.em)),
      f1: mean(r.map((x) => x.f1)),
      emAnswerable: meanOrNull(answerable.map((x) => x.em)),
      nAnswerable: answerable.length,
      emEvidenceIn: meanOrNull(evidenceIn.map((x) => x.em)),
      nEvidenceIn: evidenceIn.length,
      abstention: meanOrNull(other.map((x) => x.em)),
      judge: meanOrNull(r.flatMap((x) => (x.judge === null ? [] : [x.judge]))),
      ttftMs: mean(r.map((x) => x.ttftMs)),
      ttftMedianMs: median(r.map((x) => x.ttftMs)),
      turnMs: mean(r.map((x) => x.turnMs)),
      promptTokens: mean(r.map((x) => x.promptTokens)),
      memoryTokens: mean(r.map((x) => x.memoryTokens)),
      evidenceRecall: meanOrNull(r.flatMap((x) => (x.evidenceRecall === null ? [] : [x.evidenceRecall]))),
      leftOut: mean(r.map((x) => x.leftOut)),
      rowsWithDrops: mode === "full" ? r.filter((x) => x.leftOut > 0).length : 0,
    };
  });
}

export function summarizeCategories(rows: readonly QARow[], modes: readonly Mode[]): CategorySummary[] {
  const categories = [...new Set(rows.map((r) => r.category))].sort();
  return categories.flatMap((category) =>
    modes.map((mode) => {
      const r = rows.filter((x) => x.category === category && x.mode === mode);
      return { category, mode, n: r.length, em: mean(r.map((x) => x.em)), f1: mean(r.map((x) => x.f1)) };
    }),
  );
}

const LOCOMO_CATEGORIES: Record<string, string> = { "1": "1 multi-hop", "2": "2 temporal", "3": "3 open-domain", "4": "4 single-hop", "5": "5 adversarial" };

/** Writes `${base}.md`, `${base}.json` and the plots; returns what it wrote. */
export async function writeMemoryQAReport(result: MemoryQAResult, base: string): Promise<MemoryQAReport> {
  const s = result.settings;
  const modes = s.modes.filter((m) => result.rows.some((r) => r.mode === m));
  const summary = summarizeModes(result.rows, modes);
  const categories = summarizeCategories(result.rows, modes);
  const title = basename(base);
  const label = (c: string) => (result.format === "locomo" ? (LOCOMO_CATEGORIES[c] ?? c) : c);
  const notes = [
    `Every mode answers with the same system prompt (src/eval/instruction.ts) and the question as the user's query, greedy, at most ${s.maxAnswerTokens} tokens, one fresh session a question.`,
    `rag and dki* route the same top-${s.topK} memories (routeMemories${s.rerank === null || s.rerank === undefined ? "" : `, the search's best ${s.rerank.depth ?? `max(20, 4 × ${s.topK})`} reranked by ${s.rerank.reranker}`}); dki α ${s.alpha === null ? "gated (relevance and entropy)" : `forced to ${s.alpha} for every routed memory`}; dki-joint encodes the same memories as one block.`,
    `Scores: ${result.format === "locomo" ? "LoCoMo's rules (token F1 on Porter stems; category 1 multi-part, 3 before ';', 5 abstention)" : "LongMemEval exact match and token F1 (abstention questions: correct when the answer is \"not mentioned\")"}; EM is the normalised exact match.`,
    "TTFT and turn latency are wall-clock from the question to the first / last token, prompt building and routing included; memory tokens reach the model as prompt text (full, rag) or as K/V (dki*), prompt tokens are those prefilled.",
  ];
  const full = summary.find((m) => m.mode === "full");
  if (full) notes.push(`full: ${full.rowsWithDrops} of ${full.n} questions had their oldest turns dropped to fit the window (mean ${full.leftOut.toFixed(1)} turns dropped a question); its evidence recall is the share of evidence turns still in the prompt.`);
  if (s.dkiConfig !== null && s.dkiConfig !== undefined) notes.push(`dki* config over the harness's defaults: \`${JSON.stringify(s.dkiConfig)}\`.`);
  if (s.judge !== null) notes.push(`Judge: ${s.judge} (LongMemEval's per-type yes/no questions).`);

  const plots: PlotFiles[] = [];
  try {
    plots.push(await renderVegaLite(categoryPlot(categories, modes, label, title), `${base}-by-category`));
    plots.push(await renderVegaLite(ttftPlot(summary, modes, title), `${base}-ttft`));
  } catch (e) {
    notes.push(`Plots not drawn: ${(e as Error).message}`);
  }

  const report: MemoryQAReport = {
    title,
    settings: s,
    format: result.format,
    machine: { cpu: cpus()[0]?.model ?? "unknown", cores: cpus().length, memoryGiB: Math.round(totalmem() / 2 ** 30), loadAverage: loadavg().map((x) => Number(x.toFixed(2))), node: process.version, date: new Date().toISOString(), threads: result.threads },
    modes: summary,
    categories,
    plots,
    notes,
  };
  mkdirSync(dirname(base), { recursive: true });
  writeFileSync(`${base}.json`, JSON.stringify(report, null, 2) + "\n");
  writeFileSync(`${base}.md`, markdown(report, label));
  return report;
}

const pct = (x: number | null) => (x === null ? "–" : `${(100 * x).toFixed(1)}`);
const ms = (x: number) => (x >= 100 ? x.toFixed(0) : x.toFixed(1));

function markdown(r: MemoryQAReport, label: (c: string) => string): string {
  const s = r.settings;
  const m = r.machine;
  const modes = r.modes.map((x) => x.mode);
  const cats = [...new Set(r.categories.map((c) => c.category))];
  const cell = (c: string, mode: Mode) => {
    const x = r.categories.find((y) => y.category === c && y.mode === mode)!;
    return x.n === 0 ? "–" : `${pct(x.em)} / ${pct(x.f1)} (${x.n})`;
  };
  return [
    `# ${r.title}`,
    "",
    `Model \`${s.model}\`, data \`${s.data}\` (${r.format}), device ${s.device}, embedder ${s.embedder}${s.contextSize === null ? "" : `, window ${s.contextSize} tokens`}.`,
    `Machine: ${m.cpu}, ${m.cores} cores, ${m.memoryGiB} GiB, ${m.threads === null ? "no answers this run" : `${m.threads} engine thread${m.threads === 1 ? "" : "s"}`}; load average ${m.loadAverage.join(" / ")} when the report was written (other work on the machine slows the latencies, not the scores); Node ${m.node}; ${m.date}.`,
    "",
    "## By mode",
    "",
    `| mode | n | EM % | F1 % | EM answerable % (n) | EM answerable, evidence in % (n) | abstention % | ${s.judge === null ? "" : "judge % | "}TTFT ms mean / median | turn ms | prompt tokens | memory tokens | evidence recall % | left out / dropped |`,
    `| --- | ---: | ---: | ---: | ---: | ---: | ---: | ${s.judge === null ? "" : "---: | "}---: | ---: | ---: | ---: | ---: | ---: |`,
    ...r.modes.map(
      (x) =>
        `| ${x.mode} | ${x.n} | ${pct(x.em)} | ${pct(x.f1)} | ${pct(x.emAnswerable)} (${x.nAnswerable}) | ${pct(x.emEvidenceIn)} (${x.nEvidenceIn}) | ${pct(x.abstention)} | ${s.judge === null ? "" : `${pct(x.judge)} | `}${ms(x.ttftMs)} / ${ms(x.ttftMedianMs)} | ${ms(x.turnMs)} | ${x.promptTokens.toFixed(0)} | ${x.memoryTokens.toFixed(0)} | ${pct(x.evidenceRecall)} | ${x.leftOut.toFixed(2)} |`,
    ),
    "",
    `## By ${r.format === "locomo" ? "category" : "question type"} (EM % / F1 % (n))`,
    "",
    `| ${r.format === "locomo" ? "category" : "question type"} | ${modes.join(" | ")} |`,
    `| --- | ${modes.map(() => "---:").join(" | ")} |`,
    ...cats.map((c) => `| ${label(c)} | ${modes.map((mode) => cell(c, mode)).join(" | ")} |`),
    "",
    ...r.plots.map((p) => `![${basename(p.png)}](${basename(p.png)})`),
    "",
    ...r.notes.map((n) => `- ${n}`),
    "",
  ].join("\n");
}

function categoryPlot(categories: CategorySummary[], modes: readonly Mode[], label: (c: string) => string, title: string): Record<string, unknown> {
  return {
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    title: `${title}: F1 by mode and category`,
    width: 560,
    height: 300,
    background: "white",
    data: { values: categories.filter((c) => c.n > 0).map((c) => ({ category: label(c.category), mode: c.mode, f1: 100 * c.f1, n: c.n })) },
    mark: { type: "bar" },
    encoding: {
      x: { field: "category", type: "nominal", title: null, axis: { labelAngle: 0, labelLimit: 160 } },
      xOffset: { field: "mode", type: "nominal", sort: modes },
      y: { field: "f1", type: "quantitative", title: "F1 (%)", scale: { domain: [0, 100] } },
      color: { field: "mode", type: "nominal", title: "mode", sort: modes },
      tooltip: [{ field: "category" }, { field: "mode" }, { field: "f1" }, { field: "n" }],
    },
  };
}

function ttftPlot(summary: ModeSummary[], modes: readonly Mode[], title: string): Record<string, unknown> {
  const values = summary.map((x) => ({ mode: x.mode, ttft: x.ttftMs, f1: 100 * x.f1 }));
  return {
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    title: `${title}: F1 against mean time to first token`,
    width: 560,
    height: 300,
    background: "white",
    data: { values },
    encoding: {
      // Room on the right for the last point's label.
      x: { field: "ttft", type: "quantitative", title: "mean TTFT (ms)", scale: { domain: [0, 1.2 * Math.max(1, ...values.map((v) => v.ttft))], nice: true } },
      y: { field: "f1", type: "quantitative", title: "F1 (%)", scale: { domain: [0, 100] } },
    },
    layer: [
      { mark: { type: "point", filled: true, size: 120 }, encoding: { color: { field: "mode", type: "nominal", title: "mode", sort: modes } } },
      { mark: { type: "text", dx: 8, align: "left", baseline: "middle" }, encoding: { text: { field: "mode" } } },
    ],
  };
}
