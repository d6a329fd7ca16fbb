// The forward kernel against the GPU reference on fresh random inputs.
//
// Tolerance, as FlashAttention's own tests: the kernel's max error against
// the float32 reference must be at most 2x (plus a small epsilon) the error of
// a straightforward implementation in the same precision (the reference with
// emulate_low_precision), and the LSE within 1e-3 relative.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/tile_counter.h"
#include "flash3/flash3.h"
#include "gpu_test_util.h"
#include "reference.h"

namespace {

using flash3::DType;
using flash3::reference::AttentionShape;
using flash3::testing::DeviceBuffer;
using flash3::testing::HeadDims;
using flash3::testing::kHeadDims;
using flash3::testing::sweep_name;
using flash3::testing::SweepParam;
using flash3::testing::from_bits;
using flash3::testing::to_bits;

struct Case {
  DType dtype;
  int head_dim;
  bool causal;
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv;
  bool packed_qkv;  // Q, K, V interleaved in one [b, s, 3, h, d] buffer (needs seqlen_q == seqlen_k)
  int64_t batch_gap = 0;  // elements left unused between batches of Q, K, V and O (not packed)
  // K's row j scaled by 1 + k_growth * (seqlen_k - 1 - j) / seqlen_k (not packed): the
  // scores grow toward the first keys, which the kernel visits last, so each
  // row's running max keeps moving, by more and by less than 2^8 per block.
  float k_growth = 0.f;
  bool sinks = false;  // a random sink per query head (ForwardArgs::sinks)
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  int head_dim_v = 0;  // V's and O's, as ForwardArgs::head_dim_v
};

std::string name(Case const& c) {
  return std::string(c.dtype == DType::kBF16 ? "bf16" : "fp16") + " d" + std::to_string(c.head_dim) +
         (c.head_dim_v != 0 ? " dv" + std::to_string(c.head_dim_v) : "") + (c.causal ? " causal" : "") + " b" +
         std::to_string(c.batch) + " sq" + std::to_string(c.seqlen_q) + " sk" +
         std::to_string(c.seqlen_k) + " h" + std::to_string(c.heads_q) + "/" + std::to_string(c.heads_kv) +
         (c.packed_qkv ? " packed" : "") + (c.sinks ? " sinks" : "") +
         (c.window_left >= 0 || c.window_right >= 0
              ? " window (" + std::to_string(c.window_left) + ", " + std::to_string(c.window_right) + ")"
              : "") +
         (c.softcap != 0.f ? " softcap " + std::to_string(c.softcap) : "");
}

// A case of the options' lists (gpu_test_util.h).
Case with_options(flash3::testing::OptionCase const& o) {
  Case c{o.dtype, o.head_dim, o.causal, o.batch, o.seqlen_q, o.seqlen_k, o.heads_q, o.heads_kv, false};
  c.window_left = o.window_left;
  c.window_right = o.window_right;
  c.softcap = o.softcap;
  c.sinks = o.sinks;
  c.head_dim_v = o.head_dim_v;
  return c;
}

void run_case(Case const& c, uint32_t seed, flash3::KernelOptions options = {}) {
  SCOPED_TRACE(name(c));
  int64_t const d = c.head_dim, dv = c.head_dim_v != 0 ? c.head_dim_v : d;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);

  // Host inputs, then one device buffer holding Q, K, V (packed or not).
  flash3::ForwardArgs a;
  a.dtype = c.dtype;
  a.batch = c.batch;
  a.seqlen_q = c.seqlen_q;
  a.seqlen_k = c.seqlen_k;
  a.heads_q = c.heads_q;
  a.heads_kv = c.heads_kv;
  a.head_dim = d;
  a.head_dim_v = c.head_dim_v;
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  a.options = options;

