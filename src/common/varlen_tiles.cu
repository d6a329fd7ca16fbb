// The varlen tile table's build on the device (common/varlen_tiles.h): one
// CTA. A counting sort by descending sort_key: the histogram and its scan by
// every thread, the stable placement and the tiles' prefix sums by warp 0,
// 32 sequences a step (sequences with equal keys take consecutive slots in
// index order, found with __match_any_sync), and its groups of equal
// lengths. Then a grid expands the tiles' coordinates.
#include <cub/block/block_scan.cuh>

#include "common/varlen_tiles.h"

namespace flash3 {
namespace {

constexpr int kBuildThreads = 512;
constexpr int kBuckets = VarlenTileOrder::kMaxKeyBlocks + 1;
constexpr int kBucketsPerThread = (kBuckets + kBuildThreads - 1) / kBuildThreads;

__global__ void __launch_bounds__(kBuildThreads) build_kernel(VarlenTileOrder const order) {
  using Scan = cub::BlockScan<int, kBuildThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int next_slot[kBuckets];  // per key: the histogram, then the next free slot
  int const t = int(threadIdx.x);
  for (int i = t; i < kBuckets; i += kBuildThreads) next_slot[i] = 0;
  __syncthreads();
  for (int b = t; b < order.batch; b += kBuildThreads) atomicAdd(&next_slot[order.sort_key(b)], 1);
  __syncthreads();
  // Bucket i of the scan is key kMaxKeyBlocks - i: the largest keys first.
  int counts[kBucketsPerThread];
  for (int j = 0; j < kBucketsPerThread; ++j) {
    int const i = t * kBucketsPerThread + j;
    counts[j] = i < kBuckets ? next_slot[kBuckets - 1 - i] : 0;
  }
  Scan(scan_storage).ExclusiveSum(counts, counts);
  __syncthreads();
  for (int j = 0; j < kBucketsPerThread; ++j) {
    int const i = t * kBucketsPerThread + j;
    if (i < kBuckets) next_slot[kBuckets - 1 - i] = counts[j];
  }
  __syncthreads();
  if (t >= 32) return;
  unsigned const below = (1u << t) - 1u;
  for (int first = 0; first < order.batch; first += 32) {
    int const b = first + t;
    int const key = b < order.batch ? order.sort_key(b) : -1;
    unsigned const peers = __match_any_sync(0xffffffffu, key);
    int const slot = key >= 0 ? next_slot[key] + __popc(peers & below) : 0;
    __syncwarp();
    // The last of each group of equal keys moves its bucket on.
    if (key >= 0 && (peers >> t) == 1u) next_slot[key] += __popc(peers);
    __syncwarp();
    if (key >= 0) order.table.order[slot] = b;
  }
  __syncwarp();
  int tiles = 0, group = 0;  // of the slots before this step's
  for (int first = 0; first < order.batch; first += 32) {
    int const s = first + t;
    int const b = s < order.batch ? order.table.order[s] : -1;
    int sum = b >= 0 ? order.m_blocks(b) * order.num_heads : 0;
    // A group starts where a slot differs from the one before it.
    int const before = __shfl_up_sync(0xffffffffu, b, 1);
    int const previous = t > 0 ? before : (s > 0 ? order.table.order[s - 1] : -1);
    int start = b >= 0 && (previous < 0 || !order.same_group(previous, b)) ? s : group;
    for (int d = 1; d < 32; d *= 2) {
      int const other = __shfl_up_sync(0xffffffffu, sum, d);
      int const other_start = __shfl_up_sync(0xffffffffu, start, d);
      if (t >= d) {
        sum += other;
        start = max(start, other_start);
      }
    }
    if (b >= 0) {
      order.table.tile_end[s] = tiles + sum;
      order.table.group_first[s] = start;
    }
    tiles += __shfl_sync(0xffffffffu, sum, 31);
    group = __shfl_sync(0xffffffffu, start, 31);
  }
  __syncwarp();
  for (int s = t; s < order.batch; s += 32) {
    int const g = order.table.group_first[s];
    if (s + 1 == order.batch || order.table.group_first[s + 1] != g) {
      order.table.group_size[g] = s - g + 1;
      order.table.sections[g] = order.group_sections(order.table.order[g], s - g + 1);
    }
  }
}

constexpr int kExpandThreads = 256;

__global__ void __launch_bounds__(kExpandThreads) expand_kernel(VarlenTileOrder const order) {
  int const i = int(blockIdx.x) * kExpandThreads + int(threadIdx.x);
  if (i < order.num_tiles()) order.table.tiles[i] = order.tile(i);
}

}  // namespace

cudaError_t build_varlen_tiles(VarlenTileOrder const& order, int64_t max_tiles, cudaStream_t stream) {
  build_kernel<<<1, kBuildThreads, 0, stream>>>(order);
  if (max_tiles > 0) {
    expand_kernel<<<unsigned((max_tiles + kExpandThreads - 1) / kExpandThreads), kExpandThreads, 0, stream>>>(order);
  }
  return cudaGetLastError();
}

}  // namespace flash3
