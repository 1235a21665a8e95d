// A bound on the turns a server holds at once (running, or waiting in the systems' fair queue for
// the model). Past it a request is answered 429 at once with a Retry-After, instead of piling up
// behind a queue whose wait nobody would sit through.
import { ApiError } from "./errors.js";

export class Admission {
  private held = 0;
  /** A moving average of turn times (ms), for Retry-After. */
  private meanTurnMs = 1000;

  constructor(readonly limit: number) {
    if (!Number.isSafeInteger(limit) || limit < 1) throw new Error(`the queue bound must be an integer >= 1, got ${limit}`);
  }

  /** Turns held now. */
  get depth(): number {
    return this.held;
  }

  /** Takes a place, or throws the 429 the client gets; the returned function gives the place back (once). */
  enter(): () => void {
    if (this.held >= this.limit) {
      // The time for the turns ahead to drain, one at a time on the model.
      const seconds = Math.max(1, Math.ceil((this.meanTurnMs * this.held) / 1000));
      throw new ApiError(429, "rate_limit_error", `the server holds ${this.held} turns, its bound (--max-queue ${this.limit}); retry after ${seconds} s`, null, "queue_full", { "retry-after": String(seconds) });
    }
    this.held++;
    const started = Date.now();
    let left = false;
    return () => {
      if (left) return;
      left = true;
      this.held--;
      this.meanTurnMs = 0.8 * this.meanTurnMs + 0.2 * (Date.now() - started);
    };
  }
}
