// FP8 (e4m3) quantization of Q, K, V with descale factors and the optional
// Hadamard transform of Q and K (paper §3.3). Memory-bound; plain CUDA.
//
// A CTA owns kCtaRows rows of one (batch, head). Each row is split among
// kHeadDim / 16 consecutive threads of a warp, 16 elements each (two 16-byte
// loads; the 16 e4m3 results are one 16-byte store), and each thread holds
// kRowsPerThread rows, all loads issued before any use. With the transform, a
// thread flips the signs on the 16-bit inputs, widens them to float32 and runs
// the fast Walsh-Hadamard transform (4 butterfly stages within the thread,
// log2(kHeadDim / 16) across threads through shuffles, then 1/sqrt(d)) on
// values it keeps in registers; without it, it keeps the raw 16-bit words and
// takes the absolute maximum on them, two at a time. The maximum is reduced
// over the warp (shuffles), then the CTA (shared memory).
//
// kPerBlock (Pass::kFused): one pass. A scale block of R rows is one CTA, or
// a cluster of CTAs of equal parts (head dim 256, R = 96: two of 48 rows;
// head dim 128, R = 192: two of 96) that exchange their amax through
// distributed shared memory, so that no CTA holds more than 64 float32 values
// per thread. The CTA then writes e4m3 and the scale.
// kPerTensor: the scale is zeroed (cudaMemsetAsync), Pass::kAmax folds each
// CTA's amax into it with an atomicMax on the bits of (amax | sign bit)
// (order-preserving on non-negative floats, and marked as "an amax, not yet a
// scale" by the sign bit), and Pass::kQuantize re-reads the input
// (recomputing the same transform), turns the slot into the scale and
// quantizes; the first tile's CTA overwrites the slot with the (positive)
// scale, which any CTA that reads it afterwards takes as is. The input is
// read twice: a tensor larger than L2 cannot wait on chip for its amax.
// kPerHead (Pass::kPerHead): one kernel, a cluster per (batch, head) that
// takes the head's amax, exchanges it through distributed shared memory and
// quantizes; with few heads in flight their second reads are served by L2.
// Tensors that can share the launch do (HeadJobs), so that its last,
// partly filled wave of clusters comes once rather than once per tensor.
//
// Every float operation is the same in quantize_cpu (reference/), in the same
// order (quant/hadamard.h holds the shared parts), so that the two agree bit
// for bit; the result does not depend on the launch configuration (max is
// exact, and each element's arithmetic is fixed).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "fwd/tile_size.h"
#include "quant/hadamard.h"
#include "quant/quantize.h"

