// Chat templates come with model files, so they are untrusted input, and Jinja is enough to hang
// a process: @huggingface/jinja runs a loop step in ~4 µs, so two nested range(10000) loops take
// minutes, and doubling a list in a loop allocates gigabytes. Templates are therefore rendered in
// a child process with a heap limit, which a relay worker thread stops at the time limit.
//
// A child process, not a worker thread with resourceLimits: a worker that reaches its heap limit
// with one large array (`range(20000000) | list`, or a list doubled from range(1000000)) aborts
// the whole process with "FATAL ERROR: Reached heap limit" instead of ending the worker
// (nodejs/node#47224, still open). A child that runs out of memory dies alone, and its exit
// reaches the relay at once.
//
// A render can be synchronous for its callers (encodePrompt is): the main thread posts the job
// to the relay and blocks on an Atomics.wait that the relay ends with the reply. The relay's own
// event loop is free (it only moves lines between the two), so it keeps the time limit, kills the
// child past it, and starts a fresh child for the next render. renderTemplateSandboxedAsync waits
// with Atomics.waitAsync instead, so the main thread works on while the render process renders
// (a DKI turn routes its memories meanwhile). One render is in flight at a time.
import { createRequire } from "node:module";
import { MessageChannel, receiveMessageOnPort, Worker, type MessagePort } from "node:worker_threads";

/** How long a render may take by default. Real templates render in well under a millisecond. */
export const CHAT_TEMPLATE_TIME_LIMIT_MS = 5000;
/** The render process's V8 heap limit: a template needing more is stopped. */
const HEAP_LIMIT_MB = 256;
/** Starting the render process (Node and the Jinja module, ~60 ms) on a slow, busy machine. */
const STARTUP_LIMIT_MS = 30_000;
/** A rendered prompt longer than this (as JSON) is refused rather than carried to this thread. */
const MAX_REPLY_CHARS = 64 * 1024 * 1024;
/** Parsed templates the render process keeps (parsing costs far more than rendering). */
const MAX_COMPILED = 32;

// The render process, run as `node -e` (CommonJS) with the Jinja module's path as its argument.
// It reads a job per line on stdin and answers each with a line on stdout, and ends with stdin.
const PROCESS_SOURCE = `
const send = (message) => process.stdout.write(JSON.stringify(message) + "\\n");
let Template;
try {
  ({ Template } = require(process.argv[1]));
} catch (e) {
  send({ startError: String(e && e.message ? e.message : e) });
  process.exit(1);
}
// Orphaned mid-render (its parent killed), nothing would read the reply and the render could run
// for hours: a thread of its own ends this process once the parent is gone.
const watchdog = "const parent = " + process.ppid + "; setInterval(() => { if (process.ppid !== parent) process.kill(process.pid, 'SIGKILL'); }, 500);";
new (require("node:worker_threads").Worker)(watchdog, { eval: true }).unref();
const compiled = new Map();
require("node:readline").createInterface({ input: process.stdin }).on("line", (line) => {
  const { template, context } = JSON.parse(line);
  let t = compiled.get(template);
  if (!t) {
    try {
      t = new Template(template);
    } catch (e) {
      return send({ error: "parse", message: String(e && e.message ? e.message : e) });
    }
    if (compiled.size >= ${MAX_COMPILED}) compiled.delete(compiled.keys().next().value);
    compiled.set(template, t);
  }
  try {
    send({ text: t.render(context) });
  } catch (e) {
    send({ error: "render", message: String(e && e.message ? e.message : e) });
  }
});
send({ ready: true });
`;

