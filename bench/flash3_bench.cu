// flash3-bench: the forward and backward passes on the paper's sweep, each
// result checked against the GPU reference before it is timed.
//
//   flash3-bench                      the paper's sweep (bf16, hdim 64/128/256, causal off/on), forward
//   flash3-bench --pass bwd           the same sweep, backward
//   flash3-bench --hdim 192,192/128   V's head dim of its own (DeepSeek-V3's) beside the symmetric 192
//   flash3-bench --ablation           paper Table 2: each technique switched off
//   flash3-bench --dtype e4m3         the FP8 forward (inputs quantized by quantize_fp8)
//   flash3-bench --fp8-accuracy       paper Table 3: RMSE of O with outliers in the inputs
//   flash3-bench --quant-bandwidth    quantize_fp8 against the GPU's copy bandwidth
//   flash3-bench --help               all options
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "flash3/flash3.h"
#include "reference.h"

namespace {

using flash3::DType;

#define CHECK_CUDA(x)                                                                              \
  do {                                                                                             \
    cudaError_t err_ = (x);                                                                        \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(err_), __FILE__, __LINE__, #x); \
      std::exit(3);                                                                                \
    }                                                                                              \
  } while (0)

__device__ uint32_t mix(uint32_t h) {
  h ^= h >> 16; h *= 0x7FEB352Du; h ^= h >> 15; h *= 0x846CA68Bu; h ^= h >> 16;
  return h;
}

// N(0, 1) from a hash of (seed, index): fresh inputs without a host round trip.
// With outliers (paper Table 3), N(0, 1) + N(0, 100) * Bernoulli(0.001).
__global__ void fill_normal(uint16_t* out, size_t n, uint32_t seed, bool bf16, bool outliers = false) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = mix(uint32_t(i) * 0x9E3779B9u ^ seed ^ uint32_t(i >> 32) * 0x85EBCA6Bu);
    uint32_t g = h * 0x27D4EB2Fu + 0x165667B1u;
    g ^= g >> 15; g *= 0x2C1B3C6Du; g ^= g >> 12;
    float u1 = (float(h >> 8) + 1.f) * (1.f / 16777217.f);
    float u2 = float(g >> 8) * (1.f / 16777216.f);
    float x = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    if (outliers) {
      uint32_t const b = mix(g ^ 0x5bd1e995u);
      if (float(b >> 8) * (1.f / 16777216.f) < 0.001f) x += 10.f * sqrtf(-2.f * logf(u1)) * sinpif(2.f * u2);
    }
    if (bf16) {
      __nv_bfloat16 b = __float2bfloat16(x);
      out[i] = *reinterpret_cast<uint16_t*>(&b);
    } else {
      __half b = __float2half(x);
      out[i] = *reinterpret_cast<uint16_t*>(&b);
    }
  }
}

// Largest |a - ref| and |low - ref|, and whether any element of a is NaN.
// ref and low are dense; a holds the same elements as rows of row_len
// elements, row_stride apart.
__global__ void compare(uint16_t const* a, int64_t row_len, int64_t row_stride, float const* ref, float const* low,
                        size_t n, bool bf16, float* out /* [max_err, max_low_err, nan_count] */) {
  float err = 0.f, low_err = 0.f, nans = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint16_t bits = a[int64_t(i) / row_len * row_stride + int64_t(i) % row_len];
    float x = bf16 ? __bfloat162float(*reinterpret_cast<__nv_bfloat16*>(&bits))
                   : __half2float(*reinterpret_cast<__half*>(&bits));
    if (x != x) nans += 1.f;
    err = fmaxf(err, fabsf(x - ref[i]));
    low_err = fmaxf(low_err, fabsf(low[i] - ref[i]));
  }
  atomicMax(reinterpret_cast<int*>(&out[0]), __float_as_int(err));  // non-negative floats order as ints
  atomicMax(reinterpret_cast<int*>(&out[1]), __float_as_int(low_err));
  if (nans > 0.f) atomicAdd(&out[2], nans);
}

char const* dtype_name(DType t) { return t == DType::kBF16 ? "bf16" : t == DType::kFP16 ? "fp16" : "e4m3"; }

enum class Pass { kFwd, kBwd, kFwdBwd };

// --ablation's variants (paper Table 2), in the order of their option switches below.
constexpr char const* kAblations[] = {"default", "no-pingpong", "no-intra-wg-overlap", "no-persistent",
                                      "no-warp-specialization"};
constexpr int kNumAblations = sizeof(kAblations) / sizeof(kAblations[0]);
char const* pass_name(Pass p) { return p == Pass::kFwd ? "fwd" : p == Pass::kBwd ? "bwd" : "fwd+bwd"; }

struct Config {
  Pass pass = Pass::kFwd;
  std::string variant = "default";
  DType dtype = DType::kBF16;
  int head_dim = 128;
  int head_dim_v = 0;  // V's and O's: 0 is head_dim (ForwardArgs::head_dim_v)
  bool causal = false;
  int64_t batch = 1, seqlen = 1024, heads_q = 16, heads_kv = 16;
  flash3::KernelOptions options;
  bool deterministic = false;  // backward
  bool sinks = false;          // a random sink per query head
  int64_t window_left = -1, window_right = -1;  // a sliding window (-1: unbounded)
  float softcap = 0.f;                          // 0: off
  // FP8 (dtype kE4M3): the inputs are bf16 draws quantized by quantize_fp8.
  flash3::ScaleGranularity granularity = flash3::ScaleGranularity::kPerBlock;
  bool hadamard = false;
};

struct Result {
  Config config;
  double ms = 0, tflops = 0;
  float max_err = 0, ref_err = 0;
  bool ok = false;
  std::string error;
};

// The power-capped card's clock follows its recent load: how the timed calls
// meet it (the same for every shape and build).
struct Regime {
  int gap_ms = 0;               // the GPU idle this long before the shape's samples...
  bool gap_per_sample = false;  // ...or before each sample: none of them under the cap
  int load_ms = 0;              // the sustained regime: the shape back to back this long first
};

// A head dim of the sweep: Q and K's, and V's (--hdim D/DV; 0: D).
struct HeadDims {
  int d;
  int v = 0;
};

