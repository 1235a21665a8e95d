import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

export const repoRoot = fileURLToPath(new URL("../..", import.meta.url));
export const fixtures = join(repoRoot, "test", "fixtures");
export const hfLlamaTiny = join(fixtures, "hf", "llama-tiny");
export const smollm2Tokenizer = join(repoRoot, "models", "tokenizers", "smollm2");

/** A fresh folder inside this test run's temp root (see global-setup.ts), removed with it. */
export function tempDir(prefix = "dki-test-"): string {
  return mkdtempSync(join(process.env.DKI_TEST_TMP ?? tmpdir(), prefix));
}

export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length mismatch ${a.length} vs ${b.length}`);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}
