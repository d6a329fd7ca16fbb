#!/usr/bin/env python3
"""Where the FP8 forward's error comes from, emulated on the CPU (numpy, ml_dtypes).

Paper Table 3's inputs, N(0, 1) + N(0, 100) * Bernoulli(0.001) rounded to bf16, at head dim 128
and seqlen 4096, a few heads. The FP8 path as the kernel computes it:
- Q and K optionally times M = diag(random signs) H / sqrt(d);
- e4m3 with one scale per block of 128 query rows and 192 key rows, or per tensor;
- P~ = exp2(S - rowmax + 8) rounded to e4m3, with l the sum of the unrounded P~;
- O = P~ V / l.
It takes the final row max, not the running one. Errors are RMSE of O against float64 attention
on the same bf16 inputs.

It prints one table. Its first rows compare the granularities, with incoherent processing of
Q and K, and of V as well (O then multiplied by M^T). Its last rows keep one operand of the
per-block + Hadamard path exact at a time, so that each rounding's share shows.
"""
import ml_dtypes
import numpy as np

SEQ, D, HEADS, BLOCK_M, BLOCK_N = 4096, 128, 3, 128, 192
rng = np.random.default_rng(0)


def e4m3(x):
    return x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)


def draw():
    shape = (SEQ, D)
    x = rng.standard_normal(shape) + 10.0 * rng.standard_normal(shape) * (rng.random(shape) < 0.001)
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def rotation():
    h = np.array([[1.0]])
    while h.shape[0] < D:
        h = np.block([[h, h], [h, -h]])
    signs = np.where(rng.random(D) < 0.5, -1.0, 1.0)
    return (np.diag(signs) @ h / np.sqrt(D)).astype(np.float32)


M = rotation()


def quantized(x, rows):
    """x rounded to e4m3 with a scale per block of `rows` rows (None: one for the tensor)."""
    out = np.empty_like(x)
    rows = rows or x.shape[0]
    for i in range(0, x.shape[0], rows):
        scale = max(np.abs(x[i:i + rows]).max() / 448.0, 1e-30)
        out[i:i + rows] = e4m3(x[i:i + rows] / scale) * scale
    return out


def reference(q, k, v):
    s = q.astype(np.float64) @ k.T.astype(np.float64) / np.sqrt(D)
    p = np.exp(s - s.max(1, keepdims=True))
    return p @ v.astype(np.float64) / p.sum(1, keepdims=True)


def fp8(q, k, v, per_block=True, rotate_qk=True, rotate_v=False, exact=()):
    rows_q, rows_kv = (BLOCK_M, BLOCK_N) if per_block else (None, None)
    if rotate_qk:
        q, k = q @ M, k @ M
    if rotate_v:
        v = v @ M
    if "qk" not in exact:
        q, k = quantized(q, rows_q), quantized(k, rows_kv)
    if "v" not in exact:
        v = quantized(v, rows_kv)
    s = q @ k.T / np.sqrt(D)
    p = np.exp2((s - s.max(1, keepdims=True)) * np.log2(np.e) + 8.0).astype(np.float32)
    o = ((p if "p" in exact else e4m3(p)) @ v) / p.sum(1, keepdims=True)
    return o @ M.T if rotate_v else o


METHODS = {
    "per-tensor": dict(per_block=False, rotate_qk=False),
    "per-block": dict(rotate_qk=False),
    "per-block + Hadamard (Q, K)": dict(),
    "per-block + Hadamard (Q, K, V)": dict(rotate_v=True),
    "per-block + Hadamard, exact Q and K": dict(exact=("qk",)),
    "per-block + Hadamard, exact P": dict(exact=("p",)),
    "per-block + Hadamard, exact V": dict(exact=("v",)),
    "per-block + Hadamard, only P rounded": dict(exact=("qk", "v")),
}


def main():
    squared = {name: [] for name in METHODS}
    for _ in range(HEADS):
        q, k, v = draw(), draw(), draw()
        ref = reference(q, k, v)
        for name, kw in METHODS.items():
            squared[name].append(np.mean((fp8(q, k, v, **kw) - ref) ** 2))
    rmse = {name: np.sqrt(np.mean(s)) for name, s in squared.items()}
    print("| method | RMSE of O | per-tensor / this |\n|---|---|---|")
    for name, r in rmse.items():
        print(f"| {name} | {r:.2e} | {rmse['per-tensor'] / r:.2f}x |")


if __name__ == "__main__":
    main()
