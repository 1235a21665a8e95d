// The tests' seeded PRNG is the library's own (src/util/prng.ts): one mulberry32, not two.
export { prng } from "../../src/util/prng.js";
