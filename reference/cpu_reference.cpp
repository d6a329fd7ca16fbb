// Float64 CPU attention and the host-side 16-bit float conversions.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "reference.h"

namespace flash3::reference {

namespace {

// FlashAttention-3's softcapping of a scaled score x: softcap tanh(x / softcap),
// or x itself when softcap is 0.
double softcapped(const AttentionShape& s, double x) {
  return s.softcap > 0 ? s.softcap * std::tanh(x / s.softcap) : x;
}

// d softcapped(x) / dx: 1 - tanh^2(x / softcap), or 1 when softcap is 0.
double softcapped_slope(const AttentionShape& s, double x) {
  if (s.softcap == 0) return 1.0;
  const double t = std::tanh(x / s.softcap);
  return 1.0 - t * t;
}

}  // namespace

void attention_cpu(const AttentionShape& s, const double* q, const double* k, const double* v, double* o,
                   double* lse, const double* sinks) {
  if (!is_valid(s)) throw std::invalid_argument("attention_cpu: invalid AttentionShape");
  const int64_t d = s.head_dim, dim_v = value_head_dim(s);
  const int64_t group = s.heads_q / s.heads_kv;
  const double scale = effective_scale(s);
  std::vector<double> w(s.seqlen_k);  // the row's scores, then its unnormalized weights

  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads_q; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const double* qi = q + ((b * s.seqlen_q + i) * s.heads_q + h) * d;
        double* oi = o + ((b * s.seqlen_q + i) * s.heads_q + h) * dim_v;
        double* lse_i = lse ? lse + (b * s.heads_q + h) * s.seqlen_q + i : nullptr;
        const KeyRange keys = visible_keys(s, i);
        std::fill(oi, oi + dim_v, 0.0);
        if (keys.first == keys.last) {
          // The sink's own log-weight; without one, +inf marks the empty row (FlashAttention's convention).
          if (lse_i) *lse_i = sinks ? sinks[h] : std::numeric_limits<double>::infinity();
          continue;
        }
        double max_score = sinks ? sinks[h] : -std::numeric_limits<double>::infinity();
        for (int64_t j = keys.first; j < keys.last; ++j) {
          const double* kj = k + ((b * s.seqlen_k + j) * s.heads_kv + hk) * d;
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += qi[c] * kj[c];
          w[j] = softcapped(s, scale * dot);
          max_score = std::max(max_score, w[j]);
        }
        // Subtracting the max (the sink's included) keeps exp() finite for any score magnitude; the sink adds
        // to the denominator only.
        double sum = sinks ? std::exp(sinks[h] - max_score) : 0.0;
        for (int64_t j = keys.first; j < keys.last; ++j) {
          w[j] = std::exp(w[j] - max_score);
          sum += w[j];
        }
        for (int64_t j = keys.first; j < keys.last; ++j) {
          const double* vj = v + ((b * s.seqlen_k + j) * s.heads_kv + hk) * dim_v;
          for (int64_t c = 0; c < dim_v; ++c) oi[c] += w[j] * vj[c];
        }
        for (int64_t c = 0; c < dim_v; ++c) oi[c] /= sum;
        if (lse_i) *lse_i = max_score + std::log(sum);
      }
    }
  }
}

