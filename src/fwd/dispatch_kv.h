// The KV cache kernels' dispatch (ForwardArgs::kv_cache), compiled in a unit
// of their own per (dtype, head dim, V's head dim) (fwd/instantiate_kv.cu.in)
// beside the forward's, so that the two build in parallel. Four kernels: split
// or not by the call's number of splits, without a mask or with the window
// kernel's (a causal mask is window_right 0). A paged cache is a run-time
// option of the same kernels (kv_cache.page_table: the producer loads a
// block whole or as 16-row boxes, fwd/kv_boxes.h), so it adds no kernel; an
// append (kv_cache.append) runs its own small kernel before them
// (fwd/launch_append.h); a decoding call's GQA groups are packed into tiles
// (fwd/pack_gqa.h), a view of the call; its scratch is one block
// (fwd/kv_workspace.h).
#pragma once

#include "common/device_info.h"
#include "common/element.h"
#include "common/mask.h"
#include "flash3/flash3.h"
#include "fwd/kv_call.h"
#include "fwd/launch.h"
#include "fwd/launch_split.h"
#include "fwd/pack_gqa.h"
#include "fwd/traits.h"
#include "fwd/variants.h"

namespace flash3::fwd {

// The call (fwd/kv_call.h), its GQA groups packed when it decodes
// (fwd/pack_gqa.h), on the split kernel when it takes more than one split,
// else the plain one (both of kBase's mask).
template <DType kDType, int kHeadDim, int kHeadDimV, Variant kBase>
Status launch_kv_cache(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream) {
  using Plain = FwdTraits<ElementOf<kDType>, kHeadDim, kBase.with_kv_cache(false), kHeadDimV>;
  using Split = FwdTraits<ElementOf<kDType>, kHeadDim, kBase.with_kv_cache(true), kHeadDimV>;
  constexpr TileSize kPlanned = tile_size(kHeadDim, kHeadDimV, Split::kFp8, true);
  static_assert(Split::kBlockM == kPlanned.block_m && Split::kBlockN == kPlanned.block_n &&
                    Plain::kBlockM == Split::kBlockM,
                "kv_cache_tile (fwd/kv_workspace.h) plans with the KV cache kernels' tiles");
  return run_kv_call(a, device, stream, [&](ForwardArgs const& appended, SplitPartials const& partials) {
    ForwardArgs const attended = packs_gqa(appended) ? packed_gqa(appended) : appended;
    if (partials.num_splits == 1) return launch_forward<Plain>(attended, device, stream);
    return launch_split_forward<Split>(attended, device, partials, stream);
  });
}

// A KV cache call on the variant with every technique on (FP8's with a
// bf16 O), the one Variant::kv_cache_built names; masked by the window
// kernel when it has a causal mask or a window, unless packed GQA drops the
// mask (fwd/pack_gqa.h).
template <DType kDType, int kHeadDim, int kHeadDimV>
Status run_kv_cache(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream) {
  constexpr Variant kBase{};
  static_assert(kBase.kv_cache_built(kDType), "KV cache kernels are built with every technique on");
  Window const w = window_of(a.causal, a.window_left, a.window_right, a.seqlen_q, a.seqlen_k);
  bool const masked = (a.causal || w.left >= 0 || w.right >= 0) && !packs_gqa(a);
  return masked ? launch_kv_cache<kDType, kHeadDim, kHeadDimV, kBase.with_mask(false, true)>(a, device, stream)
                : launch_kv_cache<kDType, kHeadDim, kHeadDimV, kBase.with_mask(false, false)>(a, device, stream);
}

}  // namespace flash3::fwd
