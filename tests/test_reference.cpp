// The float64 CPU reference and the host 16-bit conversions, checked on the CPU
// against independent formulations and hand-computed values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "reference.h"

namespace {

using flash3::reference::AttentionShape;
using flash3::reference::attention_backward_cpu;
using flash3::reference::attention_cpu;
using flash3::reference::value_head_dim;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Problem {
  std::vector<double> q, k, v;
  std::vector<double> sinks;  // one per query head, or empty for none
  const double* sinks_or_null() const { return sinks.empty() ? nullptr : sinks.data(); }
};

Problem random_problem(const AttentionShape& s, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  Problem p;
  p.q.resize(s.batch * s.seqlen_q * s.heads_q * s.head_dim);
  p.k.resize(s.batch * s.seqlen_k * s.heads_kv * s.head_dim);
  p.v.resize(s.batch * s.seqlen_k * s.heads_kv * value_head_dim(s));
  for (auto* t : {&p.q, &p.k, &p.v})
    for (double& x : *t) x = dist(rng);
  return p;
}

struct Result {
  std::vector<double> o, lse;
};

Result run_reference(const AttentionShape& s, const Problem& p) {
  Result r;
  r.o.assign(s.batch * s.seqlen_q * s.heads_q * value_head_dim(s), std::nan(""));
  r.lse.assign(s.batch * s.heads_q * s.seqlen_q, std::nan(""));
  attention_cpu(s, p.q.data(), p.k.data(), p.v.data(), r.o.data(), r.lse.data(), p.sinks_or_null());
  return r;
}

struct Gradients {
  std::vector<double> dq, dk, dv, dsinks;
};

Gradients run_backward(const AttentionShape& s, const Problem& p, const std::vector<double>& dout) {
  Gradients g;
  g.dq.assign(p.q.size(), std::nan(""));
  g.dk.assign(p.k.size(), std::nan(""));
  g.dv.assign(p.v.size(), std::nan(""));
  g.dsinks.assign(s.heads_q, std::nan(""));
  attention_backward_cpu(s, p.q.data(), p.k.data(), p.v.data(), dout.data(), g.dq.data(), g.dk.data(),
                         g.dv.data(), p.sinks_or_null(), g.dsinks.data());
  return g;
}

std::vector<double> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> x(n);
  for (double& e : x) e = dist(rng);
  return x;
}

// The backward's gradients against central finite differences of the forward:
// for L = sum(O o dO), dL/dx ~ (L(x + h) - L(x - h)) / 2h for every element x
// of Q, K, V and the sinks (none without them: dsinks must then be 0).
void expect_finite_differences(const AttentionShape& s, Problem p, const std::vector<double>& dout, double tolerance) {
  const Gradients g = run_backward(s, p, dout);
  auto loss = [&]() {
    const Result r = run_reference(s, p);
    double l = 0;
    for (size_t i = 0; i < r.o.size(); ++i) l += r.o[i] * dout[i];
    return l;
  };
  const double h = 1e-6;
  for (auto [x, grad, name] : {std::tuple{&p.q, &g.dq, "dq"}, std::tuple{&p.k, &g.dk, "dk"},
                               std::tuple{&p.v, &g.dv, "dv"}, std::tuple{&p.sinks, &g.dsinks, "dsinks"}}) {
    for (size_t i = 0; i < x->size(); ++i) {
      const double saved = (*x)[i];
      (*x)[i] = saved + h;
      const double up = loss();
      (*x)[i] = saved - h;
      const double down = loss();
      (*x)[i] = saved;
      ASSERT_NEAR((*grad)[i], (up - down) / (2 * h), tolerance) << name << "[" << i << "]";
    }
  }
  if (p.sinks.empty())
    for (double x : g.dsinks) ASSERT_EQ(x, 0.0);
}

// The textbook formulation, written independently of the reference: per (b, h)
// an explicit seqlen_q x seqlen_k score matrix with masked entries excluded,
// P = exp(S) / sum exp(S) with no max subtraction (fine for the small scores
// used here), O = P V. GQA and the mask are spelled differently too: the KV
// head is found by scanning groups, the causal offset from the bottom-right
// corner is computed as a diagonal index, and the window, the causal mask and
// the softcap each apply on their own, as their definitions say; the sink is
// one more term exp(sink) of the denominator.
Result naive_attention(const AttentionShape& s, const Problem& p) {
  const int64_t d = s.head_dim, sq = s.seqlen_q, sk = s.seqlen_k;
  const int64_t dv = s.head_dim_v != 0 ? s.head_dim_v : d;
  const double scale = s.softmax_scale != 0.0f ? s.softmax_scale : 1.0 / std::sqrt(double(d));
  auto at = [&](const std::vector<double>& t, int64_t seqlen, int64_t heads, int64_t dim, int64_t b, int64_t i,
                int64_t h, int64_t c) { return t[((b * seqlen + i) * heads + h) * dim + c]; };
  Result r;
  r.o.assign(s.batch * sq * s.heads_q * dv, 0.0);
  r.lse.assign(s.batch * s.heads_q * sq, 0.0);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads_q; ++h) {
      int64_t hk = 0;
      while ((hk + 1) * (s.heads_q / s.heads_kv) <= h) ++hk;
      std::vector<std::vector<double>> S(sq, std::vector<double>(sk));
      std::vector<std::vector<bool>> allowed(sq, std::vector<bool>(sk, true));
      for (int64_t i = 0; i < sq; ++i) {
        for (int64_t j = 0; j < sk; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c)
            dot += at(p.q, sq, s.heads_q, d, b, i, h, c) * at(p.k, sk, s.heads_kv, d, b, j, hk, c);
          S[i][j] = scale * dot;
          if (s.softcap > 0) S[i][j] = s.softcap * std::tanh(S[i][j] / s.softcap);
          // Row i's diagonal is at column i + (sk - sq); keys right of it are masked.
          if (s.causal && j - i > sk - sq) allowed[i][j] = false;
          // The window keeps keys at most window_left before the diagonal and window_right after it.
          if (s.window_left >= 0 && (i + sk - sq) - j > s.window_left) allowed[i][j] = false;
          if (s.window_right >= 0 && j - (i + sk - sq) > s.window_right) allowed[i][j] = false;
        }
      }
      for (int64_t i = 0; i < sq; ++i) {
        double denom = p.sinks.empty() ? 0.0 : std::exp(p.sinks[h]);
        for (int64_t j = 0; j < sk; ++j)
          if (allowed[i][j]) denom += std::exp(S[i][j]);
        double& lse = r.lse[(b * s.heads_q + h) * sq + i];
        lse = denom > 0 ? std::log(denom) : kInf;
        if (denom == 0) continue;
        for (int64_t j = 0; j < sk; ++j) {
          if (!allowed[i][j]) continue;
          const double pij = std::exp(S[i][j]) / denom;
          for (int64_t c = 0; c < dv; ++c)
            r.o[((b * sq + i) * s.heads_q + h) * dv + c] += pij * at(p.v, sk, s.heads_kv, dv, b, j, hk, c);
        }
      }
    }
  }
  return r;
}

