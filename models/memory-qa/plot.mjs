// The training curves of the memory-QA models: loss and held-out exact match per mode against
// steps, one panel each, from models/memory-qa/logs/<variant>.jsonl (train.py writes them), as
// models/memory-qa/training.png (and the Vega-Lite spec beside it, to restyle without retraining).
//   node models/memory-qa/plot.mjs
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as vl from "vega-lite";
import * as vega from "vega";
import { Resvg } from "@resvg/resvg-js";

const here = dirname(fileURLToPath(import.meta.url));
const loss = [];
const em = [];
for (const variant of ["plain", "block-aware"]) {
  const file = join(here, "logs", `${variant}.jsonl`);
  if (!existsSync(file)) continue;
  const rows = readFileSync(file, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
  // The copy drill run alone before the task (train.py's drill_first) takes the steps before 0;
  // the block-aware run continues the plain one: its steps are counted after the plain run's.
  const drilled = Math.max(0, ...rows.map((r) => r.drill_step ?? 0));
  const offset = variant === "plain" ? 0 : Math.max(0, ...loss.filter((r) => r.variant.startsWith("plain")).map((r) => r.step));
  for (const r of rows) {
    if (r.drill_step !== undefined) {
      loss.push({ variant: `${variant}: copy drill alone`, step: r.drill_step - drilled, loss: r.drill_loss });
      continue;
    }
    const step = r.step + offset;
    if (!r.final) {
      loss.push({ variant: `${variant}: answer tokens`, step, loss: r.loss });
      if (r.drill_loss !== undefined) loss.push({ variant: `${variant}: copy drill (mixed in)`, step, loss: r.drill_loss });
    }
    for (const [mode, v] of Object.entries(r.heldout_em ?? {})) em.push({ series: `${variant}: ${mode}`, step, em: v });
  }
}
const panel = (title, values, y, color, scale) => ({
  title, width: 520, height: 260, data: { values },
  mark: { type: "line", point: y !== "loss", strokeWidth: 2 },
  encoding: {
    x: { field: "step", type: "quantitative", title: "step (before 0: the copy drill alone; block-aware continues the plain run)" },
    y: { field: y, type: "quantitative", title: y === "loss" ? "training loss (nats)" : "held-out exact match", scale },
    color: { field: color, type: "nominal", legend: { labelLimit: 300 } },
  },
});
const spec = {
  $schema: "https://vega.github.io/schema/vega-lite/v6.json",
  background: "white",
  vconcat: [panel("Training loss", loss, "loss", "variant", { type: "log" }), panel("Held-out exact match (greedy, PyTorch)", em, "em", "series", { domain: [0, 1] })],
  resolve: { scale: { color: "independent" } },
};
const view = new vega.View(vega.parse(vl.compile(spec).spec), { renderer: "none" });
const svg = await view.toSVG();
view.finalize();
writeFileSync(join(here, "training.vl.json"), JSON.stringify(spec, null, 2) + "\n");
writeFileSync(join(here, "training.png"), new Resvg(svg, { background: "white", font: { loadSystemFonts: true } }).render().asPng());
console.log(`wrote ${join(here, "training.png")}`);
