// flash3: FlashAttention-3 for NVIDIA Hopper (sm_90a).
//
// The public C++ API. It holds no CuTe, CUTLASS or PyTorch types: a caller
// describes its tensors with device pointers and strides, and gets a Status.
//
// Layout of every Q/K/V/O tensor: [batch, seqlen, heads, head_dim], with
// arbitrary (64-bit, element-counted) strides for batch, seqlen and heads and a
// contiguous head dimension. V, O and their gradients have V's head dim
// (head_dim_v), which is head_dim unless the arguments give another. Packed QKV tensors are described by pointing Q, K
// and V into the same buffer with the packed strides. An output (O, dQ, dK,
// dV, the quantizer's) must not overlap itself: sorted by stride, each of its
// modes of more than one index steps past all that the head dim and the
// smaller modes span.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

typedef struct CUstream_st* cudaStream_t;

namespace flash3 {

// kE4M3: FP8 (e4m3) inputs of the forward pass, with descale factors in
// ForwardArgs::fp8 (see quantize_fp8 below). kFP32: combine()'s output only.
enum class DType { kBF16, kFP16, kE4M3, kFP32 };

// Every entry point returns a Status; none throws and none launches anything
// when the arguments are invalid.
class Status {
 public:
  enum class Code {
    kOk,
    kInvalidArgument,  // a bad argument; message() names it
    kUnsupported,      // valid, but not supported here (e.g. the device is not sm_90)
    kCudaError,        // a CUDA runtime call failed
  };
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// A [batch, seqlen, heads, head_dim] view of device memory. Strides count
// elements. dim_stride must be 1; it is here so that a non-contiguous head
// dimension is reported rather than silently misread.
template <class Pointer>
struct TensorRef {
  Pointer data = nullptr;
  int64_t batch_stride = 0;
  int64_t seq_stride = 0;
  int64_t head_stride = 0;
  int64_t dim_stride = 1;
};
using ConstTensor = TensorRef<const void*>;
using MutableTensor = TensorRef<void*>;

// Strides of a densely packed [batch, seqlen, heads, head_dim] tensor.
template <class Pointer>
TensorRef<Pointer> contiguous(Pointer data, int64_t seqlen, int64_t heads, int64_t head_dim) {
  return TensorRef<Pointer>{data, seqlen * heads * head_dim, heads * head_dim, head_dim, 1};
}

// Switches for the paper's ablation (Table 2). Every technique is on by
// default; turning one off gives a slower kernel that computes the same result.
// The variants are built for head dim 128 only (bf16, and e4m3 with a bf16 O
// for pingpong and the overlap; bf16 with the other two on for
// warp_specialization); validate() and forward() return kUnsupported for
// other combinations, whatever the sizes. persistent works everywhere.
struct KernelOptions {
  bool pingpong = true;            // §3.1: named barriers order the consumer warpgroups' GEMMs (they take turns)
  bool intra_warpgroup_overlap = true;  // §3.2, Algorithm 2: softmax of block j overlaps QK^T of block j+1
  bool persistent = true;          // one CTA per SM, tiles handed out by the scheduler
  bool warp_specialization = true;  // Algorithm 1: a producer warpgroup loads while the consumers compute
};

// FP8 inputs carry float32 descale factors: a stored value x stands for
// x * scale. One scale per tensor, per (batch, head), or per block of rows,
// each block whole tiles of the kernel (fp8_block_sizes), so that the kernel
// applies them at no extra pass. Scales must be positive and finite (they
// live in device memory, so validate() cannot check them); quantize_fp8
// writes such scales.
enum class ScaleGranularity { kPerTensor, kPerHead, kPerBlock };

// Rows per scale block with kPerBlock: `q` query rows, `kv` key/value rows
// ({0, 0} for a head dim FP8 does not support).
struct Fp8BlockSizes {
  int64_t q = 0;
  int64_t kv = 0;
};
Fp8BlockSizes fp8_block_sizes(int64_t head_dim);

// Number of float32 scales of one tensor: 1 (per tensor), batch * heads (per
// head, laid out [batch, heads]) or batch * heads * ceil(seqlen / block) (per
// block, laid out [batch, heads, blocks]). Packed sequences (Varlen) count
// them with batch the number of sequences and seqlen the longest one's
// (ForwardArgs::seqlen_q or seqlen_k).
int64_t fp8_scale_count(ScaleGranularity granularity, int64_t batch, int64_t heads, int64_t seqlen,
                        int64_t block);

struct Fp8Scales {
  ScaleGranularity granularity = ScaleGranularity::kPerTensor;
  const float* q = nullptr;  // heads_q, seqlen_q, block fp8_block_sizes().q
  const float* k = nullptr;  // heads_kv, seqlen_k, block fp8_block_sizes().kv
  const float* v = nullptr;  // heads_kv, seqlen_k, block fp8_block_sizes().kv
  DType out_dtype = DType::kBF16;  // O's dtype: kBF16 or kFP16
  // kPerHead only: Q's scales are [batch, heads_kv], one for the query heads
  // of each GQA group (FlashAttention-3's layout), instead of [batch, heads_q].
  // Decoding from a KV cache packs a group's heads into one tile (see
  // KvCache) with per-tensor scales or these, not with one scale per query head.
  bool q_per_kv_head = false;
};

// Variable-length batches (FlashAttention's varlen functions): the batch's
// sequences packed along the seq mode of Q, K, V and O, sequence b at rows
// cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 (keys and values at
// cu_seqlens_k's), the tensors' batch_stride unused. seqlen_q and seqlen_k
// are then the longest sequence's lengths (FlashAttention's max_seqlen_q/k,
// upper bounds), total_q and total_k the packed rows, and the LSE is
// [heads_q, total_q]. The device arrays are trusted, not read on the host:
// cu_seqlens_q/k int32 [batch + 1], from 0, non-decreasing, up to total_q/k,
// no sequence longer than seqlen_q/k; seqused_q/k (optional, int32 [batch])
// the rows of sequence b that take part, its first seqused[b] (at most its
// packed length): query rows past it are not written. The forward reads a
// sequence's last key block whole (the scores past seqused_k masked): K and
// V rows there must be finite.
// FP8 (kE4M3, with fp8.out_dtype kBF16): the scales are per sequence, index b
// of Fp8Scales' [batch, heads] and [batch, heads, blocks] layouts, blocks
// counted from the sequence's own first row (fp8_scale_count with seqlen the
// longest's): block j of sequence b holds its rows j * block .. (j + 1) *
// block - 1 from cu_seqlens[b]. Blocks wholly past a sequence's rows (past
// its seqused, where given) are not read.
struct Varlen {
  const int32_t* cu_seqlens_q = nullptr;  // nullptr: fixed-length batches
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_q = nullptr;
  const int32_t* seqused_k = nullptr;
  int64_t total_q = 0;
  int64_t total_k = 0;
};

// Decoding against a KV cache (FlashAttention's flash_attn_with_kvcache,
// contiguous cache): ForwardArgs::k and v are the caches, [batch_cache,
// seqlen_k, heads_kv, head_dim] and [.., head_dim_v], seqlen_k the rows of a
// cache entry (its capacity); q and o are [batch, seqlen_q, ...], seqlen_q
// from 1 (decoding) up. Batch entry b attends to cache entry batch_idx[b]
// (b without it), rows leftpad[b] .. seqlens[b] - 1 (from 0 without it):
// seqlens[b] - leftpad[b] keys, to which the causal mask and the window are
// aligned as in ForwardArgs (query i sees up to key seqlens[b] - seqlen_q + i
// of the cache row). Softcap, sinks, GQA and the LSE as in ForwardArgs.
// Decoding (seqlen_q 1) with several query heads a KV head and neither a
// left window nor sinks runs each KV head's query heads as the rows of one
// tile (packed GQA, src/fwd/pack_gqa.h): each K and V block is read once per
// KV head.
// The arrays are device memory, trusted, not read on the host: int32
// [batch], 0 <= leftpad[b] (a leftpad past seqlens[b] leaves no key),
// seqlens[b] <= seqlen_k, 0 <= batch_idx[b] < batch_cache. The forward reads
// the last key block of an entry whole (the keys past seqlens[b] masked):
// cache rows there, up to the block's end or seqlen_k, must be finite (a
// zero-initialised cache is). bf16 and fp16, every KernelOption on.
// An FP8 cache (dtype kE4M3: q, k and v e4m3, O in bf16): descales per tensor
// or per (batch, head) as in Fp8Scales, indexed by the query's batch entry
// (kPerBlock has no KV cache form: refused); decoding packs GQA with
// per-tensor scales or Q's per KV head (Fp8Scales::q_per_kv_head). Appended
// rows are e4m3 too, copied as they are (no rotary with FP8: refused).
//
// A paged cache (FlashAttention's page_table): k and v are a pool of pages,
// [batch_cache pages, page_size, heads_kv, head_dim] (v: head_dim_v), and
// key j of batch entry b is row j % page_size of page page_table[b *
// page_table_stride + j / page_size]. page_table is int32 [batch,
// max_pages_per_seq] in device memory, its columns contiguous; seqlen_k is an
// entry's capacity, max_pages_per_seq * page_size; page_size is a multiple
// of 16. The table is trusted, not read on the host: an entry's pages must
// hold its seqlens[b] keys, and only the columns that do are read. A page
// out of [0, batch_cache) reads as zeros (the loads are bounded by the
// pool), never memory outside it. Rows past seqlens[b] are read (masked)
// up to the end of the last key's 16-row group only: they must be finite.
// No batch_idx and no leftpad with a page table (as FlashAttention): a table
// row is its entry's.
//
// Split-KV: when batch x heads_q x query blocks cannot fill the GPU, each
// tile's key blocks are split into num_splits contiguous runs over CTAs,
// whose float32 partial O and LSE (in the call's workspace, below) a second
// kernel combines into O and the LSE. num_splits: 1 no split, 0 chosen
// (enough CTAs to fill the SMs, each split at least 4 key blocks; see
// src/fwd/kv_split.h), up to 128 (splits beyond the key blocks get no key
// and weigh nothing).
//
// The call's scratch (split-KV's partials, an append's lengths and Q's
// rotated copy) is one block: kv_cache.workspace, of plan_kv_cache's bytes
// or more, 16-byte aligned, used by no other call running at the same time;
// or, with workspace nullptr, memory allocated and freed on the stream by
// each call. A caller whose allocator must own every allocation (CUDA graph
// capture under a framework's caching allocator; a fixed memory budget)
// gives one; a workspace smaller than the call needs is refused before
// anything is launched.
// Appending to the cache (FlashAttention's k, v, rotary_cos, rotary_sin):
// new keys and values k, v [batch, seqlen_new, heads_kv, head_dim] (v:
// head_dim_v), in the caches' dtype, are written into the caches, key j of
// batch entry b at key seqlens[b] + j of its entry (its cache row, or page
// row through page_table), before the attention, which then sees
// seqlens[b] + seqlen_new keys (from leftpad[b]). The caches' other rows are
// not touched and seqlens is not changed; ForwardArgs::k and v are written
// there, so they must point to writable memory, not overlapping append.k
// or append.v. Trusted device data: seqlens[b] + seqlen_new <= seqlen_k.
//
// Rotary embedding, with rotary_cos and rotary_sin [rotary_seqlen,
// rotary_dim / 2] in q's dtype, contiguous: the first rotary_dim dims of
// each new key are rotated by the angles of position seqlens[b] + j, and
// those of each query row i of q by position seqlens[b] + i with a causal
// mask or a window, else by position seqlens[b] (FlashAttention's rule);
// the dims past rotary_dim pass through. Interleaved (GPT-J) rotates the
// pairs (2i, 2i + 1), else (GPT-NeoX) the pairs (i, i + rotary_dim / 2).
// q is read, not changed: its rotated copy lives in stream-ordered scratch
// memory for the call. rotary_dim is a multiple of 16 up to head_dim and
// rotary_seqlen at least seqlen_k, so that every position an entry can hold
// is in the tables (as FlashAttention).
struct KvAppend {
  ConstTensor k;              // data nullptr: no append (the other fields unset)
  ConstTensor v;
  int64_t seqlen_new = 0;     // from 1
  const void* rotary_cos = nullptr;  // nullptr: no rotary embedding
  const void* rotary_sin = nullptr;
  int64_t rotary_seqlen = 0;
  int64_t rotary_dim = 0;
  bool rotary_interleaved = false;
};

struct KvCache {
  const int32_t* seqlens = nullptr;    // cache_seqlens; nullptr: no KV cache (the other fields unused)
  const int32_t* batch_idx = nullptr;  // cache_batch_idx, optional
  const int32_t* leftpad = nullptr;    // cache_leftpad, optional
  int64_t batch_cache = 0;             // the caches' batch entries (paged: pages)
  int64_t num_splits = 1;
  const int32_t* page_table = nullptr;  // paged cache, optional
  int64_t page_table_stride = 0;        // elements between page_table's rows
  int64_t page_size = 0;                // a page's rows (with page_table only)
  KvAppend append;                      // new keys and values, or none
  // The call's scratch, or nullptr (see above). Last, so that the C ABI's offsets stay.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

struct ForwardArgs {
  // Q, K, V's dtype; O's too, except for kE4M3, whose O is in fp8.out_dtype.
  DType dtype = DType::kBF16;
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;  // heads_q % heads_kv == 0: MHA (equal), GQA, MQA (1)
  int64_t head_dim = 0;  // Q's and K's: 64, 96, 128, 192 or 256 (kE4M3: 64, 128 or 256)