struct Options {
  std::vector<Pass> passes = {Pass::kFwd};
  std::vector<HeadDims> head_dims = {{64}, {128}, {256}};
  std::vector<int64_t> seqlens = {512, 1024, 2048, 4096, 8192, 16384};
  bool shapes_given = false;  // --hdim or --seqlen on the command line
  std::vector<bool> causal = {false, true};
  DType dtype = DType::kBF16;
  int64_t total_tokens = 16384, hidden = 2048, gqa = 1;
  int reps = 30;
  Regime regime;
  bool check = true, ablation = false, deterministic = false, fp8_accuracy = false, quant_bandwidth = false;
  bool sinks = false;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.f;
  flash3::ScaleGranularity granularity = flash3::ScaleGranularity::kPerBlock;
  bool hadamard = false;
  flash3::KernelOptions options;  // --no-pingpong, --no-overlap, --no-ws: one technique off for the whole sweep
  std::string json, csv;
};

void usage() {
  std::printf(
      "flash3-bench: attention TFLOP/s, checked against the GPU reference\n"
      "  --pass fwd|bwd|fwd+bwd|all  which pass (default fwd); FLOPs are the GEMMs': forward 4 s^2 d,\n"
      "                         backward 2.5x that (V's head dim dv of its own: 2 s^2 (d + dv), 2 s^2 (3d + 2dv))\n"
      "  --hdim 64,128,256      head dims; D/DV: V's head dim DV of its own (192/128; bf16, fp16)\n"
      "  --seqlen 512,...       sequence lengths (batch = tokens / seqlen, heads = hidden / hdim)\n"
      "  --causal 0|1|both      mask (default both)\n"
      "  --dtype bf16|fp16|e4m3 e4m3: the FP8 forward, O in bf16\n"
      "  --granularity tensor|head|block   FP8 scales (default block)\n"
      "  --hadamard             FP8: incoherent processing of Q and K\n"
      "  --no-pingpong, --no-overlap, --no-ws   the sweep with that technique off (head dim 128;\n"
      "                         --no-ws: no warp specialization, bf16)\n"
      "  --no-persistent        the sweep with a CTA per tile instead of one per SM (any head dim)\n"
      "  --tokens N --hidden N  total tokens (16384) and hidden size (2048), the paper's settings\n"
      "  --gqa R                query heads per K/V head (default 1)\n"
      "  --reps N               timed runs per shape, median reported (default 30)\n"
      "  --gap-ms N             the GPU idle N ms before each shape is timed (default 0: the sweep's\n"
      "                         continuous load); the same gap for every shape and build\n"
      "  --gap-per-sample       the gap before each timed call instead: none of them under the power cap\n"
      "  --load-ms N            the sustained regime: each shape runs back to back N ms before it\n"
      "                         is timed, so that the power-capped card's clock has settled\n"
      "  --no-check             skip the reference check\n"
      "  --deterministic        backward in deterministic mode\n"
      "  --window L,R           a sliding window (FlashAttention's window_size; -1 unbounded); TFLOP/s\n"
      "                         count the pairs the window visits\n"
      "  --softcap X            softcapping of the scores at X (Gemma 2's; 0 off)\n"
      "  --sinks                a random attention sink per query head (the check covers O, dQ, dK,\n"
      "                         dV; the sinks' own gradient is the tests')\n"
      "  --ablation             paper Table 2: batch 4, seqlen 8448, 16 heads, hdim 128, each technique off\n"
      "  --fp8-accuracy         paper Table 3: RMSE of O, inputs N(0,1) + N(0,100) Bernoulli(0.001)\n"
      "  --quant-bandwidth      quantize_fp8's bandwidth against a device-to-device copy (32k tokens,\n"
      "                         hidden 2048; hdim 128 and seqlen 4096 unless --hdim / --seqlen)\n"
      "  --json FILE --csv FILE also write the results there\n");
}

template <class T>
std::vector<T> parse_list(char const* s) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(T(std::stoll(item)));
  return out;
}

// "64,128,192/128": head dims D, or D/DV with V's head dim DV of its own.
std::vector<HeadDims> parse_head_dims(char const* s) {
  std::vector<HeadDims> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t const slash = item.find('/');
    out.push_back(slash == std::string::npos ? HeadDims{std::stoi(item)}
                                             : HeadDims{std::stoi(item.substr(0, slash)), std::stoi(item.substr(slash + 1))});
  }
  return out;
}

// "128", or "192/128" with V's head dim of its own.
std::string hdim_name(Config const& c) {
  return std::to_string(c.head_dim) + (c.head_dim_v != 0 ? "/" + std::to_string(c.head_dim_v) : "");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> char const* {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--pass") {
      std::string v = next();
      if (v == "all") o.passes = {Pass::kFwd, Pass::kBwd, Pass::kFwdBwd};
      else if (v == "fwd" || v == "bwd" || v == "fwd+bwd")
        o.passes = {v == "fwd" ? Pass::kFwd : v == "bwd" ? Pass::kBwd : Pass::kFwdBwd};
      else { std::fprintf(stderr, "--pass: fwd, bwd, fwd+bwd or all\n"); std::exit(2); }
    } else if (a == "--hdim") o.head_dims = parse_head_dims(next()), o.shapes_given = true;
    else if (a == "--seqlen") o.seqlens = parse_list<int64_t>(next()), o.shapes_given = true;
    else if (a == "--causal") {
      std::string v = next();
      o.causal = v == "both" ? std::vector<bool>{false, true} : std::vector<bool>{v == "1"};
    } else if (a == "--dtype") {
      std::string v = next();
      if (v != "bf16" && v != "fp16" && v != "e4m3") { std::fprintf(stderr, "--dtype: bf16, fp16 or e4m3\n"); std::exit(2); }
      o.dtype = v == "fp16" ? DType::kFP16 : v == "e4m3" ? DType::kE4M3 : DType::kBF16;
    } else if (a == "--granularity") {
      std::string v = next();
      if (v != "tensor" && v != "head" && v != "block") { std::fprintf(stderr, "--granularity: tensor, head or block\n"); std::exit(2); }
      o.granularity = v == "tensor" ? flash3::ScaleGranularity::kPerTensor
                      : v == "head" ? flash3::ScaleGranularity::kPerHead
                                    : flash3::ScaleGranularity::kPerBlock;
    } else if (a == "--hadamard") o.hadamard = true;
    else if (a == "--no-pingpong") o.options.pingpong = false;
    else if (a == "--no-overlap") o.options.intra_warpgroup_overlap = false;
    else if (a == "--no-ws") o.options.warp_specialization = false;
    else if (a == "--no-persistent") o.options.persistent = false;
    else if (a == "--fp8-accuracy") o.fp8_accuracy = true;
    else if (a == "--quant-bandwidth") o.quant_bandwidth = true;
    else if (a == "--tokens") o.total_tokens = std::stoll(next());
    else if (a == "--hidden") o.hidden = std::stoll(next());
    else if (a == "--gqa") o.gqa = std::stoll(next());
    else if (a == "--reps") o.reps = std::max(1, std::stoi(next()));
    else if (a == "--gap-ms") o.regime.gap_ms = std::max(0, std::stoi(next()));
    else if (a == "--gap-per-sample") o.regime.gap_per_sample = true;
    else if (a == "--load-ms") o.regime.load_ms = std::max(0, std::stoi(next()));
    else if (a == "--no-check") o.check = false;
    else if (a == "--ablation") o.ablation = true;
    else if (a == "--deterministic") o.deterministic = true;
    else if (a == "--sinks") o.sinks = true;
    else if (a == "--softcap") {
      o.softcap = std::stof(next());
      if (!(o.softcap >= 0.f) || !std::isfinite(o.softcap)) { std::fprintf(stderr, "--softcap: a finite X >= 0\n"); std::exit(2); }
    }
    else if (a == "--window") {
      std::vector<int64_t> const w = parse_list<int64_t>(next());
      if (w.size() != 2 || w[0] < -1 || w[1] < -1) { std::fprintf(stderr, "--window: L,R, each -1 or more\n"); std::exit(2); }
      o.window_left = w[0];
      o.window_right = w[1];
    }
    else if (a == "--json") o.json = next();
    else if (a == "--csv") o.csv = next();
    else if (a == "--help" || a == "-h") { usage(); std::exit(0); }
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); usage(); std::exit(2); }
  }
  return o;
}

