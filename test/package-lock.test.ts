// The lock file must describe every package an install can need, on any platform: `npm ci` refuses
// a lock that is out of step with package.json ("Missing: @node-llama-cpp/win-x64@ from lock
// file"), and `npm install` would rewrite it. A lock written against a registry mirror that lacks
// some platform builds of a dependency's version is such a lock, and installs here all the same.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { repoRoot } from "./support/paths.js";

interface LockedPackage {
  version?: string;
  link?: boolean;
  dependencies?: Record<string, string>;
  optionalDependencies?: Record<string, string>;
  devDependencies?: Record<string, string>;
}

const lock = JSON.parse(readFileSync(join(repoRoot, "package-lock.json"), "utf8")) as { lockfileVersion: number; packages: Record<string, LockedPackage> };
const manifest = JSON.parse(readFileSync(join(repoRoot, "package.json"), "utf8")) as LockedPackage;

/** Where Node (and npm) would find `dep` from the package at `from`: its own node_modules, then each folder above. */
function resolve(from: string, dep: string): string | undefined {
  for (let dir = from; ; ) {
    const at = dir === "" ? `node_modules/${dep}` : `${dir}/node_modules/${dep}`;
    if (at in lock.packages) return at;
    if (dir === "") return undefined;
    const cut = dir.lastIndexOf("/node_modules/");
    dir = cut < 0 ? "" : dir.slice(0, cut);
  }
}

describe("package-lock.json", () => {
  test("is a v3 lock of this package.json's dependencies", () => {
    expect(lock.lockfileVersion).toBe(3);
    const root = lock.packages[""];
    expect(root.dependencies ?? {}).toEqual(manifest.dependencies ?? {});
    expect(root.devDependencies ?? {}).toEqual(manifest.devDependencies ?? {});
    expect(root.optionalDependencies ?? {}).toEqual(manifest.optionalDependencies ?? {});
  });

  test("holds every dependency, optional ones included, of every locked package", () => {
    const missing: string[] = [];
    for (const [path, pkg] of Object.entries(lock.packages)) {
      if (pkg.link) continue;
      const wanted = { ...pkg.dependencies, ...pkg.optionalDependencies, ...(path === "" ? pkg.devDependencies : {}) };
      for (const dep of Object.keys(wanted)) {
        if (resolve(path, dep) === undefined) missing.push(`${path || "(root)"} → ${dep}`);
      }
    }
    expect(missing).toEqual([]);
  });
});
