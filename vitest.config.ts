import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    globalSetup: ["test/support/global-setup.ts"],
    testTimeout: 120_000,
    hookTimeout: 300_000,
    // Native tests use all cores already; running files in parallel only thrashes a 2-core box.
    fileParallelism: false,
  },
});
