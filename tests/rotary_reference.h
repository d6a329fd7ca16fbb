// Rotary embedding on the host, the plain way, for the tests: a row's first
// rotary_dim values rotated pair by pair by the angles of one table row.
#pragma once

namespace flash3::testing {

// x: a row of at least rotary_dim values; cos, sin: the angles' table row,
// rotary_dim / 2 values. Pair p is (2p, 2p + 1) interleaved (GPT-J), else
// (p, p + rotary_dim / 2) (GPT-NeoX); the values past rotary_dim stay.
inline void rotate_row(float* x, int rotary_dim, float const* cos, float const* sin, bool interleaved) {
  int const half = rotary_dim / 2;
  for (int p = 0; p < half; ++p) {
    int const i0 = interleaved ? 2 * p : p, i1 = interleaved ? 2 * p + 1 : p + half;
    float const x0 = x[i0], x1 = x[i1];
    x[i0] = x0 * cos[p] - x1 * sin[p];
    x[i1] = x1 * cos[p] + x0 * sin[p];
  }
}

}  // namespace flash3::testing