  ConstTensor q;   // [batch, seqlen_q, heads_q, head_dim]
  ConstTensor k;   // [batch, seqlen_k, heads_kv, head_dim]
  ConstTensor v;   // [batch, seqlen_k, heads_kv, head_dim_v]
  MutableTensor o; // [batch, seqlen_q, heads_q, head_dim_v]

  // Optional float32 [batch, heads_q, seqlen_q], contiguous: the natural-log
  // sum of exp of the scaled scores of each query row. A row that sees no key
  // (causal with seqlen_q > seqlen_k) gets +inf and an output of zeros, as in
  // FlashAttention.
  float* lse = nullptr;

  // Multiplies QK^T before the softmax. 0 selects 1/sqrt(head_dim).
  float softmax_scale = 0.0f;

  // Causal mask aligned to the bottom-right corner: query i sees key j iff
  // j <= i + seqlen_k - seqlen_q (FlashAttention-2/3's convention).
  bool causal = false;

  // Sliding window (FlashAttention's window_size), aligned as the causal
  // mask: query i sees key j only if i + g - window_left <= j <= i + g +
  // window_right, g = seqlen_k - seqlen_q; -1 leaves that side unbounded.
  // causal is window_right 0 (a window_right given with it must be -1 or 0).
  // Key blocks wholly outside a row block's window are skipped.
  int64_t window_left = -1;
  int64_t window_right = -1;