// The GEMMs' count per (query, key) pair and head: the forward's Q K^T (d)
// and P V (dv), 2 (d + dv); the backward's five, 2 (3 d + 2 dv). With dv = d
// the paper's: 4 seqlen^2 d heads batch for the forward (halved with the
// causal mask), 2.5 times that for the backward.
double flops(Config const& c) {
  double pairs = double(c.seqlen) * c.seqlen;
  if (c.causal) pairs /= 2;
  if (c.window_left >= 0 || c.window_right >= 0) {
    // The pairs the window visits (the causal mask's halving is among them).
    flash3::reference::AttentionShape s{1, c.seqlen, c.seqlen, 1, 1, c.head_dim, 0.f, c.causal};
    s.window_left = c.window_left;
    s.window_right = c.window_right;
    pairs = 0;
    for (int64_t i = 0; i < c.seqlen; ++i) {
      flash3::reference::KeyRange const r = flash3::reference::visible_keys(s, i);
      pairs += double(r.last - r.first);
    }
  }
  double const d = c.head_dim, dv = c.head_dim_v != 0 ? c.head_dim_v : c.head_dim;
  double const fwd = 2.0 * pairs * (d + dv) * c.heads_q * c.batch;
  double const bwd = 2.0 * pairs * (3 * d + 2 * dv) * c.heads_q * c.batch;
  return c.pass == Pass::kFwd ? fwd : c.pass == Pass::kBwd ? bwd : fwd + bwd;
}

__global__ void spin(long long cycles) {
  long long const start = clock64();
  while (clock64() - start < cycles) {
  }
}

// The GPU idle gap_ms, then a spin of about 2 ms that brings the clock back up
// from idle, queued ahead of what follows, which thus starts on the GPU and not
// when the host submits it.
void idle(int gap_ms) {
  CHECK_CUDA(cudaDeviceSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
  spin<<<1, 1>>>(4'000'000);
  CHECK_CUDA(cudaGetLastError());
}

// The median time of f() in ms, taken as python -m flash3.benchmark times
// flash3 and its peers: before each sample a 256 MB memset flushes the L2,
// and the host queues every sample without waiting, so that each call starts
// on the GPU right behind the flush, not when the host has submitted it.
// (Not batches of back-to-back calls between two events, with a
// synchronization after each batch: that counts the host's submission of
// each batch's first call, and the causal forward's re-allocation of its
// tile counter after the synchronization.)
template <class F>
double median_ms(F&& f, int reps, Regime const& regime = {}) {
  constexpr size_t kFlushBytes = size_t(256) << 20;
  static void* flush = nullptr;  // one buffer for the process, freed with it
  if (flush == nullptr) CHECK_CUDA(cudaMalloc(&flush, kFlushBytes));
  for (int i = 0; i < 3; ++i) f();
  if (regime.load_ms > 0) {
    // Each call after a flush, as the samples; waiting only on the call
    // kQueueDepth back keeps the GPU's queue from running dry.
    constexpr int kQueueDepth = 8;
    std::vector<cudaEvent_t> marks(kQueueDepth);
    for (cudaEvent_t& e : marks) CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    auto const deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(regime.load_ms);
    for (int i = 0; std::chrono::steady_clock::now() < deadline; ++i) {
      cudaEvent_t& mark = marks[i % kQueueDepth];
      if (i >= kQueueDepth) CHECK_CUDA(cudaEventSynchronize(mark));
      CHECK_CUDA(cudaMemsetAsync(flush, 0, kFlushBytes));
      f();
      CHECK_CUDA(cudaEventRecord(mark));
    }
    for (cudaEvent_t e : marks) cudaEventDestroy(e);
  }
  if (regime.gap_ms > 0 && !regime.gap_per_sample) idle(regime.gap_ms);
  std::vector<cudaEvent_t> events(2 * size_t(reps));
  for (cudaEvent_t& e : events) CHECK_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    if (regime.gap_ms > 0 && regime.gap_per_sample) idle(regime.gap_ms);
    CHECK_CUDA(cudaMemsetAsync(flush, 0, kFlushBytes));
    CHECK_CUDA(cudaEventRecord(events[2 * i]));
    f();
    CHECK_CUDA(cudaEventRecord(events[2 * i + 1]));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> times(reps);
  for (int i = 0; i < reps; ++i) CHECK_CUDA(cudaEventElapsedTime(&times[i], events[2 * i], events[2 * i + 1]));
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  std::sort(times.begin(), times.end());
  return double(times[times.size() / 2]);
}

struct Check {
  float max_err = 0, ref_err = 0;
  bool ok = true;
  std::string error;
};

// |a - ref| <= 2 |low - ref| + eps over one tensor (a strided), NaN fails.
void check_tensor(Check& chk, char const* what, uint16_t const* a, int64_t row_len, int64_t row_stride,
                  float const* ref, float const* low, size_t n, bool bf16, float eps) {
  float* stats;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&stats), 3 * 4));
  CHECK_CUDA(cudaMemset(stats, 0, 3 * 4));
  compare<<<1024, 256>>>(a, row_len, row_stride, ref, low, n, bf16, stats);
  float h[3];
  CHECK_CUDA(cudaMemcpy(h, stats, sizeof(h), cudaMemcpyDeviceToHost));
  cudaFree(stats);
  chk.max_err = std::max(chk.max_err, h[0]);
  chk.ref_err = std::max(chk.ref_err, h[1]);
  if (chk.ok && (h[2] > 0.f || h[0] > 2 * h[1] + eps)) {
    chk.ok = false;
    chk.error = std::string(what) + (h[2] > 0 ? ": NaN or unwritten output" : ": error above 2x the same-precision reference");
  }
}