std::string describe(const AttentionShape& s) {
  return "b" + std::to_string(s.batch) + " sq" + std::to_string(s.seqlen_q) + " sk" + std::to_string(s.seqlen_k) +
         " hq" + std::to_string(s.heads_q) + " hkv" + std::to_string(s.heads_kv) + " d" +
         std::to_string(s.head_dim) + (s.head_dim_v != 0 ? " dv" + std::to_string(s.head_dim_v) : "") +
         (s.causal ? " causal" : "") +
         (s.window_left != -1 || s.window_right != -1
              ? " window " + std::to_string(s.window_left) + "," + std::to_string(s.window_right)
              : "") +
         (s.softcap != 0 ? " softcap " + std::to_string(s.softcap) : "");
}

// The backward check's epsilon: twice the largest move of D from the rounded
// O, plus 1e-4 of the largest |gradient| and 1e-5.
TEST(BackwardEpsilon, FromTheRoundedOutputsMoveAndTheLargestGradient) {
  const float ref[] = {0.5f, -2.0f, 0.25f};
  const float moved[] = {0.5f, -2.0f, 0.125f};  // one gradient moved by 0.125
  EXPECT_FLOAT_EQ(flash3::reference::backward_epsilon(ref, ref, 3), 1e-4f * 2.0f + 1e-5f);
  EXPECT_FLOAT_EQ(flash3::reference::backward_epsilon(ref, moved, 3), 2 * 0.125f + 1e-4f * 2.0f + 1e-5f);
  EXPECT_FLOAT_EQ(flash3::reference::backward_epsilon(ref, moved, 2), 1e-4f * 2.0f + 1e-5f);  // only the first n
}

TEST(ReferenceCpu, MatchesNaiveFormulation) {
  const AttentionShape shapes[] = {
      {2, 5, 5, 2, 2, 8, 0.0f, false},   // MHA
      {2, 5, 5, 2, 2, 8, 0.0f, true},    // causal, square
      {1, 3, 9, 4, 2, 6, 0.0f, true},    // causal, seqlen_q < seqlen_k, GQA
      {1, 9, 4, 2, 1, 5, 0.7f, true},    // causal, seqlen_q > seqlen_k: 5 rows see nothing; MQA
      {1, 1, 1, 1, 1, 4, 0.0f, false},   // a single key
      {1, 1, 6, 3, 1, 3, 0.0f, true},    // seqlen_q 1 with causal sees every key
      {2, 6, 1, 2, 2, 4, 0.0f, true},    // seqlen_k 1: only the last row sees it
      {1, 4, 0, 2, 2, 4, 0.0f, false},   // no keys at all
      {3, 7, 11, 6, 3, 16, 0.25f, false},
  };
  unsigned seed = 1;
  for (const AttentionShape& s : shapes) {
    SCOPED_TRACE(describe(s));
    const Problem p = random_problem(s, seed++);
    const Result got = run_reference(s, p);
    const Result want = naive_attention(s, p);
    for (size_t i = 0; i < got.o.size(); ++i) ASSERT_NEAR(got.o[i], want.o[i], 1e-12) << "o[" << i << "]";
    for (size_t i = 0; i < got.lse.size(); ++i) {
      if (std::isinf(want.lse[i])) {
        ASSERT_EQ(got.lse[i], kInf) << "lse[" << i << "]";
      } else {
        ASSERT_NEAR(got.lse[i], want.lse[i], 1e-12) << "lse[" << i << "]";
      }
    }
  }
}

// The backward reference against finite differences of the forward on the plain masks.
TEST(ReferenceCpuBackward, MatchesFiniteDifferences) {
  const AttentionShape shapes[] = {
      {1, 4, 4, 2, 2, 3, 0.0f, false},
      {1, 5, 3, 4, 2, 4, 0.6f, true},  // causal, seqlen_q > seqlen_k (rows that see nothing), GQA
      {2, 3, 6, 2, 1, 2, 0.0f, true},  // causal, seqlen_q < seqlen_k, MQA
  };
  unsigned seed = 11;
  for (const AttentionShape& s : shapes) {
    SCOPED_TRACE(describe(s));
    const Problem p = random_problem(s, seed++);
    expect_finite_differences(s, p, random_values(p.q.size(), seed++), 1e-7);
  }
}