  // Softcapping (Gemma 2): each scaled score s becomes softcap * tanh(s /
  // softcap) before the mask and the softmax. 0 is off; otherwise finite and
  // positive. The LSE is that of the capped scores. bf16 and fp16 (kE4M3:
  // kUnsupported).
  float softcap = 0.0f;

  // Optional float32 [heads_q]: attention sinks (as in gpt-oss), a logit per
  // query head that joins each row's softmax denominator without a value:
  // P_ij = exp(s_ij - L_i) with L_i = log(exp(sink) + sum_j exp(s_ij)), s the
  // scaled scores; O and the LSE are those of that softmax. A row that sees
  // no key gets O = 0 and L = sink. Values must be finite (device memory:
  // not checked).
  const float* sinks = nullptr;

  Fp8Scales fp8;  // with dtype kE4M3 only

  Varlen varlen;  // packed sequences, or none

  KernelOptions options;

  // Optional: the device int a launch with more tiles than SMs claims its
  // tiles from, for a caller whose allocator must own every allocation (CUDA
  // graph capture under a framework's caching allocator). It must be zero
  // when the call is enqueued, and the launch leaves it zero; give one to
  // each stream or graph that may run concurrently. 4-byte aligned. nullptr:
  // flash3's own (see forward()).
  int* tile_counter = nullptr;

