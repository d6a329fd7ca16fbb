// Host side of the backward pass: workspace, preprocess, the main kernel's
// TMA descriptors and grid (its last wave split, bwd/tail_split.h),
// postprocess. Each kernel after the preprocess is a programmatic dependent
// of the one before (common/dependent_launch.h), except a postprocess with no
// main kernel before it; the main kernel and the postprocess wait on
// counters (per head, per dQ tile) rather than for the grid before them to
// end. Arguments have been validated.
//
// Packed sequences (varlen, BwdTraits::kPacked): the tensors are one batch
// entry of total rows, the workspace's rows padded per sequence
// (bwd/workspace.h); the kernels find each sequence's lengths and offsets in
// the device arrays, never read here.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/device_info.h"
#include "common/dynamic_smem.h"
#include "bwd/kernel.h"
#include "bwd/postprocess.h"
#include "bwd/preprocess.h"
#include "bwd/sequence.h"
#include "bwd/sink_gradient.h"
#include "bwd/tail_split.h"
#include "bwd/workspace.h"
#include "common/dependent_launch.h"
#include "common/gmem_tensor.h"
#include "flash3/flash3.h"

namespace flash3::bwd {

template <class Pointer>
void strides_of(TensorRef<Pointer> const& t, int64_t (&s)[3]) {
  s[0] = t.batch_stride;
  s[1] = t.seq_stride;
  s[2] = t.head_stride;
}

// A call's extents as the kernels see them: packed sequences are one batch
// entry of total_q (total_k) rows.
struct Extents {
  bool packed;
  int64_t entries;
  int64_t rows_q;
  int64_t rows_k;
};
inline Extents extents_of(BackwardArgs const& a) {
  bool const packed = a.varlen.cu_seqlens_q != nullptr;
  return packed ? Extents{true, 1, a.varlen.total_q, a.varlen.total_k} : Extents{false, a.batch, a.seqlen_q, a.seqlen_k};
}
inline SequenceLengths lengths_of(BackwardArgs const& a) {
  return {a.varlen.cu_seqlens_q, a.varlen.cu_seqlens_k, a.varlen.seqused_q, a.varlen.seqused_k};
}

// dK and dV in the input dtype from the per-query-head fp32 sums, or zeros
// where dk_accum is nullptr.
template <class Element>
SumGroupsParams<Element> sum_groups_params(BackwardArgs const& a, float const* dk_accum, float const* dv_accum) {
  SumGroupsParams<Element> p{};
  p.dk_accum = dk_accum;
  p.dv_accum = dv_accum;
  p.dk = static_cast<Element*>(a.dk.data);
  p.dv = static_cast<Element*>(a.dv.data);
  strides_of(a.dk, p.dk_strides);
  strides_of(a.dv, p.dv_strides);
  Extents const e = extents_of(a);
  int64_t const head_dim_v = head_dim_v_of(a);
  p.elements = e.entries * e.rows_k * a.heads_kv * std::max(a.head_dim, head_dim_v);
  p.seqlen_k = int(e.rows_k);
  p.rows_end = e.packed ? a.varlen.cu_seqlens_k + a.batch : nullptr;
  p.heads_kv = int(a.heads_kv);
  p.head_group = int(a.heads_q / a.heads_kv);
  p.head_dim = int(a.head_dim);
  p.head_dim_v = int(head_dim_v);
  return p;
}

template <class Element>
unsigned sum_groups_ctas(SumGroupsParams<Element> const& p) {
  return unsigned((p.elements + kSumGroupsThreads - 1) / kSumGroupsThreads);
}

template <class Traits>
cudaError_t launch_sum_groups(SumGroupsParams<typename Traits::Element> const& p, bool dependent,
                              cudaStream_t stream) {
  auto kernel = sum_groups_kernel<typename Traits::Element, Traits::kPacked>;
  if (dependent) return launch_dependent(kernel, dim3(sum_groups_ctas(p)), dim3(kSumGroupsThreads), 0, stream, p);
  kernel<<<sum_groups_ctas(p), kSumGroupsThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <class Traits>
using BackwardKernel = Kernel<Mainloop<Traits>, Epilogue<Traits>, KeyBlockScheduler<Traits::kCausal>>;

template <class Traits>
cudaError_t enqueue_backward(BackwardArgs const& a, DeviceInfo const& device, char* ws, WorkspaceLayout const& w,
                             cudaStream_t stream) {
  using Element = typename Traits::Element;
  using KernelT = BackwardKernel<Traits>;
  float const scale = a.softmax_scale != 0.f ? a.softmax_scale : 1.f / std::sqrt(float(a.head_dim));
  Extents const e = extents_of(a);
  static_assert(!Traits::kPacked || Traits::kCausal);
  // The workspace's query blocks a head (packed: all sequences', padded).
  int const m_blocks = int(w.m_blocks);
  // Packed sequences: the grid of the longest sequence's key blocks, a CTA
  // past its own sequence's exiting at once (bwd/kernel.h): each CTA walks
  // its sequence's query blocks, so a table of tiles (the forward's) would
  // save only those empty CTAs, at a build kernel's cost.
  int const n_blocks = e.rows_k == 0 ? 0 : int((a.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN);
  int const group = int(a.heads_q / a.heads_kv);
  Window const window = window_of(a.causal, a.window_left, a.window_right, a.seqlen_q, a.seqlen_k);
  float* dq_accum = reinterpret_cast<float*>(ws + w.dq_accum);
  float* lse_log2 = reinterpret_cast<float*>(ws + w.lse_log2);
  float* dpsum = reinterpret_cast<float*>(ws + w.dpsum);
  float* dk_accum = reinterpret_cast<float*>(ws + w.dk_accum);
  float* dv_accum = reinterpret_cast<float*>(ws + w.dv_accum);
  cudaError_t err = cudaSuccess;

  if (a.seqlen_q == 0 || e.rows_q == 0) {
    // No query: dK = dV = 0.
    return launch_sum_groups<Traits>(sum_groups_params<Element>(a, nullptr, nullptr), false, stream);
  }

  // The main kernel's grid: its last wave split where that ends it sooner.
  // Splitting needs equal CTAs (no causal mask) and dQ's sums in any order.
  auto kernel = backward_kernel<KernelT>;
  int64_t const tiles = int64_t(n_blocks) * a.heads_q * a.batch;  // packed: CTAs, some exiting at once
  TailSplit split;
  if (n_blocks > 0) {
    err = allow_dynamic_smem<backward_kernel<KernelT>>(device.id, KernelT::kSmemBytes);
    if (err != cudaSuccess) return err;
    if (!Traits::kCausal && !a.deterministic) {
      int ctas_per_sm = 0;
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, KernelT::kNumThreads,
                                                          KernelT::kSmemBytes);
      if (err != cudaSuccess) return err;
      split = plan_tail_split(tiles, int64_t(device.num_sms) * ctas_per_sm, m_blocks, w.split_tiles);
    }
    if (split.ctas(tiles) > std::numeric_limits<int>::max()) return cudaErrorInvalidConfiguration;
  }

  // The counters cleared (before the preprocess, which the main kernel does
  // not wait for as a whole), then line 2: D and the LSE, the dQ accumulator
  // cleared.
  size_t const counters_end = w.split_sums + split.split_tiles * split_tile_bytes(Traits::kHeadDim, Traits::kHeadDimV);
  if ((err = cudaMemsetAsync(ws + w.ready, 0, counters_end - w.ready, stream)) != cudaSuccess) return err;
  PreprocessParams<Element> pre{};
  pre.o = static_cast<Element const*>(a.o.data);
  pre.dout = static_cast<Element const*>(a.dout.data);
  strides_of(a.o, pre.o_strides);
  strides_of(a.dout, pre.do_strides);
  pre.lse = a.lse;
  pre.lse_log2 = lse_log2;
  pre.dpsum = dpsum;
  pre.dq_accum = dq_accum;
  pre.ready = reinterpret_cast<int*>(ws + w.ready);
  pre.padded_rows = m_blocks * Traits::kBlockM;
  pre.seqlen_q = int(a.seqlen_q);
  pre.num_heads = int(a.heads_q);
  pre.items_per_head = int(preprocess_items_per_head(pre.padded_rows));
  pre.items = int(e.entries * a.heads_q) * pre.items_per_head;
  pre.lengths = lengths_of(a);
  pre.batch = int(a.batch);
  pre.total_q = int(e.rows_q);
  // Beside the main kernel on an eighth of the SMs, or before it on all of
  // them for long calls without the mask: there beside it the main kernel
  // loses more than the preprocess costs, its SMs no longer ending their
  // last CTAs together as its last wave's split assumes (bwd/tail_split.h).
  bool const beside = Traits::kCausal || a.seqlen_q < kPreprocessBesideBelow;
  preprocess_kernel<Element, Traits::kHeadDim, Traits::kHeadDimV, Traits::kPacked>
      <<<preprocess_ctas(pre.items, device.num_sms, beside), kPreprocessThreads, 0, stream>>>(pre);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;

  if (n_blocks > 0) {
    typename KernelT::Params params;
    params.scheduler = {int(tiles), n_blocks, int(a.heads_q), a.deterministic, split};
    auto& mp = params.mainloop;
    using MainloopT = typename KernelT::MainloopT;
    // Q, K, dK of Q's head dim; dO, V, dV of V's.
    constexpr int kHeadDim = Traits::kHeadDim, kHeadDimV = Traits::kHeadDimV;
    auto const q = gmem_tensor<kHeadDim, Element>(a.q, e.rows_q, a.heads_q, e.entries);
    auto const dout = gmem_tensor<kHeadDimV, Element>(a.dout, e.rows_q, a.heads_q, e.entries);
    auto const k = gmem_tensor<kHeadDim, Element>(a.k, e.rows_k, a.heads_kv, e.entries);
    auto const v = gmem_tensor<kHeadDimV, Element>(a.v, e.rows_k, a.heads_kv, e.entries);
    auto const tile_md = Shape<typename Traits::M, typename Traits::D>{};
    auto const tile_mdv = Shape<typename Traits::M, typename Traits::Dv>{};
    auto const tile_nd = Shape<typename Traits::N, typename Traits::D>{};
    auto const tile_ndv = Shape<typename Traits::N, typename Traits::Dv>{};
    mp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, q, take<0, 2>(typename Traits::SmemLayoutQ{}), tile_md, _1{});
    mp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, dout, take<0, 2>(typename Traits::SmemLayoutdO{}), tile_mdv, _1{});
    mp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, k, typename Traits::SmemLayoutK{}, tile_nd, _1{});
    mp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, v, typename Traits::SmemLayoutV{}, tile_ndv, _1{});
    mp.dq_tiles = int(e.entries * a.heads_q * m_blocks);
    Tensor dq_tensor = make_tensor(make_gmem_ptr(dq_accum),
                                   make_layout(make_shape(_256{}, Int<Traits::kdQRows>{}, mp.dq_tiles * Traits::kdQChunks),
                                               LayoutLeft{}));
    mp.tma_dq = make_tma_copy(SM90_TMA_REDUCE_ADD{}, dq_tensor, typename Traits::SmemLayoutdQ{},
                              typename Traits::TileShapedQAccum{}, _1{});
    mp.shape_q = q.shape();
    mp.shape_k = k.shape();
    mp.dq_accum = dq_accum;
    mp.lse_log2 = lse_log2;
    mp.dpsum = dpsum;
    mp.dq_arrivals = reinterpret_cast<int*>(ws + w.dq_arrivals);
    mp.ready = pre.ready;
    mp.ready_items = pre.items_per_head;
    mp.deterministic = a.deterministic;
    mp.head_group = group;
    mp.num_heads = int(a.heads_q);
    mp.m_blocks = m_blocks;
    mp.seqlen_q = int(a.seqlen_q);
    mp.seqlen_k = int(a.seqlen_k);
    mp.window_left = window.left;
    mp.window_right = window.right;
    mp.scale_log2 = scale * float(M_LOG2E);
    mp.softcap = softcap_of(a.softcap, scale);
    mp.lengths = lengths_of(a);

    auto& ep = params.epilogue;
    // MHA: TMA stores to dK, dV. GQA: fp32 per query head to the workspace
    // (the descriptors still need a valid tensor: dK's own).
    auto const dk = gmem_tensor<kHeadDim, Element>(a.dk, e.rows_k, a.heads_kv, e.entries);
    auto const dv = gmem_tensor<kHeadDimV, Element>(a.dv, e.rows_k, a.heads_kv, e.entries);
    using EpilogueT = typename KernelT::EpilogueT;
    ep.tma_dk = make_tma_copy(SM90_TMA_STORE{}, dk, typename EpilogueT::SmemLayoutdK{}, tile_nd, _1{});
    ep.tma_dv = make_tma_copy(SM90_TMA_STORE{}, dv, typename EpilogueT::SmemLayoutdV{}, tile_ndv, _1{});
    ep.shape_k = dk.shape();
    ep.dk_accum = dk_accum;
    ep.dv_accum = dv_accum;
    ep.grouped = group > 1;
    ep.seqlen_k = int(e.rows_k);
    ep.num_heads_q = int(a.heads_q);
    ep.head_group = group;
    ep.softmax_scale = scale;
    ep.split_sums = reinterpret_cast<float*>(ws + w.split_sums);
    ep.split_arrivals = reinterpret_cast<int*>(ws + w.split_arrivals);
    ep.dk = static_cast<Element*>(a.dk.data);
    ep.dv = static_cast<Element*>(a.dv.data);
    ep.dk_strides[0] = a.dk.seq_stride;
    ep.dk_strides[1] = a.dk.head_stride;
    ep.dv_strides[0] = a.dv.seq_stride;
    ep.dv_strides[1] = a.dv.head_stride;

    dim3 const grid = KernelT::Scheduler::grid(params.scheduler, int(a.batch));
    err = launch_dependent(kernel, grid, dim3(KernelT::kNumThreads), KernelT::kSmemBytes, stream, params);
    if (err != cudaSuccess) return err;
  }

  PostprocessParams<Element> post{};
  post.dq_accum = dq_accum;
  post.dq_arrivals = reinterpret_cast<int*>(ws + w.dq_arrivals);
  post.ready = pre.ready;
  post.ready_items = pre.items_per_head;
  post.done = reinterpret_cast<int*>(ws + w.post_done);
  post.deterministic = a.deterministic;
  post.dq = static_cast<Element*>(a.dq.data);
  strides_of(a.dq, post.dq_strides);
  post.seqlen_q = int(a.seqlen_q);
  post.seqlen_k = int(a.seqlen_k);
  post.window_left = window.left;
  post.window_right = window.right;
  post.num_heads = int(a.heads_q);
  post.m_blocks = m_blocks;
  post.softmax_scale = scale;
  post.lengths = lengths_of(a);
  // A dependent of the main kernel (bwd/postprocess.h). Without one (no
  // key), it must not start before the preprocess has cleared the accumulator.
  // Packed sequences: the longest sequence's query blocks.
  int64_t const post_blocks = e.packed ? (a.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM : m_blocks;
  dim3 const post_grid(unsigned(post_blocks), unsigned(a.heads_q), unsigned(a.batch));
  if (n_blocks > 0) {
    err = launch_dependent(postprocess_dq_kernel<Traits>, post_grid, dim3(Traits::kNumConsumerThreads), 0, stream, post);
  } else {
    postprocess_dq_kernel<Traits><<<post_grid, Traits::kNumConsumerThreads, 0, stream>>>(post);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) return err;

  if (group > 1 && e.rows_k > 0) {
    err = launch_sum_groups<Traits>(sum_groups_params<Element>(a, dk_accum, dv_accum), true, stream);
    if (err != cudaSuccess) return err;
  }
  // Last, in plain stream order: after the preprocess, which runs beside the
  // main kernel and would lose that overlap to a launch between them.
  if (a.dsinks != nullptr) {
    // Packed sequences' padding rows between them add zeros, as a batch's do.
    err = launch_sink_gradient({a.sinks, lse_log2, dpsum, a.dsinks, int(e.entries), int(a.heads_q), pre.padded_rows},
                               stream);
  }
  return err;
}

// The workspace is the caller's, or allocated and freed here in stream order.
template <class Traits>
Status launch_backward(BackwardArgs const& a, DeviceInfo const& device, cudaStream_t stream) {
  WorkspaceLayout const w = workspace_layout_of(a);
  char* ws = static_cast<char*>(a.workspace);
  cudaError_t err = cudaSuccess;
  if (ws == nullptr && w.bytes > 0) err = cudaMallocAsync(reinterpret_cast<void**>(&ws), w.bytes, stream);
  if (err == cudaSuccess) err = enqueue_backward<Traits>(a, device, ws, w, stream);
  if (a.workspace == nullptr && ws != nullptr) {
    cudaError_t const free_err = cudaFreeAsync(ws, stream);
    if (err == cudaSuccess) err = free_err;
  }
  if (err != cudaSuccess) return Status(Status::Code::kCudaError, std::string("backward: ") + cudaGetErrorString(err));
  return Status();
}

}  // namespace flash3::bwd
