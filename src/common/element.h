// The CUTLASS element type of a public DType.
#pragma once

#include <type_traits>

#include <cutlass/numeric_types.h>

#include "flash3/flash3.h"

namespace flash3 {

template <DType kDType>
using ElementOf = std::conditional_t<kDType == DType::kBF16, cutlass::bfloat16_t,
                                     std::conditional_t<kDType == DType::kFP16, cutlass::half_t, cutlass::float_e4m3_t>>;

}  // namespace flash3