// One query, two keys with scores 0 and ln 3: weights 1/4 and 3/4.
TEST(ReferenceCpu, HandComputedExample) {
  const AttentionShape s{1, 1, 2, 1, 1, 1, 1.0f, false};
  const double q[] = {1.0}, k[] = {0.0, std::log(3.0)}, v[] = {4.0, 8.0};
  double o = 0, lse = 0;
  attention_cpu(s, q, k, v, &o, &lse);
  EXPECT_NEAR(o, 0.25 * 4.0 + 0.75 * 8.0, 1e-14);
  EXPECT_NEAR(lse, std::log(4.0), 1e-14);
}

// With Q = 0 every visible key gets the same weight, so the output is the mean
// of the visible values and the LSE is log(count): this pins down which keys
// the bottom-right aligned causal mask lets each row see.
TEST(ReferenceCpu, CausalMaskIsBottomRightAligned) {
  auto run = [](int64_t sq, int64_t sk) {
    const AttentionShape s{1, sq, sk, 1, 1, 1, 0.0f, true};
    std::vector<double> q(sq, 0.0), k(sk, 0.0), v(sk), o(sq), lse(sq);
    for (int64_t j = 0; j < sk; ++j) v[j] = double(j);  // mean of keys 0..n-1 is (n-1)/2
    attention_cpu(s, q.data(), k.data(), v.data(), o.data(), lse.data());
    return std::make_pair(o, lse);
  };
  {
    const auto [o, lse] = run(2, 4);  // row 0 sees keys 0..2, row 1 sees 0..3
    EXPECT_DOUBLE_EQ(o[0], 1.0);
    EXPECT_DOUBLE_EQ(o[1], 1.5);
    EXPECT_DOUBLE_EQ(lse[0], std::log(3.0));
    EXPECT_DOUBLE_EQ(lse[1], std::log(4.0));
  }
  {
    const auto [o, lse] = run(4, 2);  // rows 0, 1 see nothing; row 2 sees key 0; row 3 keys 0..1
    EXPECT_EQ(o[0], 0.0);
    EXPECT_EQ(o[1], 0.0);
    EXPECT_EQ(lse[0], kInf);
    EXPECT_EQ(lse[1], kInf);
    EXPECT_DOUBLE_EQ(o[2], 0.0);
    EXPECT_DOUBLE_EQ(lse[2], 0.0);
    EXPECT_DOUBLE_EQ(o[3], 0.5);
    EXPECT_DOUBLE_EQ(lse[3], std::log(2.0));
  }
}

// KV head g holds the constant value g + 1, so each query head's output names
// the KV head it used: h / (heads_q / heads_kv), i.e. 1 1 2 2 3 3 for 6 / 3.
TEST(ReferenceCpu, GqaMapsQueryHeadsToContiguousGroups) {
  const AttentionShape s{1, 2, 3, 6, 3, 2, 0.0f, false};
  std::vector<double> q(2 * 6 * 2, 0.5), k(3 * 3 * 2, 0.25), v(3 * 3 * 2), o(q.size());
  for (int64_t j = 0; j < 3; ++j)
    for (int64_t g = 0; g < 3; ++g)
      for (int64_t c = 0; c < 2; ++c) v[(j * 3 + g) * 2 + c] = double(g + 1);
  attention_cpu(s, q.data(), k.data(), v.data(), o.data(), nullptr);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t h = 0; h < 6; ++h)
      for (int64_t c = 0; c < 2; ++c) EXPECT_DOUBLE_EQ(o[(i * 6 + h) * 2 + c], double(h / 2 + 1)) << "head " << h;
}

// Every output is a convex combination of the visible V rows: within their
// per-column range. The LSE lies between the max score and max + log(count).
// Scores up to ~200 also check that the max subtraction keeps exp() finite.
TEST(ReferenceCpu, OutputsAreConvexCombinationsOfVisibleValues) {
  for (float scale : {0.0f, 50.0f}) {
    const AttentionShape s{2, 13, 17, 4, 2, 16, scale, true};
    SCOPED_TRACE("scale " + std::to_string(scale));
    const Problem p = random_problem(s, 42);
    const Result r = run_reference(s, p);
    const int64_t d = s.head_dim, group = s.heads_q / s.heads_kv;
    const double sc = flash3::reference::effective_scale(s);
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t h = 0; h < s.heads_q; ++h) {
        for (int64_t i = 0; i < s.seqlen_q; ++i) {
          const int64_t visible = i + s.seqlen_k - s.seqlen_q + 1;
          double max_score = -kInf;
          for (int64_t j = 0; j < visible; ++j) {
            double dot = 0;
            for (int64_t c = 0; c < d; ++c)
              dot += p.q[((b * s.seqlen_q + i) * s.heads_q + h) * d + c] *
                     p.k[((b * s.seqlen_k + j) * s.heads_kv + h / group) * d + c];
            max_score = std::max(max_score, sc * dot);
          }
          const double lse = r.lse[(b * s.heads_q + h) * s.seqlen_q + i];
          ASSERT_GE(lse, max_score - 1e-12);
          ASSERT_LE(lse, max_score + std::log(double(visible)) + 1e-12);
          for (int64_t c = 0; c < d; ++c) {
            double lo = kInf, hi = -kInf;
            for (int64_t j = 0; j < visible; ++j) {
              const double x = p.v[((b * s.seqlen_k + j) * s.heads_kv + h / group) * d + c];
              lo = std::min(lo, x);
              hi = std::max(hi, x);
            }
            const double x = r.o[((b * s.seqlen_q + i) * s.heads_q + h) * d + c];
            ASSERT_TRUE(std::isfinite(x));
            ASSERT_GE(x, lo - 1e-12);
            ASSERT_LE(x, hi + 1e-12);
          }
        }
      }
    }
  }
}

