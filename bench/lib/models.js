// Benchmark models: random weights at real shapes, generated once into models/bench/ (git-ignored).
import { existsSync } from "node:fs";
import { join } from "node:path";
import { makeTinyModel } from "../../dist/src/models/make-tiny.js";
import { packageRoot } from "../../dist/src/engine/native.js";

export async function benchModel(preset, dtype, arch = "llama") {
  const dir = join(packageRoot(), "models", "bench", `${arch}-${preset}-${dtype}`);
  if (!existsSync(join(dir, "config.json"))) {
    process.stderr.write(`generating ${dir} ...\n`);
    await makeTinyModel({ arch, preset, dtype, out: dir, seed: 1 });
  }
  return dir;
}