void attention_backward_cpu(const AttentionShape& s, const double* q, const double* k, const double* v,
                            const double* dout, double* dq, double* dk, double* dv, const double* sinks,
                            double* dsinks) {
  if (!is_valid(s)) throw std::invalid_argument("attention_backward_cpu: invalid AttentionShape");
  const int64_t d = s.head_dim, dim_v = value_head_dim(s);
  const int64_t group = s.heads_q / s.heads_kv;
  const double scale = effective_scale(s);
  std::fill(dq, dq + s.batch * s.seqlen_q * s.heads_q * d, 0.0);
  std::fill(dk, dk + s.batch * s.seqlen_k * s.heads_kv * d, 0.0);
  std::fill(dv, dv + s.batch * s.seqlen_k * s.heads_kv * dim_v, 0.0);
  if (dsinks) std::fill(dsinks, dsinks + s.heads_q, 0.0);
  std::vector<double> p(s.seqlen_k), dp(s.seqlen_k), slope(s.seqlen_k);
  auto row = [&](const double* t, int64_t b, int64_t seqlen, int64_t heads, int64_t i, int64_t h, int64_t dim) {
    return t + ((b * seqlen + i) * heads + h) * dim;
  };
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads_q; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const KeyRange keys = visible_keys(s, i);
        if (keys.first == keys.last) continue;  // O = 0 is constant: D = 0 and no gradient flows, the sink's neither
        const double* qi = row(q, b, s.seqlen_q, s.heads_q, i, h, d);
        const double* doi = row(dout, b, s.seqlen_q, s.heads_q, i, h, dim_v);
        // P_i = softmax(softcapped(scale q_i K^T)) with the sink in the denominator, dP_i = dO_i V^T.
        double max_score = sinks ? sinks[h] : -std::numeric_limits<double>::infinity();
        for (int64_t j = keys.first; j < keys.last; ++j) {
          const double* kj = row(k, b, s.seqlen_k, s.heads_kv, j, hk, d);
          const double* vj = row(v, b, s.seqlen_k, s.heads_kv, j, hk, dim_v);
          double qk = 0, dov = 0;
          for (int64_t c = 0; c < d; ++c) qk += qi[c] * kj[c];
          for (int64_t c = 0; c < dim_v; ++c) dov += doi[c] * vj[c];
          p[j] = softcapped(s, scale * qk);
          slope[j] = softcapped_slope(s, scale * qk);
          dp[j] = dov;
          max_score = std::max(max_score, p[j]);
        }
        const double sink_weight = sinks ? std::exp(sinks[h] - max_score) : 0.0;  // unnormalized, as p[j] below
        double sum = sink_weight;
        for (int64_t j = keys.first; j < keys.last; ++j) sum += (p[j] = std::exp(p[j] - max_score));
        // D_i = sum_j P_ij dP_ij (= rowsum(dO_i o O_i)); dS = P o (dP - D), the sink's dP being 0.
        double dsum = 0;
        for (int64_t j = keys.first; j < keys.last; ++j) dsum += (p[j] /= sum) * dp[j];
        if (dsinks) dsinks[h] -= sink_weight / sum * dsum;
        double* dqi = dq + ((b * s.seqlen_q + i) * s.heads_q + h) * d;
        for (int64_t j = keys.first; j < keys.last; ++j) {
          const double ds = p[j] * (dp[j] - dsum) * slope[j];  // through the softcap to scale q_i.k_j
          const double* kj = row(k, b, s.seqlen_k, s.heads_kv, j, hk, d);
          double* dkj = dk + ((b * s.seqlen_k + j) * s.heads_kv + hk) * d;
          double* dvj = dv + ((b * s.seqlen_k + j) * s.heads_kv + hk) * dim_v;
          for (int64_t c = 0; c < d; ++c) {
            dqi[c] += scale * ds * kj[c];
            dkj[c] += scale * ds * qi[c];
          }
          for (int64_t c = 0; c < dim_v; ++c) dvj[c] += p[j] * doi[c];
        }
      }
    }
  }
}

namespace {

uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace

float bf16_to_float(uint16_t bits) { return bits_float(uint32_t(bits) << 16); }

uint16_t float_to_bf16(float x) {
  const uint32_t u = float_bits(x);
  if (std::isnan(x)) return uint16_t((u >> 16) | 0x0040);  // keep the sign, force a quiet NaN
  // Adding 0x7fff plus the kept part's lowest bit rounds to nearest, ties to
  // even; a carry out of the mantissa bumps the exponent, up to infinity.
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(rounded >> 16);
}

float half_to_float(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = std::ldexp(float(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf or NaN
  return bits_float(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

uint16_t float_to_half(float x) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;  // NaN
  // 65520 = 0x477ff000 is halfway between the largest half (65504) and 2^16;
  // the tie goes to the even neighbour, 2^16, i.e. infinity.
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a >= 0x38800000u) {  // normal half (>= 2^-14): rebias the exponent, drop 13 bits
    const uint32_t rebiased = a - ((127u - 15u) << 23);
    return sign | uint16_t((rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13);
  }
  // Subnormal half: round |x| / 2^-24 to an integer. At or below 2^-25 (half
  // the smallest subnormal) that is 0, the tie included.
  if (a <= 0x33000000u) return sign;
  const uint32_t significand = (a & 0x7fffffu) | 0x800000u;  // |x| = significand * 2^(e - 150)
  const int shift = 126 - int(a >> 23);                      // |x| / 2^-24 = significand >> shift
  const uint32_t quotient = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1);
  const uint32_t half_way = 1u << (shift - 1);
  const bool round_up = remainder > half_way || (remainder == half_way && (quotient & 1u));
  return sign | uint16_t(quotient + (round_up ? 1 : 0));  // 0x400 (2^-14) when it rounds up into the normals
}

float backward_epsilon(const float* ref, const float* ref_rounded_o, size_t n) {
  float largest = 0.f, d_moved = 0.f;
  for (size_t i = 0; i < n; ++i) {
    largest = std::max(largest, std::fabs(ref[i]));
    d_moved = std::max(d_moved, std::fabs(ref_rounded_o[i] - ref[i]));
  }
  return 2.f * d_moved + 1e-4f * largest + 1e-5f;
}

}  // namespace flash3::reference