namespace flash3::quant {
namespace {

namespace cg = cooperative_groups;

enum class Pass { kFused, kAmax, kQuantize, kPerHead };

constexpr int kHeadCluster = 16;  // kPerHead: the most CTAs of one head (a non-portable cluster)

// kPerHead: CTAs of a head's cluster. A CTA a tile while that keeps the
// cluster to 8 CTAs; past that, two tiles a CTA, up to kHeadCluster CTAs:
// 16-CTA clusters of one tile each, and CTAs of four tiles, reach less of the
// copy bandwidth than 8 CTAs of two (why is open: neither L2 nor one CTA's
// load latency binds).
constexpr int64_t head_cluster(int64_t tiles_per_head) {
  if (tiles_per_head <= 8) return std::max<int64_t>(1, tiles_per_head);
  return std::min<int64_t>(kHeadCluster, (tiles_per_head + 1) / 2);
}

constexpr int kVec = 16;           // elements of a row per thread: 32 bytes in, 16 bytes out
constexpr int kRowsPerThread = 4;  // rows per thread: 64 float32 registers
constexpr int kMaxThreads = 256;
constexpr uint32_t kAmaxMark = 0x80000000u;  // sign bit: the slot holds an amax, not a scale

struct TensorParams {
  uint16_t const* in;  // bf16 or fp16
  int64_t in_batch_stride, in_seq_stride, in_head_stride;
  uint8_t* out;  // e4m3
  int64_t out_batch_stride, out_seq_stride, out_head_stride;
  float* scale;
  int64_t seqlen;
  int64_t heads;
  int64_t tiles_per_head;  // tiles of the kernel (kFused: scale blocks) along the sequence of one (batch, head)
  uint64_t signs[4];       // bit i % 64 of signs[i / 64]: column i is negated (with kHadamard)
};

// kPerHead: up to three tensors in one launch, their (batch, head) clusters
// one after the other, so that one launch's last wave, not three, runs short.
struct HeadJobs {
  TensorParams tensor[3];
  int64_t first_cluster[4];  // tensor i's clusters are [first_cluster[i], first_cluster[i + 1])
  int count;
};

// Rows a CTA owns: the scale block, or when kMaxThreads threads cannot hold
// it (over 64 rows at head dim 256, over 128 at head dim 128), an equal part
// of it.
constexpr int cta_rows(int head_dim, int block_rows) {
  int const most = kMaxThreads * kRowsPerThread * kVec / head_dim;
  return block_rows / ((block_rows + most - 1) / most);
}

// The float32 of a bf16 placed in the high half of `bits`, a subnormal
// flushed to a zero of its sign (bf16 shares float32's exponent range, so this
// is where float32 subnormals could come from; fp16's are normal floats).
__device__ __forceinline__ float flushed_float(uint32_t bits) {
  return __uint_as_float((bits & 0x7F800000u) != 0u ? bits : (bits & 0x80000000u));
}

template <bool kBF16>
__device__ __forceinline__ void widen(uint32_t w, float& lo, float& hi) {
  if constexpr (kBF16) {
    lo = flushed_float(w << 16);
    hi = flushed_float(w & 0xFFFF0000u);
  } else {
    __half2 h;
    static_assert(sizeof(h) == sizeof(w));
    __builtin_memcpy(&h, &w, sizeof(w));
    float2 const f = __half22float2(h);
    lo = f.x;
    hi = f.y;
  }
}

// Elementwise max(m, |w|) of two packed 16-bit values (exact; a NaN loses to
// a number, as with fmaxf).
template <bool kBF16>
__device__ __forceinline__ uint32_t max_abs2(uint32_t m, uint32_t w) {
  w &= 0x7FFF7FFFu;
  uint32_t r;
  if constexpr (kBF16) {
    __nv_bfloat162 a, b;
    __builtin_memcpy(&a, &m, 4);
    __builtin_memcpy(&b, &w, 4);
    __nv_bfloat162 const c = __hmax2(a, b);
    __builtin_memcpy(&r, &c, 4);
  } else {
    __half2 a, b;
    __builtin_memcpy(&a, &m, 4);
    __builtin_memcpy(&b, &w, 4);
    __half2 const c = __hmax2(a, b);
    __builtin_memcpy(&r, &c, 4);
  }
  return r;
}

// Two floats to e4m3 (round to nearest even, saturating), `a` in the low byte.
__device__ __forceinline__ uint32_t e4m3x2(float a, float b) {
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}

template <bool kBF16, int kHeadDim, int kCtaRows, int kCluster, bool kHadamard, Pass kPass>
struct Config {
  static constexpr int kRowThreads = kHeadDim / kVec;  // threads per row, consecutive lanes of a warp
  static constexpr int kThreads = kCtaRows * kRowThreads / kRowsPerThread;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRowStep = kCtaRows / kRowsPerThread;  // between the rows of one thread
  // Registers: the transform keeps 64 float32 values per thread live (2
  // CTAs of 256 threads per SM); without it a thread needs its 32 words of
  // raw input and some of their widened values (3 CTAs per SM, 85 registers).
  static constexpr int kMinBlocks = (kHadamard ? 2 : 3) * kMaxThreads / kThreads;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256);
  static_assert(kCtaRows % kRowsPerThread == 0 && kThreads % 32 == 0 && kThreads <= kMaxThreads);
  static_assert(kCtaRows >= kMinTileRows, "validate() bounds the grid with kMinTileRows");
  // quant/quantize.h's bound on the CTAs of a launch (validate() relies on it)
  // holds for clusters of at most kMaxCluster CTAs. (kPerHead's cluster is
  // chosen at launch: at most as many CTAs as the head has tiles.)
  static_assert(kCluster >= 1 && kCluster <= kMaxCluster && (kCluster == 1 || kPass == Pass::kFused));
};

// The 16 values of row e: raw 16-bit words (sign flips already applied) to float32.
template <bool kBF16>
__device__ __forceinline__ void widen_row(uint32_t const (&w)[8], float (&v)[kVec]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) widen<kBF16>(w[i], v[2 * i], v[2 * i + 1]);
}

