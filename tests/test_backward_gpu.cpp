// The backward kernels against the GPU reference on fresh random inputs.
//
// O and LSE come from flash3's forward, as in training. Tolerance, as
// FlashAttention's own tests: for each of dQ, dK, dV the max error against the
// float32 reference is at most 2x (plus a small epsilon) the error of a
// straightforward implementation in the same precision (the reference with
// emulate_low_precision). The epsilon (reference::backward_epsilon, which the
// benchmark's check uses too) is, first, twice what D = rowsum(dO o O)
// taken from the rounded O (as FlashAttention takes it) moves the float32
// reference's gradients, measured (the reference given O); then 1e-4 of the
// largest gradient and 1e-5, for float32's own rounding (with one key the
// exact gradients are 0, the kernel's 1e-6 to 2e-5, growing with the rows).
// The first term is needed: at fp16, head dim 96, causal, 6 queries on 2
// keys, D's rounding alone moves dQ well past the other two terms.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bwd/tail_split.h"
#include "bwd/workspace.h"
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
  bool packed = false;  // Q, K, V (and dQ, dK, dV) interleaved in one [b, s, 3, h, d] buffer
  bool sinks = false;   // a random sink per query head, and its gradient
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  int head_dim_v = 0;  // V's, O's, dO's and dV's, as BackwardArgs::head_dim_v
};

std::string name(Case const& c) {
  return std::string(c.dtype == DType::kBF16 ? "bf16" : "fp16") + " d" + std::to_string(c.head_dim) +
         (c.head_dim_v != 0 ? " dv" + std::to_string(c.head_dim_v) : "") + (c.causal ? " causal" : "") + " b" +
         std::to_string(c.batch) + " sq" + std::to_string(c.seqlen_q) + " sk" +
         std::to_string(c.seqlen_k) + " h" + std::to_string(c.heads_q) + "/" + std::to_string(c.heads_kv) +
         (c.packed ? " packed" : "") + (c.sinks ? " sinks" : "") +
         (c.window_left >= 0 || c.window_right >= 0
              ? " window (" + std::to_string(c.window_left) + ", " + std::to_string(c.window_right) + ")"
              : "") +
         (c.softcap != 0.f ? " softcap " + std::to_string(c.softcap) : "");
}

// A case of the options' lists (gpu_test_util.h).
Case with_options(flash3::testing::OptionCase const& o) {
  Case c{o.dtype, o.head_dim, o.causal, o.batch, o.seqlen_q, o.seqlen_k, o.heads_q, o.heads_kv};
  c.window_left = o.window_left;
  c.window_right = o.window_right;
  c.softcap = o.softcap;
  c.sinks = o.sinks;
  c.head_dim_v = o.head_dim_v;
  return c;
}

// A [batch, seqlen, heads, d] tensor in its own buffer, or a view into a packed one.
struct Tensor {
  uint16_t* data;
  int64_t batch_stride, seq_stride, head_stride;
  flash3::ConstTensor in() const { return {data, batch_stride, seq_stride, head_stride, 1}; }
  flash3::MutableTensor out() const { return {data, batch_stride, seq_stride, head_stride, 1}; }
};

struct Grads {
  std::vector<uint16_t> dq, dk, dv;  // dense copies of the outputs
  std::vector<float> dsinks;         // with sinks
};

class BackwardCase {
 public:
  // Q, K (and dQ, dK) of head dim d; V, O, dO (and dV) of dv. Packed: each
  // row holds Q's, K's and V's heads, [h, d], [h, d], [h, dv].
  BackwardCase(Case const& c, uint32_t seed)
      : c_(c),
        d_(c.head_dim),
        dv_(c.head_dim_v != 0 ? c.head_dim_v : c.head_dim),
        q_elems_(size_t(c.batch) * c.seqlen_q * c.heads_q * d_),
        kv_elems_(size_t(c.batch) * c.seqlen_k * c.heads_kv * d_),
        v_elems_(size_t(c.batch) * c.seqlen_k * c.heads_kv * dv_),
        o_elems_(size_t(c.batch) * c.seqlen_q * c.heads_q * dv_),
        in_(inputs_elems()),
        grad_(inputs_elems()),
        o_(o_elems_),
        dout_(o_elems_),
        lse_(size_t(c.batch) * c.heads_q * c.seqlen_q),
        sinks_(c.sinks ? c.heads_q : 0),
        dsinks_(c.sinks ? c.heads_q : 0) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto upload = [&](uint16_t* dst, size_t n) {
      std::vector<uint16_t> host(n);
      for (auto& x : host) x = to_bits(normal(rng), c.dtype);
      ok_ = ok_ && dst && cudaMemcpy(dst, host.data(), n * 2, cudaMemcpyHostToDevice) == cudaSuccess;
    };
    upload(in_.ptr, inputs_elems());
    upload(dout_.ptr, o_elems_);
    if (c.sinks) {
      std::vector<float> host(c.heads_q);
      for (float& x : host) x = 2.f * normal(rng);  // around the scores' size
      ok_ = ok_ && sinks_.ptr && dsinks_.ptr &&
            cudaMemcpy(sinks_.ptr, host.data(), host.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess;
    }
    q_ = view(in_.ptr, 0, true);
    k_ = view(in_.ptr, 1, false);
    v_ = view(in_.ptr, 2, false);
    dq_ = view(grad_.ptr, 0, true);
    dk_ = view(grad_.ptr, 1, false);
    dv_grad_ = view(grad_.ptr, 2, false);
  }

  bool ok() const { return ok_ && o_.ptr && lse_.ptr; }

