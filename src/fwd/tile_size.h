// Forward tile sizes per head dim, without CuTe: the kernel's traits and the
// public API (FP8 scale blocks are the kernel's tiles) both read them.
//
// Each consumer warpgroup owns 64 query rows; 2 consumer warpgroups make
// block M = 128, 3 make 192 (160 registers each).
//  - block N sets the S accumulator: 64 x N fp32 is N/2 registers per thread,
//    held twice by the intra-warpgroup overlap (S_next and P), beside the
//    64 x dv fp32 O accumulator (dv/2 registers, dv V's head dim); 240
//    registers per consumer thread bound it. FP8's P takes half of BF16's
//    registers but its PV GEMM reads P in k-steps of 32, so N stays a
//    multiple of 32.
//  - shared memory holds Q (M x d), kStages of K (N x d) and V (N x dv) and
//    O (M x dv, or half of its columns when the whole would pass 227 KB).
// docs/design.md and docs/performance-log.md record the measurements behind them.
#pragma once

namespace flash3::fwd {

struct TileSize {
  int block_m;
  int block_n;
  int stages;
};

// head_dim is Q's and K's, head_dim_v V's (and O's). extra_mask_registers: a
// window's kernel, packed sequences' causal one, or a KV cache's (each
// entry's lengths and, split, the split's range), which hold more registers
// than the plain kernels.
constexpr TileSize tile_size(int head_dim, int head_dim_v, bool fp8, bool extra_mask_registers = false) {
  if (fp8) {
    // Head dim 64: three consumer warpgroups as for BF16, and a third stage
    // that gives V's transpose room to run ahead of the PV GEMMs. Head dim
    // 128: 192 keys a block halve the per-block work of softmax and barriers
    // against 128 (224 spill). Head dim 256: 96 keys, the most that stay
    // spill-free with the consumers at 240 registers (128 spill).
    switch (head_dim) {
      case 64: return {192, 128, 3};
      case 128: return {128, 192, 2};
      default: return {128, 96, 2};  // 256
    }
  }
  switch (head_dim) {
    // Three consumer warpgroups at d = 64: there the softmax's share of a
    // block is largest, and a third warpgroup hides more of it. Causal too,
    // since each warpgroup walks only the key blocks its own rows see
    // (Mainloop::mma), so a taller tile meets no more diagonal blocks.
    // A window's kernel masks both edges of its blocks, packed sequences'
    // causal kernel and the KV cache's read each sequence's lengths: at
    // d = 64 their three warpgroups' 160 registers spill, two warpgroups'
    // 240 do not. (Decoding's packed GQA rows fill few of 128 anyway.)
    case 64: return extra_mask_registers ? TileSize{128, 128, 2} : TileSize{192, 128, 2};
    case 96: return {128, 128, 2};
    case 128: return {128, 128, 2};
    // With V's 128 the registers are head dim 128's (S, P and O at N = 128),
    // and shared memory holds Q, two stages of K and V and half of O.
    case 192: return head_dim_v == 128 ? TileSize{128, 128, 2} : TileSize{128, 96, 2};
    default: return {128, 64, 2};  // 256
  }
}

// MLA's kernel (ForwardArgs::qv, fwd/mla_traits.h): 64 query rows, whose O
// of 512 columns two consumer warpgroups split between them, and 64 keys a
// block: Q and Qv (72 KB), two stages of K and V (144 KB) and P (8 KB) fill
// shared memory.
inline constexpr TileSize kMlaTile{64, 64, 2};

// FP8's per-block scales (fp8_block_sizes): Q's rows per scale are block M
// and a K/V scale block is block N, both masks' kernels having the same tiles.
struct Fp8ScaleBlocks {
  int q;
  int kv;
};

constexpr Fp8ScaleBlocks fp8_scale_blocks(int head_dim) {
  TileSize const t = tile_size(head_dim, head_dim, true);
  return {t.block_m, t.block_n};
}

}  // namespace flash3::fwd