// 16 values times `inv` to e4m3, as one 16-byte vector (element 0 in byte 0).
__device__ __forceinline__ uint4 quantize16(float const (&v)[kVec], float inv) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = e4m3x2(v[4 * i] * inv, v[4 * i + 1] * inv) | (e4m3x2(v[4 * i + 2] * inv, v[4 * i + 3] * inv) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The kRowsPerThread rows a thread holds of a tile (first_row, first_row +
// row_step, ...), 16 columns of each (those of `slot`).
template <bool kBF16, int kHeadDim, bool kHadamard>
struct ThreadRows {
  static constexpr int kT = kHeadDim / kVec;  // threads per row
  static constexpr int kE = kRowsPerThread;
  uint32_t w[kE][8];  // raw 16-bit pairs (with the transform: signs flipped)
  float v[kE][kVec];  // float32 values (with the transform: transformed)

  // 2 x 16 bytes per row, all in flight at once. Rows past the sequence read
  // as zeros, which change no maximum, and are not stored.
  __device__ __forceinline__ void load(uint16_t const* in, int64_t seq_stride, int64_t first_row, int row_step,
                                       int64_t seqlen) {
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      int64_t const row = first_row + e * row_step;
      uint4 lo = make_uint4(0u, 0u, 0u, 0u), hi = lo;
      if (row < seqlen) {
        uint4 const* src = reinterpret_cast<uint4 const*>(in + row * seq_stride);
        lo = __ldg(src);
        hi = __ldg(src + 1);
      }
      w[e][0] = lo.x, w[e][1] = lo.y, w[e][2] = lo.z, w[e][3] = lo.w;
      w[e][4] = hi.x, w[e][5] = hi.y, w[e][6] = hi.z, w[e][7] = hi.w;
    }
  }

  // With the transform: x -> x diag(s) H / sqrt(d) in float32, kept in v.
  // The butterflies in the reference's order: h = 1, 2, 4, 8 within the
  // thread, then 16, 32, ... across the row's threads (lane ^ h / 16).
  __device__ __forceinline__ void transform(uint64_t const (&sign_bits)[4], int slot) {
    if constexpr (kHadamard) {
      // The signs flip the 16-bit sign bits (exact, and subnormals are
      // flushed to zeros of the flipped sign either way).
      uint32_t const signs = uint32_t(sign_bits[slot / 4] >> ((slot % 4) * 16)) & 0xFFFFu;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        uint32_t const flip = (((signs >> (2 * i)) & 1u) << 15) | (((signs >> (2 * i + 1)) & 1u) << 31);
#pragma unroll
        for (int e = 0; e < kE; ++e) w[e][i] ^= flip;
      }
#pragma unroll
      for (int e = 0; e < kE; ++e) widen_row<kBF16>(w[e], v[e]);
#pragma unroll
      for (int hh = 1; hh < kVec; hh *= 2) {
#pragma unroll
        for (int e = 0; e < kE; ++e) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            if ((j & hh) == 0) {
              float const x = v[e][j], y = v[e][j + hh];
              v[e][j] = x + y;
              v[e][j + hh] = x - y;
            }
          }
        }
      }
#pragma unroll
      for (int m = 1; m < kT; m *= 2) {
        // The thread of the lower index keeps x + y, that of the upper x - y
        // (its partner's value minus its own): one FMA by +-1, exact but for
        // the single rounding of the sum, as the reference's add and subtract.
        float const sign = (slot & m) != 0 ? -1.0f : 1.0f;
#pragma unroll
        for (int e = 0; e < kE; ++e) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            float const other = __shfl_xor_sync(0xFFFFFFFFu, v[e][j], m);
            v[e][j] = fmaf(v[e][j], sign, other);
          }
        }
      }
      float const norm = hadamard_norm(kHeadDim);