  flash3::BackwardArgs args() const {
    flash3::BackwardArgs a;
    a.dtype = c_.dtype;
    a.batch = c_.batch;
    a.seqlen_q = c_.seqlen_q;
    a.seqlen_k = c_.seqlen_k;
    a.heads_q = c_.heads_q;
    a.heads_kv = c_.heads_kv;
    a.head_dim = d_;
    a.head_dim_v = c_.head_dim_v;
    a.causal = c_.causal;
    a.window_left = c_.window_left;
    a.window_right = c_.window_right;
    a.softcap = c_.softcap;
    a.q = q_.in();
    a.k = k_.in();
    a.v = v_.in();
    a.o = flash3::contiguous<const void*>(o_.ptr, c_.seqlen_q, c_.heads_q, dv_);
    a.dout = flash3::contiguous<const void*>(dout_.ptr, c_.seqlen_q, c_.heads_q, dv_);
    a.lse = lse_.ptr;
    a.dq = dq_.out();
    a.dk = dk_.out();
    a.dv = dv_grad_.out();
    a.sinks = sinks_.ptr;
    a.dsinks = dsinks_.ptr;
    return a;
  }

  flash3::Status forward() {
    flash3::ForwardArgs f;
    f.dtype = c_.dtype;
    f.batch = c_.batch;
    f.seqlen_q = c_.seqlen_q;
    f.seqlen_k = c_.seqlen_k;
    f.heads_q = c_.heads_q;
    f.heads_kv = c_.heads_kv;
    f.head_dim = d_;
    f.head_dim_v = c_.head_dim_v;
    f.causal = c_.causal;
    f.window_left = c_.window_left;
    f.window_right = c_.window_right;
    f.softcap = c_.softcap;
    f.q = q_.in();
    f.k = k_.in();
    f.v = v_.in();
    f.o = flash3::contiguous<void*>(o_.ptr, c_.seqlen_q, c_.heads_q, dv_);
    f.lse = lse_.ptr;
    f.sinks = sinks_.ptr;
    flash3::Status s = flash3::forward(f, nullptr);
    if (!s.ok()) return s;
    cudaError_t const err = cudaDeviceSynchronize();
    if (err != cudaSuccess) return {flash3::Status::Code::kCudaError, std::string("forward: ") + cudaGetErrorString(err)};
    return s;
  }

  // Poisons the gradients (NaN where not written), runs backward, copies them out.
  flash3::Status backward(flash3::BackwardArgs const& a, Grads& run) {
    poison(nullptr);
    flash3::Status s = flash3::backward(a, nullptr);
    return s.ok() ? download_grads(nullptr, run) : s;
  }

