// The one place where runtime arguments become template parameters of the
// forward kernel: the rows of fwd/variants.h's table that are built for a
// (dtype, head dim), each for no mask and the causal mask, and those with
// every technique on for a sliding window too (a window wider than the
// sequences is none). Each (dtype, head dim, V's head dim) is compiled in its
// own generated translation unit (fwd/instantiate.cu.in); V's head dim of its
// own (a pair of common/head_dims.inc) is built with every technique on, as
// fwd/variants.h's table builds its ablation rows at head dim 128 only. A KV
// cache call (ForwardArgs::kv_cache) goes to the KV cache kernels of the
// rows Variant::kv_cache_built names, compiled in a unit of their own
// (fwd/dispatch_kv.h).
#pragma once

#include <string>
#include <utility>

#include "common/device_info.h"
#include "common/element.h"
#include "common/mask.h"
#include "flash3/flash3.h"
#include "fwd/launch.h"
#include "fwd/registry.h"
#include "fwd/traits.h"
#include "fwd/variants.h"

namespace flash3::fwd {

// The kernel of a (dtype, head dims) instance for one variant.
template <DType kDType, int kHeadDim, int kHeadDimV, Variant kVariant>
Status launch_variant(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream) {
  return launch_forward<FwdTraits<ElementOf<kDType>, kHeadDim, kVariant, kHeadDimV>>(a, device, stream);
}

// Launches row I's kernel if the row is built for (kDType, kHeadDim) and the
// call selects it.
template <DType kDType, int kHeadDim, int kHeadDimV, size_t I>
bool launch_if_selected(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream, Status& status) {
  constexpr BuiltVariant kRow = kBuiltVariants[I];
  if constexpr (kRow.built_for(kDType, kHeadDim)) {
    if (kRow.selected_by(a.dtype, int(a.head_dim), a.options, a.fp8.out_dtype)) {
      Window const w = window_of(a.causal, a.window_left, a.window_right, a.seqlen_q, a.seqlen_k);
      bool const window = w.left >= 0 || (!a.causal && w.right >= 0);
      // Packed sequences: kernels of their own, built for the rows
      // Variant::packed_built names (validate() refuses the others).
      if (a.varlen.cu_seqlens_q != nullptr) {
        if constexpr (kRow.variant.packed_built(kDType)) {
          constexpr Variant kPacked = kRow.variant.with_packed(true);
          status = window     ? launch_variant<kDType, kHeadDim, kHeadDimV, kPacked.with_mask(false, true)>(a, device, stream)
                   : a.causal ? launch_variant<kDType, kHeadDim, kHeadDimV, kPacked.with_mask(true, false)>(a, device, stream)
                              : launch_variant<kDType, kHeadDim, kHeadDimV, kPacked.with_mask(false, false)>(a, device, stream);
        } else {
          status = Status(Status::Code::kUnsupported, "varlen: no packed kernel for these options or dtype");
        }
        return true;
      }
      if (a.kv_cache.seqlens != nullptr) {
        if constexpr (kRow.variant.kv_cache_built(kDType)) {
          status = run_kv_cache_instance<kDType, kHeadDim, kHeadDimV>(a, device, stream);  // its own unit
        } else {
          status = Status(Status::Code::kUnsupported, "kv_cache: no KV cache kernel for these options or dtype");
        }
        return true;
      }
      if (window) {
        if constexpr (kRow.variant.all_techniques()) {
          status = launch_variant<kDType, kHeadDim, kHeadDimV, kRow.variant.with_mask(false, true)>(a, device, stream);
        } else {
          status = Status(Status::Code::kUnsupported, kNoWindowWithOptions);  // validate() says so first
        }
        return true;
      }
      status = a.causal ? launch_variant<kDType, kHeadDim, kHeadDimV, kRow.variant.with_mask(true, false)>(a, device, stream)
                        : launch_variant<kDType, kHeadDim, kHeadDimV, kRow.variant.with_mask(false, false)>(a, device, stream);
      return true;
    }
  }
  return false;
}

template <DType kDType, int kHeadDim, int kHeadDimV, size_t... I>
Status run_forward_rows(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream, std::index_sequence<I...>) {
  // validate() refuses options no row builds (variant_built); kept for a caller that skipped it.
  Status status(Status::Code::kUnsupported, "options: this combination of KernelOptions is not built for head_dim " +
                                                std::to_string(kHeadDim) + " with this dtype (fwd/variants.h)");
  (launch_if_selected<kDType, kHeadDim, kHeadDimV, I>(a, device, stream, status) || ...);
  return status;
}

template <DType kDType, int kHeadDim, int kHeadDimV>
Status run_forward(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream) {
  return run_forward_rows<kDType, kHeadDim, kHeadDimV>(a, device, stream, std::make_index_sequence<kNumBuiltVariants>{});
}

}  // namespace flash3::fwd
