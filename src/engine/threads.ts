// The engine's thread count, and where its default came from: what the process may really run
// on (its affinity mask and its cgroup's CPU quota), not the machine's core count.
import { native } from "./native.js";

export interface ThreadsInfo {
  /** Threads the engine runs loops on (process-wide: LoadOptions.threads / setThreads set it). */
  count: number;
  /** The count 0 or no setting gives: min(affinity, cgroup quota rounded up), at least 1. */
  default: number;
  /** CPUs in the process's affinity mask (sched_getaffinity; taskset, cpusets). */
  affinity: number;
  /** CPUs the cgroup's quota allows (cpu.max, or v1's cfs quota ÷ period); null when none. */
  cgroupQuota: number | null;
  /** The file that quota was read from; null when none. */
  cgroupFile: string | null;
}

/** The engine's thread count now and its default's sources. */
export function threadsInfo(): ThreadsInfo {
  const addon = native();
  const b = addon.threadBudget();
  return { count: addon.getThreads(), default: b.threads, affinity: b.affinity, cgroupQuota: b.cgroupQuota, cgroupFile: b.cgroupFile };
}

/**
 * One line for people: "2 (affinity 2, cgroup quota none)", or when a count was asked for,
 * "1 (set; default 2: affinity 2, cgroup quota 1.5 CPUs)".
 */
export function formatThreads(t: ThreadsInfo): string {
  const quota = t.cgroupQuota === null ? "none" : `${Number(t.cgroupQuota.toFixed(2))} CPU${t.cgroupQuota === 1 ? "" : "s"}`;
  const sources = `affinity ${t.affinity}, cgroup quota ${quota}`;
  return t.count === t.default ? `${t.count} (${sources})` : `${t.count} (set; default ${t.default}: ${sources})`;
}
