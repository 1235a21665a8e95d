// Downloads a registry model into a local folder. Each file goes to `<name>.part` first; an
// interrupted download is resumed with an HTTP Range request (If-Range: only if the server still
// serves the version the .part began with, else the whole file again), and the file is renamed into place
// only after its size (and sha256, when the registry knows it) checks out, so a file under its
// final name is always complete.
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdir, open, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { findModel, isPlainFileName, loadRegistry, modelBaseUrl, type ModelRegistry, type RegistryFile } from "./registry.js";

export type PullProgress =
  | { type: "skip"; file: string; bytes: number }
  | { type: "start"; file: string; url: string; total: number | null; resumeFrom: number }
  | { type: "data"; file: string; received: number; total: number | null }
  | { type: "verify"; file: string }
  | { type: "done"; file: string; bytes: number; sha256: string };

export interface PullOptions {
  /** Destination folder for this model's files; created if missing. */
  dir: string;
  /** Hub root replacing https://huggingface.co (default: DKI_HUB_URL, else huggingface.co). */
  baseUrl?: string;
  onProgress?: (event: PullProgress) => void;
  fetchImpl?: typeof fetch;
  /** Registry to look the name up in (default: models/registry.json). */
  registry?: ModelRegistry;
}

export interface PulledFile {
  name: string;
  bytes: number;
  /** Computed from the downloaded bytes; null for files already present (not re-read). */
  sha256: string | null;
  skipped: boolean;
}

export interface PullResult {
  name: string;
  dir: string;
  files: PulledFile[];
}

/** A download that failed for a reason outside the program: network, server, or corrupt data. */
export class DownloadError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "DownloadError";
  }
}

export async function pullModel(name: string, opts: PullOptions): Promise<PullResult> {
  const registry = opts.registry ?? (await loadRegistry());
  const model = findModel(registry, name);
  const base = modelBaseUrl(model, opts.baseUrl);
  await mkdir(opts.dir, { recursive: true });
  const files: PulledFile[] = [];
  for (const f of model.files) {
    files.push(await pullFile(base + f.name, f, opts));
  }
  return { name, dir: opts.dir, files };
}

const fileSize = (p: string) => stat(p).then((s) => s.size, () => null);

async function pullFile(url: string, file: RegistryFile, opts: PullOptions): Promise<PulledFile> {
  // A registry passed in through the API has not been through parseRegistry's checks.
  if (!isPlainFileName(file.name)) throw new DownloadError(`${JSON.stringify(file.name)} is not a plain file name: refusing to write outside ${opts.dir}`);
  const emit = opts.onProgress ?? (() => {});
  const finalPath = join(opts.dir, file.name);
  const partPath = finalPath + ".part";
  // The server's validator (ETag or Last-Modified) of the version the .part holds: a resume asks
  // for the rest only if that is still the version served (If-Range), else it gets the whole file.
  const validatorPath = partPath + ".validator";

  // Files only get their final name after verification, so one that is there (at the known size) is done.
  const existing = await fileSize(finalPath);
  if (existing !== null && (file.size === null || existing === file.size)) {
    emit({ type: "skip", file: file.name, bytes: existing });
    return { name: file.name, bytes: existing, sha256: null, skipped: true };
  }

  let have = (await fileSize(partPath)) ?? 0;
  if (file.size !== null && have > file.size) {
    await rm(partPath, { force: true });
    have = 0;
  }
  const validator = have > 0 ? await readFile(validatorPath, "utf8").catch(() => null) : null;
  let res = await request(url, have, opts.fetchImpl ?? fetch, validator);
  if (res.status === 416 && have > 0) {
    // The range starts at or past the end: either the .part is already complete, or it is not this file.
    const total = parseContentRangeTotal(res.headers.get("content-range"));
    await res.body?.cancel();
    if (total !== have) {
      await rm(partPath, { force: true });
      have = 0;
      res = await request(url, 0, opts.fetchImpl ?? fetch, null);
    }
  }

  let total: number | null;
  if (res.status === 416 && have > 0) {
    total = have;
  } else {
    if (res.status !== 200 && res.status !== 206) {
      await res.body?.cancel();
      throw new DownloadError(`GET ${url} failed: HTTP ${res.status} ${res.statusText}${res.status === 404 ? " (is the hub URL right?)" : ""}`);
    }
    if (res.status === 206) {
      const start = parseContentRangeStart(res.headers.get("content-range"));
      if (start !== have) {
        await res.body?.cancel();
        throw new DownloadError(`GET ${url}: asked for bytes from ${have} but the server sent a range starting at ${start}`);
      }
      total = parseContentRangeTotal(res.headers.get("content-range"));
    } else {
      have = 0; // the server ignored the Range header, or the file changed since the .part began: start over
      total = contentLength(res);
      const v = validatorOf(res);
      if (v) await writeFile(validatorPath, v);
      else await rm(validatorPath, { force: true });
    }
    if (file.size !== null && total !== null && total !== file.size) {
      await res.body?.cancel();
      throw new DownloadError(`${url}: the server has ${total} bytes, the registry expects ${file.size}`);
    }
    total ??= file.size;
    emit({ type: "start", file: file.name, url, total, resumeFrom: have });
    have = await receive(res, partPath, have, url, total, (received) => emit({ type: "data", file: file.name, received, total }));
  }

  const expected = file.size ?? total;
  if (expected !== null && have !== expected) {
    // Short: keep the .part to resume from. Long: it cannot be this file.
    if (have > expected) await rm(partPath, { force: true });
    throw new DownloadError(`${url}: got ${have} bytes, expected ${expected}${have < expected ? "; run the same command again to resume" : ""}`);
  }
  emit({ type: "verify", file: file.name });
  const sha256 = await sha256File(partPath);
  if (file.sha256 !== null && sha256 !== file.sha256) {
    await rm(partPath, { force: true });
    throw new DownloadError(`${file.name}: sha256 mismatch (got ${sha256}, expected ${file.sha256}); the download was deleted`);
  }
  await rename(partPath, finalPath);
  await rm(validatorPath, { force: true });
  emit({ type: "done", file: file.name, bytes: have, sha256 });
  return { name: file.name, bytes: have, sha256, skipped: false };
}