// FP8 inputs: 16-bit draws quantized by the library's quantize_fp8, which
// then stand in for them in `a` (dtype kE4M3, O in bf16).
struct Fp8Inputs {
  uint8_t *q = nullptr, *k = nullptr, *v = nullptr;
  float *q_scale = nullptr, *k_scale = nullptr, *v_scale = nullptr;
  flash3::QuantizeArgs qa;  // the quantization, as last run

  flash3::Status quantize(flash3::ForwardArgs& a, flash3::ScaleGranularity granularity, bool hadamard) {
    qa.dtype = a.dtype;
    qa.batch = a.batch;
    qa.seqlen_q = a.seqlen_q;
    qa.seqlen_k = a.seqlen_k;
    qa.heads_q = a.heads_q;
    qa.heads_kv = a.heads_kv;
    qa.head_dim = a.head_dim;
    qa.q = a.q;
    qa.k = a.k;
    qa.v = a.v;
    qa.granularity = granularity;
    qa.hadamard = hadamard;
    qa.seed = 2024;
    size_t const q_elems = size_t(a.batch * a.seqlen_q * a.heads_q * a.head_dim);
    size_t const kv_elems = size_t(a.batch * a.seqlen_k * a.heads_kv * a.head_dim);
    flash3::Fp8BlockSizes const blocks = flash3::fp8_block_sizes(a.head_dim);
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&q), q_elems));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&k), kv_elems));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&v), kv_elems));
    auto scales = [&](float*& p, int64_t heads, int64_t seqlen, int64_t block) {
      int64_t const n = flash3::fp8_scale_count(granularity, a.batch, heads, seqlen, block);
      CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), std::max<int64_t>(n, 1) * 4));
    };
    scales(q_scale, a.heads_q, a.seqlen_q, blocks.q);
    scales(k_scale, a.heads_kv, a.seqlen_k, blocks.kv);
    scales(v_scale, a.heads_kv, a.seqlen_k, blocks.kv);
    qa.q_out = flash3::contiguous<void*>(q, a.seqlen_q, a.heads_q, a.head_dim);
    qa.k_out = flash3::contiguous<void*>(k, a.seqlen_k, a.heads_kv, a.head_dim);
    qa.v_out = flash3::contiguous<void*>(v, a.seqlen_k, a.heads_kv, a.head_dim);
    qa.q_scale = q_scale;
    qa.k_scale = k_scale;
    qa.v_scale = v_scale;
    flash3::Status s = flash3::quantize_fp8(qa, nullptr);
    a.dtype = DType::kE4M3;
    a.q = flash3::contiguous<const void*>(q, a.seqlen_q, a.heads_q, a.head_dim);
    a.k = flash3::contiguous<const void*>(k, a.seqlen_k, a.heads_kv, a.head_dim);
    a.v = flash3::contiguous<const void*>(v, a.seqlen_k, a.heads_kv, a.head_dim);
    a.fp8.granularity = granularity;
    a.fp8.q = q_scale;
    a.fp8.k = k_scale;
    a.fp8.v = v_scale;
    a.fp8.out_dtype = DType::kBF16;
    return s;
  }
  ~Fp8Inputs() {
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)q_scale, (void*)k_scale, (void*)v_scale}) cudaFree(p);
  }
};

