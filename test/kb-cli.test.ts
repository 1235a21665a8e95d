// `dki kb` as a user runs it (node bin/dki.js, built by npm test's tsc step).
import { existsSync, mkdirSync, realpathSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
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
    expect(again.stdout).toMatch(/^\[1\/1\] unchanged .*guide\.md: 2 chunks/);

    const found = JSON.parse((await dki(["kb", "search", "get a compiler on Linux", ...args, "--format", "json", "-k", "1"])).stdout) as { results: { source: { heading_path: string[]; doc_id: string }; text: string }[] };
    expect(found.results).toHaveLength(1);
    expect(found.results[0].source.heading_path).toEqual(["Guide", "Linux"]);
    const text = (await dki(["kb", "search", "revenue quarter", ...args, "--filter", '{"eq":{"docType":"pdf"}}'])).stdout;
    expect(text).toMatch(/^\[1\] [\d.]+ .*report\.pdf, p\. 1 \(chars 0-\d+\)\n {4}Revenue grew/);
    expect(await dkiFails(["kb", "search", "x", ...args, "--filter", '{"eq":{"colour":"red"}}'])).toMatch(/^dki: filter: unknown field "colour"/);
    expect(await dkiFails(["kb", "search", "x", ...args, "--filter", "{bad json"])).toMatch(/--filter is not valid JSON/);
    expect(await dkiFails(["kb", "search", "x", "--collection", "nope", "--data", data])).toMatch(/no collection "nope"; collections: docs/);
    expect(await dkiFails(["kb", "ingest", join(files, "notes.odt"), ...args])).toMatch(/unsupported document type "\.odt"/);

    const id = listed.documents.find((d) => d.doc_id.endsWith("report.pdf"))!.doc_id;
    expect((await dki(["kb", "rm", id, ...args])).stdout).toBe(`removed ${id}\n`);
    expect(await dkiFails(["kb", "rm", id, ...args])).toMatch(/no document/);
    expect((await dki(["kb", "list", "--data", data])).stdout).toBe("docs\t1 documents\t2 chunks\n");
  });
});