  // The same, captured once in a CUDA graph on a stream of its own and
  // replayed runs.size() times, each on poisoned gradients.
  flash3::Status backward_in_graph(flash3::BackwardArgs const& a, std::vector<Grads>& runs) {
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    flash3::Status s = cuda_status("stream", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (s.ok()) s = cuda_status("capture", cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    if (s.ok()) {
      s = flash3::backward(a, stream);
      flash3::Status const ended = cuda_status("capture", cudaStreamEndCapture(stream, &graph));
      if (s.ok()) s = ended;
    }
    if (s.ok()) s = cuda_status("instantiate", cudaGraphInstantiate(&exec, graph, 0));
    for (Grads& run : runs) {
      if (!s.ok()) break;
      poison(stream);
      s = cuda_status("replay", cudaGraphLaunch(exec, stream));
      if (s.ok()) s = download_grads(stream, run);
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (stream) cudaStreamDestroy(stream);
    return s;
  }

  void check(Grads const& run) {
    AttentionShape shape{c_.batch, c_.seqlen_q, c_.seqlen_k, c_.heads_q, c_.heads_kv, d_, 0.f, c_.causal};
    shape.window_left = c_.window_left;
    shape.window_right = c_.window_right;
    shape.softcap = c_.softcap;
    shape.head_dim_v = c_.head_dim_v;
    // Each run's buffer: dQ, dK, dV, then the sinks' gradient.
    size_t const grads = q_elems_ + kv_elems_ + v_elems_;
    size_t const n = grads + (c_.sinks ? c_.heads_q : 0);
    DeviceBuffer<float> ref(n), low(n), rounded_o(n);
    ASSERT_TRUE(ref.ptr && low.ptr && rounded_o.ptr);
    flash3::ConstTensor dout = flash3::contiguous<const void*>(dout_.ptr, c_.seqlen_q, c_.heads_q, dv_);
    flash3::ConstTensor const o = flash3::contiguous<const void*>(o_.ptr, c_.seqlen_q, c_.heads_q, dv_);
    struct Run {
      float* buf;
      bool emulate;
      flash3::ConstTensor const* o;
    };
    for (Run const& r : {Run{ref.ptr, false, nullptr}, Run{low.ptr, true, nullptr}, Run{rounded_o.ptr, false, &o}}) {
      CUDA_OK(flash3::reference::attention_backward_gpu(
          shape, c_.dtype, q_.in(), k_.in(), v_.in(), dout, r.buf, r.buf + q_elems_, r.buf + q_elems_ + kv_elems_,
          r.emulate, nullptr, r.o, sinks_.ptr, c_.sinks ? r.buf + grads : nullptr));
    }
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> h_ref(n), h_low(n), h_rounded_o(n);
    CUDA_OK(cudaMemcpy(h_ref.data(), ref.ptr, n * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h_low.data(), low.ptr, n * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h_rounded_o.data(), rounded_o.ptr, n * 4, cudaMemcpyDeviceToHost));
    size_t const at[3] = {0, q_elems_, q_elems_ + kv_elems_};
    compare("dQ", run.dq, h_ref.data() + at[0], h_low.data() + at[0], h_rounded_o.data() + at[0]);
    compare("dK", run.dk, h_ref.data() + at[1], h_low.data() + at[1], h_rounded_o.data() + at[1]);
    compare("dV", run.dv, h_ref.data() + at[2], h_low.data() + at[2], h_rounded_o.data() + at[2]);
    if (c_.sinks) compare_sink_gradient(run.dsinks, h_ref.data() + grads, h_rounded_o.data() + grads);
  }

 private:
  static flash3::Status cuda_status(char const* what, cudaError_t err) {
    if (err == cudaSuccess) return {};
    return {flash3::Status::Code::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
  }
  size_t inputs_elems() const {
    return c_.packed ? size_t(c_.batch) * c_.seqlen_q * c_.heads_q * (2 * d_ + dv_) : q_elems_ + kv_elems_ + v_elems_;
  }
  void poison(cudaStream_t stream) {
    cudaMemsetAsync(grad_.ptr, 0xff, inputs_elems() * 2, stream);
    if (dsinks_.ptr) cudaMemsetAsync(dsinks_.ptr, 0xff, c_.heads_q * sizeof(float), stream);
  }
  flash3::Status download_grads(cudaStream_t stream, Grads& run) {
    flash3::Status const s = cuda_status("backward", cudaStreamSynchronize(stream));
    if (!s.ok()) return s;
    run.dq = download(dq_, c_.seqlen_q, c_.heads_q, d_);
    run.dk = download(dk_, c_.seqlen_k, c_.heads_kv, d_);
    run.dv = download(dv_grad_, c_.seqlen_k, c_.heads_kv, dv_);
    run.dsinks.resize(dsinks_.ptr ? c_.heads_q : 0);
    if (dsinks_.ptr) cudaMemcpy(run.dsinks.data(), dsinks_.ptr, c_.heads_q * sizeof(float), cudaMemcpyDeviceToHost);
    return s;
  }

  // Q (which 0), K (1) or V (2), or their gradients.
  Tensor view(uint16_t* base, int which, bool is_q) const {
    int64_t const heads = is_q ? c_.heads_q : c_.heads_kv;
    int64_t const seqlen = is_q ? c_.seqlen_q : c_.seqlen_k;
    int64_t const dim = which == 2 ? dv_ : d_;
    if (c_.packed) {
      int64_t const row = c_.heads_q * (2 * d_ + dv_);
      return {base + which * c_.heads_q * d_, row * c_.seqlen_q, row, dim};
    }
    uint16_t* start = base + (which == 0 ? 0 : which == 1 ? q_elems_ : q_elems_ + kv_elems_);
    return {start, seqlen * heads * dim, heads * dim, dim};
  }

  std::vector<uint16_t> download(Tensor const& t, int64_t seqlen, int64_t heads, int64_t dim) {
    std::vector<uint16_t> out(size_t(c_.batch) * seqlen * heads * dim);
    for (int64_t b = 0; b < c_.batch; ++b) {
      for (int64_t s = 0; s < seqlen; ++s) {
        cudaMemcpy2D(out.data() + ((b * seqlen + s) * heads) * dim, dim * 2,
                     t.data + b * t.batch_stride + s * t.seq_stride, t.head_stride * 2, dim * 2, heads,
                     cudaMemcpyDeviceToHost);
      }
    }
    return out;
  }

  void compare(char const* what, std::vector<uint16_t> const& got, float const* ref, float const* low,
               float const* rounded_o) {
    double err = 0, low_err = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      float const x = from_bits(got[i], c_.dtype);
      ASSERT_FALSE(std::isnan(x)) << what << "[" << i << "] not written or NaN";
      err = std::max(err, double(std::fabs(x - ref[i])));
      low_err = std::max(low_err, double(std::fabs(low[i] - ref[i])));
    }
    double const eps = flash3::reference::backward_epsilon(ref, rounded_o, got.size());
    EXPECT_LE(err, 2 * low_err + eps) << what << ": flash3 max error " << err << ", same-precision reference "
                                      << low_err << ", epsilon " << eps;
  }

  // The sinks' gradient, -sum_i P_sink D_i, takes D from the kernel's rounded
  // O as every fused backward does: its yardstick is the reference given that
  // O (rounded_o), from which only float32 sums separate it; its distance to
  // the plain reference is that rounding's alone.
  void compare_sink_gradient(std::vector<float> const& got, float const* ref, float const* rounded_o) {
    double scale = 0;
    for (int64_t h = 0; h < c_.heads_q; ++h) scale = std::max({scale, double(std::fabs(ref[h])), 1.0});
    for (int64_t h = 0; h < c_.heads_q; ++h) {
      ASSERT_FALSE(std::isnan(got[h])) << "dsinks[" << h << "] not written or NaN";
      double const err = std::fabs(got[h] - rounded_o[h]);
      EXPECT_LE(err, 1e-4 * scale) << "dsinks[" << h << "]: " << got[h] << ", reference with flash3's O "
                                   << rounded_o[h] << ", plain reference " << ref[h];
    }
  }

  Case c_;
  int64_t d_, dv_;
  size_t q_elems_, kv_elems_, v_elems_, o_elems_;
  DeviceBuffer<uint16_t> in_, grad_, o_, dout_;
  DeviceBuffer<float> lse_, sinks_, dsinks_;
  Tensor q_{}, k_{}, v_{}, dq_{}, dk_{}, dv_grad_{};
  bool ok_ = true;
};

void run_case(Case const& c, uint32_t seed) {
  SCOPED_TRACE(name(c));
  BackwardCase bc(c, seed);
  ASSERT_TRUE(bc.ok());
  flash3::Status s = bc.forward();
  if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  Grads run;
  s = bc.backward(bc.args(), run);
  if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  bc.check(run);
}

class Backward : public ::testing::TestWithParam<SweepParam> {};

TEST_P(Backward, ShapeSweep) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto [dtype, h, causal] = GetParam();
  int const d = h.qk;
  std::vector<Case> cases = {
      {dtype, d, causal, 2, 1, 1, 4, 4},       {dtype, d, causal, 2, 7, 7, 4, 4},
      {dtype, d, causal, 1, 113, 113, 8, 2},   {dtype, d, causal, 2, 255, 255, 8, 8},
      {dtype, d, causal, 1, 1023, 1023, 8, 1}, {dtype, d, causal, 1, 4097, 4097, 2, 2},
      {dtype, d, causal, 2, 113, 1023, 4, 1},  {dtype, d, causal, 2, 1023, 113, 4, 4},
      {dtype, d, causal, 1, 1, 700, 8, 2},     {dtype, d, causal, 1, 300, 7, 2, 2},
      {dtype, d, causal, 2, 255, 255, 4, 4, true},
  };
  uint32_t seed = 4321 + d + (causal ? 1 : 0);
  for (Case c : cases) {
    c.head_dim_v = h.v_arg();
    run_case(c, seed++);
  }
}

INSTANTIATE_TEST_SUITE_P(All, Backward,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kFP16),
                                            ::testing::ValuesIn(kHeadDims), ::testing::Bool()),
                         sweep_name);

