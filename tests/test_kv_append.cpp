// Appending to a KV cache, without a GPU: validate()'s checks of
// ForwardArgs::kv_cache.append (each field named), where the key map puts
// appended keys and how many keys an entry then has, the rotary rule for
// Q's positions, and the host rotary reference the GPU tests use.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "common/kv_cache.h"
#include "expect_invalid.h"
#include "flash3/flash3.h"
#include "fwd/launch_append.h"
#include "rotary_reference.h"
#include "valid_args.h"

namespace {

using flash3::ForwardArgs;
using flash3::Status;

// valid_cache_args() appending 3 rows per entry, rotated over 64 dims.
ForwardArgs valid_append_args() {
  ForwardArgs a = flash3::testing::valid_cache_args();
  flash3::KvAppend& n = a.kv_cache.append;
  n.seqlen_new = 3;
  n.k = flash3::contiguous<const void*>(flash3::testing::fake_address(0xc0000), 3, a.heads_kv, a.head_dim);
  n.v = flash3::contiguous<const void*>(flash3::testing::fake_address(0xd0000), 3, a.heads_kv, a.head_dim);
  n.rotary_cos = flash3::testing::fake_address(0xe0000);
  n.rotary_sin = flash3::testing::fake_address(0xf0000);
  n.rotary_seqlen = a.seqlen_k;
  n.rotary_dim = 64;
  n.rotary_interleaved = true;
  return a;
}

void expect_invalid(std::function<void(ForwardArgs&)> const& edit, std::string const& names) {
  flash3::testing::expect_invalid_args(valid_append_args(), edit, names);
}

TEST(KvAppendValidation, ValidArgumentsPass) {
  EXPECT_TRUE(flash3::validate(valid_append_args()).ok());
  ForwardArgs a = valid_append_args();
  a.kv_cache.append.rotary_cos = nullptr;  // an append without rotary embedding
  a.kv_cache.append.rotary_sin = nullptr;
  a.kv_cache.append.rotary_dim = 0;
  EXPECT_TRUE(flash3::validate(a).ok());
  a = valid_append_args();
  a.kv_cache.append.rotary_dim = a.head_dim;
  a.kv_cache.append.rotary_seqlen = a.seqlen_k + 1;
  a.kv_cache.append.seqlen_new = a.seqlen_k;
  a.kv_cache.append.k = flash3::contiguous(a.kv_cache.append.k.data, a.seqlen_k, a.heads_kv, a.head_dim);
  a.kv_cache.append.v = flash3::contiguous(a.kv_cache.append.v.data, a.seqlen_k, a.heads_kv, a.head_dim);
  EXPECT_TRUE(flash3::validate(a).ok());
}

TEST(KvAppendValidation, FieldsWithoutAnAppend) {
  auto without_k = [](ForwardArgs& a) {
    a.kv_cache.append = {};
  };
  EXPECT_TRUE(flash3::validate([&] { ForwardArgs a = valid_append_args(); without_k(a); return a; }()).ok());
  expect_invalid([&](ForwardArgs& a) { without_k(a); a.kv_cache.append.v.data = a.q.data; }, "kv_cache.append.v");
  expect_invalid([&](ForwardArgs& a) { without_k(a); a.kv_cache.append.seqlen_new = 1; },
                 "kv_cache.append.seqlen_new");
  expect_invalid([&](ForwardArgs& a) { without_k(a); a.kv_cache.append.rotary_sin = a.q.data; },
                 "kv_cache.append.rotary_cos");
  expect_invalid([&](ForwardArgs& a) { without_k(a); a.kv_cache.append.rotary_dim = 64; },
                 "kv_cache.append.rotary_dim");
  // An append needs a cache to append to.
  expect_invalid([](ForwardArgs& a) { a.kv_cache.seqlens = nullptr; a.kv_cache.batch_cache = 0;
                                      a.kv_cache.num_splits = 1; },
                 "kv_cache.append.k");
}

TEST(KvAppendValidation, NewKeysAndValues) {
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.v.data = nullptr; }, "kv_cache.append.v.data");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.seqlen_new = 0; }, "kv_cache.append.seqlen_new");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.seqlen_new = a.seqlen_k + 1; }, "kv_cache.append.seqlen_new");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.k.data = flash3::testing::fake_address(0xc0008); },
                 "kv_cache.append.k.data");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.k.seq_stride = 100; }, "kv_cache.append.k.seq_stride");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.k.dim_stride = 2; }, "kv_cache.append.k.dim_stride");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.v.batch_stride = -8; }, "kv_cache.append.v.batch_stride");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.v.head_stride = 0; }, "kv_cache.append.v.head_stride");
  expect_invalid([](ForwardArgs& a) {
    a.seqlen_q = 0;
    a.q = flash3::contiguous(a.q.data, 0, a.heads_q, a.head_dim);
    a.o = flash3::contiguous(a.o.data, 0, a.heads_q, a.head_dim);
  }, "seqlen_q");
}

