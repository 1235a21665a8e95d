// The web UI of `dki serve`, in headless Chromium (Debian's chromium, driven by playwright-core)
// against a real server with an API key: a user adds a memory, asks, watches the answer stream
// in and sees the memory listed as injected (as K/V, with its tier and α); switches to RAG and sees
// the memory in the prompt instead; compares both side by side. Also: the shipped bundle
// (ui/public/app.js) is exactly what ui/src builds to.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { build } from "esbuild";
import { chromium, type Browser, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { MemoryStore } from "../src/memory/index.js";
import { ApiKeys } from "../src/server/auth.js";
import { repoRoot, tempDir } from "./support/paths.js";
import { makeTinyModel, startServer, type Running } from "./support/serve.js";

const CHROMIUM = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => existsSync(p));
const KEY = "ui-alice-0123456789abcdef";
const MEMORY = "Alice loves hiking in the Alps and is allergic to peanuts.";
const QUESTION = "Any tips for hiking in the Alps with a peanut allergy?";

test("ui/public/app.js is what ui/src/app.ts builds to (npm run build:ui)", async () => {
  const out = await build({ entryPoints: [join(repoRoot, "ui", "src", "app.ts")], bundle: true, format: "esm", target: "es2022", write: false, logLevel: "silent" });
  expect(out.outputFiles[0].text).toBe(readFileSync(join(repoRoot, "ui", "public", "app.js"), "utf8"));
});

describe.skipIf(CHROMIUM === undefined)("dki serve: the web UI in headless Chromium", () => {
  let running: Running;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    const model = await makeTinyModel();
    const data = join(tempDir(), "data");
    await (await MemoryStore.open({ dir: data })).close();
    running = await startServer(model, data, { keys: ApiKeys.fromJson({ keys: [{ key: KEY, users: ["alice"] }] }) });
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox"] });
    page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  });

  afterAll(async () => {
    await browser?.close();
    await running?.server.close();
  });

  /** Sends a question and waits for its turn's panels (one per answer column). */
  async function askAndWait(question: string, panels: number): Promise<void> {
    const before = await page.getByTestId("turn").count();
    await page.getByTestId("query").fill(question);
    await page.getByTestId("send").click();
    await expect.poll(() => page.getByTestId("turn").count()).toBe(before + 1);
    const turn = page.getByTestId("turn").nth(before);
    await expect.poll(() => turn.getByTestId("turn-info").count(), { timeout: 30_000 }).toBe(panels);
  }

  test("without the key the UI says the server refused it; with it, memories are managed and a DKI answer streams with the memory injected", async () => {
    await page.goto(`${running.url}/`);
    await expect.poll(() => page.locator("#error").textContent()).toMatch(/API key/);

    await page.locator("#api-key").fill(KEY);
    await page.getByTestId("user").fill("alice");
    await page.locator("#connect").click();
    await expect.poll(() => page.locator("#model").textContent()).toBe("tiny");
    await expect.poll(() => page.locator("#error").isHidden()).toBe(true);

    await page.getByTestId("memory-text").fill(MEMORY);
    await page.getByTestId("add-memory").click();
    await expect.poll(() => page.getByTestId("memory-item").allTextContents()).toEqual([expect.stringContaining(MEMORY)]);

    // Count the pieces of text the answer receives before its panel appears: a streamed answer arrives in many.
    await page.evaluate(() => {
      const w = window as unknown as { pieces: number };
      w.pieces = 0;
      new MutationObserver((records) => {
        for (const r of records) if ((r.target as Element).classList?.contains("answer-text")) w.pieces += r.addedNodes.length;
      }).observe(document.getElementById("log")!, { childList: true, subtree: true });
    });
    await askAndWait(QUESTION, 1);
    expect(await page.evaluate(() => (window as unknown as { pieces: number }).pieces)).toBeGreaterThan(3);
    const turn = page.getByTestId("turn").last();
    expect((await turn.getByTestId("answer-dki").textContent())!.length).toBeGreaterThan(0);
    const used = turn.getByTestId("memory-used");
    expect(await used.count()).toBe(1);
    expect(await used.textContent()).toContain(MEMORY);
    expect(await used.getAttribute("data-tier")).toMatch(/^L[1-4]$/);
    expect(await used.textContent()).toMatch(/relevance \d\.\d\d · α \d\.\d\d · tier L[1-4]/);
    expect(await turn.getByTestId("turn-info").textContent()).toContain("injected as K/V");
    expect(await turn.getByTestId("gate-reason").textContent()).toMatch(/gate: top relevance/);
    expect(await turn.getByTestId("turn-stats").textContent()).toMatch(/TTFT \d+ ms · prompt \d+ tokens · memory \d+ tokens as K\/V/);
  });

  test("RAG puts the memory in the prompt instead; compare shows DKI and RAG side by side", async () => {
    await page.getByTestId("mode-rag").check();
    await askAndWait(QUESTION, 1);
    const rag = page.getByTestId("turn").last();
    expect(await rag.getByTestId("turn-info").textContent()).toContain("in the prompt as text");
    expect(await rag.getByTestId("memory-used").getAttribute("data-tier")).toBe("prompt");
    expect(await rag.getByTestId("turn-stats").textContent()).toMatch(/memory \d+ tokens as text/);

    await page.getByTestId("compare").check();
    await askAndWait(QUESTION, 2);
    const both = page.getByTestId("turn").last();
    expect(await both.getByTestId("answer-dki").count()).toBe(1);
    expect(await both.getByTestId("answer-rag").count()).toBe(1);
    expect(await both.getByTestId("memory-used").evaluateAll((els) => els.map((e) => e.getAttribute("data-tier")))).toEqual([expect.stringMatching(/^L[1-4]$/), "prompt"]);
    await page.screenshot({ path: join(tempDir(), "serve-ui.png"), fullPage: true });
  });
});
