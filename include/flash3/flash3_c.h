/* flash3's C ABI: the entry points of flash3.h for callers through a
 * foreign-function interface (flash3's Python package calls them through
 * ctypes), in a shared library, libflash3_c.
 *
 * The arguments are flash3.h's structs (ForwardArgs, BackwardArgs,
 * QuantizeArgs, CombineArgs), passed by pointer: they are standard-layout
 * C++ structs of integers, floats, pointers and int-sized enums, which a
 * caller mirrors field by field. flash3_abi_offset() gives each field's offset (and each
 * struct's size), so that a mirror can check itself against the library it
 * loaded instead of trusting a copy.
 *
 * Every function that can fail returns flash3::Status::Code as an int (0 ok,
 * 1 invalid argument, 2 unsupported, 3 CUDA error) and, when not ok, copies
 * the message (truncated, NUL-terminated) into `message` if it is not NULL.
 * Nothing throws across this boundary: a failure on the host (out of memory)
 * is code 3 with its message. A NULL `args` is code 1, "args: null pointer". */
#ifndef FLASH3_FLASH3_C_H_
#define FLASH3_FLASH3_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version, "MAJOR.MINOR.PATCH". */
const char* flash3_version(void);

/* Byte offset of `field` in the struct `struct_name` ("ForwardArgs",
 * "BackwardArgs", "QuantizeArgs", "CombineArgs", "TensorRef", "Fp8Scales",
 * "KernelOptions", "Varlen", "KvCache", "KvAppend");
 * with field "" the struct's size. -1 for a name it does not know. Nested
 * fields are named with dots ("q.seq_stride", "fp8.out_dtype"); a nested
 * struct's own name ("q", "fp8") gives its offset. */
int64_t flash3_abi_offset(const char* struct_name, const char* field);

/* flash3::validate / forward / backward / quantize_fp8 / combine. `args`
 * points to a ForwardArgs, BackwardArgs, QuantizeArgs or CombineArgs;
 * `stream` is a cudaStream_t. The validate_* functions never touch the
 * device. */
int flash3_validate_forward(const void* args, char* message, size_t message_size);
int flash3_forward(const void* args, void* stream, char* message, size_t message_size);
int flash3_validate_backward(const void* args, char* message, size_t message_size);
int flash3_backward(const void* args, void* stream, char* message, size_t message_size);
int flash3_validate_quantize(const void* args, char* message, size_t message_size);
int flash3_quantize_fp8(const void* args, void* stream, char* message, size_t message_size);
int flash3_validate_combine(const void* args, char* message, size_t message_size);
int flash3_combine(const void* args, void* stream, char* message, size_t message_size);

/* flash3::backward_workspace_size(args, bytes). */
int flash3_backward_workspace_size(const void* args, size_t* bytes, char* message, size_t message_size);

/* flash3::plan_kv_cache(args, plan) into *num_splits and *workspace_bytes
 * (1 and 0 when it fails). */
int flash3_plan_kv_cache(const void* args, int64_t* num_splits, size_t* workspace_bytes, char* message,
                         size_t message_size);

/* flash3::fp8_block_sizes (into *q, *kv) and flash3::fp8_scale_count;
 * granularity is ScaleGranularity as an int (0 per tensor, 1 per head, 2 per
 * block); the count is 0 for another value. */
void flash3_fp8_block_sizes(int64_t head_dim, int64_t* q, int64_t* kv);
int64_t flash3_fp8_scale_count(int granularity, int64_t batch, int64_t heads, int64_t seqlen, int64_t block);

#ifdef __cplusplus
}
#endif

#endif /* FLASH3_FLASH3_C_H_ */
