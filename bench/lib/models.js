// Benchmark models: random weights at real shapes, generated once into models/bench/ (git-ignored).
import { closeSync, existsSync, fsyncSync, openSync } from "node:fs";
import { join } from "node:path";
import { makeTinyModel } from "../../dist/src/models/make-tiny.js";
import { convertHfToGguf } from "../../dist/src/models/convert.js";
import { packageRoot } from "../../dist/src/engine/native.js";

export async function benchModel(preset, dtype, arch = "llama") {
  const dir = join(packageRoot(), "models", "bench", `${arch}-${preset}-${dtype}`);
  if (!existsSync(join(dir, "config.json"))) {
    process.stderr.write(`generating ${dir} ...\n`);
    await makeTinyModel({ arch, preset, dtype, out: dir, seed: 1 });
  }
  return dir;
}

/** The F16 bench model of `preset` converted to a GGUF file of `type` (f16, q8_0), made once. */
export async function benchGguf(preset, type) {
  const file = join(await benchModel(preset, "f16"), "..", `llama-${preset}-${type}.gguf`);
  if (!existsSync(file)) {
    process.stderr.write(`converting to ${file} ...\n`);
    await convertHfToGguf({ dir: await benchModel(preset, "f16"), out: file, type });
  }
  // A freshly written file is still being flushed to disk for a while; timing during that
  // write-back would charge whichever engine runs first.
  const fd = openSync(file, "r");
  fsyncSync(fd);
  closeSync(fd);
  return file;
}