// Adding u to every key adds scale * q.u to every score of a row: softmax is
// shift-invariant, so O is unchanged and the LSE moves by exactly that amount.
TEST(ReferenceCpu, ShiftingAllKeysOnlyShiftsLse) {
  const AttentionShape s{1, 6, 9, 2, 2, 8, 0.0f, true};
  const Problem p = random_problem(s, 7);
  Problem shifted = p;
  const double u[8] = {0.5, -1.0, 2.0, 0.0, 0.25, -0.75, 1.5, 3.0};
  for (size_t i = 0; i < shifted.k.size(); ++i) shifted.k[i] += u[i % 8];
  const Result a = run_reference(s, p), b = run_reference(s, shifted);
  for (size_t i = 0; i < a.o.size(); ++i) ASSERT_NEAR(a.o[i], b.o[i], 1e-12);
  const double scale = 1.0 / std::sqrt(8.0);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 6; ++i) {
      double qu = 0;
      for (int c = 0; c < 8; ++c) qu += p.q[(i * 2 + h) * 8 + c] * u[c];
      ASSERT_NEAR(b.lse[h * 6 + i] - a.lse[h * 6 + i], scale * qu, 1e-12);
    }
  }
}

TEST(ReferenceCpu, RejectsInvalidShapes) {
  double x = 0;
  const AttentionShape bad_group{1, 1, 1, 3, 2, 1, 0.0f, false};
  const AttentionShape no_heads{1, 1, 1, 0, 1, 1, 0.0f, false};
  EXPECT_THROW(attention_cpu(bad_group, &x, &x, &x, &x, nullptr), std::invalid_argument);
  EXPECT_THROW(attention_cpu(no_heads, &x, &x, &x, &x, nullptr), std::invalid_argument);
}

// A shape with a window, a softcap or a V head dim of its own, filled in after
// the positional fields.
AttentionShape with_options(AttentionShape s, int64_t window_left, int64_t window_right, double softcap = 0.0,
                            int64_t head_dim_v = 0) {
  s.window_left = window_left;
  s.window_right = window_right;
  s.softcap = softcap;
  s.head_dim_v = head_dim_v;
  return s;
}

void expect_same_result(const Result& got, const Result& want, double tolerance) {
  ASSERT_EQ(got.o.size(), want.o.size());
  for (size_t i = 0; i < got.o.size(); ++i) ASSERT_NEAR(got.o[i], want.o[i], tolerance) << "o[" << i << "]";
  for (size_t i = 0; i < got.lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      ASSERT_EQ(got.lse[i], want.lse[i]) << "lse[" << i << "]";
    } else {
      ASSERT_NEAR(got.lse[i], want.lse[i], tolerance) << "lse[" << i << "]";
    }
  }
}

void expect_same_gradients(const Gradients& got, const Gradients& want, double tolerance) {
  for (auto [a, b, name] : {std::tuple{&got.dq, &want.dq, "dq"}, std::tuple{&got.dk, &want.dk, "dk"},
                            std::tuple{&got.dv, &want.dv, "dv"}, std::tuple{&got.dsinks, &want.dsinks, "dsinks"}}) {
    ASSERT_EQ(a->size(), b->size()) << name;
    for (size_t i = 0; i < a->size(); ++i) ASSERT_NEAR((*a)[i], (*b)[i], tolerance) << name << "[" << i << "]";
  }
}

// The window, the softcap, sinks and a V head dim of its own, alone and
// together, against the textbook formulation.
TEST(ReferenceCpu, MatchesNaiveFormulationWithOptions) {
  const AttentionShape shapes[] = {
      with_options({2, 7, 7, 2, 2, 8, 0.0f, false}, 2, 1),             // a window, both sides
      with_options({1, 4, 9, 4, 2, 6, 0.0f, false}, 3, -1),            // left only, seqlen_q < seqlen_k, GQA
      with_options({1, 9, 4, 2, 1, 5, 0.7f, false}, -1, 1),            // right only: the first rows see nothing
      with_options({1, 6, 8, 2, 2, 4, 0.0f, true}, 2, 5),              // causal caps the right side at 0
      with_options({2, 5, 6, 2, 1, 8, 3.0f, false}, -1, -1, 1.5),      // softcap with scores beyond it
      with_options({1, 5, 5, 3, 3, 6, 0.0f, false}, -1, -1, 0.0, 4),   // head_dim_v < head_dim
      with_options({1, 8, 6, 4, 2, 5, 2.0f, true}, 1, -1, 2.0, 7),     // everything, rows that see nothing
  };
  unsigned seed = 101;
  for (const AttentionShape& s : shapes) {
    for (bool sinks : {false, true}) {
      SCOPED_TRACE(describe(s) + (sinks ? " sinks" : ""));
      Problem p = random_problem(s, seed++);
      if (sinks) p.sinks = random_values(s.heads_q, seed++);
      expect_same_result(run_reference(s, p), naive_attention(s, p), 1e-12);
    }
  }
}