/** A strong ETag, else Last-Modified: what If-Range may name (a weak ETag may not). */
function validatorOf(res: Response): string | null {
  const etag = res.headers.get("etag");
  if (etag && !etag.startsWith("W/")) return etag;
  return res.headers.get("last-modified");
}

async function request(url: string, from: number, fetchImpl: typeof fetch, validator: string | null): Promise<Response> {
  // identity: a compressed transfer would make Content-Length disagree with the bytes we store.
  const headers: Record<string, string> = { "accept-encoding": "identity" };
  if (from > 0) headers.range = `bytes=${from}-`;
  if (from > 0 && validator) headers["if-range"] = validator;
  try {
    return await fetchImpl(url, { headers, redirect: "follow" });
  } catch (e) {
    throw new DownloadError(`cannot reach ${url} (${networkDetail(e)}): check your network or set DKI_HUB_URL`);
  }
}

/**
 * Appends the body to the .part file (or rewrites it when starting from 0); returns the bytes now
 * on disk. A body that runs past `total` (when known) is cut off there: it cannot be this file,
 * and a server that never stops must not fill the disk.
 */
async function receive(res: Response, partPath: string, from: number, url: string, total: number | null, onData: (received: number) => void): Promise<number> {
  const fh = await open(partPath, from > 0 ? "a" : "w");
  let received = from;
  let over = false;
  try {
    if (!res.body) return received;
    for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
      if (total !== null && received + chunk.byteLength > total) {
        over = true;
        break; // leaving the loop cancels the body
      }
      await fh.write(chunk);
      received += chunk.byteLength;
      onData(received);
    }
  } catch (e) {
    throw new DownloadError(`download of ${url} was interrupted after ${received} bytes (${networkDetail(e)}); run the same command again to resume`);
  } finally {
    await fh.close();
  }
  if (over) {
    await rm(partPath, { force: true });
    throw new DownloadError(`${url}: the server sent more than the ${total} bytes it announced; the download was deleted`);
  }
  return received;
}

/** The most specific reason fetch/undici gives: "connect ECONNREFUSED 127.0.0.1:1", "getaddrinfo ENOTFOUND host", ... */
function networkDetail(e: unknown): string {
  let err: unknown = e;
  // undici wraps the socket error as `cause`; happy-eyeballs failures are AggregateErrors of per-address errors.
  while (err instanceof Error && err.cause instanceof Error) err = err.cause;
  if (err instanceof AggregateError && err.errors[0] instanceof Error) {
    const code = (err as NodeJS.ErrnoException).code;
    const first = (err.errors[0] as Error).message;
    return code && !first.includes(code) ? `${code} ${first}` : first;
  }
  if (err instanceof Error && err.message === "bad port") return "fetch refuses to connect to this port";
  if (err instanceof Error) {
    const code = (err as NodeJS.ErrnoException).code;
    const msg = err.message || err.name;
    return code && !msg.includes(code) ? `${code}: ${msg}` : msg;
  }
  return String(err);
}

function contentLength(res: Response): number | null {
  const enc = res.headers.get("content-encoding");
  if (enc && enc !== "identity") return null;
  const v = res.headers.get("content-length");
  const n = v === null ? NaN : Number(v);
  return Number.isSafeInteger(n) && n >= 0 ? n : null;
}

/** "bytes 100-199/1000" → 100. */
function parseContentRangeStart(v: string | null): number | null {
  const m = v?.match(/^bytes (\d+)-\d+\/(?:\d+|\*)$/);
  return m ? Number(m[1]) : null;
}

/** "bytes 100-199/1000" or "bytes * /1000" → 1000; null when unknown. */
function parseContentRangeTotal(v: string | null): number | null {
  const m = v?.match(/\/(\d+)$/);
  return m ? Number(m[1]) : null;
}

async function sha256File(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path, { highWaterMark: 1 << 20 })) hash.update(chunk as Buffer);
  return hash.digest("hex");
}
