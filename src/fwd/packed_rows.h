// A KV head's query rows as (position, query head) pairs, the group's heads
// innermost: the rows of MLA's tiles (fwd/mla_kernel.h), which pack GQA for
// any number of query positions. Which position and head a row is, and which
// key blocks a tile of them visits under the mask policy. Plain integer
// code, shared by the kernel and the CPU tests.
#pragma once

#include "common/host_device.h"
#include "common/mask.h"

namespace flash3 {

struct PackedRows {
  int group;     // query heads a KV head serves
  int seqlen_q;  // query positions

  FLASH3_HOST_DEVICE int rows() const { return seqlen_q * group; }
  FLASH3_HOST_DEVICE int position(int row) const { return row / group; }
  FLASH3_HOST_DEVICE int head(int head_kv, int row) const { return head_kv * group + row % group; }

  // The positions of tile m_block's rows that exist: first .. last.
  FLASH3_HOST_DEVICE int first_position(int m_block, int block_m) const { return position(m_block * block_m); }
  FLASH3_HOST_DEVICE int last_position(int m_block, int block_m) const {
    int const end = (m_block + 1) * block_m < rows() ? (m_block + 1) * block_m : rows();
    return position(end - 1);
  }

  // The key blocks the tile's rows visit: those of its positions.
  FLASH3_HOST_DEVICE BlockRange key_blocks(MaskPolicy const& mask, int m_block, int block_m, int block_n) const {
    return mask.key_blocks(first_position(m_block, block_m), last_position(m_block, block_m), block_n);
  }
  // With a left bound, the key blocks below this one need the mask too.
  FLASH3_HOST_DEVICE int key_blocks_masked_below(MaskPolicy const& mask, int m_block, int block_m,
                                                 int block_n) const {
    return mask.key_blocks_masked_below(last_position(m_block, block_m), block_n);
  }
};

}  // namespace flash3