  // V's and O's head dim: 0 (the same as head_dim), head_dim, or 128 with
  // head_dim 192 (DeepSeek-V3's shape; bf16 and fp16, with every option
  // above), or 512 with head_dim 64 for MLA (qv, below). After the fields
  // above, so that the C ABI's offsets stay.
  int64_t head_dim_v = 0;

  // A KV cache (decoding), or none (kv_cache.seqlens nullptr). After the
  // fields above, for the same reason.
  KvCache kv_cache;

  // MLA (multi-head latent attention, DeepSeek-V2/V3) in its absorbed form,
  // as FlashAttention-3's qv: [batch, seqlen_q, heads_q, head_dim_v], the
  // queries' latent part, whose scores against V join Q's against K: S =
  // softmax_scale * (Q K^T + Qv V^T), O = softmax(S) V. With a KV cache
  // only, kBF16, head_dim 64 (the rotary part: q and k_cache) and
  // head_dim_v 512 (the latent part: qv, v_cache, O); softmax_scale 0 then
  // selects 1/sqrt(head_dim + head_dim_v). The cache's forms (contiguous,
  // paged, batch_idx, leftpad), appends with rotary (of q and the new k),
  // split-KV, GQA, the causal mask, a window and the LSE are as without qv;
  // softcap and sinks are not supported with it. Each KV head's query rows,
  // (position, head) pairs, are packed into the kernel's tiles for any
  // seqlen_q, so that speculative decoding's few tokens share each read of
  // the cache as one token's heads do. A cache of one 576-column tensor (latent
  // then rotary, as FlashMLA's) is two views of it: v its first 512
  // columns, k its last 64. nullptr: no MLA. Last, for the same reason.
  ConstTensor qv;
};

// Checks the arguments without touching the device: sizes, head dim, pointers
// and their alignment, strides. Returns kInvalidArgument naming the argument,
// or kUnsupported (message starting "options") for KernelOptions no kernel is
// built for.
Status validate(const ForwardArgs& args);

// O = softmax(scale * Q K^T [+ causal mask] [, sinks]) V, and the LSE if asked for.
// Validates first (including that the current device is sm_90), then enqueues
// the kernel on `stream`. Asynchronous: errors of the kernel itself surface at
// the next synchronization, as with any CUDA launch. A launch with more
// tiles than SMs claims them from args.tile_counter or, without one, from a
// 4-byte counter that flash3 allocates in stream order the first time a
// stream (cudaStreamPerThread: a host thread) is used, keeps for the
// process's lifetime, and that every launch leaves zero (under graph
// capture, the graph's own allocation). With batch or seqlen_q 0 there is
// nothing to write: it validates and returns, without touching the device.
Status forward(const ForwardArgs& args, cudaStream_t stream);

// Partial attentions combined (FlashAttention-3's flash_attn_combine; the
// combine step of split-KV): num_splits attentions of the same queries over
// disjoint parts of the keys, each with its float32 O (normalised by its own
// softmax sum) and its natural-log LSE (-inf where a part had no key for the
// row), make O = sum_s exp(lse_s - L) O_s with L = log(exp(sink) + sum_s
// exp(lse_s)) (no sink: its term 0). A row with no key and no sink gets O = 0
// and L = +inf. forward() runs it for split-KV.
struct CombineArgs {
  int64_t num_splits = 0;  // 1 .. 128
  int64_t batch = 0;
  int64_t seqlen = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;  // a multiple of 4: the partials are read as 16-byte vectors
  // Split 0's partial O, float32 [batch, seqlen, heads, head_dim] (16-byte
  // aligned, strides multiples of 4), and the stride between splits.
  ConstTensor o_partial;
  int64_t o_partial_split_stride = 0;
  // The partial LSEs, float32 [num_splits, batch, seqlen, heads], strides in elements.
  const float* lse_partial = nullptr;
  int64_t lse_split_stride = 0;
  int64_t lse_batch_stride = 0;
  int64_t lse_seq_stride = 0;
  int64_t lse_head_stride = 0;
  DType out_dtype = DType::kBF16;  // kBF16, kFP16 or kFP32
  MutableTensor out;               // [batch, seqlen, heads, head_dim]
  float* lse = nullptr;            // [batch, heads, seqlen], or nullptr
  const float* sinks = nullptr;    // [heads], or nullptr
};

// Checks the arguments without touching the device: sizes, pointers, their
// alignment and strides (the partials' contents are device memory, not read).
Status validate(const CombineArgs& args);

// Validates, then enqueues the combine on `stream` (asynchronous). With
// batch or seqlen 0 there is nothing to write: it validates and returns,
// without touching the device.
Status combine(const CombineArgs& args, cudaStream_t stream);

// What a KV cache call runs with on the current device (FlashAttention's
// get_scheduler_metadata): its number of splits (kv_cache.num_splits, or
// for 0 forward()'s choice, which needs the device's SM count) and the
// bytes of kv_cache.workspace it needs (0: none). Reads the sizes, head
// dims, the mask, whether sinks and kv_cache.seqlens (required) are given,
// kv_cache.num_splits and kv_cache.append.seqlen_new (an append when
// positive, with room for rotary tables), never a pointer's target, so it
// can be asked before the other tensors exist (MLA's head dims, 64 and 512,
// plan MLA's kernel, qv given or not). The workspace depends on the splits, not on seqlen_k: a
// call given the planned num_splits explicitly fits the planned workspace
// at any cache length. kInvalidArgument naming the argument for sizes that
// validate() would refuse.
struct KvCachePlan {
  int64_t num_splits = 1;
  size_t workspace_bytes = 0;
};
Status plan_kv_cache(const ForwardArgs& args, KvCachePlan* plan);

// The gradients of forward(): dQ, dK, dV from dO, for training.
struct BackwardArgs {
  DType dtype = DType::kBF16;
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;  // Q's and K's: 64, 96, 128, 192 or 256

