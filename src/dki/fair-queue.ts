// Turns of many users on one model: one runs at a time, and the next is taken round-robin over
// the users waiting, so a user with ten queued turns delays another user's single turn by at most
// one of them (a FIFO would make it wait for all ten). An abort removes only its own waiting turn.

interface Waiter {
  start: () => void;
  cancel: (reason: unknown) => void;
}

export class FairQueue {
  /** Waiting turns per key; the Map's order is the round-robin order. */
  private readonly waiting = new Map<string, Waiter[]>();
  private running = false;

  /** Turns waiting (not counting the one running). */
  get size(): number {
    let n = 0;
    for (const q of this.waiting.values()) n += q.length;
    return n;
  }

  /** Runs fn when it is this key's turn. A signal that fires while waiting rejects with its reason. */
  async run<T>(key: string, fn: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    signal?.throwIfAborted();
    if (this.running) await this.wait(key, signal);
    else this.running = true;
    try {
      return await fn();
    } finally {
      this.next();
    }
  }

  private wait(key: string, signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const onAbort = () => {
        const q = this.waiting.get(key);
        const i = q ? q.indexOf(w) : -1;
        if (i >= 0) {
          q!.splice(i, 1);
          if (q!.length === 0) this.waiting.delete(key);
        }
        reject(signal!.reason);
      };
      const w: Waiter = {
        start: () => {
          signal?.removeEventListener("abort", onAbort);
          resolve();
        },
        cancel: reject,
      };
      const q = this.waiting.get(key);
      if (q) q.push(w);
      else this.waiting.set(key, [w]);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  /** Hands the model to the first waiting key's oldest turn; that key goes to the back of the round. */
  private next(): void {
    const first = this.waiting.entries().next();
    if (first.done) {
      this.running = false;
      return;
    }
    const [key, q] = first.value;
    const w = q.shift()!;
    this.waiting.delete(key);
    if (q.length > 0) this.waiting.set(key, q);
    w.start();
  }
}
