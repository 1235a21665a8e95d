/**
 * Runs async sections at most `capacity` at a time, in call order (capacity 1: a mutex). A slot
 * freed by one section passes straight to the longest-waiting call.
 */
export class Semaphore {
  private active = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(readonly capacity: number) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`semaphore capacity must be a positive integer, got ${capacity}`);
  }

  /**
   * Runs fn once a slot is free. A signal that aborts while the call is still waiting rejects it
   * at once with the signal's reason; the calls queued after it keep their order.
   */
  async run<T>(fn: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    signal?.throwIfAborted();
    if (this.active < this.capacity && this.waiting.length === 0) this.active++;
    else await this.turn(signal);
    try {
      return await fn();
    } finally {
      const next = this.waiting.shift();
      if (next) next();
      else this.active--;
    }
  }

  /** Waits until a slot is handed over (the caller then holds it). */
  private turn(signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const onAbort = () => {
        this.waiting.splice(this.waiting.indexOf(go), 1);
        reject(signal!.reason);
      };
      const go = () => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      };
      this.waiting.push(go);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }
}
