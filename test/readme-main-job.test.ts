// The README's main job, run as written from the repository root: it must run no npm lifecycle
// script. `npx dki` (and `npm exec`, `--no` included) inside the repository installs this package
// into npx's cache to run it, which runs its install (node-gyp rebuild) and prepare (tsc) scripts;
// `node bin/dki.js` runs the built CLI and nothing else.
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { expect, test } from "vitest";
import { repoRoot, tempDir } from "./support/paths.js";

test("the main job runs with npm, npx and node-gyp unreachable, and leaves the built addon as it was", () => {
  const readme = readFileSync(join(repoRoot, "README.md"), "utf8");
  const block = /The main job[^\n]*\n\n```sh\n([^\n]+)\n```/.exec(readme);
  expect(block, "the README's main job block").not.toBeNull();
  const line = block![1];
  expect(line).not.toMatch(/\b(npx|npm|node-gyp)\b/);
  // On the PATH first: npm, npx and node-gyp that only record that they were called, and fail.
  const shims = tempDir();
  for (const name of ["npm", "npx", "node-gyp"]) writeFileSync(join(shims, name), `#!/bin/sh\necho "${name} $*" >> "${shims}/called.log"\nexit 1\n`, { mode: 0o755 });
  const addon = join(repoRoot, "build", "Release", "dki_native.node");
  const before = statSync(addon).mtimeMs;
  // Into a temporary folder, not the repository's models/tiny.
  const out = join(tempDir(), "tiny");
  const r = spawnSync("bash", ["-c", line.replaceAll("models/tiny", out)], {
    cwd: repoRoot,
    env: { ...process.env, PATH: `${shims}:${dirname(process.execPath)}:${process.env.PATH ?? ""}` },
    encoding: "utf8",
  });
  expect(r.status, r.stderr).toBe(0);
  expect(r.stderr).toMatch(/\| memory: \d+ tokens injected as K\/V, α 0\.8 /);
  expect(existsSync(join(shims, "called.log")) ? readFileSync(join(shims, "called.log"), "utf8") : "").toBe("");
  expect(statSync(addon).mtimeMs).toBe(before);
});
