// validate(QuantizeArgs) and quantize_fp8(): the FP8 quantization entry point.
// The checks (api/checks.h) are host code only, so they run in CI: each
// failure is kInvalidArgument with a message that starts with the argument's
// name.
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "api/checks.h"
#include "api/device.h"
#include "flash3/flash3.h"
#include "quant/quantize.h"

namespace flash3 {

using checks::invalid;
using checks::kMaxExtent;

Status validate(QuantizeArgs const& a) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kFP16) return invalid("dtype: must be kBF16 or kFP16");
  if (Status s = checks::sizes(a.batch, a.seqlen_q, a.seqlen_k, a.heads_q, a.heads_kv); !s.ok()) return s;
  if (a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256) {
    return invalid("head_dim: must be 64, 128 or 256, got " + std::to_string(a.head_dim));
  }
  switch (a.granularity) {
    case ScaleGranularity::kPerTensor: case ScaleGranularity::kPerHead: case ScaleGranularity::kPerBlock: break;
    default: return invalid("granularity: must be kPerTensor, kPerHead or kPerBlock");
  }
  // A launch has at most batch * heads * (ceil(seqlen / kMinTileRows) +
  // kMaxCluster - 1) CTAs (quant/quantize.h): below 2^31. (batch * heads <
  // 2^62: no overflow.)
  for (auto const& [seqlen, heads, what] : {std::tuple{a.seqlen_q, a.heads_q, "batch * heads_q * seqlen_q"},
                                            std::tuple{a.seqlen_k, a.heads_kv, "batch * heads_kv * seqlen_k"}}) {
    int64_t const tiles = (seqlen + quant::kMinTileRows - 1) / quant::kMinTileRows + quant::kMaxCluster - 1;
    if (a.batch > 0 && seqlen > 0 && tiles > kMaxExtent / (a.batch * heads)) {
      return invalid(std::string("batch: ") + what + " / " + std::to_string(quant::kMinTileRows) +
                     " must be below 2^31");
    }
  }
  if (a.batch == 0) return Status();  // nothing to read or write
  if (a.seqlen_q > 0) {
    if (Status s = checks::tensor("q", a.q, a.batch, a.seqlen_q, a.heads_q, a.head_dim, 2); !s.ok()) return s;
    if (Status s = checks::output("q_out", a.q_out, a.batch, a.seqlen_q, a.heads_q, a.head_dim, 1); !s.ok()) return s;
    if (Status s = checks::scale("q_scale", a.q_scale); !s.ok()) return s;
  }
  if (a.seqlen_k > 0) {
    if (Status s = checks::tensor("k", a.k, a.batch, a.seqlen_k, a.heads_kv, a.head_dim, 2); !s.ok()) return s;
    if (Status s = checks::output("k_out", a.k_out, a.batch, a.seqlen_k, a.heads_kv, a.head_dim, 1); !s.ok()) return s;
    if (Status s = checks::scale("k_scale", a.k_scale); !s.ok()) return s;
    if (Status s = checks::tensor("v", a.v, a.batch, a.seqlen_k, a.heads_kv, a.head_dim, 2); !s.ok()) return s;
    if (Status s = checks::output("v_out", a.v_out, a.batch, a.seqlen_k, a.heads_kv, a.head_dim, 1); !s.ok()) return s;
    if (Status s = checks::scale("v_scale", a.v_scale); !s.ok()) return s;
  }
  return Status();
}

Status quantize_fp8(QuantizeArgs const& args, cudaStream_t stream) {
  if (Status s = validate(args); !s.ok()) return s;
  // Nothing to read or write: a no-op, even without a device.
  if (args.batch == 0 || (args.seqlen_q == 0 && args.seqlen_k == 0)) return Status();
  DeviceInfo device;
  if (Status s = query_device(device); !s.ok()) return s;
  return quant::launch_quantize(args, fp8_block_sizes(args.head_dim), stream);
}

}  // namespace flash3
