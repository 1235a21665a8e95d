// float32 ⇄ IEEE half (F16) and bfloat16 (BF16) bit conversions, rounding to nearest, ties to
// even, as numpy and torch do; the random-weight generator and the tests share them.

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The F16 bit pattern nearest to `x` (after rounding `x` to float32); overflow gives ±Inf, NaN stays a quiet NaN. */
export function f32ToF16Bits(x: number): number {
  f32[0] = x;
  const bits = u32[0];
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  const mant = bits & 0x7fffff;
  if (exp === 0xff) return mant === 0 ? sign | 0x7c00 : sign | 0x7e00 | (mant >>> 13);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    // Half subnormal: value = m · 2^-24, so shift the full 24-bit significand right by 14 - e.
    const shift = 14 - e;
    if (shift > 24) return sign;
    const sig = mant | 0x800000;
    let m = sig >>> shift;
    const rem = sig & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rem > half || (rem === half && (m & 1) === 1)) m++;
    // A carry out of the 10 mantissa bits lands on exponent 1: the smallest normal, as it should.
    return sign | m;
  }
  let h = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (h & 1) === 1)) h++; // a carry may reach 0x7c00 = Inf, which is correct
  return sign | h;
}

export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant === 0 ? sign * Infinity : NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** The BF16 bit pattern nearest to `x` (after rounding `x` to float32); NaN stays a quiet NaN. */
export function f32ToBf16Bits(x: number): number {
  f32[0] = x;
  const bits = u32[0];
  if ((bits & 0x7f800000) === 0x7f800000 && (bits & 0x7fffff) !== 0) return (bits >>> 16) | 0x40;
  // Adding 0x7fff plus the lowest kept bit rounds ties to even; cannot overflow 32 bits for non-NaN input.
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

export function bf16BitsToF32(b: number): number {
  u32[0] = (b & 0xffff) << 16;
  return f32[0];
}
