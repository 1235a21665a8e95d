// The `dki serve` tests' setup: a tiny model generated here, a store, and a real server on a
// loopback port: in this process (createServer + ServerSystems, listening on port 0) or as a child
// process running `node bin/dki.js serve`, as a user runs it.
import { spawn, type ChildProcess } from "node:child_process";
import { join } from "node:path";
import { createServer, type DkiServer, type ServerOptions } from "../../src/server/app.js";
import { ServerSystems } from "../../src/server/systems.js";
import { MemoryStore } from "../../src/memory/index.js";
import { dki, dkiBin } from "./dki-bin.js";
import { tempDir } from "./paths.js";

/** A tiny random-weight llama (SmolLM2's tokenizer) in a fresh folder; its id on the server is "tiny". */
export async function makeTinyModel(): Promise<string> {
  const model = join(tempDir(), "tiny");
  await dki(["models", "make-tiny", "--arch", "llama", "--preset", "tiny", "--dtype", "f32", "--out", model]);
  return model;
}

/** A new store (its folder returned) holding one memory of alice's, about hiking in the Alps. */
export async function storeWithAlice(): Promise<string> {
  const data = join(tempDir(), "data");
  const store = await MemoryStore.open({ dir: data });
  await store.memories.add("Alice loves hiking in the Alps.", { userId: "alice" });
  await store.close();
  return data;
}

export interface Running {
  server: DkiServer;
  url: string;
  systems: ServerSystems;
}

/** A server in this process over `model` and the store in `data`, on a free loopback port, ready. */
export async function startServer(model: string, data: string, o: ServerOptions = {}): Promise<Running> {
  const server = createServer(o);
  const url = await server.app.listen({ host: "127.0.0.1", port: 0 });
  const systems = await ServerSystems.open({ model, loadOptions: { threads: 1, contextSize: 4096 }, dataDir: data });
  server.ready(systems);
  return { server, url, systems };
}

/** fetch with a JSON body (or none), and the key when given. */
export async function call(url: string, method: string, path: string, o: { body?: unknown; key?: string; raw?: string | Buffer; headers?: Record<string, string> } = {}): Promise<{ status: number; json: unknown; text: string; headers: Headers }> {
  const headers: Record<string, string> = { ...(o.headers ?? {}) };
  if (o.key !== undefined) headers.authorization = `Bearer ${o.key}`;
  let payload: string | Blob | undefined;
  if (o.raw !== undefined) payload = typeof o.raw === "string" ? o.raw : new Blob([Uint8Array.from(o.raw)]);
  else if (o.body !== undefined) payload = JSON.stringify(o.body);
  if (payload !== undefined && headers["content-type"] === undefined) headers["content-type"] = "application/json";
  const r = await fetch(url + path, { method, headers, body: payload });
  const text = await r.text();
  let json: unknown = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = null;
  }
  return { status: r.status, json, text, headers: r.headers };
}

export interface ChildServer {
  child: ChildProcess;
  url: string;
  stderr: () => string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/** `dki serve ...args --port 0` in a child process; resolves once it says it is ready. */
export async function spawnServer(args: string[]): Promise<ChildServer> {
  const child = spawn(process.execPath, [dkiBin, "serve", "--port", "0", "--no-log", ...args], { stdio: ["ignore", "pipe", "pipe"] });
  let err = "";
  child.stdout!.resume();
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  const url = await new Promise<string>((resolve, reject) => {
    let address: string | null = null;
    child.stderr!.on("data", (d: Buffer) => {
      err += d.toString();
      address ??= /listening on (http:\/\/\S+)/.exec(err)?.[1] ?? null;
      if (address !== null && err.includes("dki: ready")) resolve(address);
    });
    void exited.then((e) => reject(new Error(`dki serve exited (${e.code ?? e.signal}) before it was ready:\n${err}`)));
  });
  return { child, url, stderr: () => err, exited };
}

/**
 * Reads an SSE response's `data:` payloads as they come; `onData` sees each one (and may stop
 * reading by returning true). Resolves with every payload read.
 */
export async function readSse(response: Response, onData?: (data: string) => boolean | void): Promise<string[]> {
  const reader = response.body!.getReader();
  const decoder = new TextDecoder();
  const out: string[] = [];
  let buf = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return out;
    buf += decoder.decode(value, { stream: true });
    for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
      const event = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!event.startsWith("data: ")) throw new Error(`not an SSE data event: ${JSON.stringify(event)}`);
      const data = event.slice("data: ".length);
      out.push(data);
      if (onData?.(data) === true) {
        await reader.cancel();
        return out;
      }
    }
  }
}