#pragma unroll
      for (int e = 0; e < kE; ++e) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[e][j] = v[e][j] * norm;
      }
    }
  }

  // This thread's absolute maximum (after transform()).
  __device__ __forceinline__ float amax() const {
    float amax = 0.0f;
    if constexpr (kHadamard) {
#pragma unroll
      for (int e = 0; e < kE; ++e) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) amax = fmaxf(amax, fabsf(v[e][j]));
      }
    } else {
      // On the raw 16-bit values, two at a time (the max of the widened
      // values, since widening is exact and, with the flush, monotonic).
      uint32_t m = 0u;
#pragma unroll
      for (int e = 0; e < kE; ++e) {
#pragma unroll
        for (int i = 0; i < 8; ++i) m = max_abs2<kBF16>(m, w[e][i]);
      }
      float lo, hi;
      widen<kBF16>(m, lo, hi);
      amax = fmaxf(lo, hi);
    }
    return amax;
  }

  // The rows times `inv` to e4m3, 16 bytes per row (after transform()).
  __device__ __forceinline__ void store(uint8_t* out, int64_t seq_stride, int64_t first_row, int row_step,
                                        int64_t seqlen, float inv) {
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      int64_t const row = first_row + e * row_step;
      if constexpr (!kHadamard) widen_row<kBF16>(w[e], v[e]);
      uint4 const q = quantize16(v[e], inv);
      if (row < seqlen) *reinterpret_cast<uint4*>(out + row * seq_stride) = q;
    }
  }
};

// The shared memory of the reductions below: one object, so that the
// compiler cannot give the two parts one address (as it did to two function-
// local buffers, whose lifetimes it judged apart from one thread's view).
struct AmaxScratch {
  float warp[kMaxThreads / 32];
  float cta;
};

// The maximum of `amax` over the CTA's threads: warp shuffles, then shared
// memory (once per kernel: the buffer is not reused).
template <int kWarps>
__device__ __forceinline__ float cta_max(float amax, AmaxScratch& scratch) {
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, m));
  if (threadIdx.x % 32 == 0) scratch.warp[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = scratch.warp[0];
#pragma unroll
  for (int i = 1; i < kWarps; ++i) amax = fmaxf(amax, scratch.warp[i]);
  return amax;
}

// The maximum over the cluster of each CTA's `amax` (the CTA's, the same in
// all its threads), read from the others' shared memory. The caller waits on
// the cluster barrier (barrier_wait) before it exits, so that no CTA's shared
// memory goes while another may still read it.
__device__ __forceinline__ float cluster_max(float amax, AmaxScratch& scratch) {
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) scratch.cta = amax;
  cluster.sync();  // every CTA's amax written and visible
  unsigned const rank = cluster.block_rank();
  for (unsigned r = 0; r < cluster.num_blocks(); ++r) {
    if (r != rank) amax = fmaxf(amax, cluster.map_shared_rank(&scratch, r)->cta);
  }
  cluster.barrier_arrive();  // done reading the others' shared memory
  return amax;
}

