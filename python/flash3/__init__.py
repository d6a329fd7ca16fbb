"""flash3: FlashAttention-3 for NVIDIA Hopper GPUs (sm_90a), from PyTorch.

flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func
(packed sequences of different lengths), flash_attn_with_kvcache (decoding
against a KV cache, with get_scheduler_metadata's plan for CUDA graphs) and
flash_attn_combine (partial attentions combined) take FlashAttention-3's
arguments (hopper/flash_attn_interface.py), so that replacing
`from flash_attn_interface import flash_attn_func` with
`from flash3 import flash_attn_func` is the whole migration; quantize_fp8
prepares FP8 inputs for them. The operators are registered as flash3::fwd,
flash3::bwd, flash3::varlen_fwd, flash3::varlen_bwd, flash3::kvcache_fwd,
flash3::combine and flash3::quantize_fp8
(torch.library), so torch.compile traces them and CUDA graphs capture them.

The kernels are in libflash3_c.so, beside this file (or at FLASH3_LIBRARY). The
package imports, checks arguments and traces without it; a call that needs it
raises flash3.LibraryError saying why it cannot run.
"""
from ._abi import LibraryError
from .interface import (flash_attn_combine, flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
                        flash_attn_with_kvcache, get_scheduler_metadata, quantize_fp8)

__version__ = "0.3.0"
__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
           "get_scheduler_metadata", "flash_attn_combine", "quantize_fp8", "LibraryError"]
