// The CUTLASS element type of a public DType.
#pragma once

#include <type_traits>

#include <cutlass/numeric_types.h>

#include "flash3/flash3.h"

namespace flash3 {

template <DType kDType>
using ElementOf = std::conditional_t<kDType == DType::kBF16, cutlass::bfloat16_t, cutlass::half_t>;

}  // namespace flash3
