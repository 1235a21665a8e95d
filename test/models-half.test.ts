// F16/BF16 conversions against bit patterns numpy produces (round to nearest, ties to even).
import { describe, expect, test } from "vitest";
import { bf16BitsToF32, f16BitsToF32, f32ToBf16Bits, f32ToF16Bits } from "../src/models/half.js";

describe("float32 → F16", () => {
  test.each([
    [0, 0x0000],
    [-0, 0x8000],
    [1, 0x3c00],
    [-2, 0xc000],
    [0.5, 0x3800],
    [65504, 0x7bff], // largest finite half
    [65519, 0x7bff], // below the midpoint to the next (unrepresentable) step
    [65520, 0x7c00], // the midpoint rounds to even, which is Inf
    [1e6, 0x7c00],
    [-Infinity, 0xfc00],
    [2 ** -14, 0x0400], // smallest normal
    [2 ** -24, 0x0001], // smallest subnormal
    [2 ** -25, 0x0000], // half of it: tie, rounds to even (0)
    [1.5 * 2 ** -25, 0x0001],
    [3 * 2 ** -25, 0x0002], // 1.5 ulp: tie between 1 and 2, to even
    [5 * 2 ** -25, 0x0002], // 2.5 ulp: tie between 2 and 3, to even
    [2 ** -14 - 2 ** -25, 0x0400], // largest subnormal + half ulp carries into the smallest normal
    [1 + 2 ** -11, 0x3c00], // tie between 1 and 1+2^-10: even
    [1 + 3 * 2 ** -11, 0x3c02], // tie between 1+2^-10 (odd) and 1+2^-9: even
    [1 + 2 ** -11 + 2 ** -20, 0x3c01], // just above the tie
    [0.1, 0x2e66],
    [-3.140625, 0xc248],
  ])("%s → 0x%s", (x, bits) => {
    expect(f32ToF16Bits(x)).toBe(bits);
  });

  test("NaN stays NaN (quiet), Inf stays Inf", () => {
    expect(f32ToF16Bits(NaN)).toBe(0x7e00);
    expect(f32ToF16Bits(Infinity)).toBe(0x7c00);
    expect(f16BitsToF32(0x7e00)).toBeNaN();
  });

  test("every finite half round-trips exactly", () => {
    const bad: number[] = [];
    for (let h = 0; h < 0x10000; h++) {
      if ((h & 0x7c00) !== 0x7c00 && f32ToF16Bits(f16BitsToF32(h)) !== h) bad.push(h);
    }
    expect(bad).toEqual([]);
  });
});

describe("float32 → BF16", () => {
  test.each([
    [0, 0x0000],
    [-0, 0x8000],
    [1, 0x3f80],
    [-2, 0xc000],
    [65504, 0x4780], // 65536 is the nearest bf16
    [1 + 2 ** -8, 0x3f80], // tie: even
    [1 + 3 * 2 ** -8, 0x3f82], // tie: even (up)
    [1 + 2 ** -8 + 2 ** -20, 0x3f81], // above the tie
    [2 ** -133, 0x0001], // float32 subnormal, kept as a bf16 subnormal
    [3.4028234663852886e38, 0x7f80], // float32 max rounds up to Inf
    [Infinity, 0x7f80],
    [-Infinity, 0xff80],
    [0.1, 0x3dcd],
  ])("%s → 0x%s", (x, bits) => {
    expect(f32ToBf16Bits(x)).toBe(bits);
  });

  test("NaN stays a quiet NaN", () => {
    expect(f32ToBf16Bits(NaN)).toBe(0x7fc0);
    expect(bf16BitsToF32(0x7fc0)).toBeNaN();
  });

  test("every bf16 value round-trips exactly", () => {
    const bad: number[] = [];
    for (let b = 0; b < 0x10000; b++) {
      const nan = (b & 0x7f80) === 0x7f80 && (b & 0x7f) !== 0;
      if (!nan && f32ToBf16Bits(bf16BitsToF32(b)) !== b) bad.push(b);
    }
    expect(bad).toEqual([]);
  });
});
