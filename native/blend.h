// CacheBlend (Yao et al., 2024): K/V blocks encoded each on its own, brought close to the joint
// encoding of all of them by recomputing the few tokens whose K/V would change the most.
#pragma once
#include <memory>
#include <vector>

#include "kv_block.h"
#include "model.h"

namespace dki {

// Blends `blocks` (concatenated in order, each right after the previous, from the first block's
// position) as if they had been encoded together behind `prefix` (null: nothing; else a block
// that ends right where the first block starts). Layer 0's K/V do not depend on the context;
// layers 0 and 1 run jointly for every memory token, and the ⌈ratio·n⌉ tokens whose layer-1 K and
// V deviate most (squared L2 over heads) from the cached ones are selected; every later layer
// recomputes only them, their attention reading the mixed K/V (recomputed for selected tokens,
// cached for the others; causal over the memory), and their K/V are written back. ratio 0
// returns the concatenation; ratio 1 the joint encoding. Runs on the engine's thread pool (the
// caller holds the compute lock); CPU models and host blocks only.
std::shared_ptr<KVBlock> blend_blocks(const Model& m, const KVBlock* prefix, const std::vector<std::shared_ptr<const KVBlock>>& blocks, double ratio);

}  // namespace dki