// One shape: fresh random inputs, poisoned outputs, check, then time.
Result run(Config const& c, Options const& opt, uint32_t seed) {
  Result r;
  r.config = c;
  // Q, K, dQ, dK of head dim d; V, O, dO, dV of dim_v.
  int64_t const d = c.head_dim, dim_v = c.head_dim_v != 0 ? c.head_dim_v : d;
  size_t const q_elems = size_t(c.batch) * c.seqlen * c.heads_q * d;
  size_t const kv_elems = size_t(c.batch) * c.seqlen * c.heads_kv * d;
  size_t const v_elems = size_t(c.batch) * c.seqlen * c.heads_kv * dim_v;
  size_t const o_elems = size_t(c.batch) * c.seqlen * c.heads_q * dim_v;
  size_t const lse_elems = size_t(c.batch) * c.heads_q * c.seqlen;
  bool const fp8 = c.dtype == DType::kE4M3;
  bool const bf16 = c.dtype == DType::kBF16 || fp8;  // FP8: bf16 draws, quantized; O in bf16
  bool const backward = c.pass != Pass::kFwd;
  uint16_t *q, *k, *v, *o, *dout = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float* lse;
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&q), q_elems * 2));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&k), kv_elems * 2));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&v), v_elems * 2));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&o), o_elems * 2));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&lse), lse_elems * 4));
  fill_normal<<<1024, 256>>>(q, q_elems, seed, bf16);
  fill_normal<<<1024, 256>>>(k, kv_elems, seed * 3 + 1, bf16);
  fill_normal<<<1024, 256>>>(v, v_elems, seed * 7 + 2, bf16);
  CHECK_CUDA(cudaMemset(o, 0xff, o_elems * 2));  // NaN: unwritten elements show

  flash3::ForwardArgs a;
  a.dtype = bf16 ? DType::kBF16 : DType::kFP16;
  a.batch = c.batch;
  a.seqlen_q = a.seqlen_k = c.seqlen;
  a.heads_q = c.heads_q;
  a.heads_kv = c.heads_kv;
  a.head_dim = d;
  a.head_dim_v = c.head_dim_v;
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  a.options = c.options;
  a.q = flash3::contiguous<const void*>(q, c.seqlen, c.heads_q, d);
  a.k = flash3::contiguous<const void*>(k, c.seqlen, c.heads_kv, d);
  a.v = flash3::contiguous<const void*>(v, c.seqlen, c.heads_kv, dim_v);
  a.o = flash3::contiguous<void*>(o, c.seqlen, c.heads_q, dim_v);
  a.lse = lse;
  Fp8Inputs fp8_inputs;
  flash3::Status quantized = fp8 ? fp8_inputs.quantize(a, c.granularity, c.hadamard) : flash3::Status();
  // Sinks around the scores' own size (N(0, 2^2)), and their gradient.
  float *sinks = nullptr, *dsinks = nullptr;
  if (c.sinks) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.f, 2.f);
    std::vector<float> host(c.heads_q);
    for (float& x : host) x = normal(rng);
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&sinks), c.heads_q * 4));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dsinks), c.heads_q * 4));
    CHECK_CUDA(cudaMemcpy(sinks, host.data(), c.heads_q * 4, cudaMemcpyHostToDevice));
    a.sinks = sinks;
  }

  flash3::BackwardArgs b;
  if (backward) {
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dout), o_elems * 2));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dq), q_elems * 2));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dk), kv_elems * 2));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dv), v_elems * 2));
    fill_normal<<<1024, 256>>>(dout, o_elems, seed * 11 + 3, bf16);
    CHECK_CUDA(cudaMemset(dq, 0xff, q_elems * 2));
    CHECK_CUDA(cudaMemset(dk, 0xff, kv_elems * 2));
    CHECK_CUDA(cudaMemset(dv, 0xff, v_elems * 2));
    b.dtype = c.dtype;
    b.batch = c.batch;
    b.seqlen_q = b.seqlen_k = c.seqlen;
    b.heads_q = c.heads_q;
    b.heads_kv = c.heads_kv;
    b.head_dim = d;
    b.head_dim_v = c.head_dim_v;
    b.causal = c.causal;
    b.window_left = c.window_left;
    b.window_right = c.window_right;
    b.softcap = c.softcap;
    b.deterministic = c.deterministic;
    b.q = a.q;
    b.k = a.k;
    b.v = a.v;
    b.o = flash3::contiguous<const void*>(o, c.seqlen, c.heads_q, dim_v);
    b.dout = flash3::contiguous<const void*>(dout, c.seqlen, c.heads_q, dim_v);
    b.lse = lse;
    b.dq = flash3::contiguous<void*>(dq, c.seqlen, c.heads_q, d);
    b.dk = flash3::contiguous<void*>(dk, c.seqlen, c.heads_kv, d);
    b.dv = flash3::contiguous<void*>(dv, c.seqlen, c.heads_kv, dim_v);
    b.sinks = sinks;
    b.dsinks = dsinks;
    // The caller's workspace, as a training loop keeps one.
    CHECK_CUDA(cudaMalloc(&workspace, std::max<size_t>(1, flash3::backward_workspace_size(b))));
    b.workspace = workspace;
  }
  auto call = [&]() {
    flash3::Status s;
    if (c.pass != Pass::kBwd) s = flash3::forward(a, nullptr);
    if (s.ok() && backward) s = flash3::backward(b, nullptr);
    return s;
  };

  flash3::Status s = quantized;
  if (s.ok() && backward) s = flash3::forward(a, nullptr);
  if (s.ok()) s = call();
  if (s.ok()) {
    CHECK_CUDA(cudaDeviceSynchronize());
    r.ok = true;
    if (opt.check) {
      Check chk;
      if (!backward) {
        float *ref, *low;
        CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&ref), o_elems * 4));
        CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&low), o_elems * 4));
        flash3::reference::AttentionShape shape{c.batch, c.seqlen, c.seqlen, c.heads_q, c.heads_kv, d, 0.f, c.causal};
        shape.window_left = c.window_left;
        shape.window_right = c.window_right;
        shape.softcap = c.softcap;
        shape.head_dim_v = c.head_dim_v;
        // FP8: the reference sees the quantized inputs (dequantized).
        for (auto [buf, emulate] : {std::pair{ref, false}, std::pair{low, true}}) {
          using flash3::reference::Fp8Emulation;
          CHECK_CUDA(fp8 ? flash3::reference::attention_gpu_fp8(shape, a.q, a.k, a.v, a.fp8, buf, nullptr,
                                                                emulate ? Fp8Emulation::kFused : Fp8Emulation::kNone,
                                                                nullptr, sinks)
                         : flash3::reference::attention_gpu(shape, c.dtype, a.q, a.k, a.v, buf, nullptr, emulate, nullptr,
                                                            sinks));
        }
        check_tensor(chk, "O", o, int64_t(o_elems), int64_t(o_elems), ref, low, o_elems, bf16, 1e-5f);
        cudaFree(ref);
        cudaFree(low);
      } else {
        // The reference backward is one block per row: check batch 0 and the
        // query heads of K/V head 0 (views into the same tensors).
        int64_t const group = c.heads_q / c.heads_kv;
        flash3::reference::AttentionShape shape{1, c.seqlen, c.seqlen, group, 1, d, 0.f, c.causal};
        shape.window_left = c.window_left;
        shape.window_right = c.window_right;
        shape.softcap = c.softcap;
        shape.head_dim_v = c.head_dim_v;
        size_t const sq = size_t(c.seqlen) * group * d, sk = size_t(c.seqlen) * d, sv = size_t(c.seqlen) * dim_v;
        // The epsilon as the GPU tests' (reference::backward_epsilon).
        float *ref, *low, *rounded_o;
        CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&ref), (sq + sk + sv) * 4));
        CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&low), (sq + sk + sv) * 4));
        CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&rounded_o), (sq + sk + sv) * 4));
        for (auto [buf, emulate, o_used] : {std::tuple{ref, false, false}, std::tuple{low, true, false},
                                            std::tuple{rounded_o, false, true}}) {
          // Query heads 0 .. group - 1: the sinks' first group.
          CHECK_CUDA(flash3::reference::attention_backward_gpu(shape, c.dtype, a.q, a.k, a.v, b.dout, buf, buf + sq,
                                                               buf + sq + sk, emulate, nullptr,
                                                               o_used ? &b.o : nullptr, sinks));
        }
        CHECK_CUDA(cudaDeviceSynchronize());
        auto eps = [&](size_t offset, size_t n) {
          std::vector<float> h(n), h_o(n);
          CHECK_CUDA(cudaMemcpy(h.data(), ref + offset, n * 4, cudaMemcpyDeviceToHost));
          CHECK_CUDA(cudaMemcpy(h_o.data(), rounded_o + offset, n * 4, cudaMemcpyDeviceToHost));
          return flash3::reference::backward_epsilon(h.data(), h_o.data(), n);
        };
        check_tensor(chk, "dQ", dq, group * d, c.heads_q * d, ref, low, sq, bf16, eps(0, sq));
        check_tensor(chk, "dK", dk, d, c.heads_kv * d, ref + sq, low + sq, sk, bf16, eps(sq, sk));
        check_tensor(chk, "dV", dv, dim_v, c.heads_kv * dim_v, ref + sq + sk, low + sq + sk, sv, bf16, eps(sq + sk, sv));
        cudaFree(ref);
        cudaFree(low);
        cudaFree(rounded_o);
      }
      r.max_err = chk.max_err;
      r.ref_err = chk.ref_err;
      r.ok = chk.ok;
      r.error = chk.error;
    }
    r.ms = median_ms([&] { call(); }, opt.reps, opt.regime);
    r.tflops = flops(c) / (r.ms * 1e-3) / 1e12;
  } else {
    r.error = s.message();
  }
  for (void* p : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)lse, (void*)dout, (void*)dq, (void*)dk, (void*)dv,
                  workspace, (void*)sinks, (void*)dsinks}) {
    cudaFree(p);
  }
  return r;
}

