// Operations on K/V blocks. Blocks are immutable once made: every op returns a new block, so a
// block injected into a running generation can never change under it.
#pragma once
#include <memory>
#include <string>
#include <optional>
#include <vector>

#include "checksum.h"
#include "kv_block.h"

namespace dki {

using BlockPtr = std::shared_ptr<const KVBlock>;

// V ← α·V; keys are never scaled.
BlockPtr scale_values(const KVBlock& b, float alpha);
// Re-rotates every key from position start_pos+i to new_start+i: rotary embedding is a rotation
// by θ·pos per dimension pair, so multiplying by the rotation of the delta moves it. No recompute.
// inv_freq and interleaved describe the model's rotary embedding (Model::inv_freq, config).
BlockPtr remap_positions(const KVBlock& b, int new_start, const std::vector<double>& inv_freq, bool interleaved);
// Joins blocks along the token axis, placing each right after the previous (keys re-rotated
// where a block does not already sit there), the first at `start` (default: where it sits).
BlockPtr concat_blocks(const std::vector<BlockPtr>& blocks, const std::vector<double>& inv_freq, bool interleaved, std::optional<int> start = std::nullopt);
// Tokens [from, to) of a block.
BlockPtr slice_block(const KVBlock& b, int from, int to);

// The block's largest |value|, +inf when any key or value is NaN or ±inf: computed once (on its
// GPU for a device block) and kept in the block, since blocks never change. What injection checks
// an α against (Context::check_segments).
float known_value_abs_max(const KVBlock& b);

// A block's start position stays within ±kMaxPosition (remap refuses others, deserialize too), so
// a start plus any token count, or the difference of two starts, fits an int.
constexpr int kMaxPosition = 1 << 29;

// Tokens one K/V block holds at most (computeBlock, concat and a serialised header alike).
constexpr int kMaxBlockTokens = 1 << 22;

// Storage forms for serialisation and colder cache tiers.
enum class KVStorage : uint32_t { F32 = 0, F16 = 1, BF16 = 2, Int8 = 3 };
KVStorage parse_storage(const std::string& name);

// Versioned binary: header, model fingerprint, token ids, payload in `storage` form, checksum.
// Int8 uses per-channel scales for keys and per-token scales for values.
// F16/BF16 conversion runs on the engine's thread pool: callers hold the compute lock.
// A block in GPU memory is encoded on its GPU (DKI_CUDA builds), to the same bytes.
std::vector<unsigned char> serialize_block(const KVBlock& b, KVStorage storage);
// Parses and verifies a serialised block; throws a dki::Error naming the problem for a short,
// corrupt or foreign buffer. expected_fingerprint 0 skips the model check. device ≥ 0 decodes
// the payload on that GPU into a device block (only the stored bytes cross PCIe); the header's
// checks run first, the checksum as the payload is staged, and a block that fails it is dropped.
BlockPtr deserialize_block(const unsigned char* data, size_t size, uint64_t expected_fingerprint, int device = -1);
// Bytes a block takes in a storage form (payload only, without header and token ids).
size_t storage_bytes(const KVBlock& b, KVStorage storage);
// Bytes of serialize_block(b, storage): header, token ids, payload.
size_t serialized_bytes(const KVBlock& b, KVStorage storage);

}  // namespace dki
