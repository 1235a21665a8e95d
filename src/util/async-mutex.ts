/** Runs async critical sections one at a time, in call order. */
export class AsyncMutex {
  private tail: Promise<void> = Promise.resolve();

  /**
   * Runs fn once every earlier section has finished. A signal that aborts while the call is still
   * waiting its turn rejects it at once with the signal's reason; the sections queued after it
   * keep their order.
   */
  async run<T>(fn: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    signal?.throwIfAborted();
    const prev = this.tail;
    let release!: () => void;
    this.tail = new Promise<void>((r) => (release = r));
    if (signal) {
      try {
        await untilAborted(prev, signal);
      } catch (e) {
        void prev.then(release);
        throw e;
      }
    } else {
      await prev;
    }
    try {
      return await fn();
    } finally {
      release();
    }
  }
}

/** Resolves with `p`, or rejects with the signal's reason if it aborts first. */
function untilAborted(p: Promise<void>, signal: AbortSignal): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    });
  });
}
