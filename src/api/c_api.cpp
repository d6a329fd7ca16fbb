// flash3's C ABI (flash3/flash3_c.h): flash3.h's entry points behind extern
// "C" functions of plain types, built into libflash3_c for callers through a
// foreign-function interface. A C caller cannot catch an exception, so each
// entry point catches them all and reports them as a status code.
#include "flash3/flash3_c.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <span>
#include <string_view>
#include <type_traits>

#include "flash3/flash3.h"

namespace {

using flash3::BackwardArgs;
using flash3::ConstTensor;
using flash3::Fp8Scales;
using flash3::ForwardArgs;
using flash3::KernelOptions;
using flash3::CombineArgs;
using flash3::KvAppend;
using flash3::KvCache;
using flash3::MutableTensor;
using flash3::QuantizeArgs;
using flash3::Varlen;
using flash3::Status;

// Copies `text` into the caller's buffer, truncated to fit and NUL-terminated;
// a NULL or empty buffer takes nothing. Allocates nothing, so it cannot throw.
void copy_message(std::string_view text, char* message, size_t message_size) {
  if (message == nullptr || message_size == 0) return;
  size_t const n = std::min(text.size(), message_size - 1);
  std::memcpy(message, text.data(), n);
  message[n] = '\0';
}

// Runs `call` (which returns a Status) and reports its code and message. An
// exception (std::bad_alloc while a message is built, a mutex's
// std::system_error) becomes kCudaError, the code of a failed resource.
template <class Call>
int guarded(Call const& call, char* message, size_t message_size) {
  try {
    Status const s = call();
    if (!s.ok()) copy_message(s.message(), message, message_size);
    return static_cast<int>(s.code());
  } catch (std::bad_alloc const&) {
    copy_message("host: out of memory", message, message_size);
  } catch (std::exception const& e) {
    copy_message(e.what(), message, message_size);
  } catch (...) {
    copy_message("host: unknown exception", message, message_size);
  }
  return static_cast<int>(Status::Code::kCudaError);
}

// Calls `call` with a copy of the caller's `Args`: copying bytes (not
// dereferencing a cast pointer) is what C++ allows for memory that a
// foreign caller filled, and needs no alignment of it.
template <class Args, class Call>
int with_args(void const* args, Call const& call, char* message, size_t message_size) {
  static_assert(std::is_trivially_copyable_v<Args> && std::is_standard_layout_v<Args>);
  return guarded(
      [&] {
        if (args == nullptr) return Status(Status::Code::kInvalidArgument, "args: null pointer");
        Args a;
        std::memcpy(&a, args, sizeof a);
        return call(a);
      },
      message, message_size);
}

// flash3_abi_offset's tables: each field's name and offset, and the fields of
// its type where it is a struct (named "field.subfield").
struct Field {
  std::string_view name;
  int64_t offset;
  std::span<Field const> nested;
};

struct Struct {
  std::string_view name;
  int64_t size;
  std::span<Field const> fields;
};

#define FLASH3_FIELD(Type, member) Field{#member, int64_t(offsetof(Type, member)), {}}
#define FLASH3_NESTED(Type, member, fields) Field{#member, int64_t(offsetof(Type, member)), fields}

// ConstTensor's table serves MutableTensor too: TensorRef's layout does not
// depend on its pointer type.
static_assert(sizeof(ConstTensor) == sizeof(MutableTensor) &&
              offsetof(ConstTensor, dim_stride) == offsetof(MutableTensor, dim_stride));
constexpr Field kTensorRef[] = {FLASH3_FIELD(ConstTensor, data), FLASH3_FIELD(ConstTensor, batch_stride),
                                FLASH3_FIELD(ConstTensor, seq_stride), FLASH3_FIELD(ConstTensor, head_stride),
                                FLASH3_FIELD(ConstTensor, dim_stride)};

constexpr Field kFp8Scales[] = {FLASH3_FIELD(Fp8Scales, granularity), FLASH3_FIELD(Fp8Scales, q),
                                FLASH3_FIELD(Fp8Scales, k), FLASH3_FIELD(Fp8Scales, v),
                                FLASH3_FIELD(Fp8Scales, out_dtype), FLASH3_FIELD(Fp8Scales, q_per_kv_head)};

constexpr Field kVarlen[] = {FLASH3_FIELD(Varlen, cu_seqlens_q), FLASH3_FIELD(Varlen, cu_seqlens_k),
                             FLASH3_FIELD(Varlen, seqused_q),    FLASH3_FIELD(Varlen, seqused_k),
                             FLASH3_FIELD(Varlen, total_q),      FLASH3_FIELD(Varlen, total_k)};

constexpr Field kKvAppend[] = {FLASH3_NESTED(KvAppend, k, kTensorRef),    FLASH3_NESTED(KvAppend, v, kTensorRef),
                               FLASH3_FIELD(KvAppend, seqlen_new),          FLASH3_FIELD(KvAppend, rotary_cos),
                               FLASH3_FIELD(KvAppend, rotary_sin),          FLASH3_FIELD(KvAppend, rotary_seqlen),
                               FLASH3_FIELD(KvAppend, rotary_dim),          FLASH3_FIELD(KvAppend, rotary_interleaved)};

constexpr Field kKvCache[] = {FLASH3_FIELD(KvCache, seqlens), FLASH3_FIELD(KvCache, batch_idx),
                              FLASH3_FIELD(KvCache, leftpad), FLASH3_FIELD(KvCache, batch_cache),
                              FLASH3_FIELD(KvCache, num_splits), FLASH3_FIELD(KvCache, page_table),
                              FLASH3_FIELD(KvCache, page_table_stride), FLASH3_FIELD(KvCache, page_size),
                              FLASH3_NESTED(KvCache, append, kKvAppend), FLASH3_FIELD(KvCache, workspace),
                              FLASH3_FIELD(KvCache, workspace_bytes)};

constexpr Field kKernelOptions[] = {FLASH3_FIELD(KernelOptions, pingpong),
                                    FLASH3_FIELD(KernelOptions, intra_warpgroup_overlap),
                                    FLASH3_FIELD(KernelOptions, persistent),
                                    FLASH3_FIELD(KernelOptions, warp_specialization)};

constexpr Field kForwardArgs[] = {
    FLASH3_FIELD(ForwardArgs, dtype),         FLASH3_FIELD(ForwardArgs, batch),
    FLASH3_FIELD(ForwardArgs, seqlen_q),      FLASH3_FIELD(ForwardArgs, seqlen_k),
    FLASH3_FIELD(ForwardArgs, heads_q),       FLASH3_FIELD(ForwardArgs, heads_kv),
    FLASH3_FIELD(ForwardArgs, head_dim),      FLASH3_NESTED(ForwardArgs, q, kTensorRef),
    FLASH3_NESTED(ForwardArgs, k, kTensorRef), FLASH3_NESTED(ForwardArgs, v, kTensorRef),
    FLASH3_NESTED(ForwardArgs, o, kTensorRef), FLASH3_FIELD(ForwardArgs, lse),
    FLASH3_FIELD(ForwardArgs, softmax_scale), FLASH3_FIELD(ForwardArgs, causal),
    FLASH3_FIELD(ForwardArgs, window_left),   FLASH3_FIELD(ForwardArgs, window_right),
    FLASH3_FIELD(ForwardArgs, softcap),       FLASH3_FIELD(ForwardArgs, sinks),
           FLASH3_NESTED(ForwardArgs, fp8, kFp8Scales), FLASH3_NESTED(ForwardArgs, varlen, kVarlen),
    FLASH3_NESTED(ForwardArgs, options, kKernelOptions),
    FLASH3_FIELD(ForwardArgs, tile_counter),  FLASH3_FIELD(ForwardArgs, head_dim_v),
    FLASH3_NESTED(ForwardArgs, kv_cache, kKvCache), FLASH3_NESTED(ForwardArgs, qv, kTensorRef)};

constexpr Field kBackwardArgs[] = {
    FLASH3_FIELD(BackwardArgs, dtype),           FLASH3_FIELD(BackwardArgs, batch),
    FLASH3_FIELD(BackwardArgs, seqlen_q),        FLASH3_FIELD(BackwardArgs, seqlen_k),
    FLASH3_FIELD(BackwardArgs, heads_q),         FLASH3_FIELD(BackwardArgs, heads_kv),
    FLASH3_FIELD(BackwardArgs, head_dim),        FLASH3_NESTED(BackwardArgs, q, kTensorRef),
    FLASH3_NESTED(BackwardArgs, k, kTensorRef),  FLASH3_NESTED(BackwardArgs, v, kTensorRef),
    FLASH3_NESTED(BackwardArgs, o, kTensorRef),  FLASH3_NESTED(BackwardArgs, dout, kTensorRef),
    FLASH3_FIELD(BackwardArgs, lse),             FLASH3_NESTED(BackwardArgs, dq, kTensorRef),
    FLASH3_NESTED(BackwardArgs, dk, kTensorRef), FLASH3_NESTED(BackwardArgs, dv, kTensorRef),
    FLASH3_FIELD(BackwardArgs, softmax_scale),   FLASH3_FIELD(BackwardArgs, causal),
    FLASH3_FIELD(BackwardArgs, window_left),     FLASH3_FIELD(BackwardArgs, window_right),
    FLASH3_FIELD(BackwardArgs, softcap),         FLASH3_FIELD(BackwardArgs, sinks),
    FLASH3_FIELD(BackwardArgs, dsinks),
    FLASH3_FIELD(BackwardArgs, deterministic),   FLASH3_NESTED(BackwardArgs, varlen, kVarlen),
    FLASH3_FIELD(BackwardArgs, workspace),       FLASH3_FIELD(BackwardArgs, head_dim_v)};

constexpr Field kQuantizeArgs[] = {
    FLASH3_FIELD(QuantizeArgs, dtype),            FLASH3_FIELD(QuantizeArgs, batch),
    FLASH3_FIELD(QuantizeArgs, seqlen_q),         FLASH3_FIELD(QuantizeArgs, seqlen_k),
    FLASH3_FIELD(QuantizeArgs, heads_q),          FLASH3_FIELD(QuantizeArgs, heads_kv),
    FLASH3_FIELD(QuantizeArgs, head_dim),         FLASH3_NESTED(QuantizeArgs, q, kTensorRef),
    FLASH3_NESTED(QuantizeArgs, k, kTensorRef),   FLASH3_NESTED(QuantizeArgs, v, kTensorRef),
    FLASH3_NESTED(QuantizeArgs, q_out, kTensorRef), FLASH3_NESTED(QuantizeArgs, k_out, kTensorRef),
    FLASH3_NESTED(QuantizeArgs, v_out, kTensorRef), FLASH3_FIELD(QuantizeArgs, granularity),
    FLASH3_FIELD(QuantizeArgs, q_scale),          FLASH3_FIELD(QuantizeArgs, k_scale),
    FLASH3_FIELD(QuantizeArgs, v_scale),          FLASH3_FIELD(QuantizeArgs, hadamard),
    FLASH3_FIELD(QuantizeArgs, seed)};

constexpr Field kCombineArgs[] = {
    FLASH3_FIELD(CombineArgs, num_splits),       FLASH3_FIELD(CombineArgs, batch),
    FLASH3_FIELD(CombineArgs, seqlen),           FLASH3_FIELD(CombineArgs, heads),
    FLASH3_FIELD(CombineArgs, head_dim),         FLASH3_NESTED(CombineArgs, o_partial, kTensorRef),
    FLASH3_FIELD(CombineArgs, o_partial_split_stride), FLASH3_FIELD(CombineArgs, lse_partial),
    FLASH3_FIELD(CombineArgs, lse_split_stride), FLASH3_FIELD(CombineArgs, lse_batch_stride),
    FLASH3_FIELD(CombineArgs, lse_seq_stride),   FLASH3_FIELD(CombineArgs, lse_head_stride),
    FLASH3_FIELD(CombineArgs, out_dtype),        FLASH3_NESTED(CombineArgs, out, kTensorRef),
    FLASH3_FIELD(CombineArgs, lse),              FLASH3_FIELD(CombineArgs, sinks)};

#undef FLASH3_FIELD
#undef FLASH3_NESTED

// Each table's last entry is its struct's last member: a member appended to
// a struct fails here until its table lists it.
template <class T>
constexpr bool ends_at(size_t last_offset, size_t last_size) {
  return sizeof(T) == (last_offset + last_size + alignof(T) - 1) / alignof(T) * alignof(T);
}
static_assert(ends_at<ConstTensor>(offsetof(ConstTensor, dim_stride), sizeof(int64_t)));
static_assert(ends_at<Fp8Scales>(offsetof(Fp8Scales, q_per_kv_head), sizeof(bool)));
static_assert(ends_at<KernelOptions>(offsetof(KernelOptions, warp_specialization), sizeof(bool)));
static_assert(ends_at<Varlen>(offsetof(Varlen, total_k), sizeof(int64_t)));
static_assert(ends_at<KvAppend>(offsetof(KvAppend, rotary_interleaved), sizeof(bool)));
static_assert(ends_at<KvCache>(offsetof(KvCache, workspace_bytes), sizeof(size_t)));
static_assert(ends_at<ForwardArgs>(offsetof(ForwardArgs, qv), sizeof(ConstTensor)));
static_assert(ends_at<BackwardArgs>(offsetof(BackwardArgs, head_dim_v), sizeof(int64_t)));
static_assert(ends_at<QuantizeArgs>(offsetof(QuantizeArgs, seed), sizeof(uint64_t)));
static_assert(ends_at<CombineArgs>(offsetof(CombineArgs, sinks), sizeof(const float*)));

constexpr Struct kStructs[] = {
    {"ForwardArgs", sizeof(ForwardArgs), kForwardArgs},    {"BackwardArgs", sizeof(BackwardArgs), kBackwardArgs},
    {"QuantizeArgs", sizeof(QuantizeArgs), kQuantizeArgs}, {"TensorRef", sizeof(ConstTensor), kTensorRef},
    {"Fp8Scales", sizeof(Fp8Scales), kFp8Scales},           {"KernelOptions", sizeof(KernelOptions), kKernelOptions},
    {"Varlen", sizeof(Varlen), kVarlen},                   {"KvCache", sizeof(KvCache), kKvCache},
    {"KvAppend", sizeof(KvAppend), kKvAppend},             {"CombineArgs", sizeof(CombineArgs), kCombineArgs}};

// The offset of `name` ("field" or "field.subfield...") in `fields`; -1 if
// there is no such field.
int64_t find_offset(std::span<Field const> fields, std::string_view name) {
  size_t const dot = name.find('.');
  std::string_view const head = name.substr(0, dot);
  for (Field const& f : fields) {
    if (f.name != head) continue;
    if (dot == std::string_view::npos) return f.offset;
    int64_t const inner = find_offset(f.nested, name.substr(dot + 1));
    return inner < 0 ? -1 : f.offset + inner;
  }
  return -1;
}

}  // namespace