TEST(KvAppendValidation, RotaryTables) {
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.rotary_sin = nullptr; }, "kv_cache.append.rotary_sin");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.rotary_cos = nullptr; }, "kv_cache.append.rotary_cos");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.rotary_cos = nullptr; a.kv_cache.append.rotary_sin = nullptr; },
                 "kv_cache.append.rotary_dim");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.rotary_cos = flash3::testing::fake_address(0xe0004); },
                 "kv_cache.append.rotary_cos");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.rotary_sin = flash3::testing::fake_address(0xf0008); },
                 "kv_cache.append.rotary_sin");
  for (int64_t dim : {0, 8, 30, 136, 256}) {
    expect_invalid([dim](ForwardArgs& a) { a.kv_cache.append.rotary_dim = dim; }, "kv_cache.append.rotary_dim");
  }
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.rotary_seqlen = a.seqlen_k - 1; },
                 "kv_cache.append.rotary_seqlen");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.append.rotary_seqlen = int64_t(1) << 31; },
                 "kv_cache.append.rotary_seqlen");
}

TEST(KvAppendValidation, ForwardRejectsBeforeTouchingTheDevice) {
  ForwardArgs a = valid_append_args();
  a.kv_cache.append.rotary_dim = 7;
  EXPECT_EQ(flash3::forward(a, nullptr).code(), Status::Code::kInvalidArgument);
}

// Where an appended key goes: its row counted from the entry's row 0
// (leftpad included) in the entry cache_batch_idx picks, or through the page
// table.
TEST(KvCacheMap, RowOfAKey) {
  int32_t const seqlens[] = {10, 0, 5};
  int32_t const leftpad[] = {3, 0, 9};
  int32_t const idx[] = {2, 0, 1};
  flash3::KvCacheMap const padded{seqlens, idx, leftpad};
  flash3::KvCacheMap::Row const r = padded.row_of(0, seqlens[0] + 2);
  EXPECT_EQ(r.entry, 2);
  EXPECT_EQ(r.row, 12);
  EXPECT_EQ(flash3::KvCacheMap{seqlens}.row_of(1, 0).entry, 1);
  int32_t const table[] = {7, 3, 5, 0, 1, 2};  // rows of 3 columns
  int32_t const paged_lens[] = {31, 16};
  flash3::KvCacheMap const paged{paged_lens, nullptr, nullptr, table, 3, 16};
  for (auto [b, key, page, row] : {std::tuple{0, 31, 3, 15}, std::tuple{0, 32, 5, 0}, std::tuple{1, 16, 1, 0},
                                   std::tuple{1, 17, 1, 1}, std::tuple{0, 0, 7, 0}}) {
    flash3::KvCacheMap::Row const p = paged.row_of(b, key);
    EXPECT_EQ(p.entry, page) << b << " " << key;
    EXPECT_EQ(p.row, row) << b << " " << key;
  }
}

