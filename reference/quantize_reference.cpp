// CPU reference of the FP8 quantization (see quantize_reference.h).
#include "quantize_reference.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "quant/hadamard.h"

namespace flash3::reference {

uint8_t float_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  uint8_t const sign = std::signbit(x) ? 0x80 : 0x00;
  float const a = std::fabs(x);
  if (a >= quant::kE4M3Max) return sign | 0x7E;  // saturate (infinity too)
  if (a < 0.015625f) {
    // Below the smallest normal 2^-6: multiples of 2^-9. a * 512 is exact; its
    // rounding (ties to even, the default mode) gives the encoding, 8 being
    // 2^-6 = 0x08.
    return sign | uint8_t(std::nearbyint(a * 512.0f));
  }
  int e = 0;
  float const f = std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1)
  int exponent = e - 1;               // a = (1 + m / 8) 2^exponent, exponent in [-6, 8]
  int mantissa = int(std::nearbyint((2.0f * f - 1.0f) * 8.0f));  // exact before the rounding
  if (mantissa == 8) {
    mantissa = 0;
    ++exponent;
  }
  // a < 448 = 1.75 * 2^8 rounds to at most 448 (exponent 8, mantissa 6).
  return sign | uint8_t(((exponent + 7) << 3) | mantissa);
}

float e4m3_to_float(uint8_t bits) {
  int const exponent = (bits >> 3) & 0xF;
  int const mantissa = bits & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  float const magnitude = exponent == 0 ? std::ldexp(float(mantissa), -9)
                                        : std::ldexp(1.0f + float(mantissa) / 8.0f, exponent - 7);
  return (bits & 0x80) != 0 ? -magnitude : magnitude;
}

void fwht(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        float const a = x[j], b = x[j + h];
        x[j] = quant::flush_subnormal(a + b);
        x[j + h] = quant::flush_subnormal(a - b);
      }
    }
  }
}

void hadamard_rotate(float* x, int64_t head_dim, uint64_t seed) {
  for (int64_t i = 0; i < head_dim; ++i) {
    float const xi = quant::flush_subnormal(x[i]);
    x[i] = quant::hadamard_sign_negative(seed, i) ? -xi : xi;
  }
  fwht(x, head_dim);
  float const norm = quant::hadamard_norm(head_dim);
  for (int64_t i = 0; i < head_dim; ++i) x[i] = quant::flush_subnormal(x[i] * norm);
}

int64_t scale_count(ScaleGranularity granularity, int64_t batch, int64_t heads, int64_t seqlen, int64_t block) {
  switch (granularity) {
    case ScaleGranularity::kPerTensor: return 1;
    case ScaleGranularity::kPerHead: return batch * heads;
    case ScaleGranularity::kPerBlock: return block > 0 ? batch * heads * ((seqlen + block - 1) / block) : 0;
  }
  return 0;
}

void quantize_tensor_cpu(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                         ScaleGranularity granularity, int64_t block, bool hadamard, uint64_t seed, const float* in,
                         uint8_t* out, float* scale) {
  if (batch < 0 || seqlen < 0 || heads < 1) throw std::invalid_argument("quantize_tensor_cpu: bad sizes");
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    throw std::invalid_argument("quantize_tensor_cpu: head_dim must be 64, 128 or 256");
  }
  if (granularity == ScaleGranularity::kPerBlock && block < 1) {
    throw std::invalid_argument("quantize_tensor_cpu: block must be at least 1");
  }
  if (batch == 0 || seqlen == 0) return;
  int64_t const d = head_dim;
  int64_t const rows = batch * seqlen * heads;

  // The values the kernel quantizes: flushed, and transformed for Q and K.
  std::vector<float> x(in, in + rows * d);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * d;
    if (hadamard) {
      hadamard_rotate(row, d, seed);
    } else {
      for (int64_t i = 0; i < d; ++i) row[i] = quant::flush_subnormal(row[i]);
    }
  }

  // Scale index of row (b, s, h).
  int64_t const blocks = granularity == ScaleGranularity::kPerBlock ? (seqlen + block - 1) / block : 1;
  auto group = [&](int64_t b, int64_t s, int64_t h) -> int64_t {
    switch (granularity) {
      case ScaleGranularity::kPerTensor: return 0;
      case ScaleGranularity::kPerHead: return b * heads + h;
      default: return (b * heads + h) * blocks + s / block;
    }
  };
  int64_t const count = scale_count(granularity, batch, heads, seqlen, block);
  std::vector<float> amax(count, 0.0f);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seqlen; ++s) {
      for (int64_t h = 0; h < heads; ++h) {
        float const* row = x.data() + ((b * seqlen + s) * heads + h) * d;
        float& m = amax[group(b, s, h)];
        for (int64_t i = 0; i < d; ++i) m = std::fmax(m, std::fabs(row[i]));
      }
    }
  }
  std::vector<float> inverse(count);
  for (int64_t g = 0; g < count; ++g) {
    scale[g] = quant::scale_from_amax(amax[g]);
    inverse[g] = quant::inverse_scale(scale[g]);
  }
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seqlen; ++s) {
      for (int64_t h = 0; h < heads; ++h) {
        int64_t const offset = ((b * seqlen + s) * heads + h) * d;
        float const inv = inverse[group(b, s, h)];
        for (int64_t i = 0; i < d; ++i) out[offset + i] = float_to_e4m3(quant::flush_subnormal(x[offset + i] * inv));
      }
    }
  }
}

void quantize_cpu(const QuantizeShape& shape, const float* q, const float* k, const float* v, uint8_t* q_out,
                  uint8_t* k_out, uint8_t* v_out, float* q_scale, float* k_scale, float* v_scale) {
  if (shape.heads_kv < 1 || shape.heads_q % shape.heads_kv != 0) {
    throw std::invalid_argument("quantize_cpu: heads_kv must divide heads_q");
  }
  QuantizeShape const& s = shape;
  quantize_tensor_cpu(s.batch, s.seqlen_q, s.heads_q, s.head_dim, s.granularity, s.block_q, s.hadamard, s.seed, q,
                      q_out, q_scale);
  quantize_tensor_cpu(s.batch, s.seqlen_k, s.heads_kv, s.head_dim, s.granularity, s.block_kv, s.hadamard, s.seed, k,
                      k_out, k_scale);
  quantize_tensor_cpu(s.batch, s.seqlen_k, s.heads_kv, s.head_dim, s.granularity, s.block_kv, false, s.seed, v,
                      v_out, v_scale);
}

}  // namespace flash3::reference
