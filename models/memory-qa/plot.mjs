// The training curves of the memory-QA models: loss and held-out exact match per mode against
// steps, one panel each, from models/memory-qa/logs/<run>.jsonl (train.py writes them), as
// models/memory-qa/training.png (and the Vega-Lite spec beside it, to restyle without retraining).
//   node models/memory-qa/plot.mjs
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as vl from "vega-lite";
import * as vega from "vega";
import { Resvg } from "@resvg/resvg-js";

const here = dirname(fileURLToPath(import.meta.url));
// The runs in the order they ran, each continuing the one before on the step axis: the tiny (1.3M)
// plain model from random weights, the plain model grown from it (5.8M, train.py --grow-from), the
// block-aware model from that.
const stages = [["tiny plain, 1.3M", "tiny-plain"], ["plain, 5.8M", "plain"], ["block-aware, 5.8M", "block-aware"]];
const loss = [];
const em = [];
const starts = [];
let offset = 0;
for (const [stage, name] of stages) {
  const file = join(here, "logs", `${name}.jsonl`);
  if (!existsSync(file)) continue;
  const rows = readFileSync(file, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
  // The copy drill run alone before the task (train.py's drill_first) takes the steps before the run's start.
  const drilled = Math.max(0, ...rows.map((r) => r.drill_step ?? 0));
  starts.push({ step: offset - drilled, stage });
  let last = 0;
  for (const r of rows) {
    if (r.drill_step !== undefined) {
      loss.push({ stage, series: "copy drill alone", step: offset + r.drill_step - drilled, loss: r.drill_loss });
      continue;
    }
    const step = offset + r.step;
    last = r.step;
    if (!r.final) {
      loss.push({ stage, series: "answer tokens", step, loss: r.loss });
      if (r.drill_loss !== undefined) loss.push({ stage, series: "copy drill (mixed in)", step, loss: r.drill_loss });
    }
    for (const [mode, v] of Object.entries(r.heldout_em ?? {})) em.push({ stage, mode, step, em: v });
  }
  offset += last;
}
const panel = (title, values, y, color, scale) => ({
  title, width: 620, height: 260,
  layer: [
    {
      data: { values }, mark: { type: "line", point: y !== "loss", strokeWidth: 2 },
      encoding: {
        x: { field: "step", type: "quantitative", title: "step (before 0: the copy drill alone; each run continues the one before)" },
        y: { field: y, type: "quantitative", title: y === "loss" ? "training loss (nats)" : "held-out exact match", scale },
        color: { field: color, type: "nominal", legend: { labelLimit: 300 } },
        detail: { field: "stage" },
      },
    },
    {
      data: { values: starts }, mark: { type: "rule", strokeDash: [4, 4], color: "gray" },
      encoding: { x: { field: "step", type: "quantitative" } },
    },
    {
      data: { values: starts }, mark: { type: "text", align: "left", baseline: "top", dx: 4, dy: 4, color: "gray" },
      encoding: { x: { field: "step", type: "quantitative" }, y: { value: 0 }, text: { field: "stage" } },
    },
  ],
});
const spec = {
  $schema: "https://vega.github.io/schema/vega-lite/v6.json",
  background: "white",
  vconcat: [panel("Training loss", loss, "loss", "series", { type: "log" }), panel("Held-out exact match (greedy, PyTorch, 40 questions a mode)", em, "em", "mode", { domain: [0, 1] })],
  resolve: { scale: { color: "independent" } },
};
const view = new vega.View(vega.parse(vl.compile(spec).spec), { renderer: "none" });
const svg = await view.toSVG();
view.finalize();
writeFileSync(join(here, "training.vl.json"), JSON.stringify(spec, null, 2) + "\n");
writeFileSync(join(here, "training.png"), new Resvg(svg, { background: "white", font: { loadSystemFonts: true } }).render().asPng());
console.log(`wrote ${join(here, "training.png")}`);
