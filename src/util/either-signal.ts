/**
 * A signal that aborts, with the same reason, as soon as any of `signals` does, and release() to
 * detach it from them once it is no longer needed. AbortSignal.any does the first part, but on
 * Node 20 each source keeps a record of every signal ever made from it: a long-lived source (a
 * model's own) grew by one entry per call, without bound.
 */
export function eitherSignal(signals: AbortSignal[]): { signal: AbortSignal; release: () => void } {
  const ctl = new AbortController();
  const links: { source: AbortSignal; onAbort: () => void }[] = [];
  const release = () => {
    for (const { source, onAbort } of links) source.removeEventListener("abort", onAbort);
    links.length = 0;
  };
  for (const source of signals) {
    if (source.aborted) {
      ctl.abort(source.reason);
      release();
      break;
    }
    const onAbort = () => {
      ctl.abort(source.reason);
      release();
    };
    source.addEventListener("abort", onAbort, { once: true });
    links.push({ source, onAbort });
  }
  return { signal: ctl.signal, release };
}

/**
 * A signal that aborts when `signal` does, or after `ms` with an Error of `message`; `timeout`
 * is the timer's own signal (aborted: the time ran out), and release() clears the timer and
 * detaches from `signal`.
 */
export function withTimeout(signal: AbortSignal | undefined, ms: number, message: string): { signal: AbortSignal; timeout: AbortSignal; release: () => void } {
  const timeout = new AbortController();
  const timer = setTimeout(() => timeout.abort(new Error(message)), ms);
  const either = eitherSignal(signal ? [signal, timeout.signal] : [timeout.signal]);
  return {
    signal: either.signal,
    timeout: timeout.signal,
    release: () => {
      clearTimeout(timer);
      either.release();
    },
  };
}
