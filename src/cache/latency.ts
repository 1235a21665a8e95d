// Load-latency statistics of one tier: the mean over every load, the p95 over the most recent
// ones (a bounded window, so a long-running cache does not grow a sample list forever).
const WINDOW = 1024;

export class LatencyStats {
  private count = 0;
  private total = 0;
  private readonly recent: number[] = [];
  private next = 0;

  add(ms: number): void {
    this.count++;
    this.total += ms;
    if (this.recent.length < WINDOW) this.recent.push(ms);
    else this.recent[this.next] = ms;
    this.next = (this.next + 1) % WINDOW;
  }

  get mean(): number {
    return this.count ? this.total / this.count : 0;
  }

  /** Nearest-rank 95th percentile of the last WINDOW loads. */
  get p95(): number {
    if (this.recent.length === 0) return 0;
    const s = [...this.recent].sort((a, b) => a - b);
    return s[Math.min(s.length - 1, Math.ceil(0.95 * s.length) - 1)];
  }
}