  // Q and K of head dim d; V and O of dv.
  size_t const q_batch = size_t(c.seqlen_q) * c.heads_q * d;
  size_t const kv_batch = size_t(c.seqlen_k) * c.heads_kv * d;
  size_t const v_batch = size_t(c.seqlen_k) * c.heads_kv * dv;
  size_t const o_batch = size_t(c.seqlen_q) * c.heads_q * dv;
  size_t const o_elems = c.batch * o_batch;
  size_t const lse_elems = size_t(c.batch) * c.heads_q * c.seqlen_q;
  // Each tensor in its own buffer, batch b at b * (dense batch + gap); packed
  // QKV shares one buffer with interleaved rows (each [h, d], [h, d], [h, dv]).
  auto span = [&](size_t per_batch) { return (c.batch - 1) * (per_batch + c.batch_gap) + per_batch; };
  int64_t const packed_row = c.heads_q * (2 * d + dv);
  size_t const packed_batch = size_t(c.seqlen_q) * packed_row;
  DeviceBuffer<uint16_t> qkv(c.packed_qkv ? c.batch * packed_batch : 0);
  DeviceBuffer<uint16_t> q(c.packed_qkv ? 0 : span(q_batch)), k(c.packed_qkv ? 0 : span(kv_batch)),
      v(c.packed_qkv ? 0 : span(v_batch)), o(span(o_batch));
  DeviceBuffer<float> lse(lse_elems), ref_o(o_elems), ref_lse(lse_elems), low_o(o_elems);
  ASSERT_TRUE(o.ptr && lse.ptr && ref_o.ptr && ref_lse.ptr && low_o.ptr);
  auto upload_random = [&](uint16_t* dst, size_t per_batch, int64_t stride, float growth = 0.f) {
    std::vector<uint16_t> host(per_batch);
    size_t const row = growth == 0.f ? 1 : per_batch / c.seqlen_k;  // with growth: a K row of all heads
    for (int64_t b = 0; b < c.batch; ++b) {
      for (size_t i = 0; i < per_batch; ++i) {
        float const keys_after = growth == 0.f ? 0.f : float(c.seqlen_k - 1 - int64_t(i / row));
        host[i] = to_bits(normal(rng) * (1.f + growth * keys_after / float(c.seqlen_k)), c.dtype);
      }
      ASSERT_EQ(cudaMemcpy(dst + b * stride, host.data(), per_batch * 2, cudaMemcpyHostToDevice), cudaSuccess);
    }
  };
  if (c.packed_qkv) {
    ASSERT_NE(qkv.ptr, nullptr);
    upload_random(qkv.ptr, packed_batch, packed_batch);
    auto view = [&](int64_t offset, int64_t dim) {
      return flash3::ConstTensor{qkv.ptr + offset, int64_t(packed_batch), packed_row, dim, 1};
    };
    a.q = view(0, d);
    a.k = view(c.heads_q * d, d);
    a.v = view(2 * c.heads_q * d, dv);
  } else {
    ASSERT_TRUE(q.ptr && k.ptr && v.ptr);
    upload_random(q.ptr, q_batch, q_batch + c.batch_gap);
    upload_random(k.ptr, kv_batch, kv_batch + c.batch_gap, c.k_growth);
    upload_random(v.ptr, v_batch, v_batch + c.batch_gap);
    a.q = {q.ptr, int64_t(q_batch) + c.batch_gap, c.heads_q * d, d, 1};
    a.k = {k.ptr, int64_t(kv_batch) + c.batch_gap, c.heads_kv * d, d, 1};
    a.v = {v.ptr, int64_t(v_batch) + c.batch_gap, c.heads_kv * dv, dv, 1};
  }
  int64_t const o_stride = int64_t(o_batch) + c.batch_gap;
  // Poison: an element the kernel does not write reads back as NaN.
  for (int64_t b = 0; b < c.batch; ++b) CUDA_OK(cudaMemset(o.ptr + b * o_stride, 0xff, o_batch * 2));
  CUDA_OK(cudaMemset(lse.ptr, 0xff, lse_elems * 4));
  a.o = {o.ptr, o_stride, c.heads_q * dv, dv, 1};
  a.lse = lse.ptr;
  // Sinks around the scores' own size, some above every score of a row.
  DeviceBuffer<float> sinks(c.sinks ? c.heads_q : 0);
  if (c.sinks) {
    std::vector<float> host(c.heads_q);
    for (float& x : host) x = 2.f * normal(rng);
    CUDA_OK(cudaMemcpy(sinks.ptr, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    a.sinks = sinks.ptr;
  }

  flash3::Status s = flash3::forward(a, nullptr);
  if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  CUDA_OK(cudaDeviceSynchronize());

  AttentionShape shape{c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, d, 0.f, c.causal};
  shape.window_left = c.window_left;
  shape.window_right = c.window_right;
  shape.softcap = c.softcap;
  shape.head_dim_v = c.head_dim_v;
  CUDA_OK(flash3::reference::attention_gpu(shape, c.dtype, a.q, a.k, a.v, ref_o.ptr, ref_lse.ptr, false, nullptr,
                                           a.sinks));
  CUDA_OK(flash3::reference::attention_gpu(shape, c.dtype, a.q, a.k, a.v, low_o.ptr, nullptr, true, nullptr, a.sinks));
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<uint16_t> h_o(o_elems);
  std::vector<float> h_lse(lse_elems), h_ref(o_elems), h_ref_lse(lse_elems), h_low(o_elems);
  for (int64_t b = 0; b < c.batch; ++b) {
    CUDA_OK(cudaMemcpy(h_o.data() + b * o_batch, o.ptr + b * o_stride, o_batch * 2, cudaMemcpyDeviceToHost));
  }
  CUDA_OK(cudaMemcpy(h_lse.data(), lse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_ref.data(), ref_o.ptr, o_elems * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_ref_lse.data(), ref_lse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_low.data(), low_o.ptr, o_elems * 4, cudaMemcpyDeviceToHost));

  flash3::testing::expect_forward_close(h_o, c.dtype, h_ref, h_low, h_lse, h_ref_lse, [](size_t) { return 0.0; });
}

class Forward : public ::testing::TestWithParam<SweepParam> {};

TEST_P(Forward, ShapeSweep) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto [dtype, h, causal] = GetParam();
  int const d = h.qk;
  std::vector<Case> cases = {
      {dtype, d, causal, 2, 1, 1, 4, 4, false},          {dtype, d, causal, 2, 7, 7, 4, 4, false},
      {dtype, d, causal, 1, 113, 113, 8, 2, false},      {dtype, d, causal, 2, 255, 255, 8, 8, false},
      {dtype, d, causal, 1, 1023, 1023, 8, 1, false},    {dtype, d, causal, 1, 4097, 4097, 2, 2, false},
      {dtype, d, causal, 2, 113, 1023, 4, 1, false},     {dtype, d, causal, 2, 1023, 113, 4, 4, false},
      {dtype, d, causal, 1, 1, 4097, 8, 2, false},       {dtype, d, causal, 1, 300, 7, 2, 2, false},
      {dtype, d, causal, 2, 255, 255, 4, 4, true},
  };
  uint32_t seed = 1234 + d + (causal ? 1 : 0);
  for (Case c : cases) {
    c.head_dim_v = h.v_arg();
    run_case(c, seed++);
  }
}

INSTANTIATE_TEST_SUITE_P(All, Forward,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kFP16),
                                            ::testing::ValuesIn(kHeadDims), ::testing::Bool()),
                         sweep_name);

