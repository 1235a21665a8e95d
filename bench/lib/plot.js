// Plots for benchmark results: a Vega-Lite spec compiled and rendered to SVG by Vega in Node, and
// to PNG by resvg for viewers that do not show SVG. The spec is written beside them, so a plot can
// be re-rendered or restyled without rerunning the benchmark.
import { writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import * as vl from "vega-lite";
import * as vega from "vega";
import { Resvg } from "@resvg/resvg-js";
import { resultsDir } from "./results.js";

/**
 * A line chart, one line per series, both axes logarithmic (x symlog, so a 0 stays on the chart).
 * rows: [{ x, y, series }]. Returns the paths written.
 */
export async function writeLinePlot(name, { rows, title, x, y, series = "series", xZero = true, width = 560, height = 340 }) {
  const spec = {
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    title,
    width,
    height,
    background: "white",
    data: { values: rows },
    mark: { type: "line", point: true, strokeWidth: 2 },
    encoding: {
      x: { field: "x", type: "quantitative", title: x, scale: xZero ? { type: "symlog", constant: 64 } : { type: "log" }, axis: { values: [...new Set(rows.map((r) => r.x))].sort((a, b) => a - b) } },
      y: { field: "y", type: "quantitative", title: y, scale: { type: "log" } },
      color: { field: "series", type: "nominal", title: series, legend: { labelLimit: 400, titleLimit: 400 } },
      strokeDash: { field: "series", type: "nominal", title: series },
      tooltip: [{ field: "series" }, { field: "x" }, { field: "y" }],
    },
  };
  const view = new vega.View(vega.parse(vl.compile(spec).spec), { renderer: "none" });
  const svg = await view.toSVG();
  view.finalize();
  mkdirSync(resultsDir, { recursive: true });
  const base = join(resultsDir, name);
  writeFileSync(`${base}.vl.json`, JSON.stringify(spec, null, 2) + "\n");
  writeFileSync(`${base}.svg`, svg);
  writeFileSync(`${base}.png`, new Resvg(svg, { background: "white", font: { loadSystemFonts: true } }).render().asPng());
  return { svg: `${base}.svg`, png: `${base}.png`, spec: `${base}.vl.json` };
}
