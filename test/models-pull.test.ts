// `pullModel` against a local HTTP server (loopback only): full downloads, resuming an
// interrupted transfer with a Range request, checksum and size checks, and clear errors.
import { createHash, randomBytes } from "node:crypto";
import { existsSync, readdirSync } from "node:fs";
import { readFile, stat, writeFile } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server } from "node:http";
import { createServer as createNetServer } from "node:net";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import { pullModel, type PullProgress } from "../src/models/pull.js";
import { loadRegistry, modelBaseUrl, parseRegistry, type ModelRegistry } from "../src/models/registry.js";
import { tempDir } from "./support/paths.js";

const REPO = "test-org/Test-Model";
const files: Record<string, Buffer> = {
  "config.json": Buffer.from(JSON.stringify({ model_type: "llama" })),
  "model.safetensors": randomBytes(1 << 20),
};
const sha = (b: Buffer) => createHash("sha256").update(b).digest("hex");

interface Behaviour {
  /** Send this many bytes of the file, then drop the connection (once). */
  dropAfter?: Record<string, number>;
  /** Answer Range requests with the whole file (200), as some servers do. */
  ignoreRange?: boolean;
  /** Send the file and then this many bytes more, chunked (no Content-Length). */
  oversend?: number;
}

let server: Server;
let hub: string;
let behaviour: Behaviour = {};
let requests: { path: string; range: string | undefined }[] = [];
let ifRanges: (string | undefined)[] = [];

function handle(req: IncomingMessage, res: import("node:http").ServerResponse): void {
  const prefix = `/${REPO}/resolve/main/`;
  const name = req.url?.startsWith(prefix) ? decodeURIComponent(req.url.slice(prefix.length)) : "";
  requests.push({ path: req.url ?? "", range: req.headers.range });
  ifRanges.push(req.headers["if-range"] as string | undefined);
  const body = files[name];
  if (!body) {
    res.writeHead(404).end("not found");
    return;
  }
  const etag = `"${sha(body).slice(0, 16)}"`;
  const m = /^bytes=(\d+)-$/.exec(req.headers.range ?? "");
  const sameVersion = req.headers["if-range"] === undefined || req.headers["if-range"] === etag;
  if (m && !behaviour.ignoreRange && sameVersion) {
    const start = Number(m[1]);
    if (start >= body.length) {
      res.writeHead(416, { "content-range": `bytes */${body.length}` }).end();
      return;
    }
    res.writeHead(206, { "content-length": body.length - start, "content-range": `bytes ${start}-${body.length - 1}/${body.length}`, etag });
    res.end(body.subarray(start));
    return;
  }
  if (behaviour.oversend) {
    res.writeHead(200);
    res.write(body);
    res.end(Buffer.alloc(behaviour.oversend, 7));
    return;
  }
  const drop = behaviour.dropAfter?.[name];
  res.writeHead(200, { "content-length": body.length, "accept-ranges": "bytes", etag });
  if (drop !== undefined) {
    delete behaviour.dropAfter![name];
    res.write(body.subarray(0, drop), () => setTimeout(() => res.socket?.destroy(), 100));
    return;
  }
  res.end(body);
}

function registry(overrides: Partial<Record<string, { size?: number | null; sha256?: string | null }>> = {}): ModelRegistry {
  return parseRegistry({
    models: {
      "test-model": {
        repo: REPO,
        revision: "main",
        files: Object.entries(files).map(([name, b]) => ({ name, size: b.length, sha256: sha(b), ...overrides[name] })),
      },
    },
  });
}

beforeAll(async () => {
  server = createServer(handle);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  hub = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));
afterEach(() => {
  behaviour = {};
  requests = [];
  ifRanges = [];
});

