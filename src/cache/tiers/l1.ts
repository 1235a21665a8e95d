// L1: live K/V blocks in the compute dtype (fp32), ready to inject with no conversion: in GPU
// memory when the model runs on CUDA, in host memory otherwise. Costed by the bytes they hold
// wherever they are. Evicted blocks are only dropped from the map,
// never disposed: a caller may still be generating with one, and native blocks report their size
// to V8, so the garbage collector reclaims them once nothing refers to them.
import type { KVBlock } from "../../kv/kv-block.js";
import { BudgetedMap } from "./budgeted-map.js";

export class L1Blocks extends BudgetedMap<KVBlock> {
  static cost(block: KVBlock): number {
    return block.byteSize + block.deviceBytes;
  }
}
