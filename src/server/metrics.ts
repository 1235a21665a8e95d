// The server's Prometheus metrics (GET /metrics), on a registry of its own so that several servers
// in one process (tests) never share counters.
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from "prom-client";

/** Seconds: from 5 ms (an L1-warm tiny-model turn) to two minutes (a cold 1B turn on 2 cores). */
const TURN_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

export class ServerMetrics {
  readonly registry = new Registry();
  readonly requests = new Counter({ name: "dki_http_requests_total", help: "HTTP requests answered, by route, method and status", labelNames: ["route", "method", "status"] as const, registers: [this.registry] });
  readonly errors = new Counter({ name: "dki_http_errors_total", help: "HTTP requests answered with a 4xx or 5xx status, by route and status", labelNames: ["route", "status"] as const, registers: [this.registry] });
  readonly ttft = new Histogram({ name: "dki_turn_ttft_seconds", help: "Time to first token of a turn, from the request", labelNames: ["mode"] as const, buckets: TURN_BUCKETS, registers: [this.registry] });
  readonly latency = new Histogram({ name: "dki_turn_latency_seconds", help: "Whole turn time, from the request to the recorded answer", labelNames: ["mode"] as const, buckets: TURN_BUCKETS, registers: [this.registry] });
  readonly tokens = new Counter({ name: "dki_tokens_total", help: "Tokens: prompt (prefilled), completion (generated), memory_kv (injected as K/V, not in the prompt)", labelNames: ["kind"] as const, registers: [this.registry] });
  readonly turns = new Counter({ name: "dki_turns_total", help: "Turns by mode and outcome (answered, failed, aborted, rejected)", labelNames: ["mode", "outcome"] as const, registers: [this.registry] });
  readonly kvBlocks = new Counter({ name: "dki_kv_blocks_total", help: "K/V blocks injected, by the cache tier they came from (L4: computed for the turn)", labelNames: ["tier"] as const, registers: [this.registry] });
  readonly queueDepth: Gauge;

  constructor(queueDepth: () => number) {
    collectDefaultMetrics({ register: this.registry, prefix: "dki_process_" });
    this.queueDepth = new Gauge({
      name: "dki_queue_depth",
      help: "Turns admitted and not finished (running or waiting for the model)",
      registers: [this.registry],
      collect() {
        this.set(queueDepth());
      },
    });
  }
}
