// Global tensors as the kernels see them: (seqlen, head_dim, heads, batch)
// CuTe views of a public TensorRef, with 64-bit strides.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>

#include "flash3/flash3.h"

namespace flash3 {

// TMA needs every stride to be a multiple of 16 bytes, including those of
// modes of size 1, which the caller may have left arbitrary: give those a
// harmless valid value.
inline int64_t tma_stride(int64_t extent, int64_t stride, int64_t head_dim) {
  return extent == 1 ? head_dim : stride;
}

// A tensor of kHeadDim columns (Q's, or V's where it has its own) of Element.
template <int kHeadDim, class Element, class Pointer>
auto gmem_tensor(TensorRef<Pointer> const& t, int64_t seqlen, int64_t heads, int64_t batch) {
  using Ptr = std::conditional_t<std::is_const_v<std::remove_pointer_t<Pointer>>, Element const*, Element*>;
  // A sequence of length 0 (no keys) still needs a valid descriptor; no tile reads it.
  int32_t const rows = int32_t(std::max<int64_t>(seqlen, 1));
  return cute::make_tensor(cute::make_gmem_ptr(static_cast<Ptr>(t.data)),
                           cute::make_shape(rows, cute::Int<kHeadDim>{}, int32_t(heads), int32_t(batch)),
                           cute::make_stride(tma_stride(seqlen, t.seq_stride, kHeadDim), cute::_1{},
                                             tma_stride(heads, t.head_stride, kHeadDim),
                                             tma_stride(batch, t.batch_stride, kHeadDim)));
}

}  // namespace flash3
