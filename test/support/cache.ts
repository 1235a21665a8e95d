// Shared fixtures of the tiered K/V cache tests: tiny models, a model wrapper that counts
// computes, a seeded PRNG and disk accounting of an L3 folder.
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import type { ComputeBlockOptions } from "../../src/engine/model.js";
import { Model } from "../../src/engine/model.js";
import type { KVBlock } from "../../src/kv/kv-block.js";
import { makeTinyModel, type TinyArch } from "../../src/models/make-tiny.js";
import type { CacheModel } from "../../src/cache/index.js";
import { tempDir } from "./paths.js";

export async function tinyModel(seed = 1, arch: TinyArch = "llama"): Promise<Model> {
  const dir = tempDir("dki-cache-model-");
  await makeTinyModel({ arch, preset: "tiny", dtype: "f16", out: dir, seed });
  return Model.load(dir, { contextSize: 256 });
}

/** A model as the cache sees it, counting computeBlock calls and how many ran at once. */
export class CountingModel implements CacheModel {
  computes = 0;
  running = 0;
  mostRunning = 0;
  constructor(readonly inner: Model) {}
  get info() {
    return this.inner.info;
  }
  nativeHandle() {
    return this.inner.nativeHandle();
  }
  async computeBlock(tokens: number[], opts: ComputeBlockOptions): Promise<KVBlock> {
    this.computes++;
    this.mostRunning = Math.max(this.mostRunning, ++this.running);
    try {
      return await this.inner.computeBlock(tokens, opts);
    } finally {
      this.running--;
    }
  }
}

export { prng } from "./prng.js";

/**
 * Every file under `dir` (entries, temporaries) but the cache's lock file: count and total bytes.
 * Synchronous on purpose: no cache callback can run during the walk, so what it sees is bounded by
 * the cache's accounting at one moment (an asynchronous walk could count a file deleted from one
 * folder and a file created in another afterwards, which never coexisted).
 */
export function diskUsage(dir: string): { files: number; bytes: number; entries: string[] } {
  let files = 0;
  let bytes = 0;
  const entries: string[] = [];
  const walk = (d: string): void => {
    let list;
    try {
      list = readdirSync(d, { withFileTypes: true });
    } catch {
      return; // removed while we looked
    }
    for (const e of list) {
      const p = join(d, e.name);
      if (d === dir && e.name === ".lock") continue; // a few bytes of pid, outside the L3 budget
      if (e.isDirectory()) walk(p);
      else {
        try {
          bytes += statSync(p).size;
          files++;
          if (e.name.endsWith(".kvb")) entries.push(p);
        } catch {
          // an unlink already in flight finished between readdir and stat
        }
      }
    }
  };
  walk(dir);
  return { files, bytes, entries };
}

export const tokensFrom = (seed: number, n: number): number[] => Array.from({ length: n }, (_, i) => 100 + ((seed * 7919 + i * 104729) % 40000));
