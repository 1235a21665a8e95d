// `dki kb create`, `dki kb delete` and `dki kb search --user` as a user runs them (node bin/dki.js).
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { makeTinyModel } from "../src/models/make-tiny.js";
import { MemoryStore } from "../src/memory/memory-store.js";
import { dki, dkiFails } from "./support/dki-bin.js";
import { tempDir } from "./support/paths.js";

let files: string;
let data: string;
beforeAll(() => {
  files = tempDir();
  data = tempDir();
  writeFileSync(join(files, "s1.md"), "# Game s1\nThe knight took the bishop.\n");
  writeFileSync(join(files, "s2.md"), "# Game s2\nThe queen took the knight.\n");
  writeFileSync(join(files, "secret.txt"), "Alice's safe combination is 7-19-42.\n");
});

describe("dki kb create / delete / search --user", () => {
  test("create is get-or-create; other settings are refused, naming them", async () => {
    expect((await dki(["kb", "create", "games", "--data", data, "--chunk-tokens", "128", "--overlap", "16"])).stdout).toBe("created games\tchunks of 128 tokens, overlap 16, sentence\n");
    expect((await dki(["kb", "create", "games", "--data", data, "--chunk-tokens", "128", "--overlap", "16"])).stdout).toBe("exists games\tchunks of 128 tokens, overlap 16, sentence\n");
    expect(await dkiFails(["kb", "create", "games", "--data", data])).toBe('dki: collection "games" exists with other settings: chunk.chunkTokens is 128, not 512; chunk.overlapTokens is 16, not 64; chunk.minTailTokens is 32, not 128\n');
    expect(await dkiFails(["kb", "create", "x", "--data", data, "--owner-user", "a", "--owner-prefix", "b"])).toMatch(/--owner-user or --owner-prefix, not both/);
    expect(await dkiFails(["kb", "ingest", join(files, "s1.md"), "-c", "games", "--data", data, "--chunk-strategy", "words"])).toMatch(/--chunk-strategy must be one of sentence, tokens, got "words"/);
    const json = JSON.parse((await dki(["kb", "create", "private", "--data", data, "--owner-user", "alice", "--format", "json"])).stdout) as { created: boolean; collection: { owner: { user_id: string } } };
    expect(json).toMatchObject({ created: true, collection: { owner: { user_id: "alice" } } });
    expect((await dki(["kb", "list", "--data", data])).stdout).toBe("games\t0 documents\t0 chunks\nprivate\t0 documents\t0 chunks\towner alice\n");
  });

  test("delete by filter removes the matching documents; search --user never finds another tenant's collection", async () => {
    await dki(["kb", "ingest", join(files, "s1.md"), "-c", "games", "--data", data, "--metadata", '{"sessionId":"s1"}']);
    await dki(["kb", "ingest", join(files, "s2.md"), "-c", "games", "--data", data, "--metadata", '{"sessionId":"s2"}']);
    const del = await dki(["kb", "delete", "-c", "games", "--filter", '{"eq":{"sessionId":"s1"}}', "--data", data]);
    expect(del.stdout).toBe(`deleted 1 documents (1 chunks)\n  ${join(files, "s1.md")}\n`);
    expect((await dki(["kb", "list", "-c", "games", "--data", data])).stdout).toMatch(/^\S*s2\.md\tmarkdown\t1 chunks\tGame s2\n$|^\S*s2\.md\tmarkdown\t1 chunks\n$/);
    expect(await dkiFails(["kb", "delete", "-c", "games", "--filter", '{"eq":{"colour":"red"}}', "--data", data])).toMatch(/^dki: filter: unknown field "colour"/);
    expect(await dkiFails(["kb", "delete", "-c", "games", "--data", data])).toMatch(/--filter/);

    await dki(["kb", "ingest", join(files, "secret.txt"), "-c", "private", "--data", data]);
    expect((await dki(["kb", "search", "safe combination", "-c", "private", "--data", data, "--user", "alice"])).stdout).toMatch(/7-19-42/);
    expect(await dkiFails(["kb", "search", "safe combination", "-c", "private", "--data", data, "--user", "bob"])).toBe('dki: no collection "private"; collections: games\n');
    // dki rag searches as --user: the owner's turn sees the chunk, another user's is refused.
    const model = tempDir();
    await makeTinyModel({ arch: "llama", preset: "tiny", dtype: "f32", out: model, seed: 3 });
    await (await MemoryStore.open({ dir: data })).close();
    const own = JSON.parse((await dki(["rag", "--model", model, "--data", data, "--user", "alice", "--query", "What is the safe combination?", "--collection", "private", "--max-tokens", "1", "--format", "json"])).stdout) as { sources: { kind: string; collection: string }[] };
    expect(own.sources).toContainEqual(expect.objectContaining({ kind: "chunk", collection: "private" }));
    expect(await dkiFails(["rag", "--model", model, "--data", data, "--user", "bob", "--query", "What is the safe combination?", "--collection", "private", "--max-tokens", "1"])).toBe('dki: no collection "private"; collections: games\n');
  });
});