// Query rows take positions of their own with a causal mask or a window
// (after trimming sides wider than the sequences), one position otherwise.
TEST(KvAppendRotary, QueryPositionRule) {
  ForwardArgs a = valid_append_args();
  a.seqlen_q = 4;
  EXPECT_FALSE(flash3::fwd::rotary_position_per_row(a));
  a.causal = true;
  EXPECT_TRUE(flash3::fwd::rotary_position_per_row(a));
  a.causal = false;
  a.window_left = 100;
  EXPECT_TRUE(flash3::fwd::rotary_position_per_row(a));
  a.window_left = a.seqlen_k - 1;  // the whole cache: no window
  EXPECT_FALSE(flash3::fwd::rotary_position_per_row(a));
  a.window_left = -1;
  a.window_right = 2;
  EXPECT_TRUE(flash3::fwd::rotary_position_per_row(a));
  a.window_right = 3;
  EXPECT_FALSE(flash3::fwd::rotary_position_per_row(a));
}

// The reference: angle 0 leaves a row, a quarter turn maps each pair (x0, x1)
// to (-x1, x0), the dims past rotary_dim stay, two turns add their angles,
// and interleaved pairs are the halves' pairs under a permutation.
TEST(KvAppendRotary, HostReference) {
  int const d = 16, rd = 8;
  std::vector<float> x(d), y;
  for (int i = 0; i < d; ++i) x[i] = float(i + 1);
  std::vector<float> one(rd / 2, 1.f), zero(rd / 2, 0.f);
  for (bool interleaved : {false, true}) {
    y = x;
    flash3::testing::rotate_row(y.data(), rd, one.data(), zero.data(), interleaved);
    EXPECT_EQ(y, x);
    y = x;
    flash3::testing::rotate_row(y.data(), rd, zero.data(), one.data(), interleaved);
    for (int p = 0; p < rd / 2; ++p) {
      int const i0 = interleaved ? 2 * p : p, i1 = interleaved ? 2 * p + 1 : p + rd / 2;
      EXPECT_EQ(y[i0], -x[i1]);
      EXPECT_EQ(y[i1], x[i0]);
    }
    for (int i = rd; i < d; ++i) EXPECT_EQ(y[i], x[i]);
  }
  std::vector<float> ca(rd / 2), sa(rd / 2), cb(rd / 2), sb(rd / 2), cab(rd / 2), sab(rd / 2);
  for (int p = 0; p < rd / 2; ++p) {
    float const a = 0.3f * (p + 1), b = -1.1f + p;
    ca[p] = std::cos(a), sa[p] = std::sin(a), cb[p] = std::cos(b), sb[p] = std::sin(b);
    cab[p] = std::cos(a + b), sab[p] = std::sin(a + b);
  }
  std::vector<float> twice = x, once = x;
  flash3::testing::rotate_row(twice.data(), rd, ca.data(), sa.data(), false);
  flash3::testing::rotate_row(twice.data(), rd, cb.data(), sb.data(), false);
  flash3::testing::rotate_row(once.data(), rd, cab.data(), sab.data(), false);
  for (int i = 0; i < d; ++i) EXPECT_NEAR(twice[i], once[i], 1e-5f) << i;
  std::vector<float> halves = x, inter(d);
  for (int p = 0; p < rd / 2; ++p) inter[2 * p] = x[p], inter[2 * p + 1] = x[p + rd / 2];
  for (int i = rd; i < d; ++i) inter[i] = x[i];
  flash3::testing::rotate_row(halves.data(), rd, ca.data(), sa.data(), false);
  flash3::testing::rotate_row(inter.data(), rd, ca.data(), sa.data(), true);
  for (int p = 0; p < rd / 2; ++p) {
    EXPECT_EQ(inter[2 * p], halves[p]);
    EXPECT_EQ(inter[2 * p + 1], halves[p + rd / 2]);
  }
}

}  // namespace
