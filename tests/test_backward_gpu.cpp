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

#include <cmath>
#include <cstring>
#include <random>
#include <string>
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
};

std::string name(Case const& c) {
  return std::string(c.dtype == DType::kBF16 ? "bf16" : "fp16") + " d" + std::to_string(c.head_dim) +
         (c.causal ? " causal" : "") + " b" + std::to_string(c.batch) + " sq" + std::to_string(c.seqlen_q) + " sk" +
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
  BackwardCase(Case const& c, uint32_t seed)
      : c_(c),
        d_(c.head_dim),
        q_elems_(size_t(c.batch) * c.seqlen_q * c.heads_q * d_),
        kv_elems_(size_t(c.batch) * c.seqlen_k * c.heads_kv * d_),
        in_(c.packed ? 3 * q_elems_ : q_elems_ + 2 * kv_elems_),
        grad_(c.packed ? 3 * q_elems_ : q_elems_ + 2 * kv_elems_),
        o_(q_elems_),
        dout_(q_elems_),
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
    upload(in_.ptr, c.packed ? 3 * q_elems_ : q_elems_ + 2 * kv_elems_);
    upload(dout_.ptr, q_elems_);
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
    dv_ = view(grad_.ptr, 2, false);
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
    a.causal = c_.causal;
    a.window_left = c_.window_left;
    a.window_right = c_.window_right;
    a.softcap = c_.softcap;
    a.q = q_.in();
    a.k = k_.in();
    a.v = v_.in();
    a.o = flash3::contiguous<const void*>(o_.ptr, c_.seqlen_q, c_.heads_q, d_);
    a.dout = flash3::contiguous<const void*>(dout_.ptr, c_.seqlen_q, c_.heads_q, d_);
    a.lse = lse_.ptr;
    a.dq = dq_.out();
    a.dk = dk_.out();
    a.dv = dv_.out();
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
    f.causal = c_.causal;
    f.window_left = c_.window_left;
    f.window_right = c_.window_right;
    f.softcap = c_.softcap;
    f.q = q_.in();
    f.k = k_.in();
    f.v = v_.in();
    f.o = flash3::contiguous<void*>(o_.ptr, c_.seqlen_q, c_.heads_q, d_);
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
    // Each run's buffer: dQ, dK, dV, then the sinks' gradient.
    size_t const n = q_elems_ + 2 * kv_elems_ + (c_.sinks ? c_.heads_q : 0);
    DeviceBuffer<float> ref(n), low(n), rounded_o(n);
    ASSERT_TRUE(ref.ptr && low.ptr && rounded_o.ptr);
    flash3::ConstTensor dout = flash3::contiguous<const void*>(dout_.ptr, c_.seqlen_q, c_.heads_q, d_);
    flash3::ConstTensor const o = flash3::contiguous<const void*>(o_.ptr, c_.seqlen_q, c_.heads_q, d_);
    struct Run {
      float* buf;
      bool emulate;
      flash3::ConstTensor const* o;
    };
    for (Run const& r : {Run{ref.ptr, false, nullptr}, Run{low.ptr, true, nullptr}, Run{rounded_o.ptr, false, &o}}) {
      CUDA_OK(flash3::reference::attention_backward_gpu(
          shape, c_.dtype, q_.in(), k_.in(), v_.in(), dout, r.buf, r.buf + q_elems_, r.buf + q_elems_ + kv_elems_,
          r.emulate, nullptr, r.o, sinks_.ptr, c_.sinks ? r.buf + q_elems_ + 2 * kv_elems_ : nullptr));
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
    if (c_.sinks) {
      compare_sink_gradient(run.dsinks, h_ref.data() + q_elems_ + 2 * kv_elems_,
                            h_rounded_o.data() + q_elems_ + 2 * kv_elems_);
    }
  }

 private:
  static flash3::Status cuda_status(char const* what, cudaError_t err) {
    if (err == cudaSuccess) return {};
    return {flash3::Status::Code::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
  }
  void poison(cudaStream_t stream) {
    cudaMemsetAsync(grad_.ptr, 0xff, (c_.packed ? 3 * q_elems_ : q_elems_ + 2 * kv_elems_) * 2, stream);
    if (dsinks_.ptr) cudaMemsetAsync(dsinks_.ptr, 0xff, c_.heads_q * sizeof(float), stream);
  }
  flash3::Status download_grads(cudaStream_t stream, Grads& run) {
    flash3::Status const s = cuda_status("backward", cudaStreamSynchronize(stream));
    if (!s.ok()) return s;
    run.dq = download(dq_, c_.seqlen_q, c_.heads_q);
    run.dk = download(dk_, c_.seqlen_k, c_.heads_kv);
    run.dv = download(dv_, c_.seqlen_k, c_.heads_kv);
    run.dsinks.resize(dsinks_.ptr ? c_.heads_q : 0);
    if (dsinks_.ptr) cudaMemcpy(run.dsinks.data(), dsinks_.ptr, c_.heads_q * sizeof(float), cudaMemcpyDeviceToHost);
    return s;
  }

  Tensor view(uint16_t* base, int which, bool is_q) const {
    int64_t const heads = is_q ? c_.heads_q : c_.heads_kv;
    int64_t const seqlen = is_q ? c_.seqlen_q : c_.seqlen_k;
    if (c_.packed) {
      int64_t const row = 3 * c_.heads_q * d_;
      return {base + which * c_.heads_q * d_, row * c_.seqlen_q, row, d_};
    }
    uint16_t* start = base + (which == 0 ? 0 : q_elems_ + (which - 1) * kv_elems_);
    return {start, seqlen * heads * d_, heads * d_, d_};
  }

  std::vector<uint16_t> download(Tensor const& t, int64_t seqlen, int64_t heads) {
    std::vector<uint16_t> out(size_t(c_.batch) * seqlen * heads * d_);
    for (int64_t b = 0; b < c_.batch; ++b) {
      for (int64_t s = 0; s < seqlen; ++s) {
        cudaMemcpy2D(out.data() + ((b * seqlen + s) * heads) * d_, d_ * 2,
                     t.data + b * t.batch_stride + s * t.seq_stride, t.head_stride * 2, d_ * 2, heads,
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
  int64_t d_;
  size_t q_elems_, kv_elems_;
  DeviceBuffer<uint16_t> in_, grad_, o_, dout_;
  DeviceBuffer<float> lse_, sinks_, dsinks_;
  Tensor q_{}, k_{}, v_{}, dq_{}, dk_{}, dv_{};
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
  auto [dtype, d, causal] = GetParam();
  std::vector<Case> cases = {
      {dtype, d, causal, 2, 1, 1, 4, 4},       {dtype, d, causal, 2, 7, 7, 4, 4},
      {dtype, d, causal, 1, 113, 113, 8, 2},   {dtype, d, causal, 2, 255, 255, 8, 8},
      {dtype, d, causal, 1, 1023, 1023, 8, 1}, {dtype, d, causal, 1, 4097, 4097, 2, 2},
      {dtype, d, causal, 2, 113, 1023, 4, 1},  {dtype, d, causal, 2, 1023, 113, 4, 4},
      {dtype, d, causal, 1, 1, 700, 8, 2},     {dtype, d, causal, 1, 300, 7, 2, 2},
      {dtype, d, causal, 2, 255, 255, 4, 4, true},
  };
  uint32_t seed = 4321 + d + (causal ? 1 : 0);
  for (Case const& c : cases) run_case(c, seed++);
}

INSTANTIATE_TEST_SUITE_P(All, Backward,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kFP16),
                                            ::testing::Values(64, 96, 128, 192, 256), ::testing::Bool()),
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
// path (GQA, fp16).
TEST(Backward, LastWaveSplit) {
  SKIP_WITHOUT_CUDA_DEVICE();
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  uint32_t seed = 900;
  for (int d : {64, 128, 256}) {
    int const heads = 2048 / d;
    // A wave of tiles and a few more on this device, the last key block partial.
    int const seqlen_k = (sms / heads + 1) * flash3::bwd::bwd_block_n(d) - 20;
    for (Case const& c : {Case{DType::kBF16, d, false, 1, 1100, seqlen_k, heads, heads},
                          Case{DType::kFP16, d, false, 1, 1000, seqlen_k, heads, heads / 4}}) {
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
  for (int d : {64, 128, 256}) {
    for (int heads_kv : {8, 2}) {
      SCOPED_TRACE("d" + std::to_string(d) + " h8/" + std::to_string(heads_kv));
      int64_t const batch = 2, seqlen_k = 300;
      size_t const n = size_t(batch * seqlen_k * heads_kv * d);
      DeviceBuffer<uint16_t> k(n), v(n), dk(n), dv(n);
      ASSERT_TRUE(k.ptr && v.ptr && dk.ptr && dv.ptr);
      ASSERT_EQ(cudaMemset(k.ptr, 0x3c, n * 2), cudaSuccess);
      ASSERT_EQ(cudaMemset(v.ptr, 0x3c, n * 2), cudaSuccess);
      ASSERT_EQ(cudaMemset(dk.ptr, 0xff, n * 2), cudaSuccess);  // NaN
      ASSERT_EQ(cudaMemset(dv.ptr, 0xff, n * 2), cudaSuccess);
      flash3::BackwardArgs a;
      a.dtype = DType::kBF16;
      a.batch = batch;
      a.seqlen_q = 0;
      a.seqlen_k = seqlen_k;
      a.heads_q = 8;
      a.heads_kv = heads_kv;
      a.head_dim = d;
      a.k = flash3::contiguous<const void*>(k.ptr, seqlen_k, heads_kv, d);
      a.v = flash3::contiguous<const void*>(v.ptr, seqlen_k, heads_kv, d);
      a.dk = flash3::contiguous<void*>(dk.ptr, seqlen_k, heads_kv, d);
      a.dv = flash3::contiguous<void*>(dv.ptr, seqlen_k, heads_kv, d);
      flash3::Status const s = flash3::backward(a, nullptr);
      if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
      ASSERT_TRUE(s.ok()) << s.message();
      std::vector<uint16_t> got_k(n), got_v(n);
      ASSERT_EQ(cudaMemcpy(got_k.data(), dk.ptr, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got_v.data(), dv.ptr, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got_k[i], 0) << "dk[" << i << "]";
        ASSERT_EQ(got_v[i], 0) << "dv[" << i << "]";
      }
    }
  }
}

// No key: dQ = 0 (the postprocess runs without a main kernel before it).
TEST(Backward, NoKeyGivesZeroQueryGradients) {
  SKIP_WITHOUT_CUDA_DEVICE();
  for (int d : {64, 128, 256}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE("d" + std::to_string(d) + (causal ? " causal" : ""));
      int64_t const batch = 2, seqlen_q = 300, heads = 4;
      size_t const n = size_t(batch * seqlen_q * heads * d);
      DeviceBuffer<uint16_t> q(n), o(n), dout(n), dq(n);
      DeviceBuffer<float> lse(size_t(batch * heads * seqlen_q));
      ASSERT_TRUE(q.ptr && o.ptr && dout.ptr && dq.ptr && lse.ptr);
      for (void* p : {static_cast<void*>(q.ptr), static_cast<void*>(o.ptr), static_cast<void*>(dout.ptr)}) {
        ASSERT_EQ(cudaMemset(p, 0x3c, n * 2), cudaSuccess);
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
      a.causal = causal;
      a.q = flash3::contiguous<const void*>(q.ptr, seqlen_q, heads, d);
      a.o = flash3::contiguous<const void*>(o.ptr, seqlen_q, heads, d);
      a.dout = flash3::contiguous<const void*>(dout.ptr, seqlen_q, heads, d);
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
// Attention sinks: every head dim and dtype, GQA, and causal rows that see
// only their sink (nothing added to its gradient).
TEST(Backward, Sinks) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 700;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (int d : {64, 96, 128, 192, 256}) {
      for (bool causal : {false, true}) {
        Case c{dtype, d, causal, 2, 300, 300, 4, 2};
        c.sinks = true;
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

}  // namespace
