// A description of the machine a benchmark ran on, written next to every result.
import { cpus, totalmem, hostname } from "node:os";
import { readFileSync } from "node:fs";

export function machine(native) {
  let flags = [];
  try {
    const info = readFileSync("/proc/cpuinfo", "utf8");
    const line = info.split("\n").find((l) => l.startsWith("flags"));
    const all = new Set((line ?? "").split(":")[1]?.trim().split(/\s+/) ?? []);
    flags = ["avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8"].filter((f) => all.has(f));
  } catch {
    // not Linux: leave flags empty
  }
  return {
    host: hostname(),
    cpu: cpus()[0]?.model ?? "unknown",
    cores: cpus().length,
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    cpuFlags: flags,
    simd: native?.simd().active,
    prefetchBytes: native?.simd().prefetchBytes,
    decodeStreams: native?.simd().decodeStreams,
    threads: native?.getThreads(),
    node: process.version,
    date: new Date().toISOString(),
  };
}
