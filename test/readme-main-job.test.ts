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
  const block = /The main job[\s\S]*?\n\n```sh\n([^\n]+)\n```/.exec(readme);
  expect(block, "the README's main job block").not.toBeNull();
  const line = block![1];
  expect(line).not.toMatch(/\b(npx|npm|node-gyp)\b/);
  // On the PATH first: npm, npx and node-gyp that only record that they were called, and fail.
  const shims = tempDir();
  for (const name of ["npm", "npx", "node-gyp"]) writeFileSync(join(shims, name), `#!/bin/sh\necho "${name} $*" >> "${shims}/called.log"\nexit 1\n`, { mode: 0o755 });
  const addon = join(repoRoot, "build", "Release", "dki_native.node");
  const before = statSync(addon).mtimeMs;
  // Into a temporary folder, not the repository's work/me.
  const data = join(tempDir(), "me");
  const r = spawnSync("bash", ["-c", line.replaceAll("work/me", data)], {
    cwd: repoRoot,
    env: { ...process.env, PATH: `${shims}:${dirname(process.execPath)}:${process.env.PATH ?? ""}` },
    encoding: "utf8",
  });
  expect(r.status, r.stderr).toBe(0);
  // The committed model answers from the memory it got only as K/V (greedy: the same answer on every CPU path).
  const [added, answer, ...rest] = r.stdout.trim().split("\n");
  expect(added).toMatch(/^added mem_\S+$/);
  expect([answer!.trim(), rest]).toEqual(["Biscuit", []]);
  expect(r.stderr).toMatch(/^\[memories: mem_\S+ \(relevance [\d.]+\) "My dog is called Biscuit\." \| α 1\.00 /m);
  expect(existsSync(join(shims, "called.log")) ? readFileSync(join(shims, "called.log"), "utf8") : "").toBe("");
  expect(statSync(addon).mtimeMs).toBe(before);
});