// The relay (CommonJS whatever the process runs with). Every reply is a message on `reply`
// followed by signal[0] going to 1, which wakes the main thread's Atomics.wait; signal[1] holds
// the render process's pid while one runs, for the main thread to kill should the relay hang.
const RELAY_SOURCE = `
const { parentPort, workerData } = require("node:worker_threads");
const { spawn } = require("node:child_process");
const { signal: signalBuffer, reply, jinja, processSource } = workerData;
const signal = new Int32Array(signalBuffer);
const answer = (message) => {
  reply.postMessage(message);
  Atomics.store(signal, 0, 1);
  Atomics.notify(signal, 0);
};

// Why a render process ended: the heap limit, or whatever else stderr's last line says.
function ended(code, sig, stderr) {
  if (/heap out of memory|Allocation failed/.test(stderr)) return "needs more than ${HEAP_LIMIT_MB} MB of memory";
  const last = stderr.trim().split("\\n").pop();
  return "ended its render process (" + (sig ? "signal " + sig : "exit code " + code) + ")" + (last ? ": " + last : "");
}

// A render process, with what it says as a queue of messages that next() takes from.
function start() {
  const env = { ...process.env };
  delete env.NODE_OPTIONS;  // e.g. --input-type=module would make the -e source a module
  const proc = spawn(process.execPath, ["--max-old-space-size=${HEAP_LIMIT_MB}", "-e", processSource, jinja], { env, stdio: "pipe" });
  const c = { proc, queue: [], waiting: null, parts: [], length: 0, err: "" };
  const say = (m) => (c.waiting ? c.waiting(m) : c.queue.push(m));
  // A reply is one line; a long one comes in many chunks, joined once its newline arrives.
  const tooLong = () => {
    proc.kill("SIGKILL");
    say({ end: "rendered more than ${MAX_REPLY_CHARS / (1024 * 1024)} MB" });
  };
  proc.stdout.setEncoding("utf8").on("data", (d) => {
    let from = 0;
    for (let i; (i = d.indexOf("\\n", from)) >= 0; from = i + 1) {
      if (c.length + i - from > ${MAX_REPLY_CHARS}) return tooLong();
      const line = c.parts.join("") + d.slice(from, i);
      c.parts = [];
      c.length = 0;
      try {
        say(JSON.parse(line));
      } catch {
        say({ end: "sent a reply that is not JSON" });
      }
    }
    if (from < d.length) c.parts.push(d.slice(from)), (c.length += d.length - from);
    if (c.length > ${MAX_REPLY_CHARS}) tooLong();
  });
  proc.stderr.setEncoding("utf8").on("data", (d) => (c.err = (c.err + d).slice(-4096)));
  proc.stdin.on("error", () => {});  // EPIPE after the process died: its exit says why
  proc.on("error", (e) => say({ end: "could not start a render process: " + e.message }));
  proc.on("close", (code, sig) => say({ end: ended(code, sig, c.err) }));
  Atomics.store(signal, 1, proc.pid || 0);
  return c;
}

// The render process's next message, or { timeout: true } after ms.
function next(c, ms) {
  if (c.queue.length) return Promise.resolve(c.queue.shift());
  return new Promise((resolve) => {
    const timer = setTimeout(() => ((c.waiting = null), resolve({ timeout: true })), ms);
    c.waiting = (m) => {
      clearTimeout(timer);
      c.waiting = null;
      resolve(m);
    };
  });
}

function stop(c) {
  c.proc.kill("SIGKILL");
  Atomics.store(signal, 1, 0);
}

let child = null;
parentPort.on("message", async ({ template, context, timeLimitMs }) => {
  if (!child) {
    child = start();
    const r = await next(child, ${STARTUP_LIMIT_MS});
    if (!r.ready) {
      stop(child);
      child = null;
      const why = r.timeout ? "did not start within ${STARTUP_LIMIT_MS / 1000} s" : r.startError ?? r.end;
      return answer({ startError: why });
    }
  }
  child.proc.stdin.write(JSON.stringify({ template, context }) + "\\n");
  const r = await next(child, timeLimitMs);
  if (r.timeout || r.end !== undefined) {
    stop(child);
    child = null;  // the next render starts a fresh process
    return answer({ stopped: r.timeout ? "was stopped after " + timeLimitMs + " ms: it loops too long" : r.end });
  }
  answer(r);
});
`;

type Reply = { startError: string } | { text: string } | { error: "parse" | "render"; message: string } | { stopped: string };

interface Sandbox {
  worker: Worker;
  reply: MessagePort;
  /** [0]: the reply flag; [1]: the render process's pid, 0 when none runs. */
  signal: Int32Array;
}

let sandbox: Sandbox | null = null;
/** Why rendering could not start: later renders fail at once with it instead of trying again. */
let startFailure: string | null = null;

/**
 * Starts the relay if there is none, without waiting for it. Only a render does: a process that
 * never renders a template pays for neither the thread nor the render process (~40 MB).
 */
function startSandbox(): Sandbox {
  if (sandbox) return sandbox;
  const signal = new Int32Array(new SharedArrayBuffer(8));
  const { port1, port2 } = new MessageChannel();
  const jinja = createRequire(import.meta.url).resolve("@huggingface/jinja");
  const worker = new Worker(RELAY_SOURCE, {
    eval: true,
    // The source is CommonJS whatever the process runs with (--input-type=module made it ESM).
    execArgv: [],
    workerData: { signal: signal.buffer, reply: port2, jinja, processSource: PROCESS_SOURCE },
    transferList: [port2],
  });
  // Neither keeps the process alive. The relay runs no untrusted code; should it fail, the
  // main thread sees a missing reply.
  worker.unref();
  port1.unref();
  worker.on("error", () => {});
  sandbox = { worker, reply: port1, signal };
  return sandbox;
}

/** Thrown when a template parses but cannot be rendered, or fails to parse. */
export class TemplateError extends Error {
  constructor(
    readonly stage: "parse" | "render",
    message: string,
  ) {
    super(message);
    this.name = "TemplateError";
  }
}

