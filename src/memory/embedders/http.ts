// An embedder behind an OpenAI-compatible HTTP API (POST <url>/embeddings: OpenAI, Ollama's /v1,
// vLLM, a `dki serve`), and the first working embedder of a list.
//
// The embedder's dimension is what the server returns, so `connect` asks once before the
// embedder is handed out (a store checks the dimension when it opens). Vectors come back scaled
// to length 1, as every embedder here hands them out. Its id names the model and dimension, not
// the host: the same model served elsewhere makes the same vectors.
//
// A fallback list is resolved once, when it is opened: the first candidate that embeds a probe
// text is the embedder from then on. It never switches mid-run, since vectors of two embedders
// in one store would not be comparable (a store opened with another embedder than its own is
// refused anyway, naming both).
import { DkiArgumentError } from "../../errors.js";
import { MemoryStoreError } from "../errors.js";
import type { Embedder } from "../types.js";
import { checkTexts, unitVector } from "./common.js";

export interface HttpEmbedderOptions {
  /** The API's base URL, up to and including /v1 (e.g. http://127.0.0.1:11434/v1). */
  url: string;
  /** The model name the server knows. */
  model: string;
  /** Sent as `Authorization: Bearer …` when given. */
  apiKey?: string;
  /** Per request (default 60 s). */
  timeoutMs?: number;
  /** Texts per request (default 64). */
  batchSize?: number;
}

export class HttpEmbedder implements Embedder {
  readonly id: string;

  private constructor(
    private readonly o: Required<Omit<HttpEmbedderOptions, "apiKey">> & { apiKey?: string },
    readonly dim: number,
  ) {
    this.id = `http:${o.model}:${dim}`;
  }

  /** Checks the options, then embeds a probe text to learn the dimension. */
  static async connect(options: HttpEmbedderOptions): Promise<HttpEmbedder> {
    const o = { timeoutMs: 60_000, batchSize: 64, ...options };
    let url: URL;
    try {
      url = new URL(o.url);
    } catch {
      throw new DkiArgumentError(`HttpEmbedder: url must be an http(s) URL, got ${JSON.stringify(o.url)}`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") throw new DkiArgumentError(`HttpEmbedder: url must be http:// or https://, got ${JSON.stringify(o.url)}`);
    if (typeof o.model !== "string" || o.model.trim() === "") throw new DkiArgumentError("HttpEmbedder: model must name the server's embedding model");
    if (!Number.isSafeInteger(o.timeoutMs) || o.timeoutMs < 1) throw new DkiArgumentError(`HttpEmbedder: timeoutMs must be an integer >= 1, got ${o.timeoutMs}`);
    if (!Number.isSafeInteger(o.batchSize) || o.batchSize < 1) throw new DkiArgumentError(`HttpEmbedder: batchSize must be an integer >= 1, got ${o.batchSize}`);
    const base = { ...o, url: o.url.replace(/\/+$/, "") };
    const [probe] = await request(base, ["dimension probe"], null);
    return new HttpEmbedder(base, probe.length);
  }

  async embed(texts: string[]): Promise<Float32Array[]> {
    checkTexts(this.id, texts);
    const out: Float32Array[] = [];
    for (let i = 0; i < texts.length; i += this.o.batchSize) out.push(...(await request(this.o, texts.slice(i, i + this.o.batchSize), this.dim)));
    return out;
  }
}

/** One POST of `texts`; the vectors in input order, unit length, each `dim` long (any, first). */
async function request(o: { url: string; model: string; apiKey?: string; timeoutMs: number }, texts: string[], dim: number | null): Promise<Float32Array[]> {
  const where = `${o.url}/embeddings (model ${o.model})`;
  let res: Response;
  try {
    res = await fetch(`${o.url}/embeddings`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(o.apiKey ? { authorization: `Bearer ${o.apiKey}` } : {}) },
      body: JSON.stringify({ model: o.model, input: texts, encoding_format: "float" }),
      signal: AbortSignal.timeout(o.timeoutMs),
    });
  } catch (e) {
    // fetch says only "fetch failed"; the cause names it (ECONNREFUSED, a port fetch refuses, …).
    const err = e as Error & { cause?: { code?: string; message?: string } };
    const why = err.name === "TimeoutError" ? `no answer within ${o.timeoutMs} ms` : (err.cause?.code ?? err.cause?.message ?? err.message);
    throw new MemoryStoreError(`embedding server ${where}: ${why}`);
  }
  const text = await res.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  if (!res.ok) {
    const message = (body as { error?: { message?: unknown } } | undefined)?.error?.message;
    throw new MemoryStoreError(`embedding server ${where}: HTTP ${res.status}${typeof message === "string" ? `: ${message}` : text ? `: ${text.slice(0, 200)}` : ""}`);
  }
  const data = (body as { data?: unknown } | undefined)?.data;
  if (!Array.isArray(data) || data.length !== texts.length) {
    throw new MemoryStoreError(`embedding server ${where}: expected ${texts.length} embeddings in data[], got ${Array.isArray(data) ? data.length : body === undefined ? "a body that is not JSON" : "no data list"}`);
  }
  const out: Float32Array[] = new Array(texts.length);
  data.forEach((item: unknown, k) => {
    const { index, embedding } = (item ?? {}) as { index?: unknown; embedding?: unknown };
    // OpenAI gives each item its input's index; order by it when present.
    const i = index === undefined ? k : index;
    if (typeof i !== "number" || !Number.isInteger(i) || i < 0 || i >= texts.length || out[i] !== undefined) throw new MemoryStoreError(`embedding server ${where}: data[${k}].index ${JSON.stringify(index)} is not a distinct input index`);
    if (!Array.isArray(embedding) || embedding.length === 0 || !embedding.every((x) => typeof x === "number" && Number.isFinite(x))) {
      throw new MemoryStoreError(`embedding server ${where}: data[${k}].embedding is not a list of finite numbers`);
    }
    if (dim !== null && embedding.length !== dim) throw new MemoryStoreError(`embedding server ${where}: data[${k}].embedding has ${embedding.length} values; this embedder's dimension is ${dim}`);
    out[i] = unitVector(Float64Array.from(embedding as number[]));
  });
  return out;
}

export interface EmbedderCandidate {
  /** Names it in the report ("http://…#model", an ONNX folder, "hashing"). */
  name: string;
  open(): Promise<Embedder>;
}

/**
 * The first candidate that opens and embeds a probe text, with why each one before it was
 * skipped; an error listing every reason when none works.
 */
export async function firstWorkingEmbedder(candidates: EmbedderCandidate[]): Promise<{ embedder: Embedder; name: string; skipped: { name: string; reason: string }[] }> {
  if (candidates.length === 0) throw new DkiArgumentError("firstWorkingEmbedder: no candidates");
  const skipped: { name: string; reason: string }[] = [];
  for (const c of candidates) {
    try {
      const embedder = await c.open();
      const [v] = await embedder.embed(["dimension probe"]);
      if (!(v instanceof Float32Array) || v.length !== embedder.dim) throw new Error(`its probe vector has ${v?.length} values, not its dim ${embedder.dim}`);
      return { embedder, name: c.name, skipped };
    } catch (e) {
      skipped.push({ name: c.name, reason: (e as Error).message });
    }
  }
  throw new MemoryStoreError(`no embedder of the list works: ${skipped.map((s) => `${s.name}: ${s.reason}`).join("; ")}`);
}