describe("pullModel", () => {
  test("downloads every file, verifies it, and reports progress", async () => {
    const dir = tempDir();
    const events: PullProgress[] = [];
    const r = await pullModel("test-model", { dir, baseUrl: hub, registry: registry(), onProgress: (e) => events.push(e) });
    for (const [name, body] of Object.entries(files)) {
      expect((await readFile(join(dir, name))).equals(body)).toBe(true);
      expect(existsSync(join(dir, name + ".part"))).toBe(false);
    }
    expect(r.files.map((f) => [f.name, f.bytes, f.sha256])).toEqual(Object.entries(files).map(([n, b]) => [n, b.length, sha(b)]));
    expect(events.filter((e) => e.type === "done").map((e) => e.file)).toEqual(Object.keys(files));
    const data = events.filter((e): e is Extract<PullProgress, { type: "data" }> => e.type === "data" && e.file === "model.safetensors");
    expect(data.at(-1)!.received).toBe(files["model.safetensors"].length);

    // A second pull finds the files in place and downloads nothing.
    requests = [];
    const again = await pullModel("test-model", { dir, baseUrl: hub, registry: registry() });
    expect(again.files.every((f) => f.skipped)).toBe(true);
    expect(requests).toEqual([]);
  });

  test("resumes an interrupted transfer from the .part file with a Range request", async () => {
    const dir = tempDir();
    const body = files["model.safetensors"];
    behaviour.dropAfter = { "model.safetensors": 300_000 };
    await expect(pullModel("test-model", { dir, baseUrl: hub, registry: registry() })).rejects.toThrow(/interrupted after \d+ bytes.*run the same command again to resume/);
    expect(existsSync(join(dir, "model.safetensors"))).toBe(false);
    const partial = (await stat(join(dir, "model.safetensors.part"))).size;
    expect(partial).toBeGreaterThan(0);
    expect(partial).toBeLessThan(body.length);

    requests = [];
    const events: PullProgress[] = [];
    await pullModel("test-model", { dir, baseUrl: hub, registry: registry(), onProgress: (e) => events.push(e) });
    expect(requests).toEqual([{ path: `/${REPO}/resolve/main/model.safetensors`, range: `bytes=${partial}-` }]);
    expect(events.find((e) => e.type === "start")).toMatchObject({ resumeFrom: partial, total: body.length });
    expect((await readFile(join(dir, "model.safetensors"))).equals(body)).toBe(true);
    expect(existsSync(join(dir, "model.safetensors.part"))).toBe(false);
  });

  test("a resume names the version its .part began with (If-Range): a file changed upstream meanwhile comes whole, not spliced", async () => {
    const dir = tempDir();
    const v1 = files["model.safetensors"];
    behaviour.dropAfter = { "model.safetensors": 300_000 };
    await expect(pullModel("test-model", { dir, baseUrl: hub, registry: registry() })).rejects.toThrow(/interrupted/);
    const v2 = Buffer.from(v1).reverse(); // same size, other bytes
    files["model.safetensors"] = v2;
    try {
      ifRanges = [];
      await pullModel("test-model", { dir, baseUrl: hub, registry: registry() });
      expect(ifRanges[0]).toMatch(/^"[0-9a-f]{16}"$/); // v1's ETag, sent with the range
      expect((await readFile(join(dir, "model.safetensors"))).equals(v2)).toBe(true);
      expect(readdirSync(dir).filter((f) => f.includes(".part"))).toEqual([]);
    } finally {
      files["model.safetensors"] = v1;
    }
  });

  test("starts over when the server answers a Range request with the whole file (200)", async () => {
    const dir = tempDir();
    behaviour.ignoreRange = true;
    await writeFile(join(dir, "model.safetensors.part"), Buffer.from("stale bytes from some other download"));
    await pullModel("test-model", { dir, baseUrl: hub, registry: registry() });
    expect(requests.find((r) => r.path.endsWith("model.safetensors"))!.range).toBe("bytes=36-");
    expect((await readFile(join(dir, "model.safetensors"))).equals(files["model.safetensors"])).toBe(true);
  });

  test("a complete .part (416 on resume) is verified and moved into place", async () => {
    const dir = tempDir();
    await writeFile(join(dir, "model.safetensors.part"), files["model.safetensors"]);
    await pullModel("test-model", { dir, baseUrl: hub, registry: registry() });
    expect((await readFile(join(dir, "model.safetensors"))).equals(files["model.safetensors"])).toBe(true);
  });

  test("a checksum mismatch is an error and leaves no file behind", async () => {
    const dir = tempDir();
    const reg = registry({ "model.safetensors": { sha256: "0".repeat(64) } });
    await expect(pullModel("test-model", { dir, baseUrl: hub, registry: reg })).rejects.toThrow(/model\.safetensors: sha256 mismatch \(got [0-9a-f]{64}, expected 0{64}\)/);
    expect(existsSync(join(dir, "model.safetensors"))).toBe(false);
    expect(existsSync(join(dir, "model.safetensors.part"))).toBe(false);
  });

  test("a null checksum is size-checked only, against the registry size or Content-Length", async () => {
    const dir = tempDir();
    const unknown = registry({ "config.json": { size: null, sha256: null }, "model.safetensors": { sha256: null } });
    const r = await pullModel("test-model", { dir, baseUrl: hub, registry: unknown });
    expect(r.files[1].sha256).toBe(sha(files["model.safetensors"]));
    const wrongSize = registry({ "config.json": { size: 3, sha256: null } });
    await expect(pullModel("test-model", { dir: tempDir(), baseUrl: hub, registry: wrongSize })).rejects.toThrow(/the server has \d+ bytes, the registry expects 3/);
  });

  test("DKI_HUB_URL points downloads at another hub", async () => {
    const saved = process.env.DKI_HUB_URL;
    process.env.DKI_HUB_URL = hub + "/";
    try {
      const dir = tempDir();
      await pullModel("test-model", { dir, registry: registry() });
      expect(existsSync(join(dir, "config.json"))).toBe(true);
    } finally {
      if (saved === undefined) delete process.env.DKI_HUB_URL;
      else process.env.DKI_HUB_URL = saved;
    }
  });

  test("a body running past the file's size is cut off there and deleted, not written to the end", async () => {
    const dir = tempDir();
    behaviour = { oversend: 1 << 20 };
    await expect(pullModel("test-model", { dir, baseUrl: hub, registry: registry() })).rejects.toThrow(/the server sent more than the \d+ bytes it announced; the download was deleted/);
    expect(readdirSync(dir)).toEqual([]);
  });

  test("a registry given through the API cannot name a file outside the folder", async () => {
    const parent = tempDir();
    const dir = join(parent, "model");
    const files = [{ name: "../escaped.txt", size: null, sha256: null }];
    const bad: ModelRegistry = new Map([["bad", { name: "bad", repo: REPO, revision: "main", description: "", license: null, files }]]);
    await expect(pullModel("bad", { dir, baseUrl: hub, registry: bad })).rejects.toThrow(/"\.\.\/escaped\.txt" is not a plain file name: refusing to write outside/);
    expect(existsSync(join(parent, "escaped.txt"))).toBe(false);
  });

  test("HTTP errors name the URL and status", async () => {
    const reg = parseRegistry({ models: { gone: { repo: "nobody/none", files: [{ name: "config.json" }] } } });
    await expect(pullModel("gone", { dir: tempDir(), baseUrl: hub, registry: reg })).rejects.toThrow(`GET ${hub}/nobody/none/resolve/main/config.json failed: HTTP 404`);
  });

  test("an unknown model name lists the known ones", async () => {
    await expect(pullModel("no-such-model", { dir: tempDir() })).rejects.toThrow(/unknown model "no-such-model"; known models: .*smollm2-135m-instruct.*qwen2\.5-0\.5b-instruct/);
  });

  test("an unreachable host gives a clear network error", async () => {
    // A port that was just free: connecting is refused.
    const probe = createNetServer();
    await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
    const port = (probe.address() as AddressInfo).port;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    const url = `http://127.0.0.1:${port}`;
    const err = await pullModel("test-model", { dir: tempDir(), baseUrl: url, registry: registry() }).catch((e: Error) => e);
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toBe(
      `cannot reach ${url}/${REPO}/resolve/main/config.json (connect ECONNREFUSED 127.0.0.1:${port}): check your network or set DKI_HUB_URL`,
    );
  });
});

describe("registry", () => {
  test("models/registry.json names the real models and their files", async () => {
    const reg = await loadRegistry();
    const smol = reg.get("smollm2-135m-instruct")!;
    expect(smol.repo).toBe("HuggingFaceTB/SmolLM2-135M-Instruct");
    expect(modelBaseUrl(smol, "https://huggingface.co")).toBe("https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/resolve/main/");
    expect(reg.get("qwen2.5-0.5b-instruct")!.repo).toBe("Qwen/Qwen2.5-0.5B-Instruct");
    for (const m of reg.values()) {
      expect(m.files.map((f) => f.name).sort()).toEqual(["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]);
    }
  });

  test("file names that are not plain names and malformed checksums are refused", () => {
    expect(() => parseRegistry({ models: { x: { repo: "a/b", files: [{ name: "../evil" }] } } })).toThrow(/plain file name/);
    expect(() => parseRegistry({ models: { x: { repo: "a/b", files: [{ name: "a.json", sha256: "xyz" }] } } })).toThrow(/sha256/);
    expect(() => parseRegistry({ models: { x: { repo: "not a repo", files: [{ name: "a.json" }] } } })).toThrow(/owner\/name/);
  });
});
