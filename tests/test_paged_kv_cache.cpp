// A paged KV cache's host side, without a GPU: validate()'s checks of the
// page table's fields, and the walk that gives each 16-row box of a key block
// its page and row.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/kv_cache.h"
#include "expect_invalid.h"
#include "flash3/flash3.h"
#include "valid_args.h"

namespace {

using flash3::ForwardArgs;
using flash3::PagedBoxes;
using flash3::Status;

// A valid paged decoding call: valid_cache_args' q against a pool of 10
// pages of 64 rows, each entry up to 5 pages (seqlen_k 320).
ForwardArgs valid_paged_args() {
  ForwardArgs a = flash3::testing::valid_cache_args();
  a.seqlen_k = 320;
  a.k = flash3::contiguous<const void*>(a.k.data, 64, a.heads_kv, a.head_dim);
  a.v = flash3::contiguous<const void*>(a.v.data, 64, a.heads_kv, a.head_dim);
  a.kv_cache.batch_cache = 10;
  a.kv_cache.page_table = reinterpret_cast<const int32_t*>(0x84000);
  a.kv_cache.page_table_stride = 5;
  a.kv_cache.page_size = 64;
  return a;
}

void expect_invalid(std::function<void(ForwardArgs&)> const& edit, std::string const& names) {
  flash3::testing::expect_invalid_args(valid_paged_args(), edit, names);
}

TEST(PagedKvCacheValidation, ValidArgumentsPass) {
  EXPECT_TRUE(flash3::validate(valid_paged_args()).ok());
  for (int64_t page_size : {16, 48, 256}) {
    ForwardArgs a = valid_paged_args();
    a.kv_cache.page_size = page_size;
    a.seqlen_k = 4 * page_size;
    a.k = flash3::contiguous<const void*>(a.k.data, page_size, a.heads_kv, a.head_dim);
    a.v = flash3::contiguous<const void*>(a.v.data, page_size, a.heads_kv, a.head_dim);
    a.causal = true;
    EXPECT_TRUE(flash3::validate(a).ok()) << page_size;
  }
  ForwardArgs a = valid_paged_args();
  a.kv_cache.batch_cache = 1;  // fewer pages than entries: entries may share them
  a.kv_cache.page_table_stride = 0;
  EXPECT_TRUE(flash3::validate(a).ok());
}

TEST(PagedKvCacheValidation, PageSizeIsAMultipleOf16) {
  for (int64_t page_size : {0, -16, 8, 24, 100}) {
    Status const s = flash3::testing::expect_invalid_args<ForwardArgs>(
        valid_paged_args(), [page_size](ForwardArgs& a) { a.kv_cache.page_size = page_size; }, "kv_cache.page_size");
    EXPECT_NE(s.message().find("multiple of 16"), std::string::npos) << s.message();
  }
}

TEST(PagedKvCacheValidation, TableFields) {
  expect_invalid([](ForwardArgs& a) { a.kv_cache.page_table = reinterpret_cast<const int32_t*>(0x84002); },
                 "kv_cache.page_table");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.page_table_stride = -1; }, "kv_cache.page_table_stride");
  expect_invalid([](ForwardArgs& a) { a.seqlen_k = 300; }, "seqlen_k");  // not whole pages
  expect_invalid([](ForwardArgs& a) { a.kv_cache.batch_idx = reinterpret_cast<const int32_t*>(0x81000); },
                 "kv_cache.batch_idx");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.leftpad = reinterpret_cast<const int32_t*>(0x82000); },
                 "kv_cache.leftpad");
}

TEST(PagedKvCacheValidation, FieldsWithoutATable) {
  expect_invalid([](ForwardArgs& a) { a.kv_cache.page_table = nullptr; }, "kv_cache.page_size");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.page_table = nullptr; a.kv_cache.page_size = 0; },
                 "kv_cache.page_table_stride");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.seqlens = nullptr; a.kv_cache.batch_cache = 0;
                                      a.kv_cache.num_splits = 1; },
                 "kv_cache.page_table");
}

// K and V are the pool: [batch_cache pages, page_size, heads_kv, d].
TEST(PagedKvCacheValidation, CachesAreThePool) {
  expect_invalid([](ForwardArgs& a) { a.k.data = nullptr; }, "k.data");
  expect_invalid([](ForwardArgs& a) { a.v.seq_stride = 3; }, "v.seq_stride");
  ForwardArgs a = valid_paged_args();
  a.k.batch_stride = a.v.batch_stride = 2 * 64 * a.heads_kv * a.head_dim;  // pages apart in a larger buffer
  EXPECT_TRUE(flash3::validate(a).ok());
}

// Each box's page and row against key / page_size and key % page_size, for
// blocks from any key block start; boxes past the keys get page -1 and
// never read the table there.
TEST(PagedBoxes, EachBoxFromItsPage) {
  for (int page_size : {16, 48, 64, 256}) {
    int const max_pages = 12;
    std::vector<int32_t> table(2 * max_pages);
    for (int i = 0; i < int(table.size()); ++i) table[i] = 1000 + 7 * i;
    for (int keys : {0, 1, 15, 16, 17, page_size, page_size + 1, 5 * page_size - 3}) {
      int32_t const seqlens[] = {0, keys};
      flash3::KvCacheMap m{seqlens};
      m.page_table = table.data();
      m.page_table_stride = max_pages;
      m.page_size = page_size;
      for (int first = 0; first < 6 * 64; first += 64) {
        PagedBoxes walk(m, 1, first);
        for (int box = 0; box < 8; ++box, walk.next()) {
          int const key = first + box * PagedBoxes::kRows;
          int const want = key < keys ? table[max_pages + key / page_size] : -1;
          EXPECT_EQ(walk.page(), want) << page_size << " " << keys << " " << key;
          if (key < keys) EXPECT_EQ(walk.row, key % page_size) << page_size << " " << key;
        }
      }
    }
  }
}

// A block loads whole where pages are a multiple of its keys and it holds
// keys only: its page is the table's entry for its first key; else boxes.
TEST(PagedBlock, WholeWhereOnePageHoldsOnlyKeys) {
  std::vector<int32_t> table = {5, 6, 7, 8, 9, 10, 11, 12};
  for (int page_size : {16, 64, 128, 256}) {
    for (int keys : {0, 63, 64, 65, 200, 512}) {
      int32_t const seqlens[] = {0, keys};
      flash3::KvCacheMap m{seqlens};
      m.page_table = table.data();
      m.page_table_stride = 4;
      m.page_size = page_size;
      for (int first = 0; first < 512; first += 64) {
        flash3::PagedBlock const b = flash3::paged_block<64>(m, 1, first);
        bool const whole = page_size % 64 == 0 && first + 64 <= keys;
        EXPECT_EQ(b.whole, whole) << page_size << " " << keys << " " << first;
        if (whole) EXPECT_EQ(b.page, table[4 + first / page_size]) << page_size << " " << first;
      }
    }
  }
}

}  // namespace