void write_json(std::string const& path, std::vector<Result> const& results) {
  std::ofstream f(path);
  f << "[\n";
  for (size_t i = 0; i < results.size(); ++i) {
    Config const& c = results[i].config;
    f << "  {\"pass\": \"" << pass_name(c.pass) << "\", \"variant\": \"" << c.variant << "\", \"dtype\": \""
      << dtype_name(c.dtype) << "\", \"hdim\": " << c.head_dim
      << ", \"hdim_v\": " << (c.head_dim_v != 0 ? c.head_dim_v : c.head_dim) << ", \"causal\": " << (c.causal ? "true" : "false") << ", \"batch\": " << c.batch
      << ", \"seqlen_q\": " << c.seqlen << ", \"seqlen_k\": " << c.seqlen << ", \"heads_q\": " << c.heads_q
      << ", \"heads_kv\": " << c.heads_kv << ", \"ms\": " << results[i].ms << ", \"tflops\": " << results[i].tflops
      << ", \"max_err\": " << results[i].max_err << ", \"ref_err\": " << results[i].ref_err
      << ", \"ok\": " << (results[i].ok ? "true" : "false") << "}" << (i + 1 < results.size() ? "," : "") << "\n";
  }
  f << "]\n";
}

void write_csv(std::string const& path, std::vector<Result> const& results) {
  std::ofstream f(path);
  f << "pass,variant,dtype,hdim,hdim_v,causal,batch,seqlen,heads_q,heads_kv,ms,tflops,max_err,ref_err,ok\n";
  for (Result const& r : results) {
    Config const& c = r.config;
    f << pass_name(c.pass) << "," << c.variant << "," << dtype_name(c.dtype) << "," << c.head_dim << ","
      << (c.head_dim_v != 0 ? c.head_dim_v : c.head_dim) << "," << c.causal
      << "," << c.batch << "," << c.seqlen << "," << c.heads_q << "," << c.heads_kv << "," << r.ms << ","
      << r.tflops << "," << r.max_err << "," << r.ref_err << "," << r.ok << "\n";
  }
}

__device__ float value(uint16_t bits, bool bf16) {
  return bf16 ? __bfloat162float(*reinterpret_cast<__nv_bfloat16*>(&bits))
              : __half2float(*reinterpret_cast<__half*>(&bits));
}
__device__ float value(float x, bool) { return x; }

// Sum of (a - ref)^2 over n elements of a dense 16-bit (or float) tensor.
template <class T>
__global__ void squared_error(T const* a, float const* ref, size_t n, bool bf16, double* out) {
  double sum = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    double const e = double(value(a[i], bf16)) - double(ref[i]);
    sum += e * e;
  }
  atomicAdd(out, sum);
}