extern "C" {

const char* flash3_version(void) { return FLASH3_VERSION; }

int64_t flash3_abi_offset(const char* struct_name, const char* field) {
  if (struct_name == nullptr || field == nullptr) return -1;
  for (Struct const& s : kStructs) {
    if (s.name != struct_name) continue;
    return *field == '\0' ? s.size : find_offset(s.fields, field);
  }
  return -1;
}

int flash3_validate_forward(const void* args, char* message, size_t message_size) {
  return with_args<ForwardArgs>(
      args, [](ForwardArgs const& a) { return flash3::validate(a); }, message, message_size);
}

int flash3_forward(const void* args, void* stream, char* message, size_t message_size) {
  return with_args<ForwardArgs>(
      args, [stream](ForwardArgs const& a) { return flash3::forward(a, static_cast<cudaStream_t>(stream)); },
      message, message_size);
}

int flash3_validate_backward(const void* args, char* message, size_t message_size) {
  return with_args<BackwardArgs>(
      args, [](BackwardArgs const& a) { return flash3::validate(a); }, message, message_size);
}

int flash3_backward(const void* args, void* stream, char* message, size_t message_size) {
  return with_args<BackwardArgs>(
      args, [stream](BackwardArgs const& a) { return flash3::backward(a, static_cast<cudaStream_t>(stream)); },
      message, message_size);
}

int flash3_validate_quantize(const void* args, char* message, size_t message_size) {
  return with_args<QuantizeArgs>(
      args, [](QuantizeArgs const& a) { return flash3::validate(a); }, message, message_size);
}

int flash3_quantize_fp8(const void* args, void* stream, char* message, size_t message_size) {
  return with_args<QuantizeArgs>(
      args, [stream](QuantizeArgs const& a) { return flash3::quantize_fp8(a, static_cast<cudaStream_t>(stream)); },
      message, message_size);
}

int flash3_validate_combine(const void* args, char* message, size_t message_size) {
  return with_args<CombineArgs>(
      args, [](CombineArgs const& a) { return flash3::validate(a); }, message, message_size);
}

int flash3_combine(const void* args, void* stream, char* message, size_t message_size) {
  return with_args<CombineArgs>(
      args, [stream](CombineArgs const& a) { return flash3::combine(a, static_cast<cudaStream_t>(stream)); },
      message, message_size);
}

int flash3_backward_workspace_size(const void* args, size_t* bytes, char* message, size_t message_size) {
  // 0 unless it succeeds, as backward_workspace_size() leaves it, null args included.
  if (bytes != nullptr) *bytes = 0;
  return with_args<BackwardArgs>(
      args, [bytes](BackwardArgs const& a) { return flash3::backward_workspace_size(a, bytes); }, message,
      message_size);
}

int flash3_plan_kv_cache(const void* args, int64_t* num_splits, size_t* workspace_bytes, char* message,
                         size_t message_size) {
  // 1 and 0 unless it succeeds, as plan_kv_cache() leaves them, null args included.
  if (num_splits != nullptr) *num_splits = 1;
  if (workspace_bytes != nullptr) *workspace_bytes = 0;
  return with_args<ForwardArgs>(
      args,
      [num_splits, workspace_bytes](ForwardArgs const& a) {
        using flash3::Status;
        if (num_splits == nullptr) return Status(Status::Code::kInvalidArgument, "num_splits: null pointer");
        if (workspace_bytes == nullptr) {
          return Status(Status::Code::kInvalidArgument, "workspace_bytes: null pointer");
        }
        flash3::KvCachePlan plan;
        flash3::Status const s = flash3::plan_kv_cache(a, &plan);
        *num_splits = plan.num_splits;
        *workspace_bytes = plan.workspace_bytes;
        return s;
      },
      message, message_size);
}

void flash3_fp8_block_sizes(int64_t head_dim, int64_t* q, int64_t* kv) {
  flash3::Fp8BlockSizes const b = flash3::fp8_block_sizes(head_dim);
  if (q != nullptr) *q = b.q;
  if (kv != nullptr) *kv = b.kv;
}

int64_t flash3_fp8_scale_count(int granularity, int64_t batch, int64_t heads, int64_t seqlen, int64_t block) {
  // An int outside the enum's values converts to no enumerator, for which fp8_scale_count() gives 0.
  return flash3::fp8_scale_count(static_cast<flash3::ScaleGranularity>(granularity), batch, heads, seqlen, block);
}

}  // extern "C"
