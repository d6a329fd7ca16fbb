// MLA's calls (ForwardArgs::qv): the KV cache call's steps (fwd/kv_call.h)
// around MLA's kernel (fwd/mla_kernel.h), split or not, and split-KV's
// combine. Two kernels, in this unit of their own. The kernel packs each KV
// head's query rows itself (its tiles' rows are (position, head) pairs), so
// the call runs without packed GQA's view.
#include <cuda_runtime_api.h>

#include <cmath>
#include <string>

#include "common/device_info.h"
#include "common/dynamic_smem.h"
#include "common/gmem_tensor.h"
#include "common/int_math.h"
#include "common/mask.h"
#include "flash3/flash3.h"
#include "fwd/kv_call.h"
#include "fwd/mla_kernel.h"
#include "fwd/registry.h"
#include "fwd/split_partials.h"

namespace flash3::fwd {
namespace {

template <bool kSplit>
Status launch_mla(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream, SplitPartials const& partials) {
  using Traits = MlaTraits<kSplit>;
  using KernelT = MlaKernel<Traits>;
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim, kHeadDimV = Traits::kHeadDimV;
  // A paged cache's K and V are its pages, of page_size rows.
  bool const paged = a.kv_cache.page_table != nullptr;
  int64_t const kv_rows = paged ? a.kv_cache.page_size : a.seqlen_k;
  auto const k = gmem_tensor<kHeadDim, Element>(a.k, kv_rows, a.heads_kv, a.kv_cache.batch_cache);
  auto const v = gmem_tensor<kHeadDimV, Element>(a.v, kv_rows, a.heads_kv, a.kv_cache.batch_cache);
  typename KernelT::Params p;
  p.q = a.q;
  p.qv = a.qv;
  p.tma_k = make_tma_copy(SM90_TMA_LOAD{}, k, take<0, 2>(typename Traits::SmemLayoutK{}),
                          Shape<Int<Traits::kBlockN>, Int<kHeadDim>>{}, _1{});
  p.tma_v = make_tma_copy(SM90_TMA_LOAD{}, v, take<0, 2>(typename Traits::SmemLayoutV{}),
                          Shape<Int<Traits::kBlockN>, Int<kHeadDimV>>{}, _1{});
  p.tma_k_box = make_tma_copy(SM90_TMA_LOAD{}, k, typename Traits::SmemLayoutKBox{}, BoxShape<kHeadDim>{}, _1{});
  p.tma_v_box = make_tma_copy(SM90_TMA_LOAD{}, v, typename Traits::SmemLayoutVBox{}, BoxShape<kHeadDimV>{}, _1{});
  p.shape_k = k.shape();
  p.shape_v = v.shape();
  p.heads_kv = int(a.heads_kv);
  p.packed = PackedRows{int(a.heads_q / a.heads_kv), int(a.seqlen_q)};
  p.m_blocks = div_up(p.packed.rows(), Traits::kBlockM);
  p.cache = KvCacheMap{a.kv_cache.seqlens,    a.kv_cache.batch_idx,         a.kv_cache.leftpad,
                       a.kv_cache.page_table, a.kv_cache.page_table_stride, int(a.kv_cache.page_size)};
  p.num_splits = partials.num_splits;
  p.window = window_of(a.causal, a.window_left, a.window_right, a.seqlen_q, a.seqlen_k);
  // softmax_scale 0: 1 / sqrt of the scores' whole head dim, the rotary and the latent part.
  float const scale = a.softmax_scale != 0.f ? a.softmax_scale : 1.f / std::sqrt(float(kHeadDim + kHeadDimV));
  p.scale_log2 = scale * float(M_LOG2E);
  p.batch = int(a.batch);
  if constexpr (kSplit) {
    p.o = partials.o;
    p.lse = partials.lse;
  } else {
    p.o = a.o.data;
    p.o_batch_stride = a.o.batch_stride;
    p.o_seq_stride = a.o.seq_stride;
    p.o_head_stride = a.o.head_stride;
    p.lse = a.lse;
  }
  dim3 const grid(unsigned(int64_t(p.m_blocks) * a.heads_kv * a.batch), unsigned(partials.num_splits));
  cudaError_t err = allow_dynamic_smem<mla_kernel<KernelT>>(device.id, KernelT::kSmemBytes);
  if (err == cudaSuccess) {
    mla_kernel<KernelT><<<grid, KernelT::kNumThreads, KernelT::kSmemBytes, stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) return Status(Status::Code::kCudaError, std::string("MLA kernel launch: ") + cudaGetErrorString(err));
  if constexpr (kSplit) return combine_partials(a, partials, kHeadDimV, DType::kBF16, stream);
  return Status();
}

}  // namespace

Status run_mla(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream) {
  return run_kv_call(a, device, stream, [&](ForwardArgs const& attended, SplitPartials const& partials) {
    if (partials.num_splits == 1) return launch_mla<false>(attended, device, stream, partials);
    return launch_mla<true>(attended, device, stream, partials);
  });
}

}  // namespace flash3::fwd
