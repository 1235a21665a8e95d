// A byte-budgeted map of cache entries: the bookkeeping shared by every tier. Inserting makes
// room first by removing the lowest-priority entries (frequency × recency, see ../usage.ts) and
// hands them back to the caller, which demotes them to the next tier. Everything here is
// synchronous, so `bytes <= budget` holds at every point another task could observe.
import type { Usage } from "../usage.js";

export interface Entry<V> {
  key: string;
  /** userHash() of the owner, so clear(userId) can find the entry. */
  userHash: string;
  /** What the entry costs against the tier's budget. */
  bytes: number;
  /** Shared by all copies of one key across tiers, so a key hot in L1 is not cold in L3. */
  usage: Usage;
  value: V;
}

export class BudgetedMap<V> {
  private readonly entries = new Map<string, Entry<V>>();
  private used = 0;

  constructor(readonly budget: number) {}

  get bytes(): number {
    return this.used;
  }

  get size(): number {
    return this.entries.size;
  }

  get(key: string): Entry<V> | undefined {
    return this.entries.get(key);
  }

  has(key: string): boolean {
    return this.entries.has(key);
  }

  values(): IterableIterator<Entry<V>> {
    return this.entries.values();
  }

  fits(bytes: number): boolean {
    return bytes <= this.budget;
  }

  /**
   * Adds (or replaces) an entry, first evicting the lowest-priority others until it fits.
   * Returns the evicted entries. The caller checks fits() first: an entry larger than the whole
   * budget is refused with an error rather than emptying the tier for nothing.
   */
  insert(e: Entry<V>): Entry<V>[] {
    if (!this.fits(e.bytes)) throw new Error(`entry of ${e.bytes} bytes exceeds the tier budget of ${this.budget}`);
    this.remove(e.key);
    const evicted: Entry<V>[] = [];
    while (this.used + e.bytes > this.budget) {
      const v = this.lowest();
      if (!v) break; // unreachable: an empty map has room for anything that fits
      this.remove(v.key);
      evicted.push(v);
    }
    this.entries.set(e.key, e);
    this.used += e.bytes;
    return evicted;
  }

  remove(key: string): Entry<V> | undefined {
    const e = this.entries.get(key);
    if (!e) return undefined;
    this.entries.delete(key);
    this.used -= e.bytes;
    return e;
  }

  /** Removes every entry of one user; returns them. */
  removeUser(userHash: string): Entry<V>[] {
    const out = [...this.entries.values()].filter((e) => e.userHash === userHash);
    for (const e of out) this.remove(e.key);
    return out;
  }

  /** The entry to evict next: a linear scan, fine for the hundreds-to-thousands of blocks a tier holds. */
  lowest(filter?: (e: Entry<V>) => boolean): Entry<V> | undefined {
    let best: Entry<V> | undefined;
    let bestP = Infinity;
    for (const e of this.entries.values()) {
      if (filter && !filter(e)) continue;
      const p = e.usage.priority();
      if (p < bestP) {
        best = e;
        bestP = p;
      }
    }
    return best;
  }
}
