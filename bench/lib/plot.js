// Plots for benchmark results, drawn by the library's renderVegaLite (src/util/plot.ts: Vega-Lite →
// SVG → PNG, the spec written beside them) into bench/results/.
import { join } from "node:path";
import { renderVegaLite } from "../../dist/src/util/plot.js";
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
  return renderVegaLite(spec, join(resultsDir, name));
}