// kFused, kAmax, kQuantize: a CTA quantizes one tile of kCtaRows rows.
template <bool kBF16, int kHeadDim, int kCtaRows, int kCluster, bool kHadamard, Pass kPass>
__global__ void __launch_bounds__(Config<kBF16, kHeadDim, kCtaRows, kCluster, kHadamard, kPass>::kThreads,
                                  Config<kBF16, kHeadDim, kCtaRows, kCluster, kHadamard, kPass>::kMinBlocks)
    quantize_kernel(__grid_constant__ TensorParams const p) {
  using Cfg = Config<kBF16, kHeadDim, kCtaRows, kCluster, kHadamard, kPass>;
  static_assert(kPass != Pass::kPerHead);
  int const tid = threadIdx.x;
  int const slot = tid % Cfg::kRowThreads;  // which 16 columns of the row
  // kQuantize walks the tiles from the last: the amax pass's last reads may
  // still be in L2.
  int64_t const tile = kPass == Pass::kQuantize ? gridDim.x - 1 - blockIdx.x : blockIdx.x / kCluster;
  int const rank = kCluster > 1 ? int(cg::this_cluster().block_rank()) : 0;
  int64_t const seq_tile = tile % p.tiles_per_head;
  int64_t const bh = tile / p.tiles_per_head;
  int64_t const h = bh % p.heads;
  int64_t const b = bh / p.heads;
  int64_t const first_row = (seq_tile * kCluster + rank) * kCtaRows + tid / Cfg::kRowThreads;

  ThreadRows<kBF16, kHeadDim, kHadamard> rows;
  rows.load(p.in + b * p.in_batch_stride + h * p.in_head_stride + slot * kVec, p.in_seq_stride, first_row,
            Cfg::kRowStep, p.seqlen);

  // kQuantize: the tensor's slot holds its amax (marked) or already its scale.
  float scale = 1.0f;
  if constexpr (kPass == Pass::kQuantize) {
    uint32_t const bits = *reinterpret_cast<uint32_t volatile const*>(p.scale);
    scale = (bits & kAmaxMark) != 0u ? scale_from_amax(__uint_as_float(bits & ~kAmaxMark)) : __uint_as_float(bits);
  }
  rows.transform(p.signs, slot);

  if constexpr (kPass != Pass::kQuantize) {
    __shared__ AmaxScratch scratch;
    float amax = cta_max<Cfg::kWarps>(rows.amax(), scratch);
    if constexpr (kPass == Pass::kAmax) {
      if (tid == 0) atomicMax(reinterpret_cast<unsigned int*>(p.scale), kAmaxMark | __float_as_uint(amax));
      return;
    } else {
      if constexpr (kCluster > 1) amax = cluster_max(amax, scratch);
      scale = scale_from_amax(amax);
      if (rank == 0 && tid == 0) p.scale[tile] = scale;  // [batch, heads, blocks]: the tile index
    }
  } else {
    if (tile == 0 && tid == 0) p.scale[0] = scale;
  }

  if constexpr (kPass != Pass::kAmax) {
    rows.store(p.out + b * p.out_batch_stride + h * p.out_head_stride + slot * kVec, p.out_seq_stride, first_row,
               Cfg::kRowStep, p.seqlen, inverse_scale(scale));
    if constexpr (kPass == Pass::kFused && kCluster > 1) cg::this_cluster().barrier_wait();
  }
}