// Paper Table 3: the RMSE of O on inputs with outliers, N(0, 1) + N(0, 100) *
// Bernoulli(0.001), batch 2, seqlen 4096, 16 heads, against the float32
// reference on the same 16-bit draws: BF16 and FP16 kernels, FP8 with and
// without block scales and incoherent processing, and the paper's baselines,
// standard attention in fp16 and in FP8 (per-tensor scales, softmax in fp16),
// computed by the reference (emulate_low_precision, Fp8Emulation::kStandard).
int run_fp8_accuracy() {
  int64_t const batch = 2, seqlen = 4096, heads = 16;
  std::printf("\n| hdim | method | RMSE of O | vs flash3 per-tensor | vs standard FP8 (paper's baseline) |\n"
              "|---|---|---|---|---|\n");
  bool ok = true;
  for (int d : {128, 256}) {
    size_t const n = size_t(batch * seqlen * heads * d);
    uint16_t *q, *k, *v, *o;
    float *ref, *standard;
    double* sum;
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&q), n * 2));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&k), n * 2));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&v), n * 2));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&o), n * 2));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&ref), n * 4));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&standard), n * 4));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&sum), 8));
    struct Method {
      char const* name;
      DType draws;
      bool fp8;
      flash3::ScaleGranularity granularity;
      bool hadamard;
      bool standard;  // the reference's standard FP8 attention instead of flash3's kernel
    };
    using G = flash3::ScaleGranularity;
    Method const methods[] = {
        {"bf16", DType::kBF16, false, G::kPerTensor, false, false},
        {"fp16", DType::kFP16, false, G::kPerTensor, false, false},
        {"fp16 standard attention (paper's FP16 baseline)", DType::kFP16, false, G::kPerTensor, false, true},
        {"e4m3 standard attention, per-tensor, fp16 softmax (paper's baseline)", DType::kBF16, true, G::kPerTensor,
         false, true},
        {"e4m3 per-tensor (flash3 baseline)", DType::kBF16, true, G::kPerTensor, false, false},
        {"e4m3 per-block + hadamard (flash3)", DType::kBF16, true, G::kPerBlock, true, false},
        {"e4m3 per-tensor + hadamard (no block quantization)", DType::kBF16, true, G::kPerTensor, true, false},
        {"e4m3 per-block (no incoherent processing)", DType::kBF16, true, G::kPerBlock, false, false}};
    double flash3_baseline = 0, standard_baseline = 0;
    for (Method const& m : methods) {
      bool const bf16 = m.draws == DType::kBF16;
      fill_normal<<<1024, 256>>>(q, n, 11, bf16, true);
      fill_normal<<<1024, 256>>>(k, n, 22, bf16, true);
      fill_normal<<<1024, 256>>>(v, n, 33, bf16, true);
      CHECK_CUDA(cudaMemset(o, 0xff, n * 2));
      CHECK_CUDA(cudaMemset(standard, 0xff, n * 4));
      flash3::ForwardArgs a = flash3::reference::dense_forward_args(m.draws, batch, seqlen, heads, d, q, k, v, o);
      flash3::reference::AttentionShape shape{batch, seqlen, seqlen, heads, heads, d, 0.f, false};
      CHECK_CUDA(flash3::reference::attention_gpu(shape, m.draws, a.q, a.k, a.v, ref, nullptr, false, nullptr));
      Fp8Inputs inputs;
      flash3::Status s = m.fp8 ? inputs.quantize(a, m.granularity, m.hadamard) : flash3::Status();
      if (s.ok() && m.standard) {
        CHECK_CUDA(m.fp8 ? flash3::reference::attention_gpu_fp8(shape, a.q, a.k, a.v, a.fp8, standard, nullptr,
                                                                flash3::reference::Fp8Emulation::kStandard, nullptr)
                         : flash3::reference::attention_gpu(shape, m.draws, a.q, a.k, a.v, standard, nullptr,
                                                            true, nullptr));
      } else if (s.ok()) {
        s = flash3::forward(a, nullptr);
      }
      if (!s.ok()) {
        std::printf("| %d | %s | FAIL: %s | | |\n", d, m.name, s.message().c_str());
        ok = false;
        continue;
      }
      CHECK_CUDA(cudaMemset(sum, 0, 8));
      if (m.standard) {
        squared_error<<<1024, 256>>>(standard, ref, n, bf16, sum);
      } else {
        squared_error<<<1024, 256>>>(o, ref, n, bf16, sum);
      }
      double h_sum;
      CHECK_CUDA(cudaMemcpy(&h_sum, sum, 8, cudaMemcpyDeviceToHost));
      double const rmse = std::sqrt(h_sum / double(n));
      if (m.fp8 && m.standard) standard_baseline = rmse;
      if (m.fp8 && !m.standard && m.granularity == G::kPerTensor && !m.hadamard) flash3_baseline = rmse;
      ok &= std::isfinite(rmse);
      auto ratio = [&](double baseline) {
        char buf[32] = "";
        if (m.fp8 && baseline > 0) std::snprintf(buf, sizeof buf, "%.2fx lower", baseline / rmse);
        return std::string(buf);
      };
      std::printf("| %d | %s | %.2e | %s | %s |\n", d, m.name, rmse, ratio(flash3_baseline).c_str(),
                  ratio(standard_baseline).c_str());
    }
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)ref, (void*)standard, (void*)sum}) cudaFree(p);
  }
  return ok ? 0 : 1;
}