// visible_keys against the rule stated key by key: query i sees key j iff
// j >= i + seqlen_k - seqlen_q - window_left and j <= i + seqlen_k - seqlen_q
// + right, right being min(window_right, 0) with causal (0 when unbounded).
TEST(ReferenceCpuWindow, VisibleKeysFollowTheRule) {
  for (int64_t sq = 0; sq <= 6; ++sq) {
    for (int64_t sk = 0; sk <= 6; ++sk) {
      for (int64_t left = -1; left <= 7; ++left) {
        for (int64_t right = -1; right <= 7; ++right) {
          for (bool causal : {false, true}) {
            const AttentionShape s = with_options({1, sq, sk, 1, 1, 1, 0.0f, causal}, left, right);
            const int64_t bound = causal ? (right < 0 ? 0 : std::min<int64_t>(right, 0)) : right;
            for (int64_t i = 0; i < sq; ++i) {
              const flash3::reference::KeyRange keys = flash3::reference::visible_keys(s, i);
              ASSERT_LE(keys.first, keys.last);
              for (int64_t j = 0; j < sk; ++j) {
                const bool sees = (left < 0 || j >= i + sk - sq - left) && (bound < 0 || j <= i + sk - sq + bound);
                ASSERT_EQ(keys.first <= j && j < keys.last, sees)
                    << describe(s) << " row " << i << " key " << j;
              }
            }
          }
        }
      }
    }
  }
}

// With Q = 0 every visible key gets the same weight, so row i's output is the
// mean of the visible values (V_j = j) and its LSE log(count). seqlen_q 4,
// seqlen_k 6 puts row i's diagonal at key i + 2; a window (1, 1) keeps keys
// i + 1 .. i + 3, the last row's cut to 4 .. 5 by the sequence's end.
TEST(ReferenceCpuWindow, HandComputedExample) {
  const AttentionShape s = with_options({1, 4, 6, 1, 1, 1, 0.0f, false}, 1, 1);
  std::vector<double> q(4, 0.0), k(6, 0.0), v(6), o(4), lse(4);
  for (int64_t j = 0; j < 6; ++j) v[j] = double(j);
  attention_cpu(s, q.data(), k.data(), v.data(), o.data(), lse.data());
  const double want_o[] = {2.0, 3.0, 4.0, 4.5};
  const double want_lse[] = {std::log(3.0), std::log(3.0), std::log(3.0), std::log(2.0)};
  for (int i = 0; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(o[i], want_o[i]) << "row " << i;
    EXPECT_DOUBLE_EQ(lse[i], want_lse[i]) << "row " << i;
  }
}

// A window (0, 0) leaves each row its diagonal key alone: O_i = V_{i + sk - sq}
// and LSE_i = scale q_i.k_{i + sk - sq}.
TEST(ReferenceCpuWindow, ZeroWindowSeesOnlyTheDiagonalKey) {
  for (int64_t sk : {5, 8}) {
    const AttentionShape s = with_options({1, 5, sk, 2, 1, 3, 0.0f, false}, 0, 0);
    SCOPED_TRACE(describe(s));
    const Problem p = random_problem(s, 5);
    const Result r = run_reference(s, p);
    const double scale = 1.0 / std::sqrt(3.0);
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 5; ++i) {
        const int64_t j = i + sk - 5;
        double dot = 0;
        for (int c = 0; c < 3; ++c) {
          EXPECT_DOUBLE_EQ(r.o[(i * 2 + h) * 3 + c], p.v[j * 3 + c]);
          dot += p.q[(i * 2 + h) * 3 + c] * p.k[j * 3 + c];
        }
        EXPECT_NEAR(r.lse[h * 5 + i], scale * dot, 1e-15);
      }
    }
  }
}

// A window reaching past both ends of the sequence masks nothing, and the
// causal mask is the window (-1, 0), also when a window_right > 0 is given:
// the results, forward and backward, are the same to the bit.
TEST(ReferenceCpuWindow, EquivalentMasksGiveIdenticalResults) {
  const AttentionShape base{2, 5, 7, 4, 2, 3, 0.0f, false};
  const AttentionShape causal{2, 5, 7, 4, 2, 3, 0.0f, true};
  const std::pair<AttentionShape, AttentionShape> pairs[] = {
      {base, with_options(base, 12, 12)},
      {base, with_options(base, 100, -1)},
      {causal, with_options(base, -1, 0)},
      {causal, with_options(causal, -1, 3)},
      {with_options(causal, 2, -1), with_options(base, 2, 0)},
  };
  for (const auto& [a, b] : pairs) {
    SCOPED_TRACE(describe(a) + " vs " + describe(b));
    Problem p = random_problem(a, 9);
    p.sinks = random_values(a.heads_q, 10);
    const std::vector<double> dout = random_values(p.q.size(), 11);
    expect_same_result(run_reference(b, p), run_reference(a, p), 0.0);
    expect_same_gradients(run_backward(b, p, dout), run_backward(a, p, dout), 0.0);
  }
}