// kPerHead: a cluster per (batch, head) walks the head's tiles twice, for
// their amax and then to quantize them. Its second reads find the tiles in
// L2 (few heads are in flight at once: a cluster of up to kHeadCluster CTAs
// each; the last tile of each CTA is still in its registers), so the input is
// read from memory once while the heads in flight fit in L2.
template <bool kBF16, int kHeadDim, int kCtaRows, bool kHadamard>
__global__ void __launch_bounds__(Config<kBF16, kHeadDim, kCtaRows, 1, kHadamard, Pass::kPerHead>::kThreads,
                                  Config<kBF16, kHeadDim, kCtaRows, 1, kHadamard, Pass::kPerHead>::kMinBlocks)
    quantize_head_kernel(__grid_constant__ HeadJobs const jobs) {
  using Cfg = Config<kBF16, kHeadDim, kCtaRows, 1, kHadamard, Pass::kPerHead>;
  cg::cluster_group cluster = cg::this_cluster();
  int64_t const ctas = cluster.num_blocks();
  int64_t const rank = cluster.block_rank();
  int const tid = threadIdx.x;
  int const slot = tid % Cfg::kRowThreads;
  int const row_in_tile = tid / Cfg::kRowThreads;
  int64_t const cluster_idx = blockIdx.x / ctas;
  int job = 0;
  while (job + 1 < jobs.count && cluster_idx >= jobs.first_cluster[job + 1]) ++job;
  TensorParams const& p = jobs.tensor[job];
  int64_t const bh = cluster_idx - jobs.first_cluster[job];
  int64_t const h = bh % p.heads;
  int64_t const b = bh / p.heads;
  uint16_t const* const in = p.in + b * p.in_batch_stride + h * p.in_head_stride + slot * kVec;
  uint8_t* const out = p.out + b * p.out_batch_stride + h * p.out_head_stride + slot * kVec;

  ThreadRows<kBF16, kHeadDim, kHadamard> rows;
  float amax = 0.0f;
  int64_t last = -1;
  for (int64_t t = rank; t < p.tiles_per_head; t += ctas) {
    rows.load(in, p.in_seq_stride, t * kCtaRows + row_in_tile, Cfg::kRowStep, p.seqlen);
    rows.transform(p.signs, slot);
    amax = fmaxf(amax, rows.amax());
    last = t;
  }
  __shared__ AmaxScratch scratch;
  float const scale = scale_from_amax(cluster_max(cta_max<Cfg::kWarps>(amax, scratch), scratch));
  if (rank == 0 && tid == 0) p.scale[bh] = scale;
  float const inv = inverse_scale(scale);
  // Back down the same tiles, the most recently read first.
  for (int64_t t = last; t >= 0; t -= ctas) {
    if (t != last) {
      rows.load(in, p.in_seq_stride, t * kCtaRows + row_in_tile, Cfg::kRowStep, p.seqlen);
      rows.transform(p.signs, slot);
    }
    rows.store(out, p.out_seq_stride, t * kCtaRows + row_in_tile, Cfg::kRowStep, p.seqlen, inv);
  }
  cluster.barrier_wait();
}

// `clusters` clusters of `cluster` CTAs of `threads` threads running `kernel`.
template <class KernelParams>
cudaError_t launch(void (*kernel)(KernelParams), int threads, KernelParams const& p, int64_t clusters, int cluster,
                   cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(clusters * cluster));
  config.blockDim = dim3(threads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  if (cluster > 1) {
    if (cluster > 8) {
      cudaError_t const err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (err != cudaSuccess) return err;
    }
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = cluster;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, p);
}

TensorParams params(ConstTensor const& in, MutableTensor const& out, float* scale, int64_t seqlen, int64_t heads,
                    int64_t tile_rows, uint64_t const signs[4]) {
  TensorParams p = {};
  p.in = static_cast<uint16_t const*>(in.data);
  p.in_batch_stride = in.batch_stride;
  p.in_seq_stride = in.seq_stride;
  p.in_head_stride = in.head_stride;
  p.out = static_cast<uint8_t*>(out.data);
  p.out_batch_stride = out.batch_stride;
  p.out_seq_stride = out.seq_stride;
  p.out_head_stride = out.head_stride;
  p.scale = scale;
  p.seqlen = seqlen;
  p.heads = heads;
  p.tiles_per_head = (seqlen + tile_rows - 1) / tile_rows;
  for (int i = 0; i < 4; ++i) p.signs[i] = signs[i];
  return p;
}

// The tile of kMaxThreads threads (per tensor, per head).
constexpr int largest_tile(int head_dim) { return kMaxThreads * kRowsPerThread * kVec / head_dim; }