describe("dki kb: a missing knowledge base, folders, document ids, metadata, invalid UTF-8", () => {
  test("search, list and rm refuse a knowledge base that does not exist, naming it, and create nothing", async () => {
    const missing = join(tempDir(), "typo");
    for (const args of [["search", "x", "-c", "docs"], ["list"], ["list", "-c", "docs"], ["rm", "d", "-c", "docs"]]) {
      expect(await dkiFails(["kb", ...args, "--data", missing])).toBe(`dki: --data ${missing}: no knowledge base there (${missing}.kb); check the path (dki kb ingest creates one)\n`);
    }
    expect(existsSync(`${missing}.kb`)).toBe(false);
  });

  test("ingest DIR: recursive over the supported files, the others listed as skipped, one line per file as it is done", async () => {
    const dir = realpathSync(tempDir());
    mkdirSync(join(dir, "sub", "deeper"), { recursive: true });
    mkdirSync(join(dir, ".hidden"));
    writeFileSync(join(dir, "a.md"), "# A\nAlpha text.\n");
    writeFileSync(join(dir, "sub", "b.txt"), "Bravo text.");
    writeFileSync(join(dir, "sub", "deeper", "c.html"), "<p>Charlie text.</p>");
    writeFileSync(join(dir, "notes.odt"), "PK");
    writeFileSync(join(dir, "image.png"), "x");
    writeFileSync(join(dir, ".hidden", "x.md"), "# hidden");
    const kbData = tempDir();
    const r = await dki(["kb", "ingest", dir, "--collection", "tree", "--data", kbData]);
    expect(r.stdout).toBe(
      [
        `skipped ${dir}/.hidden: hidden`,
        `skipped ${dir}/image.png: unsupported type .png`,
        `skipped ${dir}/notes.odt: unsupported type .odt`,
        `[1/3] added ${dir}/a.md: 1 chunks`,
        `[2/3] added ${dir}/sub/b.txt: 1 chunks`,
        `[3/3] added ${dir}/sub/deeper/c.html: 1 chunks`,
        "",
      ].join("\n"),
    );
    expect(r.stderr).toBe("");
    // JSON: one object on stdout, no progress lines (stderr is not a terminal here).
    const j = await dki(["kb", "ingest", dir, "--collection", "tree", "--data", kbData, "--format", "json"]);
    expect(j.stderr).toBe("");
    const out = JSON.parse(j.stdout);
    expect(out.results.map((x: { status: string }) => x.status)).toEqual(["unchanged", "unchanged", "unchanged"]);
    expect(out.skipped).toEqual([
      { path: `${dir}/.hidden`, reason: "hidden" },
      { path: `${dir}/image.png`, reason: "unsupported type .png" },
      { path: `${dir}/notes.odt`, reason: "unsupported type .odt" },
    ]);
    // A folder with nothing to ingest is an error, naming it and what is supported.
    const other = tempDir();
    writeFileSync(join(other, "z.bin"), "x");
    expect(await dkiFails(["kb", "ingest", other, "--collection", "tree", "--data", kbData])).toBe(`dki: no files to ingest in ${other} (supported: .txt, .md, .html and .pdf files)\n`);
  });

  test("a file is one document whatever the working directory (its absolute path); re-ingest keeps its metadata unless --metadata replaces it", async () => {
    const dir = realpathSync(tempDir());
    writeFileSync(join(dir, "guide.md"), "# Guide\nInstall the engine with npm.\n");
    const kbData = tempDir();
    const args = ["--collection", "c", "--data", kbData];
    expect((await dki(["kb", "ingest", "guide.md", ...args, "--metadata", '{"category":"manual"}'], { cwd: dir })).stdout).toBe(`[1/1] added ${dir}/guide.md: 1 chunks\n`);
    expect((await dki(["kb", "ingest", join(basename(dir), "guide.md"), ...args], { cwd: dirname(dir) })).stdout).toBe(`[1/1] unchanged ${dir}/guide.md: 1 chunks\n`);
    const docs = async () => (JSON.parse((await dki(["kb", "list", ...args, "--format", "json"])).stdout) as { documents: { doc_id: string; fields: Record<string, unknown> }[] }).documents;
    const [doc] = await docs();
    expect((await docs()).length).toBe(1);
    expect(doc.doc_id).toBe(join(dir, "guide.md"));
    expect(doc.fields.category).toBe("manual");
    // Changed text, no --metadata: the chunks are replaced, the metadata stays.
    writeFileSync(join(dir, "guide.md"), "# Guide\nInstall the engine with npm, then build it.\n");
    expect((await dki(["kb", "ingest", join(dir, "guide.md"), ...args])).stdout).toMatch(/^\[1\/1\] replaced /);
    expect((await docs())[0].fields.category).toBe("manual");
    // --metadata replaces it; {} clears it.
    await dki(["kb", "ingest", join(dir, "guide.md"), ...args, "--metadata", "{}"]);
    expect((await docs())[0].fields.category).toBeUndefined();
  });

  test("a file that is not UTF-8 is refused with the count, or read with U+FFFD and a warning under --replace-invalid-utf8", async () => {
    const dir = tempDir();
    const file = join(dir, "latin1.txt");
    writeFileSync(file, Buffer.concat([Buffer.from("Caf"), Buffer.from([0xe9]), Buffer.from(" au lait, cr"), Buffer.from([0xe8]), Buffer.from("me.")]));
    const args = ["kb", "ingest", file, "--collection", "c", "--data", tempDir()];
    const refused = await dkiFails(args);
    expect(refused).toBe(
      `dki: [1/1] ${file}: is not UTF-8 text: 2 byte sequences are not UTF-8 (a binary file? replaceInvalidUtf8, CLI --replace-invalid-utf8, reads them as U+FFFD)\ndki: 1 of 1 files not ingested\n`,
    );
    const read = await dki([...args, "--replace-invalid-utf8"]);
    expect(read.stderr).toBe(`dki: warning: ${file}: 2 byte sequences were not UTF-8, read as U+FFFD\n`);
    expect(read.stdout).toMatch(/^\[1\/1\] added .*latin1\.txt: 1 chunks\n$/);
  });
});
