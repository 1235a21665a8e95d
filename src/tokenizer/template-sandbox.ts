// Chat templates come with model files, so they are untrusted input, and Jinja is enough to hang
// a process: @huggingface/jinja runs a loop step in ~4 µs, so two nested range(10000) loops take
// minutes, and doubling a list in a loop allocates gigabytes before V8 gives up. Templates are
// therefore rendered on a worker thread with a time and a heap limit. The render stays synchronous
// for its callers (encodePrompt is): the main thread posts the job and blocks on an Atomics.wait
// that the worker ends, or that times out, in which case the worker is terminated and replaced.
import { createRequire } from "node:module";
import { MessageChannel, receiveMessageOnPort, Worker, type MessagePort } from "node:worker_threads";

/** How long a render may take by default. Real templates render in well under a millisecond. */
export const CHAT_TEMPLATE_TIME_LIMIT_MS = 5000;
/** The worker's V8 heap limit: a template needing more is stopped. */
const HEAP_LIMIT_MB = 256;
/** Starting the worker (a thread and the Jinja module) on a slow, busy machine. */
const STARTUP_LIMIT_MS = 30_000;
/** Parsed templates the worker keeps (parsing costs far more than rendering). */
const MAX_COMPILED = 32;

// Runs as CommonJS in the worker. Every reply is a message on `reply` followed by the signal
// word going to 1, which wakes the main thread's Atomics.wait.
const WORKER_SOURCE = `
const { parentPort, workerData } = require("node:worker_threads");
const signal = new Int32Array(workerData.signal);
const reply = workerData.reply;
const answer = (message) => {
  reply.postMessage(message);
  Atomics.store(signal, 0, 1);
  Atomics.notify(signal, 0);
};
let Template;
try {
  ({ Template } = require(workerData.jinja));
} catch (e) {
  answer({ startError: String(e && e.message ? e.message : e) });
  throw e;
}
const compiled = new Map();
parentPort.on("message", ({ template, context }) => {
  let t = compiled.get(template);
  if (!t) {
    try {
      t = new Template(template);
    } catch (e) {
      return answer({ error: "parse", message: String(e && e.message ? e.message : e) });
    }
    if (compiled.size >= ${MAX_COMPILED}) compiled.delete(compiled.keys().next().value);
    compiled.set(template, t);
  }
  try {
    answer({ text: t.render(context) });
  } catch (e) {
    answer({ error: "render", message: String(e && e.message ? e.message : e) });
  }
});
answer({ ready: true });
`;

type Reply = { ready: true } | { startError: string } | { text: string } | { error: "parse" | "render"; message: string };

interface Sandbox {
  worker: Worker;
  reply: MessagePort;
  signal: Int32Array;
  ready: boolean;
}

let sandbox: Sandbox | null = null;
/** Why the worker could not start: later renders fail at once with it instead of trying again. */
let startFailure: string | null = null;

/**
 * Starts the worker if there is none, without waiting for it. Only a render does: a process that
 * never renders a template does not pay for a worker (~10 MB), the first render waits ~40 ms.
 */
function startSandbox(): void {
  if (sandbox) return;
  const signal = new Int32Array(new SharedArrayBuffer(4));
  const { port1, port2 } = new MessageChannel();
  const jinja = createRequire(import.meta.url).resolve("@huggingface/jinja");
  const worker = new Worker(WORKER_SOURCE, {
    eval: true,
    // The source is CommonJS whatever the process runs with (--input-type=module made it ESM).
    execArgv: [],
    workerData: { signal: signal.buffer, reply: port2, jinja },
    transferList: [port2],
    resourceLimits: { maxOldGenerationSizeMb: HEAP_LIMIT_MB },
  });
  // Neither keeps the process alive; an error (a heap limit hit) is seen as a missing reply.
  worker.unref();
  port1.unref();
  worker.on("error", () => {});
  sandbox = { worker, reply: port1, signal, ready: false };
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
 * Renders a Jinja template with `context` on the sandbox worker, blocking until it is done.
 * Throws TemplateError for a template that does not parse or raises while rendering, and an
 * Error when it runs past `timeLimitMs` or the heap limit (the worker is then replaced).
 */
export function renderTemplateSandboxed(template: string, context: Record<string, unknown>, timeLimitMs = CHAT_TEMPLATE_TIME_LIMIT_MS): string {
  if (startFailure !== null) throw new Error(startFailure);
  startSandbox();
  const s = sandbox!;
  if (!s.ready) {
    // A worker that never answers is not tried again: each try would block this thread as long.
    const r = nextReply(s, STARTUP_LIMIT_MS, () => (startFailure = `the chat template worker did not start within ${STARTUP_LIMIT_MS / 1000} s`));
    if ("startError" in r) {
      startFailure = `the chat template worker could not start: ${r.startError}`;
      stopSandbox(s);
      throw new Error(startFailure);
    }
    if (!("ready" in r)) throw new Error("the chat template worker answered before it was ready");
    s.ready = true;
  }
  s.worker.postMessage({ template, context });
  const r = nextReply(s, timeLimitMs, () => `the chat template was stopped after ${timeLimitMs} ms: it loops too long, or needs more than ${HEAP_LIMIT_MB} MB`);
  if ("error" in r) throw new TemplateError(r.error, r.message);
  if ("text" in r) return r.text;
  throw new Error("the chat template worker sent an unexpected reply");
}

/** The worker's next reply, or (past the limit) a replaced worker and an error with `why()`. */
function nextReply(s: Sandbox, limitMs: number, why: () => string): Reply {
  const waited = Atomics.wait(s.signal, 0, 0, limitMs);
  const message = receiveMessageOnPort(s.reply);
  if (waited === "timed-out" || !message) {
    stopSandbox(s);
    throw new Error(why());
  }
  Atomics.store(s.signal, 0, 0);
  return message.message as Reply;
}

function stopSandbox(s: Sandbox): void {
  void s.worker.terminate();
  s.reply.close();
  if (sandbox === s) sandbox = null;
}
