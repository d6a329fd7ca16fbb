// The varlen tile table's build on the device (common/varlen_tiles.h): one
// CTA. A counting sort by descending sort_key: the histogram and its scan by
// every thread, the stable placement and the tiles' prefix sums by warp 0,
// 32 sequences a step (sequences with equal keys take consecutive slots in
// index order, found with __match_any_sync).
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
  int tiles = 0;  // of the slots before this step's
  for (int first = 0; first < order.batch; first += 32) {
    int const s = first + t;
    int const b = s < order.batch ? order.table.order[s] : -1;
    int sum = b >= 0 ? order.m_blocks(b) * order.num_heads : 0;
    for (int d = 1; d < 32; d *= 2) {
      int const other = __shfl_up_sync(0xffffffffu, sum, d);
      if (t >= d) sum += other;
    }
    if (b >= 0) {
      order.table.tile_end[s] = tiles + sum;
      order.table.sections[s] = order.sequence_order(b).heads_per_section;
    }
    tiles += __shfl_sync(0xffffffffu, sum, 31);
  }
}

}  // namespace

cudaError_t build_varlen_tiles(VarlenTileOrder const& order, cudaStream_t stream) {
  build_kernel<<<1, kBuildThreads, 0, stream>>>(order);
  return cudaGetLastError();
}

}  // namespace flash3
