// Peak resident memory while generating from a GGUF file (issue #4, must-show 4), at the
// smollm2-135m and llama-1b shapes, F16 and Q8_0: the whole process's growth, JavaScript's share
// (the @huggingface/tokenizers objects, each step's logits), and the engine's, each against the
// bound file size × 1.15 + K/V cache. One fresh process per file (bench/lib/rss-probe.mjs).
// Usage: node bench/peak-rss.js [--quick]   (quick: smollm2-135m only)
import { spawnSync } from "node:child_process";
import { existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { convertHfToGguf } from "../dist/src/models/convert.js";
import { native, packageRoot } from "../dist/src/engine/native.js";
import { presetConfig } from "../dist/src/models/make-tiny.js";
import { machine } from "./lib/machine.js";
import { benchModel } from "./lib/models.js";
import { writeResults } from "./lib/results.js";

const CONTEXT = 512;
const NEW_TOKENS = 48;
const presets = ["smollm2-135m", ...(process.argv.includes("--quick") ? [] : ["llama-1b"])];
const mb = (n) => n / 2 ** 20;

const rows = [];
for (const preset of presets) {
  const hf = await benchModel(preset, "f16");
  for (const type of ["f16", "q8_0"]) {
    const file = join(hf, `..`, `llama-${preset}-${type}.gguf`);
    if (!existsSync(file)) await convertHfToGguf({ dir: hf, out: file, type });
    const r = spawnSync(process.execPath, [join(packageRoot(), "bench", "lib", "rss-probe.mjs"), join(packageRoot(), "dist"), file, String(CONTEXT), String(NEW_TOKENS)], {
      encoding: "utf8",
    });
    if (r.status !== 0) throw new Error(`rss-probe failed on ${file}: ${r.stderr}`);
    const { before, peak, jsGrew, engineGrew } = JSON.parse(r.stdout);
    const c = presetConfig("llama", preset);
    const kv = 2 * c.num_hidden_layers * c.num_key_value_heads * CONTEXT * (c.head_dim ?? c.hidden_size / c.num_attention_heads) * 4;
    const fileBytes = statSync(file).size;
    const bound = fileBytes * 1.15 + kv;
    const grew = peak - before;
    rows.push({
      model: `llama ${preset}`,
      type,
      "file MB": mb(fileBytes),
      "K/V MB": mb(kv),
      "bound MB": mb(bound),
      "RSS growth MB": mb(grew),
      "JS MB": mb(jsGrew),
      "engine MB": mb(engineGrew),
      "whole process ≤ bound": grew <= bound ? "yes" : "no",
      "engine ≤ bound": engineGrew <= bound ? "yes" : "no",
    });
  }
}

writeResults("peak-rss-cpu", {
  machine: machine(native()),
  columns: Object.keys(rows[0]),
  rows,
  notes: [
    `Peak RSS growth (VmHWM after clear_refs) while loading the GGUF file and generating ${NEW_TOKENS} tokens with a ${CONTEXT}-token context; bound = file × 1.15 + K/V cache (fp32).`,
    "JS = growth of the V8 heap and ArrayBuffers in the same process: the SmolLM2 tokenizer's 49152 tokens and merges as JavaScript objects, whatever the model's size.",
    "engine = growth of the model file's resident pages, the addon's and anonymous memory less JavaScript's (V8 heap, its malloc'd memory, ArrayBuffers), read at the same moment, after the load and after the generation, the larger of the two.",
  ],
});