// One tensor with scale blocks of kBlockRows rows: one fused pass.
template <bool kBF16, int kHeadDim, int kBlockRows>
cudaError_t quantize_per_block(QuantizeArgs const& a, TensorParams const& p, bool hadamard, cudaStream_t stream) {
  constexpr int kCtaRows = cta_rows(kHeadDim, kBlockRows);
  static_assert(kBlockRows % kCtaRows == 0, "a scale block is a whole number of CTAs");
  constexpr int kCluster = kBlockRows / kCtaRows;
  constexpr int kThreads = Config<kBF16, kHeadDim, kCtaRows, kCluster, false, Pass::kFused>::kThreads;
  int64_t const blocks = a.batch * p.heads * p.tiles_per_head;
  return launch(hadamard ? quantize_kernel<kBF16, kHeadDim, kCtaRows, kCluster, true, Pass::kFused>
                         : quantize_kernel<kBF16, kHeadDim, kCtaRows, kCluster, false, Pass::kFused>,
                kThreads, p, blocks, kCluster, stream);
}

// One tensor, per tensor: the amax pass (kAmax) or the quantization pass
// (kQuantize).
template <bool kBF16, int kHeadDim, Pass kPass>
cudaError_t quantize_pass(QuantizeArgs const& a, TensorParams const& p, bool hadamard, cudaStream_t stream) {
  constexpr int kCtaRows = largest_tile(kHeadDim);
  constexpr int kThreads = Config<kBF16, kHeadDim, kCtaRows, 1, false, kPass>::kThreads;
  return launch(hadamard ? quantize_kernel<kBF16, kHeadDim, kCtaRows, 1, true, kPass>
                         : quantize_kernel<kBF16, kHeadDim, kCtaRows, 1, false, kPass>,
                kThreads, p, a.batch * p.heads * p.tiles_per_head, 1, stream);
}

// Tensors with one transform and one sequence length, per head: a cluster per
// (batch, head), of at most as many CTAs as a head has tiles (which keeps
// quant/quantize.h's bound on the grid).
template <bool kBF16, int kHeadDim>
cudaError_t quantize_per_head(HeadJobs const& jobs, bool hadamard, cudaStream_t stream) {
  constexpr int kCtaRows = largest_tile(kHeadDim);
  constexpr int kThreads = Config<kBF16, kHeadDim, kCtaRows, 1, false, Pass::kPerHead>::kThreads;
  int const cluster = int(head_cluster(jobs.tensor[0].tiles_per_head));
  return launch(hadamard ? quantize_head_kernel<kBF16, kHeadDim, kCtaRows, true>
                         : quantize_head_kernel<kBF16, kHeadDim, kCtaRows, false>,
                kThreads, jobs, jobs.first_cluster[jobs.count], cluster, stream);
}