// Runs the case's forward pass. False where it failed, or where a narrowed
// build (FLASH3_HEAD_DIMS) lacks its kernels: then the reason joins
// `unsupported`, for the test to skip with once its other cases have run.
bool forward_unless_unsupported(BackwardCase& bc, std::string& unsupported) {
  flash3::Status const s = bc.forward();
  if (s.code() == flash3::Status::Code::kUnsupported) {
    unsupported += s.message() + "; ";
    return false;
  }
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok();
}

// Head dim 256 adds its dQ in two chunks in this mode (with atomics otherwise).
TEST(BackwardDeterministic, BitwiseEqualRuns) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::string unsupported;
  // A window's turns start at each query block's first key block.
  Case windowed{DType::kBF16, 128, false, 2, 2000, 1500, 4, 2};
  windowed.window_left = 300;
  windowed.window_right = 40;
  for (Case const& c : {Case{DType::kBF16, 128, false, 2, 2000, 2000, 4, 2},
                        Case{DType::kBF16, 128, true, 2, 2000, 2000, 4, 2},
                        Case{DType::kBF16, 256, false, 2, 2000, 2000, 4, 2},
                        Case{DType::kBF16, 256, true, 2, 2000, 2000, 4, 2}, windowed}) {
    SCOPED_TRACE(name(c));
    BackwardCase bc(c, 77);
    ASSERT_TRUE(bc.ok());
    if (!forward_unless_unsupported(bc, unsupported)) continue;
    flash3::BackwardArgs a = bc.args();
    a.deterministic = true;
    Grads first, second;
    flash3::Status s = bc.backward(a, first);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_TRUE(bc.backward(a, second).ok());
    EXPECT_EQ(first.dq, second.dq);
    EXPECT_EQ(first.dk, second.dk);
    EXPECT_EQ(first.dv, second.dv);
    bc.check(first);
  }
  if (!unsupported.empty()) GTEST_SKIP() << unsupported;
}

// Non-causal shapes with more CTAs than a wave and a few left over: the last
// tiles are split into parts whose dK and dV sums the last part stores
// (bwd/tail_split.h), through the TMA store (MHA, bf16) and the per-head fp32
// path (GQA, fp16); with V's head dim of its own, dK's and dV's sums of
// different widths.
TEST(Backward, LastWaveSplit) {
  SKIP_WITHOUT_CUDA_DEVICE();
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  uint32_t seed = 900;
  for (HeadDims const h : {HeadDims{64, 64}, HeadDims{128, 128}, HeadDims{256, 256}, HeadDims{192, 128}}) {
    int const d = h.qk;
    int const heads = 2048 / d;  // 10 at d = 192: GQA in groups of 2 there, of 4 elsewhere
    // A wave of tiles and a few more on this device, the last key block partial.
    int const seqlen_k = (sms / heads + 1) * flash3::bwd::bwd_block_n(d) - 20;
    for (Case c : {Case{DType::kBF16, d, false, 1, 1100, seqlen_k, heads, heads},
                   Case{DType::kFP16, d, false, 1, 1000, seqlen_k, heads, heads / (heads % 4 == 0 ? 4 : 2)}}) {
      c.head_dim_v = h.v_arg();
      int64_t const tiles = flash3::div_up(int(c.seqlen_k), flash3::bwd::bwd_block_n(d)) * int64_t(c.heads_q);
      int const m_blocks = flash3::div_up(int(c.seqlen_q), flash3::bwd::bwd_block_m(d));
      ASSERT_GT(flash3::bwd::plan_tail_split(tiles, sms, m_blocks, flash3::bwd::kMaxSplitTiles).split_tiles, 0)
          << name(c) << ": no split on " << sms << " SMs";
      run_case(c, seed++);
    }
  }
}

