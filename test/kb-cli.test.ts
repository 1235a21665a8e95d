// `dki kb` as a user runs it (node bin/dki.js, built by npm test's tsc step).
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { dki, dkiFails } from "./support/dki-bin.js";
import { tempDir } from "./support/paths.js";
import { makePdf } from "./support/pdf.js";

let files: string;
let data: string;
beforeAll(() => {
  files = tempDir();
  data = tempDir();
  writeFileSync(join(files, "guide.md"), "# Guide\nInstall the engine with npm.\n## Linux\nUse apt to get a C++ compiler.\n");
  writeFileSync(join(files, "report.pdf"), makePdf([["Revenue grew twelve percent in the third quarter."]]));
  writeFileSync(join(files, "bad.pdf"), makePdf([["x"]]).slice(0, 50));
});

describe("dki kb", () => {
  test("ingest (a bad file reported, the others kept), search with a filter, list, rm", async () => {
    const args = ["--collection", "docs", "--data", data];
    const err = await dkiFails(["kb", "ingest", join(files, "guide.md"), join(files, "bad.pdf"), join(files, "report.pdf"), ...args, "--metadata", '{"category":"manual"}']);
    expect(err).toMatch(/bad\.pdf: is not a readable PDF/);
    expect(err).toMatch(/1 of 3 files not ingested/);
    const listed = JSON.parse((await dki(["kb", "list", ...args, "--format", "json"])).stdout) as { documents: { doc_id: string; chunks: number }[] };
    expect(listed.documents.map((d) => d.doc_id.split("/").pop()).sort()).toEqual(["guide.md", "report.pdf"]);
    const again = await dki(["kb", "ingest", join(files, "guide.md"), ...args, "--metadata", '{"category":"manual"}']);
    expect(again.stdout).toMatch(/^unchanged .*guide\.md: 2 chunks/);

    const found = JSON.parse((await dki(["kb", "search", "get a compiler on Linux", ...args, "--format", "json", "-k", "1"])).stdout) as { results: { source: { heading_path: string[]; doc_id: string }; text: string }[] };
    expect(found.results).toHaveLength(1);
    expect(found.results[0].source.heading_path).toEqual(["Guide", "Linux"]);
    const text = (await dki(["kb", "search", "revenue quarter", ...args, "--filter", '{"eq":{"docType":"pdf"}}'])).stdout;
    expect(text).toMatch(/^\[1\] [\d.]+ .*report\.pdf, p\. 1 \(chars 0-\d+\)\n {4}Revenue grew/);
    expect(await dkiFails(["kb", "search", "x", ...args, "--filter", '{"eq":{"colour":"red"}}'])).toMatch(/^dki: filter: unknown field "colour"/);
    expect(await dkiFails(["kb", "search", "x", ...args, "--filter", "{bad json"])).toMatch(/--filter is not valid JSON/);
    expect(await dkiFails(["kb", "search", "x", "--collection", "nope", "--data", data])).toMatch(/no collection "nope"; collections: docs/);
    expect(await dkiFails(["kb", "ingest", join(files, "notes.docx"), ...args])).toMatch(/unsupported document type "\.docx"/);

    const id = listed.documents.find((d) => d.doc_id.endsWith("report.pdf"))!.doc_id;
    expect((await dki(["kb", "rm", id, ...args])).stdout).toBe(`removed ${id}\n`);
    expect(await dkiFails(["kb", "rm", id, ...args])).toMatch(/no document/);
    expect((await dki(["kb", "list", "--data", data])).stdout).toBe("docs\t1 documents\t2 chunks\n");
  });
});