TEST(ForwardAblation, SameResultWithEachTechniqueOff) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // Each switch selects a different kernel (or grid); each must compute the
  // same function. Built for bf16, head dim 128.
  for (int bits = 0; bits < 8; ++bits) {
    flash3::KernelOptions options;
    options.pingpong = bits & 1;
    options.intra_warpgroup_overlap = bits & 2;
    options.persistent = bits & 4;
    SCOPED_TRACE("options " + std::to_string(bits));
    for (bool causal : {false, true}) {
      run_case({DType::kBF16, 128, causal, 2, 1000, 1000, 4, 2, false}, 99 + bits, options);
      run_case({DType::kBF16, 128, causal, 1, 129, 700, 2, 2, false}, 7 + bits, options);
      Case softcap{DType::kBF16, 128, causal, 2, 500, 500, 4, 2, false};
      softcap.softcap = 1.5f;
      run_case(softcap, 17 + bits, options);
    }
  }
  // Without warp specialization (built with pingpong and the overlap on):
  // also more tiles than SMs, so that a CTA runs several (claimed
  // dynamically when causal and persistent).
  for (bool persistent : {true, false}) {
    flash3::KernelOptions options;
    options.warp_specialization = false;
    options.persistent = persistent;
    SCOPED_TRACE(std::string("no warp specialization, persistent ") + (persistent ? "on" : "off"));
    for (bool causal : {false, true}) {
      run_case({DType::kBF16, 128, causal, 2, 1000, 1000, 4, 2, false}, 31, options);
      run_case({DType::kBF16, 128, causal, 1, 129, 700, 2, 2, false}, 32, options);
      run_case({DType::kBF16, 128, causal, 4, 2000, 1500, 8, 2, false}, 33, options);
      Case softcap{DType::kBF16, 128, causal, 2, 500, 500, 4, 2, false};
      softcap.softcap = 1.5f;
      run_case(softcap, 34, options);
    }
  }
}