// No query row: every key's dK and dV are zero, and are written (the
// gradients are poisoned first); Q, O, dO and the LSE are not read (null).
// MHA and GQA, whose zeros come from the same group-sum kernel.
TEST(Backward, NoQueryGivesZeroKeyGradients) {
  SKIP_WITHOUT_CUDA_DEVICE();
  for (HeadDims const h : {HeadDims{64, 64}, HeadDims{128, 128}, HeadDims{256, 256}, HeadDims{192, 128}}) {
    int64_t const d = h.qk, dv_dim = h.v;
    for (int heads_kv : {8, 2}) {
      SCOPED_TRACE("d" + std::to_string(d) + " dv" + std::to_string(dv_dim) + " h8/" + std::to_string(heads_kv));
      int64_t const batch = 2, seqlen_k = 300;
      size_t const n = size_t(batch * seqlen_k * heads_kv * d), n_v = size_t(batch * seqlen_k * heads_kv * dv_dim);
      DeviceBuffer<uint16_t> k(n), v(n_v), dk(n), dv(n_v);
      ASSERT_TRUE(k.ptr && v.ptr && dk.ptr && dv.ptr);
      ASSERT_EQ(cudaMemset(k.ptr, 0x3c, n * 2), cudaSuccess);
      ASSERT_EQ(cudaMemset(v.ptr, 0x3c, n_v * 2), cudaSuccess);
      ASSERT_EQ(cudaMemset(dk.ptr, 0xff, n * 2), cudaSuccess);  // NaN
      ASSERT_EQ(cudaMemset(dv.ptr, 0xff, n_v * 2), cudaSuccess);
      flash3::BackwardArgs a;
      a.dtype = DType::kBF16;
      a.batch = batch;
      a.seqlen_q = 0;
      a.seqlen_k = seqlen_k;
      a.heads_q = 8;
      a.heads_kv = heads_kv;
      a.head_dim = d;
      a.head_dim_v = h.v_arg();
      a.k = flash3::contiguous<const void*>(k.ptr, seqlen_k, heads_kv, d);
      a.v = flash3::contiguous<const void*>(v.ptr, seqlen_k, heads_kv, dv_dim);
      a.dk = flash3::contiguous<void*>(dk.ptr, seqlen_k, heads_kv, d);
      a.dv = flash3::contiguous<void*>(dv.ptr, seqlen_k, heads_kv, dv_dim);
      flash3::Status const s = flash3::backward(a, nullptr);
      if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
      ASSERT_TRUE(s.ok()) << s.message();
      std::vector<uint16_t> got_k(n), got_v(n_v);
      ASSERT_EQ(cudaMemcpy(got_k.data(), dk.ptr, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got_v.data(), dv.ptr, n_v * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(got_k[i], 0) << "dk[" << i << "]";
      for (size_t i = 0; i < n_v; ++i) ASSERT_EQ(got_v[i], 0) << "dv[" << i << "]";
    }
  }
}

// No key: dQ = 0 (the postprocess runs without a main kernel before it).
TEST(Backward, NoKeyGivesZeroQueryGradients) {
  SKIP_WITHOUT_CUDA_DEVICE();
  for (HeadDims const h : {HeadDims{64, 64}, HeadDims{128, 128}, HeadDims{256, 256}, HeadDims{192, 128}}) {
    int64_t const d = h.qk, dv = h.v;
    for (bool causal : {false, true}) {
      SCOPED_TRACE("d" + std::to_string(d) + " dv" + std::to_string(dv) + (causal ? " causal" : ""));
      int64_t const batch = 2, seqlen_q = 300, heads = 4;
      size_t const n = size_t(batch * seqlen_q * heads * d), n_o = size_t(batch * seqlen_q * heads * dv);
      DeviceBuffer<uint16_t> q(n), o(n_o), dout(n_o), dq(n);
      DeviceBuffer<float> lse(size_t(batch * heads * seqlen_q));
      ASSERT_TRUE(q.ptr && o.ptr && dout.ptr && dq.ptr && lse.ptr);
      ASSERT_EQ(cudaMemset(q.ptr, 0x3c, n * 2), cudaSuccess);
      for (void* p : {static_cast<void*>(o.ptr), static_cast<void*>(dout.ptr)}) {
        ASSERT_EQ(cudaMemset(p, 0x3c, n_o * 2), cudaSuccess);
      }
      ASSERT_EQ(cudaMemset(lse.ptr, 0, size_t(batch * heads * seqlen_q) * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemset(dq.ptr, 0xff, n * 2), cudaSuccess);  // NaN
      flash3::BackwardArgs a;
      a.dtype = DType::kBF16;
      a.batch = batch;
      a.seqlen_q = seqlen_q;
      a.seqlen_k = 0;
      a.heads_q = heads;
      a.heads_kv = heads;
      a.head_dim = d;
      a.head_dim_v = h.v_arg();
      a.causal = causal;
      a.q = flash3::contiguous<const void*>(q.ptr, seqlen_q, heads, d);
      a.o = flash3::contiguous<const void*>(o.ptr, seqlen_q, heads, dv);
      a.dout = flash3::contiguous<const void*>(dout.ptr, seqlen_q, heads, dv);
      a.lse = lse.ptr;
      a.dq = flash3::contiguous<void*>(dq.ptr, seqlen_q, heads, d);
      flash3::Status const s = flash3::backward(a, nullptr);
      if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
      ASSERT_TRUE(s.ok()) << s.message();
      std::vector<uint16_t> got(n);
      ASSERT_EQ(cudaMemcpy(got.data(), dq.ptr, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 0) << "dq[" << i << "]";
    }
  }
}

// Shapes drawn at random (gpu_test_util.h), besides the sweep's.
// Attention sinks: every head dim (and pair) and dtype, GQA, and causal rows
// that see only their sink (nothing added to its gradient).
TEST(Backward, Sinks) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 700;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (HeadDims const h : kHeadDims) {
      for (bool causal : {false, true}) {
        Case c{dtype, h.qk, causal, 2, 300, 300, 4, 2};
        c.sinks = true;
        c.head_dim_v = h.v_arg();
        run_case(c, seed++);
      }
    }
  }
  Case empty_rows{DType::kBF16, 128, true, 1, 500, 100, 8, 1};
  empty_rows.sinks = true;
  run_case(empty_rows, seed++);
}

// Sliding windows (gpu_test_util.h's cases).
TEST(Backward, Windows) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 900;
  for (flash3::testing::OptionCase const& o : flash3::testing::window_cases()) run_case(with_options(o), seed++);
}

// Softcapping (gpu_test_util.h's cases).
TEST(Backward, Softcap) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 1100;
  for (flash3::testing::OptionCase const& o : flash3::testing::softcap_cases()) {
    Case c = with_options(o);
    run_case(c, seed++);
  }
}

TEST(Backward, RandomShapes) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 600;
  for (flash3::testing::RandomShape const& r : flash3::testing::random_shapes(2027, 24, 2048)) {
    run_case(Case{r.dtype, r.head_dim, r.causal, r.batch, r.seqlen_q, r.seqlen_k, r.heads_q, r.heads_kv}, seed++);
  }
}

// Many query blocks on few keys: 2188 query blocks a head, the key blocks'
// walks thousands of blocks long; with the mask all but the last 300 rows
// see no key.
TEST(Backward, ManyQueryBlocksFewKeys) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 950;
  for (bool causal : {false, true}) run_case(Case{DType::kBF16, 128, causal, 1, 140000, 300, 2, 1}, seed++);
}

// The backward's kernels are programmatic dependent launches
// (common/dependent_launch.h), which stream capture turns into programmatic
// graph edges; the workspace becomes the graph's allocation. Two replays give
// what direct calls give: bitwise in deterministic mode (GQA, so that the
// group sums join the chain), within the tolerance otherwise (without the
// mask, LastWaveSplit's first shape: its last wave split into parts).
TEST(Backward, CapturedInGraph) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::string unsupported;
  for (bool deterministic : {true, false}) {
    for (bool causal : {false, true}) {
      Case const c = deterministic ? Case{DType::kBF16, 128, causal, 2, 1000, 1000, 4, 2}
                                   : Case{DType::kBF16, 64, causal, 1, 1100, 1100, 32, 32};
      SCOPED_TRACE(name(c) + (deterministic ? " deterministic" : ""));
      BackwardCase bc(c, 91);
      ASSERT_TRUE(bc.ok());
      if (!forward_unless_unsupported(bc, unsupported)) continue;
      flash3::BackwardArgs a = bc.args();
      a.deterministic = deterministic;
      Grads direct;
      flash3::Status s = bc.backward(a, direct);
      ASSERT_TRUE(s.ok()) << s.message();
      std::vector<Grads> replays(2);
      s = bc.backward_in_graph(a, replays);
      ASSERT_TRUE(s.ok()) << s.message();
      for (Grads const& run : replays) {
        if (deterministic) {
          EXPECT_EQ(run.dq, direct.dq);
          EXPECT_EQ(run.dk, direct.dk);
          EXPECT_EQ(run.dv, direct.dv);
        } else {
          bc.check(run);
        }
      }
    }
  }
  if (!unsupported.empty()) GTEST_SKIP() << unsupported;
}

