// Every ```ts block of README.md runs as written. The convention (also stated in an HTML comment
// under the README's Library heading): the blocks of one `##` section run as one ES module,
// concatenated in order, so later blocks of a section may use what earlier ones defined and each
// section starts from nothing. Each module is type-stripped by TypeScript and run by Node in a
// child process, in a folder holding models/tiny (make-tiny's tiny preset) and a
// node_modules/dki-engine link to this package (whose "exports" map to dist/, built by npm
// test's tsc step), beside links to the other packages the examples import (the AI SDK, the MCP
// SDK), as an application would have them installed. Code that needs a GPU, a download or a
// network belongs in another fence.
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import ts from "typescript";
import { beforeAll, describe, expect, test } from "vitest";
import { packageRoot } from "../src/engine/native.js";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { tempDir } from "./support/paths.js";

interface Section {
  heading: string;
  code: string;
  blocks: number;
}

/** The ```ts blocks of a Markdown text, grouped by the `##` section they sit in. */
function readmeSections(markdown: string): Section[] {
  const sections: Section[] = [];
  let heading = "(before the first section)";
  let block: string[] | null = null;
  for (const line of markdown.split("\n")) {
    if (block) {
      if (/^```\s*$/.test(line)) {
        let s = sections.find((x) => x.heading === heading);
        if (!s) sections.push((s = { heading, code: "", blocks: 0 }));
        s.code += block.join("\n") + "\n";
        s.blocks++;
        block = null;
      } else {
        block.push(line);
      }
    } else if (/^```ts\s*$/.test(line)) {
      block = [];
    } else if (/^## /.test(line)) {
      heading = line.slice(3).trim();
    }
  }
  if (block) throw new Error(`README.md: a \`\`\`ts block in "${heading}" is never closed`);
  return sections;
}

const sections = readmeSections(readFileSync(join(packageRoot(), "README.md"), "utf8"));
let work: string;

beforeAll(async () => {
  work = tempDir("dki-readme-");
  await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f16", out: join(work, "models", "tiny"), seed: 1 });
  mkdirSync(join(work, "node_modules"));
  symlinkSync(packageRoot(), join(work, "node_modules", "dki-engine"), "dir");
  mkdirSync(join(work, "node_modules", "@modelcontextprotocol"));
  for (const name of ["ai", "@modelcontextprotocol/sdk"]) symlinkSync(join(packageRoot(), "node_modules", name), join(work, "node_modules", name), "dir");
});

describe("README.md code runs as written", () => {
  test("the sections with ```ts blocks are found (the Library section among them)", () => {
    expect(sections.map((s) => s.heading)).toContain("Library");
    // The Library section's two blocks: the model example and the cache example.
    expect(sections.find((s) => s.heading === "Library")!.blocks).toBeGreaterThanOrEqual(2);
  });

  test.each(sections.map((s) => [s.heading, s] as const))("section %s", (heading, section) => {
    const js = ts.transpileModule(section.code, {
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022, verbatimModuleSyntax: false },
      reportDiagnostics: true,
    });
    expect(js.diagnostics ?? [], `README section "${heading}" does not parse`).toEqual([]);
    const file = join(work, `${heading.replace(/[^A-Za-z0-9]+/g, "-")}.mjs`);
    writeFileSync(file, js.outputText);
    const r = spawnSync(process.execPath, [file], { cwd: work, encoding: "utf8", timeout: 120_000 });
    expect(r.error, `README section "${heading}"`).toBeUndefined();
    expect(r.status, `README section "${heading}" failed:\n${r.stderr}`).toBe(0);
  });
});
