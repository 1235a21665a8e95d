// One temp folder per test run, removed when the run ends: the test models reach hundreds of MB,
// and left behind, repeated runs fill the disk. tempDir() creates its folders inside it.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export default function setup(): () => void {
  const root = mkdtempSync(join(tmpdir(), "dki-test-run-"));
  process.env.DKI_TEST_TMP = root; // inherited by the test workers, started after this
  return () => rmSync(root, { recursive: true, force: true });
}