TEST(Backward, CallerWorkspace) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Case const c{DType::kFP16, 64, true, 1, 500, 600, 4, 2};
  BackwardCase bc(c, 5);
  ASSERT_TRUE(bc.ok());
  flash3::Status s = bc.forward();
  if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  flash3::BackwardArgs a = bc.args();
  DeviceBuffer<char> ws(flash3::backward_workspace_size(a));
  ASSERT_NE(ws.ptr, nullptr);
  a.workspace = ws.ptr;
  Grads run;
  s = bc.backward(a, run);
  ASSERT_TRUE(s.ok()) << s.message();
  bc.check(run);
}

// Packed sequences (varlen): each sequence's dQ, dK, dV (and the sinks'
// gradient, summed over the sequences) against the GPU reference run on it
// alone, O and the LSE from flash3's packed forward. Lengths of 0 (queries,
// keys, or both), 1, shorter than a tile, not a multiple of one, several
// tiles; GQA and MQA; seqused below the packed lengths, whose rows past it
// take no part: their gradients must be zeros, and their inputs are
// poisoned (NaN) after the forward, as are rows past the last sequence,
// whose gradients must stay unwritten (poisoned).
struct VarlenCase {
  DType dtype;
  int head_dim;
  bool causal;
  std::vector<int> len_q, len_k;  // the rows that take part
  int heads_q = 4, heads_kv = 2;
  bool seqused = false;  // 5 packed rows past each sequence's used ones
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool sinks = false;
  bool deterministic = false;
  int head_dim_v = 0;  // as BackwardArgs::head_dim_v
};