TEST(Forward, RowMaxMovingThroughTheSequence) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // The online softmax's max moves late and often (by more and by less than
  // 2^8 per block, the lazy row max's threshold for head dims >= 128): a max
  // that failed to move would overflow P, one that moved wrongly would
  // mis-scale O or l.
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (int d : {64, 128, 256}) {
      for (bool causal : {false, true}) {
        Case c{dtype, d, causal, 2, 1000, 1000, 4, 2, false};
        c.k_growth = 20.f;
        run_case(c, 77 + d);
        c.seqlen_q = 300;
        c.seqlen_k = 1500;
        run_case(c, 78 + d);
      }
    }
  }
}

TEST(Forward, StridesBeyond2To31Elements) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // Batch 1 of every tensor starts past element 2^31 (about 4.3 GB apart):
  // the strides and the TMA descriptors must be 64-bit throughout.
  int64_t const gap = (int64_t(1) << 31) + 1024;
  for (bool causal : {false, true}) {
    run_case({DType::kBF16, 128, causal, 2, 300, 700, 4, 2, false, gap}, 4242);
  }
}

// N(0, 1) bf16 values, seeded, into each of the device buffers of `elems` elements.
void upload_normal_bf16(std::initializer_list<uint16_t*> dsts, size_t elems, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> host(elems);
  for (uint16_t* dst : dsts) {
    for (uint16_t& x : host) x = to_bits(normal(rng), DType::kBF16);
    CUDA_OK(cudaMemcpy(dst, host.data(), elems * 2, cudaMemcpyHostToDevice));
  }
}