/**
 * Renders a Jinja template with `context` (JSON data) in the render process, blocking until it is
 * done. Throws TemplateError for a template that does not parse or raises while rendering, and an
 * Error when it runs past `timeLimitMs` or the heap limit (the next render gets a fresh process).
 */
export function renderTemplateSandboxed(template: string, context: Record<string, unknown>, timeLimitMs = CHAT_TEMPLATE_TIME_LIMIT_MS): string {
  if (startFailure !== null) throw new Error(startFailure);
  // An asynchronous render's reply comes first: taken here, and handed to its waiter.
  if (inFlight !== null) settle(inFlight, takeReply);
  const s = startSandbox();
  s.worker.postMessage({ template, context, timeLimitMs });
  return outcome(takeReply(s, replyLimit(timeLimitMs)));
}

/**
 * renderTemplateSandboxed without blocking the thread while the render process works: the same
 * limits and errors. Renders are taken one at a time, in call order.
 */
export async function renderTemplateSandboxedAsync(template: string, context: Record<string, unknown>, timeLimitMs = CHAT_TEMPLATE_TIME_LIMIT_MS): Promise<string> {
  const turn = asyncTail.then(() => renderOneAsync(template, context, timeLimitMs));
  asyncTail = turn.then(
    () => undefined,
    () => undefined,
  );
  return turn;
}

/** A posted asynchronous render: whoever takes the reply (its own wait, or a synchronous render) settles it. */
interface AsyncRender {
  sandbox: Sandbox;
  limitMs: number;
  resolve: (r: Reply) => void;
  reject: (e: unknown) => void;
}

let inFlight: AsyncRender | null = null;
let asyncTail: Promise<void> = Promise.resolve();

async function renderOneAsync(template: string, context: Record<string, unknown>, timeLimitMs: number): Promise<string> {
  if (startFailure !== null) throw new Error(startFailure);
  const s = startSandbox();
  const reply = new Promise<Reply>((resolve, reject) => {
    inFlight = { sandbox: s, limitMs: replyLimit(timeLimitMs), resolve, reject };
  });
  const mine = inFlight!;
  s.worker.postMessage({ template, context, timeLimitMs });
  const wait = waitAsync(s.signal, 0, 0, mine.limitMs);
  // A pending waitAsync does not keep the process alive (the relay and its port are unref'd so
  // that an idle sandbox never does): this timer does, while the render is in flight.
  const alive = setTimeout(() => {}, mine.limitMs);
  try {
    if (wait.async) await wait.value;
  } finally {
    clearTimeout(alive);
  }
  // A synchronous render may have taken the reply already; otherwise it is waiting on the port
  // (or the relay failed, which takeReply turns into an error).
  if (inFlight === mine) settle(mine, (sb) => takeReply(sb, 0));
  return outcome(await reply);
}

// Atomics.waitAsync (Node ≥ 16) is typed from TypeScript's ES2024 lib only; this project targets ES2022.
const waitAsync = (Atomics as unknown as { waitAsync(a: Int32Array, i: number, v: number, ms: number): { async: boolean; value: Promise<string> | string } }).waitAsync;

function settle(r: AsyncRender, take: (s: Sandbox, limitMs: number) => Reply): void {
  inFlight = null;
  try {
    r.resolve(take(r.sandbox, r.limitMs));
  } catch (e) {
    r.reject(e);
  }
}

/** The relay keeps the limits; the wait for its reply only guards against the relay itself failing. */
function replyLimit(timeLimitMs: number): number {
  return STARTUP_LIMIT_MS + timeLimitMs + 5000;
}

function outcome(r: Reply): string {
  if ("startError" in r) {
    startFailure = `the chat template process could not start: ${r.startError}`;
    throw new Error(startFailure);
  }
  if ("stopped" in r) throw new Error(`the chat template ${r.stopped}`);
  if ("error" in r) throw new TemplateError(r.error, r.message);
  return r.text;
}

/**
 * The relay's reply (waiting for it up to limitMs), or, when none comes, a stopped relay and
 * render process and an error.
 */
function takeReply(s: Sandbox, limitMs: number): Reply {
  const waited = Atomics.wait(s.signal, 0, 0, limitMs);
  const message = receiveMessageOnPort(s.reply);
  if (waited === "timed-out" || !message) {
    const pid = Atomics.load(s.signal, 1);
    if (pid > 0) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
    void s.worker.terminate();
    s.reply.close();
    if (sandbox === s) sandbox = null;
    throw new Error(`the chat template relay did not answer within ${limitMs} ms`);
  }
  Atomics.store(s.signal, 0, 0);
  return message.message as Reply;
}