void run_varlen(VarlenCase const& c, uint32_t seed) {
  int const tail = 3;  // packed rows past the last sequence
  flash3::testing::PackedBatch const packed(c.len_q, c.len_k, c.seqused, tail);
  int const batch = packed.batch(), d = c.head_dim;
  int const dim_v = c.head_dim_v != 0 ? c.head_dim_v : d;  // V's, O's, dO's and dV's
  SCOPED_TRACE(std::string(c.dtype == DType::kBF16 ? "bf16" : "fp16") + " d" + std::to_string(d) +
               (dim_v != d ? " dv" + std::to_string(dim_v) : "") + (c.causal ? " causal" : "") + " batch " + std::to_string(batch) + " h" + std::to_string(c.heads_q) +
               "/" + std::to_string(c.heads_kv) + (c.seqused ? " seqused" : "") +
               (c.window_left >= 0 || c.window_right >= 0 ? " window" : "") + (c.softcap > 0 ? " softcap" : "") +
               (c.sinks ? " sinks" : "") + (c.deterministic ? " deterministic" : ""));
  std::vector<int32_t> const& cu_q = packed.cu_q;
  std::vector<int32_t> const& cu_k = packed.cu_k;
  int const total_q = packed.total_q, total_k = packed.total_k, hq = c.heads_q, hkv = c.heads_kv;
  size_t const q_elems = size_t(total_q) * hq * d, kv_elems = size_t(total_k) * hkv * d;
  size_t const o_elems = size_t(total_q) * hq * dim_v, v_elems = size_t(total_k) * hkv * dim_v;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto random = [&](size_t n) {
    std::vector<uint16_t> h(n);
    for (auto& x : h) x = to_bits(normal(rng), c.dtype);
    return h;
  };
  std::vector<uint16_t> h_q = random(q_elems), h_k = random(kv_elems), h_v = random(v_elems),
                        h_do = random(o_elems);
  DeviceBuffer<uint16_t> q(q_elems), k(kv_elems), v(v_elems), o(o_elems), dout(o_elems), dq(q_elems), dk(kv_elems),
      dv(v_elems);
  DeviceBuffer<float> lse(size_t(hq) * total_q), sinks(hq), dsinks(hq);
  for (auto [dst, host] : {std::pair{q.ptr, &h_q}, std::pair{k.ptr, &h_k}, std::pair{v.ptr, &h_v},
                           std::pair{dout.ptr, &h_do}}) {
    CUDA_OK(cudaMemcpy(dst, host->data(), host->size() * 2, cudaMemcpyHostToDevice));
  }
  std::vector<float> h_sinks(hq);
  for (float& x : h_sinks) x = 2.f * normal(rng);
  CUDA_OK(cudaMemcpy(sinks.ptr, h_sinks.data(), hq * 4, cudaMemcpyHostToDevice));
  CUDA_OK(packed.upload());
  CUDA_OK(cudaMemset(o.ptr, 0xff, o_elems * 2));  // rows the forward does not write stay NaN
  CUDA_OK(cudaMemset(lse.ptr, 0xff, size_t(hq) * total_q * 4));

  flash3::ForwardArgs f =
      packed.forward_args(c.dtype, hq, hkv, d, c.head_dim_v, q.ptr, k.ptr, v.ptr, o.ptr, lse.ptr);
  f.causal = c.causal;
  f.window_left = c.window_left;
  f.window_right = c.window_right;
  f.softcap = c.softcap;
  f.sinks = c.sinks ? sinks.ptr : nullptr;
  flash3::Status s = flash3::forward(f, nullptr);
  if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  CUDA_OK(cudaDeviceSynchronize());

  // The rows that take part in no sequence, poisoned in the inputs: the
  // backward must neither read them into any gradient nor write them.
  std::vector<uint16_t> poisoned_q = h_q, poisoned_k = h_k, poisoned_v = h_v, poisoned_do = h_do;
  auto poison_rows = [&](std::vector<uint16_t>& t, std::vector<int32_t> const& cu, std::vector<int> const& len,
                         int heads, int dim) {
    size_t const row = size_t(heads) * dim;
    for (int b = 0; b <= batch; ++b) {
      int const from = b < batch ? cu[b] + len[b] : cu[batch], to = b < batch ? cu[b + 1] : cu[batch] + tail;
      std::fill(t.begin() + from * row, t.begin() + to * row, uint16_t(0xffff));
    }
  };
  poison_rows(poisoned_q, cu_q, c.len_q, hq, d);
  poison_rows(poisoned_do, cu_q, c.len_q, hq, dim_v);
  poison_rows(poisoned_k, cu_k, c.len_k, hkv, d);
  poison_rows(poisoned_v, cu_k, c.len_k, hkv, dim_v);
  for (auto [dst, host] : {std::pair{q.ptr, &poisoned_q}, std::pair{k.ptr, &poisoned_k},
                           std::pair{v.ptr, &poisoned_v}, std::pair{dout.ptr, &poisoned_do}}) {
    CUDA_OK(cudaMemcpy(dst, host->data(), host->size() * 2, cudaMemcpyHostToDevice));
  }

  flash3::BackwardArgs a;
  a.dtype = c.dtype;
  a.batch = batch;
  a.seqlen_q = f.seqlen_q;
  a.seqlen_k = f.seqlen_k;
  a.heads_q = hq;
  a.heads_kv = hkv;
  a.head_dim = d;
  a.head_dim_v = c.head_dim_v;
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.o = {o.ptr, 0, int64_t(hq) * dim_v, dim_v, 1};
  a.dout = {dout.ptr, 0, int64_t(hq) * dim_v, dim_v, 1};
  a.lse = lse.ptr;
  a.dq = {dq.ptr, 0, int64_t(hq) * d, d, 1};
  a.dk = {dk.ptr, 0, int64_t(hkv) * d, d, 1};
  a.dv = {dv.ptr, 0, int64_t(hkv) * dim_v, dim_v, 1};
  a.sinks = c.sinks ? sinks.ptr : nullptr;
  a.dsinks = c.sinks ? dsinks.ptr : nullptr;
  a.deterministic = c.deterministic;
  a.varlen = f.varlen;
  struct Run {
    std::vector<uint16_t> dq, dk, dv;
    std::vector<float> dsinks;
  };
  auto backward = [&](Run& run) {
    CUDA_OK(cudaMemset(dq.ptr, 0xff, q_elems * 2));
    CUDA_OK(cudaMemset(dk.ptr, 0xff, kv_elems * 2));
    CUDA_OK(cudaMemset(dv.ptr, 0xff, v_elems * 2));
    CUDA_OK(cudaMemset(dsinks.ptr, 0xff, hq * 4));
    flash3::Status const st = flash3::backward(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    CUDA_OK(cudaDeviceSynchronize());
    run.dq.resize(q_elems);
    run.dk.resize(kv_elems);
    run.dv.resize(v_elems);
    run.dsinks.resize(hq);
    CUDA_OK(cudaMemcpy(run.dq.data(), dq.ptr, q_elems * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(run.dk.data(), dk.ptr, kv_elems * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(run.dv.data(), dv.ptr, v_elems * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(run.dsinks.data(), dsinks.ptr, hq * 4, cudaMemcpyDeviceToHost));
  };
  Run run;
  backward(run);
  if (::testing::Test::HasFatalFailure()) return;
  if (c.deterministic) {
    Run again;
    backward(again);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(run.dq, again.dq);
    EXPECT_EQ(run.dk, again.dk);
    EXPECT_EQ(run.dv, again.dv);
    // Without sinks dsinks is not written: it keeps its NaN poison, which no
    // float comparison finds equal to itself.
    if (c.sinks) EXPECT_EQ(run.dsinks, again.dsinks);
  }

  // The references, sequence by sequence (the clean inputs): float32, the
  // same-precision one, and float32 given flash3's O. Each buffer: dQ, dK,
  // dV packed as the outputs, then each sequence's sinks' gradient.
  for (auto [dst, host] : {std::pair{q.ptr, &h_q}, std::pair{k.ptr, &h_k}, std::pair{v.ptr, &h_v},
                           std::pair{dout.ptr, &h_do}}) {
    CUDA_OK(cudaMemcpy(dst, host->data(), host->size() * 2, cudaMemcpyHostToDevice));
  }
  size_t const grads = q_elems + kv_elems + v_elems;  // dQ, dK, dV
  size_t const n = grads + size_t(batch) * hq;
  DeviceBuffer<float> ref(n), low(n), rounded_o(n);
  ASSERT_TRUE(ref.ptr && low.ptr && rounded_o.ptr);
  for (float* buf : {ref.ptr, low.ptr, rounded_o.ptr}) CUDA_OK(cudaMemset(buf, 0, n * 4));
  auto view = [&](uint16_t* base, int row, int heads, int dim) {
    return flash3::ConstTensor{base + size_t(row) * heads * dim, 0, int64_t(heads) * dim, dim, 1};
  };
  for (int b = 0; b < batch; ++b) {
    if (c.len_q[b] == 0) continue;  // no query: zeros (the buffers' own)
    AttentionShape shape{1, c.len_q[b], c.len_k[b], hq, hkv, d, 0.f, c.causal};
    shape.window_left = c.window_left;
    shape.window_right = c.window_right;
    shape.softcap = c.softcap;
    shape.head_dim_v = c.head_dim_v;
    flash3::ConstTensor const o_b = view(o.ptr, cu_q[b], hq, dim_v);
    struct Ref {
      float* buf;
      bool emulate;
      flash3::ConstTensor const* o;
    };
    for (Ref const& r : {Ref{ref.ptr, false, nullptr}, Ref{low.ptr, true, nullptr}, Ref{rounded_o.ptr, false, &o_b}}) {
      CUDA_OK(flash3::reference::attention_backward_gpu(
          shape, c.dtype, view(q.ptr, cu_q[b], hq, d), view(k.ptr, cu_k[b], hkv, d),
          view(v.ptr, cu_k[b], hkv, dim_v), view(dout.ptr, cu_q[b], hq, dim_v), r.buf + size_t(cu_q[b]) * hq * d,
          r.buf + q_elems + size_t(cu_k[b]) * hkv * d, r.buf + q_elems + kv_elems + size_t(cu_k[b]) * hkv * dim_v,
          r.emulate, nullptr, r.o, c.sinks ? sinks.ptr : nullptr, c.sinks ? r.buf + grads + size_t(b) * hq : nullptr));
    }
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> h_ref(n), h_low(n), h_rounded_o(n);
  CUDA_OK(cudaMemcpy(h_ref.data(), ref.ptr, n * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_low.data(), low.ptr, n * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_rounded_o.data(), rounded_o.ptr, n * 4, cudaMemcpyDeviceToHost));

  // Each gradient: the used rows against the references, the rows past
  // seqused zeros, the rows past the last sequence unwritten.
  auto compare = [&](char const* what, std::vector<uint16_t> const& got, size_t at, std::vector<int32_t> const& cu,
                     std::vector<int> const& len, int heads, int dim) {
    SCOPED_TRACE(what);
    size_t const row = size_t(heads) * dim;
    std::vector<float> used_ref, used_low, used_rounded_o;
    double err = 0, low_err = 0;
    for (int b = 0; b < batch; ++b) {
      for (int i = 0; i < cu[b + 1] - cu[b]; ++i) {
        size_t const r = size_t(cu[b] + i);
        for (size_t e = r * row; e < (r + 1) * row; ++e) {
          float const x = from_bits(got[e], c.dtype);
          if (i >= len[b]) {
            ASSERT_EQ(x, 0.f) << "row " << r << " (sequence " << b << ") past seqused";
            continue;
          }
          ASSERT_FALSE(std::isnan(x)) << "row " << r << " (sequence " << b << ") not written or NaN";
          err = std::max(err, double(std::fabs(x - h_ref[at + e])));
          low_err = std::max(low_err, double(std::fabs(h_low[at + e] - h_ref[at + e])));
          used_ref.push_back(h_ref[at + e]);
          used_rounded_o.push_back(h_rounded_o[at + e]);
        }
      }
    }
    for (size_t e = size_t(cu[batch]) * row; e < got.size(); ++e) {
      ASSERT_EQ(got[e], 0xffff) << "row " << e / row << " past the last sequence written";
    }
    double const eps = flash3::reference::backward_epsilon(used_ref.data(), used_rounded_o.data(), used_ref.size());
    EXPECT_LE(err, 2 * low_err + eps) << "flash3 max error " << err << ", same-precision reference " << low_err
                                      << ", epsilon " << eps;
  };
  compare("dQ", run.dq, 0, cu_q, c.len_q, hq, d);
  compare("dK", run.dk, q_elems, cu_k, c.len_k, hkv, d);
  compare("dV", run.dv, q_elems + kv_elems, cu_k, c.len_k, hkv, dim_v);
  if (c.sinks) {
    // As compare_sink_gradient: against the reference given flash3's O,
    // summed here over the sequences.
    for (int h = 0; h < hq; ++h) {
      double want = 0, plain = 0;
      for (int b = 0; b < batch; ++b) {
        want += h_rounded_o[grads + size_t(b) * hq + h];
        plain += h_ref[grads + size_t(b) * hq + h];
      }
      ASSERT_FALSE(std::isnan(run.dsinks[h])) << "dsinks[" << h << "] not written or NaN";
      EXPECT_LE(std::fabs(run.dsinks[h] - want), 1e-4 * std::max(1.0, std::fabs(plain)))
          << "dsinks[" << h << "]: " << run.dsinks[h] << ", reference with flash3's O " << want;
    }
  }
}

TEST(Backward, Varlen) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // Zero-length sequences inside the batch (queries, keys, both), one row,
  // shorter than a tile, several tiles, lengths that divide by no tile.
  std::vector<int> const len_q{300, 0, 1, 129, 1000, 64, 77, 0}, len_k{250, 40, 0, 700, 1000, 64, 300, 0};
  uint32_t seed = 2600;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (HeadDims const h : kHeadDims) {
      for (bool causal : {false, true}) {
        VarlenCase c{dtype, h.qk, causal, len_q, len_k};
        c.head_dim_v = h.v_arg();
        run_varlen(c, seed++);
      }
    }
  }
  // One sequence; equal lengths, as a fixed-length batch holds them.
  run_varlen({DType::kBF16, 128, false, {3000}, {2000}, 4, 4}, seed++);
  run_varlen({DType::kBF16, 64, true, {512, 512, 512}, {512, 512, 512}, 8, 8}, seed++);
  for (HeadDims const h : {HeadDims{64, 64}, HeadDims{128, 128}, HeadDims{256, 256}, HeadDims{192, 128}}) {
    int const d = h.qk;
    for (bool causal : {false, true}) {
      // seqused below the packed lengths, MHA (dK, dV by TMA and row stores) and MQA.
      VarlenCase mha{DType::kBF16, d, causal, len_q, len_k, 4, 4, true};
      VarlenCase mqa{DType::kFP16, d, causal, len_q, len_k, 8, 1, true};
      // A window (with the causal mask: its left edge), softcapping, sinks.
      VarlenCase w{DType::kBF16, d, causal, len_q, len_k, 4, 2, true, 90, causal ? -1 : 30};
      VarlenCase capped{DType::kFP16, d, causal, len_q, len_k};
      capped.softcap = 2.f;
      capped.sinks = true;
      VarlenCase sunk{DType::kBF16, d, causal, len_q, len_k, 4, 4, true};
      sunk.sinks = true;
      // Deterministic mode: bitwise equal runs.
      VarlenCase det{DType::kBF16, d, causal, len_q, len_k, 4, 2, true};
      det.deterministic = true;
      for (VarlenCase c : {mha, mqa, w, capped, sunk, det}) {
        c.head_dim_v = h.v_arg();
        run_varlen(c, seed++);
      }
    }
  }
}

}  // namespace