  // The forward's inputs and output, and the gradient of the output, all in
  // `dtype` and laid out as in ForwardArgs.
  ConstTensor q;     // [batch, seqlen_q, heads_q, head_dim]
  ConstTensor k;     // [batch, seqlen_k, heads_kv, head_dim]
  ConstTensor v;     // [batch, seqlen_k, heads_kv, head_dim_v]
  ConstTensor o;     // [batch, seqlen_q, heads_q, head_dim_v]
  ConstTensor dout;  // [batch, seqlen_q, heads_q, head_dim_v]: dLoss/dO
  // The forward's LSE: float32 [batch, heads_q, seqlen_q], contiguous
  // (packed sequences: [heads_q, total_q]).
  const float* lse = nullptr;

  // Outputs in `dtype`. With GQA/MQA, dK and dV are summed over the query
  // heads that share a K/V head.
  MutableTensor dq;  // [batch, seqlen_q, heads_q, head_dim]
  MutableTensor dk;  // [batch, seqlen_k, heads_kv, head_dim]
  MutableTensor dv;  // [batch, seqlen_k, heads_kv, head_dim_v]

  float softmax_scale = 0.0f;  // as in ForwardArgs: 0 selects 1/sqrt(head_dim)
  bool causal = false;
  int64_t window_left = -1;   // as in ForwardArgs
  int64_t window_right = -1;
  float softcap = 0.0f;       // as in ForwardArgs

