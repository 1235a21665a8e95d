// `dki models ...` run in-process through commander: output, option validation, and errors as
// one `dki: message` line with exit status 1.
import { existsSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, expect, test } from "vitest";
import { dki } from "./support/models-cli.js";
import { tempDir } from "./support/paths.js";

afterEach(() => {
  process.exitCode = undefined;
});

test("make-tiny then info --format json", async () => {
  const dir = join(tempDir(), "m");
  const made = await dki("models", "make-tiny", "--out", dir, "--arch", "qwen2", "--dtype", "f16", "--seed", "4", "--shards", "2");
  expect(made.exitCode).toBe(0);
  expect(made.stdout).toMatch(/^wrote .*: qwen2 tiny f16, 6,382,656 parameters, .* in 2 files/);
  expect(existsSync(join(dir, "model.safetensors.index.json"))).toBe(true);
  const info = await dki("models", "info", dir, "--format", "json");
  expect(info.exitCode).toBe(0);
  expect(JSON.parse(info.stdout)).toMatchObject({ arch: "qwen2", parameterCount: 6382656, dtypes: ["F16"], bias: true });
  const text = await dki("models", "info", dir);
  expect(text.stdout).toContain("q/k/v biases");
});

test("bad option values are refused with the allowed values", async () => {
  const r = await dki("models", "make-tiny", "--out", tempDir(), "--dtype", "f8");
  expect(r.exitCode).toBe(1);
  expect(r.stderr).toContain("--dtype must be one of f32, f16, bf16");
  const s = await dki("models", "make-tiny", "--out", tempDir(), "--shards", "0");
  expect(s.stderr).toContain("--shards must be an integer >= 1");
});

test("errors print `dki: message` without a stack trace", async () => {
  const r = await dki("models", "info", join(tempDir(), "missing"));
  expect(r.exitCode).toBe(1);
  expect(r.stderr).toMatch(/^dki: .*config\.json: cannot read \(ENOENT\)\n$/);
  const p = await dki("models", "pull", "nope", "--dir", tempDir());
  expect(p.stderr).toBe('dki: unknown model "nope"; known models: smollm2-135m-instruct, qwen2.5-0.5b-instruct\n');
  const h = await dki("models", "pull", "smollm2-135m-instruct", "--dir", tempDir(), "--hub-url", "not a url");
  expect(h.stderr).toMatch(/^dki: hub URL must be an http\(s\) URL/);
});

test("list names the registry models", async () => {
  const r = await dki("models", "list", "--format", "json");
  const rows = JSON.parse(r.stdout) as { name: string; repo: string }[];
  expect(rows.map((m) => m.name)).toEqual(["smollm2-135m-instruct", "qwen2.5-0.5b-instruct"]);
  expect((await dki("models", "list")).stdout).toContain("HuggingFaceTB/SmolLM2-135M-Instruct");
});

test("make-tiny refuses a folder that is not empty unless --force", async () => {
  const out = tempDir();
  writeFileSync(join(out, "notes.txt"), "mine");
  const r = await dki("models", "make-tiny", "--out", out);
  expect(r.exitCode).toBe(1);
  expect(r.stderr).toBe(`dki: --out: ${out} is not empty (1 entry); give --force to write into it, replacing the files of the same names\n`);
  expect(readdirSync(out)).toEqual(["notes.txt"]);
  expect((await dki("models", "make-tiny", "--out", out, "--force")).exitCode).toBe(0);
  expect(readdirSync(out)).toContain("config.json");
  expect(readFileSync(join(out, "notes.txt"), "utf8")).toBe("mine");
});

test("a path of the wrong kind is named as what the user got wrong, not as an errno", async () => {
  const root = tempDir();
  const file = join(root, "notes.txt");
  writeFileSync(file, "not a model");
  const model = join(root, "m");
  expect((await dki("models", "make-tiny", "--out", model)).exitCode).toBe(0);
  const cases: [string[], string][] = [
    [["models", "info", file], `dki: <path> must be a model folder or a .gguf file; ${file} is neither\n`],
    [["models", "convert", file, "--out", join(root, "x.gguf")], `dki: <dir> must be a Hugging Face model folder; ${file} is a file\n`],
    [["models", "convert", model, "--out", root], `dki: --out must be a file path; ${root} is a folder\n`],
    [["models", "convert", model, "--out", join(root, "missing", "x.gguf")], `dki: --out: the folder ${join(root, "missing")} does not exist\n`],
    [["models", "convert", model, "--out", join(file, "x.gguf")], `dki: --out: ${file} is not a folder\n`],
    [["models", "make-tiny", "--out", file], `dki: --out must be a folder; ${file} exists and is not a folder\n`],
  ];
  for (const [args, message] of cases) {
    const r = await dki(...args);
    expect(r.exitCode, args.join(" ")).toBe(1);
    expect(r.stderr).toBe(message);
  }
});
