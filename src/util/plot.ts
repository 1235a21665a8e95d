// Plots for reports: a Vega-Lite spec compiled and rendered to SVG by Vega in Node, and to PNG by
// resvg for viewers that do not show SVG. The spec is written beside them, so a plot can be
// re-rendered or restyled without rerunning what made its data. Vega, Vega-Lite and resvg are
// development dependencies: loaded when a plot is drawn, and a clear error when they are missing.
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";

export interface PlotFiles {
  svg: string;
  png: string;
  spec: string;
}

/** Writes `${base}.vl.json`, `${base}.svg` and `${base}.png` for a Vega-Lite spec. */
export async function renderVegaLite(spec: Record<string, unknown>, base: string): Promise<PlotFiles> {
  let libs;
  try {
    libs = await Promise.all([import("vega-lite"), import("vega"), import("@resvg/resvg-js")]);
  } catch (e) {
    throw new Error(`plots need vega, vega-lite and @resvg/resvg-js (development dependencies: npm install in the repository): ${(e as Error).message}`);
  }
  const [vl, vega, { Resvg }] = libs;
  const compiled = vl.compile(spec as unknown as Parameters<typeof vl.compile>[0]).spec;
  const view = new vega.View(vega.parse(compiled), { renderer: "none" });
  const svg = await view.toSVG();
  view.finalize();
  mkdirSync(dirname(base), { recursive: true });
  writeFileSync(`${base}.vl.json`, JSON.stringify(spec, null, 2) + "\n");
  writeFileSync(`${base}.svg`, svg);
  writeFileSync(`${base}.png`, new Resvg(svg, { background: "white", font: { loadSystemFonts: true } }).render().asPng());
  return { svg: `${base}.svg`, png: `${base}.png`, spec: `${base}.vl.json` };
}