// One forward call captured in a graph on a stream of its own, then two
// replays, `o` (elems 16-bit values) poisoned before each; check(replay)
// after each.
void capture_and_replay(flash3::ForwardArgs const& a, uint16_t* o, size_t elems,
                        std::function<void(int)> const& check) {
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  flash3::Status const s = flash3::forward(a, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(s.ok()) << s.message();
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    CUDA_OK(cudaMemsetAsync(o, 0xff, elems * 2, stream));  // poison
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    check(replay);
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(Forward, TileCounterInCapturedGraph) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // A persistent launch with more tiles than SMs claims its tiles from a
  // counter that each launch leaves zero: the stream's own in a direct
  // call, the graph's own allocation under capture. A second direct call and
  // two replays must give bitwise what the first call gives (a tile's result
  // does not depend on the CTA that claims it); a counter left past zero
  // would skip tiles and leave them poisoned.
  int64_t const batch = 4, seqlen = 2000, heads = 8, d = 128;
  size_t const elems = size_t(batch * seqlen * heads * d);
  DeviceBuffer<uint16_t> q(elems), k(elems), v(elems), o(elems), o_graph(elems);
  ASSERT_TRUE(q.ptr && k.ptr && v.ptr && o.ptr && o_graph.ptr);
  upload_normal_bf16({q.ptr, k.ptr, v.ptr}, elems, 2026);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    flash3::ForwardArgs a =
        flash3::reference::dense_forward_args(DType::kBF16, batch, seqlen, heads, d, q.ptr, k.ptr, v.ptr, o.ptr);
    a.causal = causal;
    flash3::Status s = flash3::forward(a, nullptr);
    if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<uint16_t> direct(elems), again(elems), replayed(elems);
    CUDA_OK(cudaMemcpy(direct.data(), o.ptr, elems * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemset(o.ptr, 0xff, elems * 2));  // poison
    ASSERT_TRUE(flash3::forward(a, nullptr).ok());
    CUDA_OK(cudaMemcpy(again.data(), o.ptr, elems * 2, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(again == direct) << "second direct call";

    a.o = flash3::contiguous<void*>(o_graph.ptr, seqlen, heads, d);
    capture_and_replay(a, o_graph.ptr, elems, [&](int replay) {
      CUDA_OK(cudaMemcpy(replayed.data(), o_graph.ptr, elems * 2, cudaMemcpyDeviceToHost));
      EXPECT_TRUE(replayed == direct) << "replay " << replay;
    });
  }
}

TEST(Forward, CallersTileCounter) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // ForwardArgs::tile_counter replaces flash3's counter: a direct call and a
  // captured graph's replays claim their tiles from it (more tiles than SMs),
  // give bitwise what a call without it gives, and leave it zero.
  int64_t const batch = 4, seqlen = 2000, heads = 8, d = 128;
  size_t const elems = size_t(batch * seqlen * heads * d);
  DeviceBuffer<uint16_t> q(elems), k(elems), v(elems), o(elems);
  DeviceBuffer<int> counter(1);
  ASSERT_TRUE(q.ptr && k.ptr && v.ptr && o.ptr && counter.ptr);
  upload_normal_bf16({q.ptr, k.ptr, v.ptr}, elems, 2027);
  CUDA_OK(cudaMemset(counter.ptr, 0, sizeof(int)));
  flash3::ForwardArgs a =
      flash3::reference::dense_forward_args(DType::kBF16, batch, seqlen, heads, d, q.ptr, k.ptr, v.ptr, o.ptr);
  a.causal = true;
  flash3::Status s = flash3::forward(a, nullptr);
  if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<uint16_t> expected(elems), got(elems);
  CUDA_OK(cudaMemcpy(expected.data(), o.ptr, elems * 2, cudaMemcpyDeviceToHost));
  auto expect_result_and_zero = [&](char const* what) {
    CUDA_OK(cudaMemcpy(got.data(), o.ptr, elems * 2, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(got == expected) << what;
    int left = -1;
    CUDA_OK(cudaMemcpy(&left, counter.ptr, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT_EQ(left, 0) << what;
  };

  a.tile_counter = counter.ptr;
  CUDA_OK(cudaMemset(o.ptr, 0xff, elems * 2));  // poison
  ASSERT_TRUE(flash3::forward(a, nullptr).ok());
  expect_result_and_zero("direct call");

  capture_and_replay(a, o.ptr, elems,
                     [&](int replay) { expect_result_and_zero(replay == 0 ? "replay 0" : "replay 1"); });
}

TEST(TileCounter, OnePerStreamAndPerHostThread) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // Launches on one stream run in order and may share a counter; launches on
  // two streams may run at once and must not. cudaStreamPerThread names a
  // different stream in each host thread, so each thread gets its own. (A
  // forward test cannot show this reliably: two persistent grids overlap only
  // in their tails, after most of their claims.)
  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  cudaStream_t one, other;
  CUDA_OK(cudaStreamCreateWithFlags(&one, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  flash3::TileCounter first, again, elsewhere;
  ASSERT_EQ(first.acquire(device, one), cudaSuccess);
  ASSERT_EQ(again.acquire(device, one), cudaSuccess);
  ASSERT_EQ(elsewhere.acquire(device, other), cudaSuccess);
  EXPECT_EQ(first.get(), again.get());
  EXPECT_NE(first.get(), elsewhere.get());
  int value = -1;
  CUDA_OK(cudaMemcpyAsync(&value, first.get(), sizeof(int), cudaMemcpyDeviceToHost, one));
  CUDA_OK(cudaStreamSynchronize(one));
  EXPECT_EQ(value, 0);

  int* per_thread[2][2] = {};
  auto worker = [&](int w) {
    cudaSetDevice(device);
    for (int i = 0; i < 2; ++i) {
      flash3::TileCounter counter;
      if (counter.acquire(device, cudaStreamPerThread) == cudaSuccess) per_thread[w][i] = counter.get();
      counter.release(cudaStreamPerThread);
    }
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  for (int w = 0; w < 2; ++w) {
    ASSERT_NE(per_thread[w][0], nullptr);
    EXPECT_EQ(per_thread[w][0], per_thread[w][1]) << "thread " << w;
  }
  EXPECT_NE(per_thread[0][0], per_thread[1][0]);
  for (flash3::TileCounter* c : {&first, &again, &elsewhere}) EXPECT_EQ(c->release(one), cudaSuccess);
  CUDA_OK(cudaStreamDestroy(one));
  CUDA_OK(cudaStreamDestroy(other));
}

// Shapes drawn at random (gpu_test_util.h), besides the sweep's.
TEST(Forward, RandomShapes) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 500;
  for (flash3::testing::RandomShape const& r : flash3::testing::random_shapes(2026, 40, 4096)) {
    run_case(Case{r.dtype, r.head_dim, r.causal, r.batch, r.seqlen_q, r.seqlen_k, r.heads_q, r.heads_kv, false}, seed++);
  }
}

// With the mask, rows 0 .. seqlen_q - seqlen_k - 1 see no key: here all but
// the last tile of each head, six to ten a CTA, so that CTAs end on such a
// tile. Every warpgroup sits it out; Q's load must still be waited for, or
// the CTA can exit with it in flight ("unspecified launch failure",
// synccheck's "Missing wait").
// Attention sinks: every head dim (and pair) and dtype, GQA, and causal rows
// that see only their sink (O = 0, LSE = sink).
TEST(Forward, Sinks) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 600;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (HeadDims const h : kHeadDims) {
      for (bool causal : {false, true}) {
        Case c{dtype, h.qk, causal, 2, 300, 300, 4, 2, false};
        c.sinks = true;
        c.head_dim_v = h.v_arg();
        run_case(c, seed++);
      }
    }
  }
  Case empty_rows{DType::kBF16, 128, true, 1, 500, 100, 8, 1, false};
  empty_rows.sinks = true;
  run_case(empty_rows, seed++);
}

// Sliding windows (gpu_test_util.h's cases).
TEST(Forward, Windows) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 800;
  for (flash3::testing::OptionCase const& o : flash3::testing::window_cases()) run_case(with_options(o), seed++);
}

// Softcapping (gpu_test_util.h's cases), with K's rows growing toward the first keys so
// that scores of a few units meet the cap.
TEST(Forward, Softcap) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 900;
  for (flash3::testing::OptionCase const& o : flash3::testing::softcap_cases()) {
    Case c = with_options(o);
    c.k_growth = 2.f;
    run_case(c, seed++);
  }
}

// Packed sequences (varlen): each sequence's O and LSE against the GPU
// reference run on it alone. Lengths of 0, 1, shorter than a tile, not a
// multiple of one, several tiles; GQA; seqused below the packed lengths;
// 3 rows past the last sequence (the rows past seqused and the last
// sequence must stay unwritten: poisoned).
struct VarlenCase {
  DType dtype;
  int head_dim;
  bool causal;
  std::vector<int> len_q, len_k;
  int heads_q = 4, heads_kv = 2;
  bool seqused = false;  // 5 packed rows past each sequence's used ones
  int window_left = -1;
  float softcap = 0.f;
  int head_dim_v = 0;  // as ForwardArgs::head_dim_v
};

void run_varlen(VarlenCase const& c, uint32_t seed) {
  flash3::testing::PackedBatch const packed(c.len_q, c.len_k, c.seqused, /*tail=*/3);
  int const batch = packed.batch(), d = c.head_dim;
  int const dv = c.head_dim_v != 0 ? c.head_dim_v : d;
  SCOPED_TRACE(std::string(c.dtype == DType::kBF16 ? "bf16" : "fp16") + " d" + std::to_string(d) +
               (dv != d ? " dv" + std::to_string(dv) : "") + (c.causal ? " causal" : "") + " batch " +
               std::to_string(batch) + (c.seqused ? " seqused" : "") + (c.window_left >= 0 ? " window" : "") +
               (c.softcap > 0 ? " softcap" : ""));
  std::vector<int32_t> const& cu_q = packed.cu_q;
  std::vector<int32_t> const& cu_k = packed.cu_k;
  int const total_q = packed.total_q, total_k = packed.total_k, hq = c.heads_q, hkv = c.heads_kv;
  size_t const q_elems = size_t(total_q) * hq * d, kv_elems = size_t(total_k) * hkv * d;
  size_t const v_elems = size_t(total_k) * hkv * dv, o_elems = size_t(total_q) * hq * dv;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto random = [&](size_t n) {
    std::vector<uint16_t> h(n);
    for (auto& x : h) x = to_bits(normal(rng), c.dtype);
    return h;
  };
  DeviceBuffer<uint16_t> q(q_elems), k(std::max<size_t>(kv_elems, 1)), v(std::max<size_t>(v_elems, 1)), o(o_elems);
  DeviceBuffer<float> lse(size_t(hq) * total_q), ref_o(o_elems), low_o(o_elems), ref_lse(size_t(hq) * total_q);
  for (auto [dst, host] : {std::pair{q.ptr, random(q_elems)}, std::pair{k.ptr, random(kv_elems)},
                           std::pair{v.ptr, random(v_elems)}}) {
    CUDA_OK(cudaMemcpy(dst, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  }
  CUDA_OK(packed.upload());
  CUDA_OK(cudaMemset(o.ptr, 0xff, o_elems * 2));  // poison: rows not written stay NaN
  CUDA_OK(cudaMemset(lse.ptr, 0xff, size_t(hq) * total_q * 4));

  flash3::ForwardArgs a =
      packed.forward_args(c.dtype, hq, hkv, d, c.head_dim_v, q.ptr, k.ptr, v.ptr, o.ptr, lse.ptr);
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.softcap = c.softcap;
  flash3::Status s = flash3::forward(a, nullptr);
  if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  CUDA_OK(cudaDeviceSynchronize());

  // The reference, sequence by sequence: views into the packed buffers.
  for (int b = 0; b < batch; ++b) {
    AttentionShape shape{1, c.len_q[b], c.len_k[b], hq, hkv, d, 0.f, c.causal};
    shape.window_left = c.window_left;
    shape.softcap = c.softcap;
    shape.head_dim_v = c.head_dim_v;
    auto view = [&](uint16_t* base, int row, int heads, int dim) {
      return flash3::ConstTensor{base + size_t(row) * heads * dim, 0, int64_t(heads) * dim, dim, 1};
    };
    DeviceBuffer<float> seq_lse(size_t(hq) * std::max(c.len_q[b], 1));
    size_t const at = size_t(cu_q[b]) * hq * dv;
    CUDA_OK(flash3::reference::attention_gpu(shape, c.dtype, view(q.ptr, cu_q[b], hq, d),
                                             view(k.ptr, cu_k[b], hkv, d), view(v.ptr, cu_k[b], hkv, dv),
                                             ref_o.ptr + at, seq_lse.ptr, false, nullptr));
    CUDA_OK(flash3::reference::attention_gpu(shape, c.dtype, view(q.ptr, cu_q[b], hq, d),
                                             view(k.ptr, cu_k[b], hkv, d), view(v.ptr, cu_k[b], hkv, dv),
                                             low_o.ptr + at, nullptr, true, nullptr));
    for (int h = 0; h < hq && c.len_q[b] > 0; ++h) {
      CUDA_OK(cudaMemcpy(ref_lse.ptr + size_t(h) * total_q + cu_q[b], seq_lse.ptr + size_t(h) * c.len_q[b],
                         c.len_q[b] * 4, cudaMemcpyDeviceToDevice));
    }
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> h_o(o_elems);
  std::vector<float> h_lse(size_t(hq) * total_q), h_ref(o_elems), h_low(o_elems), h_ref_lse(size_t(hq) * total_q);
  CUDA_OK(cudaMemcpy(h_o.data(), o.ptr, o_elems * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_lse.data(), lse.ptr, h_lse.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_ref.data(), ref_o.ptr, o_elems * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_low.data(), low_o.ptr, o_elems * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_ref_lse.data(), ref_lse.ptr, h_ref_lse.size() * 4, cudaMemcpyDeviceToHost));

  // The used rows, compared; the others (past seqused, past the last
  // sequence), still poisoned.
  flash3::testing::PackedForwardRows used;
  ASSERT_NO_FATAL_FAILURE(flash3::testing::gather_packed_rows(packed, hq, size_t(hq) * dv, h_o, h_ref, h_low, h_lse,
                                                              h_ref_lse, used, [](int, int, size_t, int) {}));
  flash3::testing::expect_forward_close(used.o, c.dtype, used.ref, used.low, used.lse, used.ref_lse,
                                        [](size_t) { return 0.0; });
}

TEST(Forward, Varlen) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::vector<int> const len_q{300, 0, 1, 129, 1000, 64, 77}, len_k{250, 40, 0, 700, 1000, 64, 300};
  uint32_t seed = 1300;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (HeadDims const h : kHeadDims) {
      for (bool causal : {false, true}) {
        VarlenCase c{dtype, h.qk, causal, len_q, len_k};
        c.head_dim_v = h.v_arg();
        run_varlen(c, seed++);
      }
    }
  }
  // Equal lengths, as a fixed-length batch would hold them; one sequence.
  run_varlen({DType::kBF16, 128, true, {512, 512, 512}, {512, 512, 512}}, seed++);
  run_varlen({DType::kBF16, 128, false, {3000}, {2000}}, seed++);
  // seqused below the packed lengths; a window and softcapping; MQA; the
  // pair 192 / 128 with each.
  for (bool causal : {false, true}) {
    run_varlen({DType::kBF16, 128, causal, len_q, len_k, 4, 2, true}, seed++);
    run_varlen({DType::kFP16, 64, causal, len_q, len_k, 4, 2, false, 90, 2.f}, seed++);
    run_varlen({DType::kBF16, 256, causal, len_q, len_k, 8, 1}, seed++);
    run_varlen({DType::kBF16, 192, causal, len_q, len_k, 4, 2, true, -1, 0.f, 128}, seed++);
    run_varlen({DType::kFP16, 192, causal, len_q, len_k, 4, 2, false, 90, 2.f, 128}, seed++);
    run_varlen({DType::kBF16, 192, causal, len_q, len_k, 8, 1, false, -1, 0.f, 128}, seed++);
  }
}

TEST(Forward, TilesWhoseRowsSeeNoKey) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 77;
  for (int d : {64, 128, 256}) run_case(Case{DType::kBF16, d, true, 1, 20000, 64, 8, 8, false}, seed++);
}

TEST(Forward, NoKeysGivesZerosAndInfiniteLse) {
  SKIP_WITHOUT_CUDA_DEVICE();
  flash3::ForwardArgs a;
  a.batch = 1;
  a.seqlen_q = 5;
  a.seqlen_k = 0;
  a.heads_q = a.heads_kv = 2;
  a.head_dim = 64;
  DeviceBuffer<uint16_t> q(5 * 2 * 64), o(5 * 2 * 64);
  DeviceBuffer<float> lse(2 * 5);
  CUDA_OK(cudaMemset(q.ptr, 0, 5 * 2 * 64 * 2));
  CUDA_OK(cudaMemset(o.ptr, 0xff, 5 * 2 * 64 * 2));
  a.q = flash3::contiguous<const void*>(q.ptr, 5, 2, 64);
  a.o = flash3::contiguous<void*>(o.ptr, 5, 2, 64);
  a.lse = lse.ptr;
  flash3::Status s = flash3::forward(a, nullptr);
  if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<uint16_t> h(5 * 2 * 64);
  std::vector<float> hl(10);
  CUDA_OK(cudaMemcpy(h.data(), o.ptr, h.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hl.data(), lse.ptr, hl.size() * 4, cudaMemcpyDeviceToHost));
  for (uint16_t x : h) EXPECT_EQ(x, 0);
  for (float x : hl) EXPECT_TRUE(std::isinf(x) && x > 0);
}

}  // namespace