// A right bound before the first key empties rows: with seqlen_q 5, seqlen_k 2
// and the window (1, 1), row i keeps keys i - 4 .. i - 2, none for rows 0 and
// 1. Those get O = 0, LSE = +inf and no gradient; the others the mean of their
// keys (Q = 0, V_j = j).
TEST(ReferenceCpuWindow, RowsThatSeeNoKey) {
  const AttentionShape s = with_options({1, 5, 2, 1, 1, 1, 0.0f, false}, 1, 1);
  const Problem p{{0, 0, 0, 0, 0}, {0.5, -0.25}, {0, 1}, {}};
  const Result r = run_reference(s, p);
  const double want_o[] = {0.0, 0.0, 0.0, 0.5, 0.5};
  const double want_lse[] = {kInf, kInf, 0.0, std::log(2.0), std::log(2.0)};
  for (int i = 0; i < 5; ++i) {
    EXPECT_DOUBLE_EQ(r.o[i], want_o[i]) << "row " << i;
    EXPECT_DOUBLE_EQ(r.lse[i], want_lse[i]) << "row " << i;
  }
  const Gradients g = run_backward(s, p, {1, 1, 1, 1, 1});
  EXPECT_EQ(g.dq[0], 0.0);
  EXPECT_EQ(g.dq[1], 0.0);
  // Row 2 sees key 0 alone (P = 1, dS = 0); rows 3 and 4 see both keys with P = 1/2 and dS = (-1/4, 1/4).
  EXPECT_DOUBLE_EQ(g.dq[2], 0.0);
  EXPECT_DOUBLE_EQ(g.dq[3], 0.25 * (-0.25 - 0.5));
  EXPECT_DOUBLE_EQ(g.dq[4], 0.25 * (-0.25 - 0.5));
  EXPECT_DOUBLE_EQ(g.dv[0], 1.0 + 0.5 + 0.5);
  EXPECT_DOUBLE_EQ(g.dv[1], 0.5 + 0.5);
  EXPECT_EQ(g.dsinks[0], 0.0);  // no sinks: zeros
}

// One query, two keys: scale 1, q = 1, k = (0, (ln 3)^2) and softcap 2 ln 3
// cap the second score to 2 ln 3 tanh((ln 3) / 2) = ln 3 (tanh((ln 3) / 2) =
// 1/2): weights 1/4 and 3/4 as in the plain hand-computed example. Backward
// with dO = 1: D = O = 7, dS = P o (V - D) = (-3/4, 3/4), times the cap's
// slope 1 - (1/2)^2 = 3/4 at the second key.
TEST(ReferenceCpuSoftcap, HandComputedExample) {
  const double ln3 = std::log(3.0);
  const AttentionShape s = with_options({1, 1, 2, 1, 1, 1, 1.0f, false}, -1, -1, 2 * ln3);
  const double q[] = {1.0}, k[] = {0.0, ln3 * ln3}, v[] = {4.0, 8.0}, dout[] = {1.0};
  double o = 0, lse = 0;
  attention_cpu(s, q, k, v, &o, &lse);
  EXPECT_NEAR(o, 0.25 * 4.0 + 0.75 * 8.0, 1e-14);
  EXPECT_NEAR(lse, std::log(4.0), 1e-14);
  double dq = 0, dk[2] = {}, dv[2] = {};
  attention_backward_cpu(s, q, k, v, dout, &dq, dk, dv);
  EXPECT_NEAR(dq, 0.75 * 0.75 * ln3 * ln3, 1e-14);
  EXPECT_NEAR(dk[0], -0.75, 1e-14);
  EXPECT_NEAR(dk[1], 0.75 * 0.75, 1e-14);
  EXPECT_NEAR(dv[0], 0.25, 1e-14);
  EXPECT_NEAR(dv[1], 0.75, 1e-14);
}

// softcap tanh(x / softcap) = x - x^3 / (3 softcap^2) + ...: a softcap of 1e6
// moves scores of a few units by ~1e-12, so it matches no softcap to 1e-9.
TEST(ReferenceCpuSoftcap, LargeSoftcapIsNoSoftcap) {
  const AttentionShape plain{2, 6, 9, 4, 2, 8, 2.0f, true};
  const AttentionShape capped = with_options(plain, 3, -1, 1e6);
  const AttentionShape windowed = with_options(plain, 3, -1);
  const Problem p = random_problem(plain, 21);
  const std::vector<double> dout = random_values(p.q.size(), 22);
  expect_same_result(run_reference(capped, p), run_reference(windowed, p), 1e-9);
  expect_same_gradients(run_backward(capped, p, dout), run_backward(windowed, p, dout), 1e-9);
}

// exp(-1e30) and exp(-inf) are 0: such a sink adds nothing to any denominator,
// so O, LSE and the gradients are the same to the bit, and its own gradient 0.
TEST(ReferenceCpuSinks, VeryNegativeSinkIsNoSink) {
  const AttentionShape s = with_options({2, 5, 7, 4, 2, 6, 0.0f, true}, 3, -1, 1.5);
  const Problem plain = random_problem(s, 31);
  const std::vector<double> dout = random_values(plain.q.size(), 32);
  const Gradients want = run_backward(s, plain, dout);  // its dsinks: zeros, without sinks
  for (double sink : {-1e30, -kInf}) {
    SCOPED_TRACE("sink " + std::to_string(sink));
    Problem p = plain;
    p.sinks.assign(s.heads_q, sink);
    expect_same_result(run_reference(s, p), run_reference(s, plain), 0.0);
    expect_same_gradients(run_backward(s, p, dout), want, 0.0);
  }
}

