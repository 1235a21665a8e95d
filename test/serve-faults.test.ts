// `dki serve` as a child process (node bin/dki.js serve), killed and stopped: SIGKILL in the middle
// of an answer loses no answered turn and leaves no half turn in the store; SIGTERM stops taking
// requests, lets the turn in flight finish and be recorded, then exits 0; with no drain time left
// it aborts that turn instead (an SSE error event, nothing recorded).
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { MemoryStore } from "../src/memory/index.js";
import type { ConversationTurn } from "../src/memory/types.js";
import { tempDir } from "./support/paths.js";
import { makeTinyModel, readSse, spawnServer, type ChildServer, storeWithAlice } from "./support/serve.js";

let model: string;
const LONG = 3500;

beforeAll(async () => {
  model = await makeTinyModel();
});

async function newStore(): Promise<string> {
  const data = await storeWithAlice();
  return data;
}

async function sessionRows(data: string, sessionId: string): Promise<ConversationTurn[]> {
  const store = await MemoryStore.open({ dir: data });
  try {
    return await store.conversations.list({ userId: "alice", sessionId });
  } finally {
    await store.close();
  }
}

function chatBody(session: string, content: string, maxTokens: number, stream: boolean) {
  return JSON.stringify({ model: "tiny", user: "alice", max_tokens: maxTokens, stream, messages: [{ role: "user", content }], dki: { session } });
}

const post = (s: ChildServer, body: string, signal?: AbortSignal) => fetch(`${s.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body, signal });

/** Every user row is followed by its assistant row, and the user rows are exactly `queries`, in order. */
function expectWholeTurns(rows: ConversationTurn[], queries: string[]): void {
  expect(rows.length % 2).toBe(0);
  for (let i = 0; i < rows.length; i += 2) {
    expect(rows[i].role).toBe("user");
    expect(rows[i + 1].role).toBe("assistant");
  }
  expect(rows.filter((r) => r.role === "user").map((r) => r.content)).toEqual(queries);
}

describe("dki serve: a killed or stopped server", () => {
  test("SIGKILL mid-stream (three times, at different moments): every answered turn is in the store, whole; the killed turns left nothing", async () => {
    const data = await newStore();
    const answered: string[] = [];
    for (const [i, killAfterChunks] of [1, 40, 400].entries()) {
      const s = await spawnServer(["--model", model, "--data", data, "--threads", "1"]);
      for (let j = 0; j < 2; j++) {
        const q = `answered turn ${i}.${j}`;
        const r = await post(s, chatBody("kill", q, 3, false));
        expect(r.status).toBe(200);
        await r.json();
        answered.push(q);
      }
      const stream = await post(s, chatBody("kill", `killed turn ${i}`, LONG, true));
      expect(stream.status).toBe(200);
      let chunks = 0;
      let done = false;
      await readSse(stream, (d) => {
        if (d === "[DONE]") done = true;
        if (++chunks === killAfterChunks) {
          s.child.kill("SIGKILL");
          return true;
        }
      }).catch(() => []);
      expect(done, "the answer ended before the kill").toBe(false);
      expect((await s.exited).signal).toBe("SIGKILL");
      expectWholeTurns(await sessionRows(data, "kill"), answered);
    }
    // The store opens and serves again after the kills, with the conversation intact.
    const s = await spawnServer(["--model", model, "--data", data, "--threads", "1"]);
    const r = await fetch(`${s.url}/v1/sessions/kill/messages?user_id=alice`);
    const msgs = (await r.json()) as { results: { role: string; content: string }[] };
    expect(msgs.results.filter((m) => m.role === "user").map((m) => m.content)).toEqual(answered);
    s.child.kill("SIGTERM");
    expect((await s.exited).code).toBe(0);
  });

  test("SIGTERM drains: new requests are refused, the turn in flight streams to [DONE] and is recorded, exit 0", async () => {
    const data = await newStore();
    const s = await spawnServer(["--model", model, "--data", data, "--threads", "1"]);
    const stream = await post(s, chatBody("drain", "finish me", 1500, true));
    let terminated = false;
    let refused: Promise<unknown> | null = null;
    const events = await readSse(stream, () => {
      if (!terminated) {
        terminated = true;
        s.child.kill("SIGTERM");
        // Once the signal is handled, the listener is closed: a new request cannot be served.
        refused = new Promise((r) => setTimeout(r, 300)).then(() =>
          post(s, chatBody("drain", "too late", 2, false)).then(
            (r) => r.status,
            (e: Error) => e.name,
          ),
        );
      }
    });
    expect(events[events.length - 1]).toBe("[DONE]");
    const last = JSON.parse(events[events.length - 2]) as { choices: { finish_reason: string }[]; usage: { completion_tokens: number } };
    expect(last.choices[0].finish_reason).toBe("length");
    expect(last.usage.completion_tokens).toBe(1500);
    expect(await refused).not.toBe(200);
    expect((await s.exited).code).toBe(0);
    expect(s.stderr()).toMatch(/SIGTERM: draining/);
    expectWholeTurns(await sessionRows(data, "drain"), ["finish me"]);
  });

  test("SIGTERM with --drain-timeout 0: the turn in flight is aborted (an SSE error, no [DONE]) and nothing of it recorded; exit 0", async () => {
    const data = await newStore();
    const s = await spawnServer(["--model", model, "--data", data, "--threads", "1", "--drain-timeout", "0"]);
    const stream = await post(s, chatBody("cut", "cut me off", LONG, true));
    let sent = false;
    const events = await readSse(stream, () => {
      if (!sent) s.child.kill("SIGTERM");
      sent = true;
    });
    expect(events).not.toContain("[DONE]");
    expect(JSON.parse(events[events.length - 1])).toMatchObject({ error: { type: "service_unavailable", code: "shutting_down" } });
    expect((await s.exited).code).toBe(0);
    expect(await sessionRows(data, "cut")).toEqual([]);
  });
});
