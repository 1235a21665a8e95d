// L2: serialised blocks in host RAM as fp16 or bf16 (half the bytes of fp32). Costed by buffer
// length. Encoding and decoding run on libuv worker threads (KVBlock.serialize/deserialize); the
// serialised form carries its own checksum, so a restore also verifies the bytes.
import { KVBlock } from "../../kv/kv-block.js";
import type { NativeModelHandle } from "../../engine/native.js";
import { BudgetedMap } from "./budgeted-map.js";

export type L2Storage = "f16" | "bf16";

export class L2Buffers extends BudgetedMap<Buffer> {
  constructor(budget: number, readonly storage: L2Storage) {
    super(budget);
  }

  /** What a block will cost here, known before paying for the conversion. */
  cost(block: KVBlock): number {
    return block.serializedBytes(this.storage);
  }

  encode(block: KVBlock): Promise<Buffer> {
    return block.serialize(this.storage);
  }

  decode(model: NativeModelHandle, bytes: Buffer): Promise<KVBlock> {
    return KVBlock.deserialize(model, bytes, { inPlace: true }); // nothing else holds L2's buffers
  }
}