template <bool kBF16, int kHeadDim>
cudaError_t quantize_all(QuantizeArgs const& a, cudaStream_t stream) {
  constexpr fwd::Fp8ScaleBlocks kBlocks = fwd::fp8_scale_blocks(kHeadDim);

  uint64_t signs[4] = {0, 0, 0, 0};
  if (a.hadamard) {
    for (int i = 0; i < kHeadDim; ++i) {
      if (hadamard_sign_negative(a.seed, i)) signs[i / 64] |= uint64_t(1) << (i % 64);
    }
  }
  struct Job {
    ConstTensor in;
    MutableTensor out;
    float* scale;
    int64_t seqlen, heads;
    bool hadamard, query;
  };
  Job const jobs[3] = {{a.q, a.q_out, a.q_scale, a.seqlen_q, a.heads_q, a.hadamard, true},
                       {a.k, a.k_out, a.k_scale, a.seqlen_k, a.heads_kv, a.hadamard, false},
                       {a.v, a.v_out, a.v_scale, a.seqlen_k, a.heads_kv, false, false}};
  auto const tensor = [&](Job const& j, int64_t tile_rows) {
    return params(j.in, j.out, j.scale, j.seqlen, j.heads, tile_rows, signs);
  };
  constexpr int kTile = largest_tile(kHeadDim);
  cudaError_t err = cudaSuccess;
  switch (a.granularity) {
    case ScaleGranularity::kPerBlock:
      for (Job const& j : jobs) {
        if (j.seqlen == 0) continue;
        err = j.query ? quantize_per_block<kBF16, kHeadDim, kBlocks.q>(a, tensor(j, kBlocks.q), j.hadamard, stream)
                      : quantize_per_block<kBF16, kHeadDim, kBlocks.kv>(a, tensor(j, kBlocks.kv), j.hadamard, stream);
        if (err != cudaSuccess) return err;
      }
      return cudaSuccess;
    case ScaleGranularity::kPerHead: {
      // Consecutive tensors with the same transform and as many tiles a head
      // share a launch (without the transform and with seqlen_q == seqlen_k:
      // all three).
      HeadJobs group = {};
      bool group_hadamard = false;
      auto flush = [&]() {
        cudaError_t const e = group.count > 0 ? quantize_per_head<kBF16, kHeadDim>(group, group_hadamard, stream)
                                              : cudaSuccess;
        group.count = 0;
        return e;
      };
      for (Job const& j : jobs) {
        if (j.seqlen == 0) continue;
        TensorParams const t = tensor(j, kTile);
        // One tensor's grid is below 2^31 (validate()); a group's must stay so.
        int64_t const ctas = (group.first_cluster[group.count] + a.batch * j.heads) * head_cluster(t.tiles_per_head);
        if (group.count > 0 && (j.hadamard != group_hadamard ||
                                t.tiles_per_head != group.tensor[0].tiles_per_head || ctas > INT32_MAX)) {
          if ((err = flush()) != cudaSuccess) return err;
        }
        group_hadamard = j.hadamard;
        group.tensor[group.count] = t;
        group.first_cluster[group.count + 1] = group.first_cluster[group.count] + a.batch * j.heads;
        ++group.count;
      }
      return flush();
    }
    default:
      // The amax passes of Q, K, V, then the quantization passes in the
      // other order (V's last tiles first: they may still be in L2).
      for (Job const& j : jobs) {
        if (j.seqlen == 0) continue;
        if ((err = cudaMemsetAsync(j.scale, 0, sizeof(float), stream)) != cudaSuccess) return err;
        err = quantize_pass<kBF16, kHeadDim, Pass::kAmax>(a, tensor(j, kTile), j.hadamard, stream);
        if (err != cudaSuccess) return err;
      }
      for (int i = 2; i >= 0; --i) {
        if (jobs[i].seqlen == 0) continue;
        err = quantize_pass<kBF16, kHeadDim, Pass::kQuantize>(a, tensor(jobs[i], kTile), jobs[i].hadamard, stream);
        if (err != cudaSuccess) return err;
      }
      return cudaSuccess;
  }
}

template <bool kBF16>
cudaError_t quantize_dtype(QuantizeArgs const& a, cudaStream_t stream) {
  switch (a.head_dim) {
    case 64: return quantize_all<kBF16, 64>(a, stream);
    case 128: return quantize_all<kBF16, 128>(a, stream);
    default: return quantize_all<kBF16, 256>(a, stream);
  }
}

}  // namespace

Status launch_quantize(QuantizeArgs const& args, Fp8BlockSizes blocks, cudaStream_t stream) {
  if (args.head_dim != 64 && args.head_dim != 128 && args.head_dim != 256) {
    return Status(Status::Code::kInvalidArgument, "head_dim: must be 64, 128 or 256");
  }
  // The kernels' scale blocks, as compiled.
  fwd::Fp8ScaleBlocks const compiled = fwd::fp8_scale_blocks(int(args.head_dim));
  if (blocks.q != compiled.q || blocks.kv != compiled.kv) {
    return Status(Status::Code::kUnsupported, "head_dim: FP8 scale blocks of " + std::to_string(blocks.q) + "/" +
                                                  std::to_string(blocks.kv) +
                                                  " rows are not those the quantization kernels were built for");
  }
  if (args.batch == 0) return Status();
  cudaError_t const err = args.dtype == DType::kBF16 ? quantize_dtype<true>(args, stream)
                                                     : quantize_dtype<false>(args, stream);
  if (err != cudaSuccess) {
    cudaGetLastError();  // do not leave the error for the caller's next check
    return Status(Status::Code::kCudaError, std::string("quantize_fp8: ") + cudaGetErrorString(err));
  }
  return Status();
}

}  // namespace flash3::quant
