// Parsers for CLI option values: each rejects bad input with a message naming the option.
import { InvalidArgumentError } from "commander";

export function intOption(name: string, min = 0) {
  return (v: string): number => {
    const n = Number(v);
    // Digits only: Number() would take "" as 0 and "0x5" as 5.
    if (!/^\s*-?\d+\s*$/.test(v) || !Number.isSafeInteger(n) || n < min) throw new InvalidArgumentError(`${name} must be an integer >= ${min}, got "${v}"`);
    return n;
  };
}

export function numberOption(name: string, min = -Infinity, max = Infinity) {
  return (v: string): number => {
    const n = Number(v);
    if (v.trim() === "" || !Number.isFinite(n) || n < min || n > max) throw new InvalidArgumentError(`${name} must be a number in [${min}, ${max}], got "${v}"`);
    return n;
  };
}

export function tokenListOption(name: string) {
  return (v: string): number[] => {
    const ids = v.split(",").map((s) => s.trim()).filter((s) => s.length > 0).map(Number);
    if (ids.length === 0 || ids.some((n) => !Number.isInteger(n) || n < 0)) {
      throw new InvalidArgumentError(`${name} must be a comma-separated list of token ids, got "${v}"`);
    }
    return ids;
  };
}

export function choiceOption<T extends string>(name: string, choices: readonly T[]) {
  return (v: string): T => {
    if (!(choices as readonly string[]).includes(v)) throw new InvalidArgumentError(`${name} must be one of ${choices.join(", ")}, got "${v}"`);
    return v as T;
  };
}