  // The forward's sinks (ForwardArgs::sinks), or nullptr. With them, dsinks
  // (float32 [heads_q], or nullptr for no sink gradient) is written, not
  // accumulated: dLoss/dsink of each head, summed over batch and rows in a
  // fixed order (bitwise reproducible in either mode); zeros when there is
  // no query row.
  const float* sinks = nullptr;
  float* dsinks = nullptr;

  // dQ is summed over key blocks in global memory. By default the order of
  // that sum varies between runs (last bits of dQ differ); deterministic mode
  // fixes the order, so runs are bitwise identical, at some speed.
  bool deterministic = false;

  // Packed sequences, as in ForwardArgs (the tensors one batch entry of
  // total_q or total_k rows), or none. Rows of a sequence past its seqused
  // take no part: their dQ, dK and dV rows are written as zeros. Rows past
  // cu_seqlens[batch] belong to no sequence and are not written.
  Varlen varlen;

  // Scratch memory of backward_workspace_size(args) bytes, 256-byte aligned,
  // owned by the caller (e.g. allocated once outside a captured CUDA graph).
  // nullptr: backward() allocates and frees it on `stream` (stream-ordered
  // cudaMallocAsync, which graph capture also supports).
  void* workspace = nullptr;

  int64_t head_dim_v = 0;  // as in ForwardArgs (last for the same reason)
};

// Bytes of workspace backward() needs for these sizes, mask and mode, in
// *bytes: 0 when there is no query (batch or seqlen_q 0, or packed sequences'
// total_q 0). The same on every device. Reads only the sizes, head dims,
// causal, deterministic and, for packed sequences, batch, varlen.total_q and
// varlen.total_k (never the device arrays); when the
// sizes or head dims are invalid, returns kInvalidArgument naming the argument
// (as validate() would) and sets *bytes to 0.
Status backward_workspace_size(const BackwardArgs& args, size_t* bytes);

// As above, returning the bytes: 0 also for invalid sizes or head dims, which
// backward() then reports.
size_t backward_workspace_size(const BackwardArgs& args);

// As validate(ForwardArgs), plus dO, LSE, dQ/dK/dV and the workspace.
Status validate(const BackwardArgs& args);

// Validates, then enqueues the backward kernels on `stream` (asynchronous).
// With batch 0, or seqlen_q and seqlen_k both 0, there is no gradient to
// write but dsinks' zeros: it validates, clears dsinks if given, and returns,
// otherwise without touching the device.
Status backward(const BackwardArgs& args, cudaStream_t stream);

// FP8 quantization for the forward pass (paper §3.3): Q, K, V in bf16/fp16
// (any strides) to e4m3 and their descale factors: one fused pass per tensor
// with per-block scales; an amax pass, then the quantizing pass, per tensor
// with per-tensor and per-head scales. Each scale is amax / 448 over its group (1 for an all-zero group).
// With `hadamard`, Q and K are first multiplied by the same random orthogonal
// matrix M = diag(random signs) * H / sqrt(head_dim) (H a Hadamard matrix,
// applied as a fast Walsh-Hadamard transform), which spreads outliers over the
// head dim before rounding; (QM)(KM)^T = QK^T, so attention is unchanged up to
// rounding. V is never transformed. The signs come from `seed` alone.
struct QuantizeArgs {
  DType dtype = DType::kBF16;  // of q, k, v: kBF16 or kFP16
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;  // 64, 128 or 256

  ConstTensor q, k, v;             // inputs, laid out as in ForwardArgs
  MutableTensor q_out, k_out, v_out;  // e4m3 outputs, same shapes
  ScaleGranularity granularity = ScaleGranularity::kPerBlock;
  // Outputs of fp8_scale_count() floats each, in the layout Fp8Scales reads.
  float* q_scale = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;

  bool hadamard = false;  // incoherent processing of Q and K
  uint64_t seed = 0;
};

Status validate(const QuantizeArgs& args);

// Validates, then enqueues the quantization on `stream` (asynchronous). With
// batch 0, or seqlen_q and seqlen_k both 0, there is nothing to write: it
// validates and returns, without touching the device.
Status quantize_fp8(const QuantizeArgs& args, cudaStream_t stream);

}  // namespace flash3