// One query, two keys with scores 0 and ln 3 and a sink ln 4: the denominator
// is 1 + 3 + 4 = 8, so O = (4 + 3 * 8) / 8, LSE = ln 8. Backward with dO = 1:
// P = (1/8, 3/8), P_sink = 1/2, D = O = 7/2, dsink = -P_sink D, dS = P o (V - D).
TEST(ReferenceCpuSinks, LseIncludesTheSink) {
  const AttentionShape s{1, 1, 2, 1, 1, 1, 1.0f, false};
  const double q[] = {1.0}, k[] = {0.0, std::log(3.0)}, v[] = {4.0, 8.0}, dout[] = {1.0};
  const double sink[] = {std::log(4.0)};
  double o = 0, lse = 0;
  attention_cpu(s, q, k, v, &o, &lse, sink);
  EXPECT_NEAR(o, 3.5, 1e-14);
  EXPECT_NEAR(lse, std::log(8.0), 1e-14);
  double dq = 0, dk[2] = {}, dv[2] = {}, dsink = 0;
  attention_backward_cpu(s, q, k, v, dout, &dq, dk, dv, sink, &dsink);
  EXPECT_NEAR(dsink, -0.5 * 3.5, 1e-14);
  EXPECT_NEAR(dk[0], 0.125 * (4.0 - 3.5), 1e-14);
  EXPECT_NEAR(dk[1], 0.375 * (8.0 - 3.5), 1e-14);
  EXPECT_NEAR(dq, 0.375 * (8.0 - 3.5) * std::log(3.0), 1e-14);
  EXPECT_NEAR(dv[0], 0.125, 1e-14);
  EXPECT_NEAR(dv[1], 0.375, 1e-14);
}

// A sink only adds exp(sink) to each denominator: LSE' = log(exp(LSE) +
// exp(sink)) and O' = O exp(LSE - LSE'). A row that sees no key keeps O = 0
// and gets LSE = sink, finite.
TEST(ReferenceCpuSinks, SinkRescalesTheRowAndFillsEmptyRows) {
  const AttentionShape s{2, 7, 4, 4, 2, 5, 0.0f, true};  // rows 0..2 see no key
  const Problem plain = random_problem(s, 41);
  Problem p = plain;
  p.sinks = {0.5, -1.0, 2.0, 0.0};
  const Result without = run_reference(s, plain), with = run_reference(s, p);
  const int64_t d = s.head_dim;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads_q; ++h) {
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const size_t row = (b * s.heads_q + h) * s.seqlen_q + i;
        const double lse = i < 3 ? p.sinks[h] : std::log(std::exp(without.lse[row]) + std::exp(p.sinks[h]));
        ASSERT_NEAR(with.lse[row], lse, 1e-13) << "b" << b << " h" << h << " row " << i;
        const double share = i < 3 ? 0.0 : std::exp(without.lse[row] - lse);
        for (int64_t c = 0; c < d; ++c) {
          const size_t x = ((b * s.seqlen_q + i) * s.heads_q + h) * d + c;
          ASSERT_NEAR(with.o[x], without.o[x] * share, 1e-13) << "b" << b << " h" << h << " row " << i;
        }
      }
    }
  }
}

// V's head dim 128 next to Q/K's 192, as FlashAttention-3's DeepSeek shape has
// it: the output has V's width and the default scale is 1 / sqrt(192).
TEST(ReferenceCpu, ValueHeadDimOfItsOwn) {
  for (bool causal : {false, true}) {
    const AttentionShape s = with_options({2, 3, 5, 4, 2, 192, 0.0f, causal}, -1, -1, 0.0, 128);
    SCOPED_TRACE(describe(s));
    const Problem p = random_problem(s, 51);
    const Result got = run_reference(s, p);
    ASSERT_EQ(got.o.size(), size_t(2 * 3 * 4 * 128));
    expect_same_result(got, naive_attention(s, p), 1e-12);
  }
}

// The backward with every option against central finite differences of the
// forward, as ReferenceCpuBackward.MatchesFiniteDifferences, over random small
// shapes (GQA, seqlen_q != seqlen_k, windows, rows that see nothing, head_dim_v
// != head_dim), with softcap and sinks each on and off. The sinks' gradients
// are checked too; the tolerance is relative to the largest gradient.
TEST(ReferenceCpuBackward, MatchesFiniteDifferencesWithOptions) {
  std::mt19937 rng(61);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int n = 0; n < 12; ++n) {
    const int64_t heads_kv = pick(1, 2);
    // A scale of 2 makes scores of a few units, so that a softcap of 1.2 bends them.
    AttentionShape s{pick(1, 2), pick(1, 6), pick(1, 6), heads_kv * pick(1, 3), heads_kv, pick(1, 5), 2.0f,
                     pick(0, 1) == 1};
    s.window_left = pick(-1, 3);
    s.window_right = pick(-1, 3);
    s.head_dim_v = pick(0, 5);
    for (double softcap : {0.0, 1.2}) {
      for (bool sinks : {false, true}) {
        s.softcap = softcap;
        SCOPED_TRACE(describe(s) + (sinks ? " sinks" : ""));
        Problem p = random_problem(s, unsigned(100 + n));
        if (sinks) p.sinks = random_values(s.heads_q, unsigned(200 + n));
        const std::vector<double> dout = random_values(s.batch * s.seqlen_q * s.heads_q * value_head_dim(s), 300);
        const Gradients g = run_backward(s, p, dout);
        double largest = 0;
        for (const auto* grad : {&g.dq, &g.dk, &g.dv, &g.dsinks})
          for (double x : *grad) largest = std::max(largest, std::fabs(x));
        expect_finite_differences(s, p, dout, 1e-6 * std::max(largest, 1.0));
      }
    }
  }
}

