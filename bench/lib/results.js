// Writes a benchmark's results as JSON and as a Markdown table under bench/results/.
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

// DKI_BENCH_RESULTS: another folder, for tests that run a bench on sample data.
export const resultsDir = process.env.DKI_BENCH_RESULTS ?? join(dirname(fileURLToPath(import.meta.url)), "..", "results");

// A --quick run covers fewer rows: it goes to NAME-quick, so it never replaces a full table.
export function writeResults(fullName, { machine, rows, columns, notes = [] }) {
  const name = process.argv.includes("--quick") ? `${fullName}-quick` : fullName;
  mkdirSync(resultsDir, { recursive: true });
  writeFileSync(join(resultsDir, `${name}.json`), JSON.stringify({ machine, rows, notes }, null, 2) + "\n");
  const md = [
    `# ${name}`,
    "",
    `Machine: ${machine.cpu}, ${machine.cores} cores, ${machine.memoryGiB} GiB, flags ${machine.cpuFlags.join(" ")}; ` +
      `SIMD path ${machine.simd}, ${machine.threads} threads${machine.prefetchBytes ? `, prefetch ${machine.prefetchBytes} B` : ""}${machine.decodeStreams ? `, ${machine.decodeStreams} decode stream${machine.decodeStreams > 1 ? "s" : ""}` : ""}; Node ${machine.node}; ${machine.date}`,
    "",
    `| ${columns.join(" | ")} |`,
    `| ${columns.map(() => "---").join(" | ")} |`,
    ...rows.map((r) => `| ${columns.map((c) => fmt(r[c])).join(" | ")} |`),
    "",
    ...notes.map((n) => `- ${n}`),
    "",
  ].join("\n");
  writeFileSync(join(resultsDir, `${name}.md`), md);
  process.stdout.write(md + "\n");
}

function fmt(v) {
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(v < 10 ? 3 : 1);
  return String(v ?? "");
}
