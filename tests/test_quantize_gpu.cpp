// quantize_fp8 on the GPU against quantize_cpu (reference/quantize_reference.h)
// on fresh random inputs with outliers: the scales and the e4m3 bytes must be
// equal (the kernel repeats the reference's float32 arithmetic; with the
// Hadamard transform, at most 0.1% of the bytes may differ by one step). The
// outputs are poisoned (0xFF) first, and every byte the kernel must not write
// (padding between rows and batches, scales past the count) must still be
// poison afterwards. Inputs sit in strided layouts (packed QKV, head-major,
// padded rows, batch gaps past 2^31 elements).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "flash3/flash3.h"
#include "gpu_test_util.h"
#include "quantize_reference.h"

namespace {

using flash3::DType;
using flash3::ScaleGranularity;
using flash3::testing::DeviceBuffer;
using flash3::testing::from_bits;
using flash3::testing::to_bits;

enum class Layout {
  kDense,      // each tensor [b, s, h, d], dense (plus the batch gap); dense outputs
  kPackedQkv,  // Q, K, V interleaved in one [b, s, 3, h, d] buffer; outputs with padded rows
  kHeadMajor,  // each tensor [b, h, s, d] with padding between heads; outputs likewise
};

struct Case {
  DType dtype;
  int head_dim;
  ScaleGranularity granularity;
  bool hadamard;
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
  Layout layout = Layout::kDense;
  int64_t batch_gap = 0;  // unused elements (inputs) and bytes (outputs) between batches; a multiple of 16
};

std::string name(Case const& c) {
  char const* g = c.granularity == ScaleGranularity::kPerTensor ? "tensor"
                  : c.granularity == ScaleGranularity::kPerHead ? "head"
                                                                : "block";
  char const* l = c.layout == Layout::kDense ? "dense" : c.layout == Layout::kPackedQkv ? "packed" : "head-major";
  return std::string(c.dtype == DType::kBF16 ? "bf16" : "fp16") + " d" + std::to_string(c.head_dim) + " per-" + g +
         (c.hadamard ? " hadamard" : "") + " b" + std::to_string(c.batch) + " sq" + std::to_string(c.seqlen_q) +
         " sk" + std::to_string(c.seqlen_k) + " h" + std::to_string(c.heads_q) + "/" + std::to_string(c.heads_kv) +
         " " + l + (c.batch_gap ? " gap " + std::to_string(c.batch_gap) : "");
}

// A device buffer of `batch` regions of `region` elements, `batch_stride`
// apart, and its host image (the regions only: the gaps are never touched).
template <class T>
struct Image {
  int64_t batch = 0, region = 0, batch_stride = 0;
  std::vector<T> host;  // batch * region
  DeviceBuffer<T> device;
  Image(int64_t b, int64_t r, int64_t gap, T fill)
      : batch(b), region(r), batch_stride(r + gap), host(size_t(b * r), fill),
        device(b > 0 && r > 0 ? size_t((b - 1) * (r + gap) + r) : 0) {}
  T& at(int64_t b, int64_t offset) { return host[size_t(b * region + offset)]; }
  bool ok() const { return batch * region == 0 || device.ptr != nullptr; }
  cudaError_t upload() {
    for (int64_t b = 0; b < batch; ++b) {
      cudaError_t err = cudaMemcpy(device.ptr + b * batch_stride, host.data() + b * region, region * sizeof(T),
                                   cudaMemcpyHostToDevice);
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
  cudaError_t download() {
    for (int64_t b = 0; b < batch; ++b) {
      cudaError_t err = cudaMemcpy(host.data() + b * region, device.ptr + b * batch_stride, region * sizeof(T),
                                   cudaMemcpyDeviceToHost);
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
  cudaError_t poison() {
    return batch * region == 0 ? cudaSuccess
                               : cudaMemset(device.ptr, 0xFF, size_t((batch - 1) * batch_stride + region) * sizeof(T));
  }
};

// Where one tensor's [b, s, h, :] rows are inside an image's batch region.
struct Placement {
  int64_t offset = 0, seq_stride = 0, head_stride = 0;
  int64_t at(int64_t s, int64_t h) const { return offset + s * seq_stride + h * head_stride; }
};

template <class Pointer, class T>
flash3::TensorRef<Pointer> ref(Image<T>& image, Placement const& p) {
  if (image.device.ptr == nullptr) return {};
  return {static_cast<Pointer>(image.device.ptr + p.offset), image.batch_stride, p.seq_stride, p.head_stride, 1};
}

// The distance of two e4m3 encodings in steps of the format (+0 and -0 alike).
int e4m3_steps(uint8_t a, uint8_t b) {
  auto ordinal = [](uint8_t c) { return (c & 0x80) ? -int(c & 0x7F) : int(c & 0x7F); };
  return std::abs(ordinal(a) - ordinal(b));
}

struct TensorSpec {
  char const* name;
  int64_t seqlen, heads;
  Image<uint16_t>* in;
  Placement in_at;
  Image<uint8_t>* out;
  Placement out_at;
  std::vector<float> values;  // dense [b, s, h, d], as the kernel reads them
  std::vector<uint8_t> expected;
  std::vector<float> expected_scale;
  DeviceBuffer<float>* scale;
  int64_t scale_count;
};

void run_case(Case const& c, uint32_t seed) {
  SCOPED_TRACE(name(c));
  int64_t const d = c.head_dim, b = c.batch;
  flash3::Fp8BlockSizes const blocks = flash3::fp8_block_sizes(d);
  ASSERT_GT(blocks.q, 0);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  // Input poison: huge finite values that would change every scale if read.
  uint16_t const in_poison = c.dtype == DType::kBF16 ? 0x7F00 : 0x7BFF;

  // Input and output images and the tensors' places in them.
  int64_t const sq = c.seqlen_q, sk = c.seqlen_k, hq = c.heads_q, hkv = c.heads_kv;
  Image<uint16_t> packed(c.layout == Layout::kPackedQkv ? b : 0, sq * 3 * hq * d, c.batch_gap, in_poison);
  // Batch regions of the separate (not packed) inputs and of the outputs.
  auto in_region = [&](int64_t s, int64_t h) {
    return c.layout == Layout::kHeadMajor ? h * (s * d + 8) : c.layout == Layout::kDense ? s * h * d : 0;
  };
  int64_t const in_batches = c.layout == Layout::kPackedQkv ? 0 : b;
  Image<uint16_t> qi(in_batches, in_region(sq, hq), c.batch_gap, in_poison);
  Image<uint16_t> ki(in_batches, in_region(sk, hkv), c.batch_gap, in_poison);
  Image<uint16_t> vi(in_batches, in_region(sk, hkv), c.batch_gap, in_poison);
  auto out_region = [&](int64_t s, int64_t h) {
    return c.layout == Layout::kDense ? s * h * d : c.layout == Layout::kPackedQkv ? s * (h * d + 16) : h * (s * d + 16);
  };
  Image<uint8_t> qo(b, out_region(sq, hq), c.batch_gap, 0xFF);
  Image<uint8_t> ko(b, out_region(sk, hkv), c.batch_gap, 0xFF);
  Image<uint8_t> vo(b, out_region(sk, hkv), c.batch_gap, 0xFF);
  auto in_place = [&](int64_t h, int which) -> Placement {
    switch (c.layout) {
      case Layout::kDense: return {0, h * d, d};
      case Layout::kPackedQkv: return {which * h * d, 3 * h * d, d};
      default: return {0, d, 0};  // head stride below
    }
  };
  auto out_place = [&](int64_t s, int64_t h) -> Placement {
    switch (c.layout) {
      case Layout::kDense: return {0, h * d, d};
      case Layout::kPackedQkv: return {0, h * d + 16, d};
      default: return {0, d, s * d + 16};
    }
  };
  int64_t const nq = flash3::fp8_scale_count(c.granularity, b, hq, sq, blocks.q);
  int64_t const nk = flash3::fp8_scale_count(c.granularity, b, hkv, sk, blocks.kv);
  constexpr int64_t kScaleSlack = 8;  // poisoned floats past the count
  DeviceBuffer<float> qs(sq > 0 ? nq + kScaleSlack : 0), ks(sk > 0 ? nk + kScaleSlack : 0),
      vs(sk > 0 ? nk + kScaleSlack : 0);

  TensorSpec tensors[3] = {
      {"q", sq, hq, c.layout == Layout::kPackedQkv ? &packed : &qi, in_place(hq, 0), &qo, out_place(sq, hq), {}, {}, {}, &qs, nq},
      {"k", sk, hkv, c.layout == Layout::kPackedQkv ? &packed : &ki, in_place(hkv, 1), &ko, out_place(sk, hkv), {}, {}, {}, &ks, nk},
      {"v", sk, hkv, c.layout == Layout::kPackedQkv ? &packed : &vi, in_place(hkv, 2), &vo, out_place(sk, hkv), {}, {}, {}, &vs, nk},
  };
  if (c.layout == Layout::kHeadMajor) {
    tensors[0].in_at.head_stride = sq * d + 8;
    tensors[1].in_at.head_stride = tensors[2].in_at.head_stride = sk * d + 8;
  }

  // Random inputs: normal, 0.1% outliers of 100x, an outlier channel (column
  // 7, 20x) in head 0, and K's last head of batch 0 all zeros (scale 1).
  for (int t = 0; t < 3; ++t) {
    TensorSpec& ts = tensors[t];
    ts.values.assign(size_t(b * ts.seqlen * ts.heads * d), 0.0f);
    for (int64_t bi = 0; bi < b; ++bi) {
      for (int64_t s = 0; s < ts.seqlen; ++s) {
        for (int64_t h = 0; h < ts.heads; ++h) {
          for (int64_t i = 0; i < d; ++i) {
            float x = normal(rng);
            if (uniform(rng) < 0.001f) x *= 100.0f;
            if (h == 0 && i == 7) x *= 20.0f;
            if (t == 1 && bi == 0 && h == ts.heads - 1) x = 0.0f;
            uint16_t const bits = to_bits(x, c.dtype);
            ts.in->at(bi, ts.in_at.at(s, h) + i) = bits;
            ts.values[size_t(((bi * ts.seqlen + s) * ts.heads + h) * d + i)] = from_bits(bits, c.dtype);
          }
        }
      }
    }
  }
  for (auto* image : {&packed, &qi, &ki, &vi}) {
    ASSERT_TRUE(image->ok()) << "out of device memory";
    CUDA_OK(image->upload());
  }
  for (auto* image : {&qo, &ko, &vo}) ASSERT_TRUE(image->ok()) << "out of device memory";

  // The reference.
  flash3::reference::QuantizeShape shape;
  shape.batch = b, shape.seqlen_q = sq, shape.seqlen_k = sk, shape.heads_q = hq, shape.heads_kv = hkv;
  shape.head_dim = d, shape.granularity = c.granularity, shape.block_q = blocks.q, shape.block_kv = blocks.kv;
  shape.hadamard = c.hadamard, shape.seed = 0x5EED0000ull + seed;
  for (TensorSpec& ts : tensors) {
    ts.expected.assign(ts.values.size(), 0);
    ts.expected_scale.assign(size_t(ts.scale_count), 0.0f);
  }
  flash3::reference::quantize_cpu(shape, tensors[0].values.data(), tensors[1].values.data(),
                                  tensors[2].values.data(), tensors[0].expected.data(), tensors[1].expected.data(),
                                  tensors[2].expected.data(), tensors[0].expected_scale.data(),
                                  tensors[1].expected_scale.data(), tensors[2].expected_scale.data());

  flash3::QuantizeArgs a;
  a.dtype = c.dtype;
  a.batch = b, a.seqlen_q = sq, a.seqlen_k = sk, a.heads_q = hq, a.heads_kv = hkv, a.head_dim = d;
  a.q = ref<const void*>(*tensors[0].in, tensors[0].in_at);
  a.k = ref<const void*>(*tensors[1].in, tensors[1].in_at);
  a.v = ref<const void*>(*tensors[2].in, tensors[2].in_at);
  a.q_out = ref<void*>(qo, tensors[0].out_at);
  a.k_out = ref<void*>(ko, tensors[1].out_at);
  a.v_out = ref<void*>(vo, tensors[2].out_at);
  a.granularity = c.granularity;
  a.q_scale = qs.ptr, a.k_scale = ks.ptr, a.v_scale = vs.ptr;
  a.hadamard = c.hadamard;
  a.seed = shape.seed;

  // Twice, from poisoned outputs each time: the same bytes (deterministic).
  std::vector<std::vector<uint8_t>> first_run(3);
  for (int run = 0; run < 2; ++run) {
    for (TensorSpec& ts : tensors) {
      CUDA_OK(ts.out->poison());
      if (ts.scale->ptr) {
        CUDA_OK(cudaMemset(ts.scale->ptr, 0xFF, size_t(ts.scale_count + kScaleSlack) * 4));
      }
    }
    flash3::Status const st = flash3::quantize_fp8(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    CUDA_OK(cudaDeviceSynchronize());
    for (int t = 0; t < 3; ++t) {
      TensorSpec& ts = tensors[t];
      SCOPED_TRACE(ts.name);
      CUDA_OK(ts.out->download());
      if (run == 1) {
        EXPECT_TRUE(ts.out->host == first_run[t]) << "a second run gave other bytes";
        continue;
      }
      first_run[t] = ts.out->host;
      if (ts.scale->ptr == nullptr) continue;
      std::vector<float> scale(size_t(ts.scale_count + kScaleSlack));
      CUDA_OK(cudaMemcpy(scale.data(), ts.scale->ptr, scale.size() * 4, cudaMemcpyDeviceToHost));
      if (b == 0) {  // an empty problem writes nothing
        for (float x : scale) EXPECT_TRUE(std::isnan(x)) << "a scale written for an empty problem";
        continue;
      }
      int scale_errors = 0;
      for (int64_t i = 0; i < ts.scale_count; ++i) {
        float const e = ts.expected_scale[size_t(i)];
        if (!(std::fabs(scale[size_t(i)] - e) <= 1e-6f * e) && scale_errors++ < 5) {
          ADD_FAILURE() << "scale " << i << ": " << scale[size_t(i)] << ", expected " << e;
        }
      }
      EXPECT_EQ(scale_errors, 0);
      for (int64_t i = ts.scale_count; i < ts.scale_count + kScaleSlack; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &scale[size_t(i)], 4);
        EXPECT_EQ(bits, 0xFFFFFFFFu) << "written past the scales, at " << i;
      }
      // Bytes: each element against the reference, the rest still poison.
      std::vector<char> is_element(ts.out->host.size(), 0);
      int64_t mismatches = 0, far = 0, elements = 0;
      for (int64_t bi = 0; bi < b; ++bi) {
        for (int64_t s = 0; s < ts.seqlen; ++s) {
          for (int64_t h = 0; h < ts.heads; ++h) {
            for (int64_t i = 0; i < d; ++i) {
              int64_t const o = bi * ts.out->region + ts.out_at.at(s, h) + i;
              is_element[size_t(o)] = 1;
              uint8_t const got = ts.out->host[size_t(o)];
              uint8_t const want = ts.expected[size_t(((bi * ts.seqlen + s) * ts.heads + h) * d + i)];
              ++elements;
              if (got == want) continue;
              ++mismatches;
              if (e4m3_steps(got, want) > 1 || !c.hadamard) {
                if (far++ < 5) {
                  ADD_FAILURE() << "b " << bi << " s " << s << " h " << h << " i " << i << ": 0x" << std::hex
                                << int(got) << ", expected 0x" << int(want) << std::dec;
                }
              }
            }
          }
        }
      }
      EXPECT_EQ(far, 0);
      if (mismatches > 0) {
        std::printf("note: %s %s: %lld of %lld bytes one step from the reference\n", name(c).c_str(), ts.name,
                    (long long)mismatches, (long long)elements);
      }
      EXPECT_LE(mismatches, c.hadamard ? elements / 1000 : 0) << mismatches << " of " << elements << " differ";
      int64_t stray = 0;
      for (size_t o = 0; o < is_element.size(); ++o) stray += !is_element[o] && ts.out->host[o] != 0xFF;
      EXPECT_EQ(stray, 0) << "bytes written outside the tensor";
    }
  }
}

class QuantizeGpu : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_CUDA_DEVICE(); }
};

constexpr ScaleGranularity kGranularities[] = {ScaleGranularity::kPerTensor, ScaleGranularity::kPerHead,
                                               ScaleGranularity::kPerBlock};

// Every granularity x transform x dtype x head dim, on odd sequence lengths
// with GQA: 300 (partial last blocks), 7 and 1.
TEST_F(QuantizeGpu, EveryConfiguration) {
  uint32_t seed = 1;
  for (DType dt : {DType::kBF16, DType::kFP16}) {
    for (int d : {64, 128, 256}) {
      for (ScaleGranularity g : kGranularities) {
        for (bool had : {false, true}) {
          run_case({dt, d, g, had, 2, 300, 7, 4, 2}, seed++);
          run_case({dt, d, g, had, 1, 1, 300, 2, 1, Layout::kHeadMajor}, seed++);
          run_case({dt, d, g, had, 3, 7, 1, 2, 2, Layout::kDense, 48}, seed++);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// Q, K, V interleaved in one buffer ([b, s, 3, h, d]); outputs with padded rows.
TEST_F(QuantizeGpu, PackedQkv) {
  uint32_t seed = 1000;
  for (DType dt : {DType::kBF16, DType::kFP16}) {
    for (int d : {64, 128, 256}) {
      for (ScaleGranularity g : kGranularities) {
        run_case({dt, d, g, dt == DType::kBF16, 2, 257, 257, 3, 3, Layout::kPackedQkv, 16}, seed++);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Many CTAs folding into one scale (per tensor, per head), and long sequences.
TEST_F(QuantizeGpu, LongSequences) {
  uint32_t seed = 2000;
  for (ScaleGranularity g : kGranularities) {
    for (bool had : {false, true}) {
      run_case({DType::kBF16, 128, g, had, 2, 4096, 3000, 4, 2}, seed++);
      run_case({DType::kFP16, 256, g, had, 1, 2500, 4100, 4, 4, Layout::kHeadMajor}, seed++);
      if (HasFatalFailure()) return;
    }
  }
}

// Empty tensors: no queries, or no keys; the other side is quantized.
TEST_F(QuantizeGpu, EmptyTensors) {
  run_case({DType::kBF16, 128, ScaleGranularity::kPerBlock, true, 2, 0, 130, 4, 2}, 3000);
  run_case({DType::kFP16, 64, ScaleGranularity::kPerHead, false, 2, 130, 0, 4, 2}, 3001);
  run_case({DType::kBF16, 256, ScaleGranularity::kPerTensor, true, 0, 10, 10, 4, 2}, 3002);
}

// Batches 2^31 + 16 elements apart (4.3 GB of bf16 per input): 64-bit offsets.
TEST_F(QuantizeGpu, OffsetsPast2To31) {
  int64_t const gap = (int64_t(1) << 31) + 16;
  size_t free_bytes = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_bytes, &total));
  if (free_bytes < (size_t(3 * 3) << 31) + (size_t(1) << 30)) GTEST_SKIP() << "needs about 20 GB of device memory";
  run_case({DType::kBF16, 128, ScaleGranularity::kPerBlock, true, 2, 300, 200, 2, 1, Layout::kDense, gap}, 4000);
  run_case({DType::kFP16, 256, ScaleGranularity::kPerHead, false, 2, 300, 200, 2, 2, Layout::kDense, gap}, 4001);
}

// An invalid argument: kInvalidArgument, and nothing written.
TEST_F(QuantizeGpu, InvalidArgumentsWriteNothing) {
  int64_t const b = 1, s = 64, h = 2, d = 128;
  DeviceBuffer<uint16_t> in(b * s * h * d);
  DeviceBuffer<uint8_t> out(3 * b * s * h * d);
  DeviceBuffer<float> scales(64);
  ASSERT_TRUE(in.ptr && out.ptr && scales.ptr);
  CUDA_OK(cudaMemset(in.ptr, 0, b * s * h * d * 2));
  CUDA_OK(cudaMemset(out.ptr, 0xFF, 3 * b * s * h * d));
  CUDA_OK(cudaMemset(scales.ptr, 0xFF, 64 * 4));
  flash3::QuantizeArgs a;
  a.batch = b, a.seqlen_q = a.seqlen_k = s, a.heads_q = a.heads_kv = h, a.head_dim = d;
  a.q = a.k = a.v = flash3::contiguous<const void*>(in.ptr, s, h, d);
  a.q_out = flash3::contiguous<void*>(out.ptr, s, h, d);
  a.k_out = flash3::contiguous<void*>(out.ptr + b * s * h * d, s, h, d);
  a.v_out = flash3::contiguous<void*>(out.ptr + 2 * b * s * h * d, s, h, d);
  a.q_scale = scales.ptr, a.k_scale = scales.ptr + 16, a.v_scale = scales.ptr + 32;
  ASSERT_TRUE(flash3::validate(a).ok());
  a.v_out.seq_stride = h * d + 8;  // not a multiple of 16 bytes
  flash3::Status const st = flash3::quantize_fp8(a, nullptr);
  EXPECT_EQ(st.code(), flash3::Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("v_out.seq_stride:", 0), 0u) << st.message();
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> host(3 * b * s * h * d + 64 * 4);
  CUDA_OK(cudaMemcpy(host.data(), out.ptr, 3 * b * s * h * d, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(host.data() + 3 * b * s * h * d, scales.ptr, 64 * 4, cudaMemcpyDeviceToHost));
  for (uint8_t x : host) ASSERT_EQ(x, 0xFF);
}

}  // namespace