TEST(ReferenceCpu, RejectsInvalidOptions) {
  const AttentionShape ok{1, 2, 2, 1, 1, 2, 0.0f, false};
  EXPECT_TRUE(flash3::reference::is_valid(with_options(ok, 0, 0, 0.5, 3)));
  const AttentionShape bad[] = {
      with_options(ok, -2, -1),
      with_options(ok, -1, -2),
      with_options(ok, -1, -1, -0.5),
      with_options(ok, -1, -1, std::nan("")),
      with_options(ok, -1, -1, kInf),
      with_options(ok, -1, -1, 0.0, -1),
  };
  double x[8] = {};
  for (const AttentionShape& s : bad) {
    SCOPED_TRACE(describe(s));
    EXPECT_FALSE(flash3::reference::is_valid(s));
    EXPECT_THROW(attention_cpu(s, x, x, x, x, nullptr), std::invalid_argument);
    EXPECT_THROW(attention_backward_cpu(s, x, x, x, x, x, x, x), std::invalid_argument);
  }
}

// ---------------------------------------------------------------------------
// 16-bit conversions.

using flash3::reference::bf16_to_float;
using flash3::reference::float_to_bf16;
using flash3::reference::float_to_half;
using flash3::reference::half_to_float;

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

TEST(Conversions, KnownValues) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc040), -3.0f);
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // above the largest bf16 + half an ulp
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(-std::nanf("")))));

  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0xc200), -3.0f);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // the tie goes to the even neighbour, infinity
  EXPECT_EQ(float_to_half(70000.0f), 0x7c00);
  EXPECT_EQ(float_to_half(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);         // half the smallest subnormal: tie to 0
  EXPECT_EQ(float_to_half(std::ldexp(1.1f, -25)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -25)), 0x0002);         // tie between 1 and 2 ulps: to even
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -14) * 0.99999f), 0x0400);  // rounds up into the normals
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
}

// half_to_float against the format's definition, evaluated in double.
TEST(Conversions, HalfToFloatMatchesDefinition) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const int exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
    const double sign = (bits & 0x8000) ? -1.0 : 1.0;
    const float got = half_to_float(uint16_t(bits));
    if (exponent == 0x1f) {
      ASSERT_EQ(std::isnan(got), mantissa != 0) << std::hex << bits;
      if (mantissa == 0) {
        ASSERT_EQ(got, float(sign * kInf)) << std::hex << bits;
      }
      continue;
    }
    const double want = exponent == 0 ? sign * std::ldexp(double(mantissa), -24)
                                      : sign * std::ldexp(double(1024 + mantissa), exponent - 25);
    ASSERT_EQ(double(got), want) << std::hex << bits;
    ASSERT_EQ(std::signbit(got), (bits & 0x8000) != 0) << std::hex << bits;
  }
}

// Every non-NaN 16-bit value survives a round trip, signed zeros and infinities
// included.
TEST(Conversions, RoundTripIsExact) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if (!std::isnan(bf16_to_float(uint16_t(bits)))) {
      ASSERT_EQ(float_to_bf16(bf16_to_float(uint16_t(bits))), bits) << std::hex << bits;
    }
    if (!std::isnan(half_to_float(uint16_t(bits)))) {
      ASSERT_EQ(float_to_half(half_to_float(uint16_t(bits))), bits) << std::hex << bits;
    }
  }
}

// For every pair of adjacent finite values a < b of the format (subnormals
// included), of either sign: their midpoint (exact in float) goes to whichever
// has an even mantissa, and the floats just either side of it go to the nearer.
void check_rounding(float (*to_float)(uint16_t), uint16_t (*from_float)(float), uint32_t largest_finite) {
  for (uint32_t lo = 0; lo < largest_finite; ++lo) {
    const uint32_t hi = lo + 1;
    const float a = to_float(uint16_t(lo)), b = to_float(uint16_t(hi));
    const float mid = float((double(a) + double(b)) / 2);
    ASSERT_EQ(double(mid), (double(a) + double(b)) / 2);
    const uint32_t even = (lo & 1) ? hi : lo;
    for (uint32_t sign : {0x0000u, 0x8000u}) {
      const float m = sign ? -mid : mid;
      const float away = sign ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
      ASSERT_EQ(from_float(m), even | sign) << std::hex << lo;
      ASSERT_EQ(from_float(std::nextafter(m, 0.0f)), lo | sign) << std::hex << lo;
      ASSERT_EQ(from_float(std::nextafter(m, away)), hi | sign) << std::hex << lo;
    }
  }
}

TEST(Conversions, Bf16RoundsToNearestEven) { check_rounding(bf16_to_float, float_to_bf16, 0x7f7f); }

TEST(Conversions, HalfRoundsToNearestEven) { check_rounding(half_to_float, float_to_half, 0x7bff); }

// Values between the largest finite value and the next power of two: below the
// midpoint they round down to the largest finite, from it on to infinity.
TEST(Conversions, OverflowBoundary) {
  EXPECT_EQ(float_to_half(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);
  const float bf16_max = bf16_to_float(0x7f7f);
  const float bf16_mid = bf16_max + std::ldexp(1.0f, 127 - 8);  // half an ulp above
  EXPECT_EQ(bits_of(bf16_mid), 0x7f7f8000u);
  EXPECT_EQ(float_to_bf16(std::nextafter(bf16_mid, 0.0f)), 0x7f7f);
  EXPECT_EQ(float_to_bf16(bf16_mid), 0x7f80);
}

}  // namespace