// quantize_fp8 is memory-bound: its bytes moved (16-bit reads, e4m3 writes)
// per second, against a device-to-device copy's (reads + writes) on the same
// device. 32k tokens of hidden 2048: 128 MB per bf16 tensor, well over L2.
int run_quant_bandwidth(Options const& opt) {
  int64_t const tokens = 32768, hidden = 2048;
  std::vector<int> head_dims;
  for (HeadDims const& h : opt.shapes_given ? opt.head_dims : std::vector<HeadDims>{{128}}) head_dims.push_back(h.d);
  std::vector<int64_t> const seqlens = opt.shapes_given ? opt.seqlens : std::vector<int64_t>{4096};
  size_t const n = size_t(tokens * hidden);
  uint16_t *q, *k, *v;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&q), n * 2));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&k), n * 2));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&v), n * 2));
  fill_normal<<<1024, 256>>>(q, n, 1, true);
  fill_normal<<<1024, 256>>>(k, n, 2, true);
  fill_normal<<<1024, 256>>>(v, n, 3, true);
  // The copy: as many bytes as the quantization reads, of Q then K then V.
  uint16_t* dst;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dst), n * 2));
  double const copy_ms = median_ms([&] {
    for (uint16_t* src : {q, k, v}) CHECK_CUDA(cudaMemcpyAsync(dst, src, n * 2, cudaMemcpyDeviceToDevice));
  }, opt.reps);
  double const copy_gbs = 3.0 * 2 * (n * 2) / (copy_ms * 1e-3) / 1e9;
  std::printf("\nquantize_fp8: %lld tokens, hidden %lld, Q, K and V (bf16 -> e4m3)\n", (long long)tokens,
              (long long)hidden);
  std::printf("\n| hdim | seqlen | granularity | hadamard | ms | GB/s | vs copy (%.0f GB/s) |\n"
              "|---|---|---|---|---|---|---|\n",
              copy_gbs);
  bool ok = true;
  using G = flash3::ScaleGranularity;
  for (int d : head_dims) {
    for (int64_t seqlen : seqlens) {
      int64_t const batch = std::max<int64_t>(1, tokens / seqlen), heads = hidden / d;
      for (G g : {G::kPerTensor, G::kPerHead, G::kPerBlock}) {
        for (bool hadamard : {false, true}) {
          flash3::ForwardArgs a =
              flash3::reference::dense_forward_args(DType::kBF16, batch, seqlen, heads, d, q, k, v, nullptr);
          Fp8Inputs inputs;
          flash3::Status s = seqlen <= tokens ? inputs.quantize(a, g, hadamard)
                                              : flash3::Status(flash3::Status::Code::kInvalidArgument,
                                                               "--seqlen: at most 32768 here");
          char const* name = g == G::kPerTensor ? "tensor" : g == G::kPerHead ? "head" : "block";
          if (!s.ok()) {
            std::printf("| %d | %lld | %s | %s | FAIL: %s | | |\n", d, (long long)seqlen, name, hadamard ? "yes" : "no",
                        s.message().c_str());
            ok = false;
            continue;
          }
          double const ms = median_ms([&] { flash3::quantize_fp8(inputs.qa, nullptr); }, opt.reps);
          double const bytes = 3.0 * double(batch * seqlen * heads * d) * 3;  // 2 read + 1 written per element
          double const gbs = bytes / (ms * 1e-3) / 1e9;
          std::printf("| %d | %lld | %s | %s | %.3f | %.0f | %.2f |\n", d, (long long)seqlen, name,
                      hadamard ? "yes" : "no", ms, gbs, gbs / copy_gbs);
        }
      }
    }
  }
  for (void* p : {(void*)q, (void*)k, (void*)v, (void*)dst}) cudaFree(p);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "flash3-bench: no CUDA device found; the benchmark needs a Hopper GPU (H100/H200).\n");
    return 2;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  if (opt.fp8_accuracy) return run_fp8_accuracy();
  if (opt.quant_bandwidth) return run_quant_bandwidth(opt);

  std::vector<Config> configs;
  if (opt.ablation) {
    // Three interleaved rounds: the card's clock drifts over a run, and a
    // variant timed only after the others would carry that drift.
    for (int i = 0; i < 3 * kNumAblations; ++i) {
      int const v = i % kNumAblations;
      Config c;
      c.variant = kAblations[v];
      c.batch = 4;
      c.seqlen = 8448;
      c.heads_q = c.heads_kv = 16;
      c.head_dim = 128;
      c.options.pingpong = v != 1;
      c.options.intra_warpgroup_overlap = v != 2;
      c.options.persistent = v != 3;
      c.options.warp_specialization = v != 4;
      configs.push_back(c);
    }
  } else {
    // Shapes outer, passes inner: "--pass all" prints each shape's passes together.
    for (HeadDims const& h : opt.head_dims) {
      if (h.v != 0 && h.v != h.d && opt.dtype == DType::kE4M3) {
        std::fprintf(stderr, "--hdim %d/%d: FP8 (e4m3) has no V head dim of its own\n", h.d, h.v);
        return 2;
      }
      for (bool causal : opt.causal) {
        for (int64_t s : opt.seqlens) {
          for (Pass pass : opt.passes) {
            if (pass != Pass::kFwd && opt.dtype == DType::kE4M3) continue;  // FP8: forward only
            Config c;
            c.pass = pass;
            c.deterministic = opt.deterministic;
            if (c.deterministic && pass != Pass::kFwd) c.variant = "deterministic";
            c.dtype = opt.dtype;
            c.granularity = opt.granularity;
            c.options = opt.options;
            if (!c.options.pingpong) c.variant = "no-pingpong";
            if (!c.options.intra_warpgroup_overlap) c.variant = "no-intra-wg-overlap";
            if (!c.options.warp_specialization) c.variant = "no-warp-specialization";
            if (!c.options.persistent) c.variant = "no-persistent";
            c.hadamard = opt.hadamard;
            c.sinks = opt.sinks;
            if (c.sinks) c.variant = c.variant == "default" ? "sinks" : c.variant + "+sinks";
            c.window_left = opt.window_left;
            c.window_right = opt.window_right;
            if (c.window_left >= 0 || c.window_right >= 0) {
              std::string const w = "window(" + std::to_string(c.window_left) + "," + std::to_string(c.window_right) + ")";
              c.variant = c.variant == "default" ? w : c.variant + "+" + w;
            }
            c.softcap = opt.softcap;
            if (c.softcap != 0.f) {
              char buf[32];
              std::snprintf(buf, sizeof buf, "softcap(%g)", c.softcap);
              c.variant = c.variant == "default" ? buf : c.variant + "+" + buf;
            }
            c.head_dim = h.d;
            c.head_dim_v = h.v != h.d ? h.v : 0;
            c.causal = causal;
            c.seqlen = s;
            c.batch = std::max<int64_t>(1, opt.total_tokens / s);
            c.heads_q = std::max<int64_t>(1, opt.hidden / h.d);
            c.heads_kv = std::max<int64_t>(1, c.heads_q / opt.gqa);
            configs.push_back(c);
          }
        }
      }
    }
  }

  std::vector<Result> results;
  bool all_ok = true;
  for (size_t i = 0; i < configs.size(); ++i) {
    Config const& c = configs[i];
    std::fprintf(stderr, "[%zu/%zu] %s %s hdim %s%s seqlen %lld batch %lld heads %lld/%lld\n", i + 1, configs.size(),
                 pass_name(c.pass), c.variant.c_str(), hdim_name(c).c_str(), c.causal ? " causal" : "", (long long)c.seqlen, (long long)c.batch,
                 (long long)c.heads_q, (long long)c.heads_kv);
    results.push_back(run(c, opt, 1000u + uint32_t(i) * 17u));
    all_ok &= results.back().ok;
  }

  std::printf("\n| pass | variant | dtype | hdim | causal | batch | seqlen | heads | ms | TFLOP/s | max err | ref err | check |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (Result const& r : results) {
    Config const& c = r.config;
    std::printf("| %s | %s | %s | %s | %s | %lld | %lld | %lld/%lld | %.3f | %.1f | %.2e | %.2e | %s |\n",
                pass_name(c.pass), c.variant.c_str(), dtype_name(c.dtype), hdim_name(c).c_str(),
                c.causal ? "yes" : "no",
                (long long)c.batch, (long long)c.seqlen, (long long)c.heads_q, (long long)c.heads_kv, r.ms, r.tflops,
                r.max_err, r.ref_err, r.ok ? (opt.check ? "ok" : "unchecked") : ("FAIL: " + r.error).c_str());
  }
  if (opt.ablation) {
    std::printf("\n| variant (median of 3 rounds) | TFLOP/s | vs default |\n|---|---|---|\n");
    auto median_of = [&](std::string const& variant) {
      std::vector<double> v;
      for (Result const& r : results) {
        if (r.config.variant == variant) v.push_back(r.tflops);
      }
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    double const base = median_of("default");
    for (char const* name : kAblations) {
      double const t = median_of(name);
      std::printf("| %s | %.1f | %.3f |\n", name, t, base > 0 ? t / base : 0.0);
    }
  }
  if (!opt.json.empty()) write_json(opt.json, results);
  if (!opt.csv.empty()) write_csv(opt.csv, results);
  return all_ok ? 0 : 1;
}
