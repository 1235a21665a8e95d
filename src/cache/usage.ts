// The eviction score: frequency × recency, as one exponentially decayed access count (LRFU).
//
// Every access adds 1 to a count that halves every `halfLife` ticks of the cache's logical clock
// (one tick per get/put). At time `now` an entry's score is count · 2^(−(now − last)/halfLife):
// often-used entries outlive ones used once, and an entry nobody touches fades whatever its past.
// Comparing two scores at the same `now` is comparing log2(count) + last/halfLife, which does not
// change while the entry is idle, so `priority()` needs no clock and ordering is stable. The
// lowest priority is evicted first. A logical clock (not wall time) keeps eviction deterministic.

export class Usage {
  private count = 0;
  private last: number;

  constructor(
    private readonly halfLife: number,
    /** Tick of the last access; restored L3 entries get ticks before 0 in file-age order. */
    last = 0,
    count = 0,
  ) {
    this.last = last;
    this.count = count;
  }

  /** Records an access at tick `now`. */
  touch(now: number): void {
    this.count = this.count * 2 ** (-(now - this.last) / this.halfLife) + 1;
    this.last = now;
  }

  /** log2(score) + now/halfLife for any now: larger is more worth keeping. */
  priority(): number {
    return Math.log2(Math.max(this.count, 1e-300)) + this.last / this.halfLife;
  }

  get lastTick(): number {
    return this.last;
  }
}
