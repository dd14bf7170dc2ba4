"""Compiled elementwise kernels for random features: fused, SIMD cos/sin and exp.

numpy evaluates float64 ``cos``, ``sin`` and ``exp`` one value at a time through libm
(about 20 ns for a cos on this project's machine, against 0.4 ns for a multiply-add),
and every numpy operation is a separate pass over arrays far larger than cache. For a
batched KJIT prediction that made the elementwise work cost more than all the matrix
products together. The kernels here compute cos and sin of the same argument together,
with branch-free polynomials that LLVM vectorises (4 doubles per AVX2 instruction), and
fuse the amplitude, the complex product of characteristic functions and the feature
scale into the same pass.

Accuracy, checked against numpy in ``tests/test_elementwise.py``:

* ``sin``/``cos``: Cody-Waite reduction by ``pi/2`` in three parts (fdlibm's constants,
  exact for quotients below ``2**20``) and fdlibm's kernel polynomials on
  ``[-pi/4, pi/4]``; within 2.3e-16 absolute of numpy for ``|x| <= TRIG_LIMIT``.
  Larger arguments are counted by the kernels and their rows recomputed with numpy.
* ``exp`` on ``[-345, 0]`` (the log amplitude of a characteristic function): reduction
  by ``ln 2`` in two parts, degree-12 Taylor polynomial on ``|r| <= ln(2)/2`` (truncation
  below 2e-16), times ``2**n`` built from its bit pattern; within 4e-16 relative of numpy. Below
  ``-345`` (1e-150) the amplitude is flushed to zero, as the numpy path did, so that
  products never go subnormal (subnormal operands slow BLAS several-fold).

All kernels release the GIL; callers split rows across threads (:func:`run_rows`).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

__all__ = ["TRIG_LIMIT", "cos_sin_kernel", "phase_cf_kernel", "complex_multiply_kernel", "run_rows"]

# Quotients x * 2/pi below 2**19 keep q * _PIO2_1 and q * _PIO2_2 exact (33-bit constants).
TRIG_LIMIT = 2.0**19
_PIO2_1 = 1.57079632673412561417e00  # first 33 bits of pi/2
_PIO2_2 = 6.07710050630396597660e-11  # next 33 bits
_PIO2_3 = 2.02226624879595063154e-21  # pi/2 - _PIO2_1 - _PIO2_2
_TWO_OVER_PI = 6.36619772367581382433e-01
# fdlibm __kernel_sin / __kernel_cos minimax coefficients on [-pi/4, pi/4]
_S1, _S2, _S3 = -1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04
_S4, _S5, _S6 = 2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10
_C1, _C2, _C3 = 4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05
_C4, _C5, _C6 = -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11

_LOG_AMP_FLOOR = -345.0  # exp(-345) ~ 1e-150: flush below
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_E = [1.0 / math.factorial(k) for k in range(13)]
_E2, _E3, _E4, _E5, _E6, _E7, _E8, _E9, _E10, _E11, _E12 = _E[2:]

_JIT = dict(nogil=True, cache=True, fastmath={"contract"})  # contract: FMAs, never reassociate


@numba.njit(inline="always", **_JIT)
def _sincos(x):
    """``(cos x, sin x)`` without branches, so that loops over it vectorise."""
    q = np.floor(x * _TWO_OVER_PI + 0.5)  # np.floor keeps q a float: float->int64 does not vectorise
    r = ((x - q * _PIO2_1) - q * _PIO2_2) - q * _PIO2_3
    z = r * r
    s = r + r * z * (_S1 + z * (_S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6)))))
    c = 1.0 - 0.5 * z + z * z * (_C1 + z * (_C2 + z * (_C3 + z * (_C4 + z * (_C5 + z * _C6)))))
    h = q - 4.0 * np.floor(q * 0.25)  # quadrant in {0, 1, 2, 3}
    odd = (h == 1.0) | (h == 3.0)
    sn = c if odd else s
    cs = s if odd else c
    sn = -sn if h >= 2.0 else sn
    cs = -cs if (h == 1.0) | (h == 2.0) else cs
    return cs, sn


@numba.njit(**_JIT)
def cos_sin_kernel(Z, out, scale):
    """``out[:, :K] = scale cos(Z)``, ``out[:, K:] = scale sin(Z)``; returns the count of ``|Z| > TRIG_LIMIT``.

    ``Z`` is ``(n, K)`` and ``out`` ``(n, 2K)``, both C-contiguous float64. Entries
    beyond ``TRIG_LIMIT`` are inaccurate and must be recomputed by the caller.
    """
    n, K = Z.shape
    n_big = 0
    for i in range(n):
        # 1-D row slices: indexing out[i, K + j] directly makes LLVM fear aliasing and not vectorise
        z, o_cos, o_sin = Z[i], out[i, :K], out[i, K:]
        for j in range(K):
            x = z[j]
            c, s = _sincos(x)
            o_cos[j] = scale * c
            o_sin[j] = scale * s
            n_big += abs(x) > TRIG_LIMIT
    return n_big


@numba.njit(**_JIT)
def phase_cf_kernel(M, V, other, out, omega, half_omega2, scale):
    """``scale`` times the characteristic functions of Gaussian (and point-mass) messages.

    For each row ``i`` and frequency ``j`` the joint characteristic function of
    independent Gaussians is ``exp(-sum_c V[i,c] half_omega2[c,j]) * exp(i sum_c M[i,c] omega[c,j])``:
    one exp and one sincos per entry whatever the number of variables. ``out`` is
    ``(n, 2K)`` and receives ``[Re, Im]``. ``other``, ``(n, 2K)`` or ``(0, 0)``, holds the
    characteristic functions of the remaining messages, multiplied in (complex product)
    when it has rows; it may be ``out`` itself. Returns the count of phases beyond
    ``TRIG_LIMIT`` (those rows must be recomputed by the caller).

    Each row goes through several short loops over private buffers rather than one
    fused loop: LLVM vectorises a loop only if it can rule out aliasing between its
    arrays with few run-time checks, and numba cannot tell it that arrays are distinct.
    """
    n, c_vars = M.shape
    K = omega.shape[1]
    multiply = other.shape[0] > 0
    phase = np.empty(K)
    amp = np.empty(K)
    cs = np.empty(K)
    sn = np.empty(K)
    # exp(la) = p(r) * 2**q; 2**q is built from its bit pattern (exponent field q + 1023)
    pow2_bits = np.empty(K, np.int64)
    pow2 = pow2_bits.view(np.float64)
    n_big = 0
    for i in range(n):
        om, hw = omega[0], half_omega2[0]
        m, v = M[i, 0], V[i, 0]
        for j in range(K):
            phase[j] = m * om[j]
        for j in range(K):
            amp[j] = -v * hw[j]
        for c in range(1, c_vars):
            om, hw = omega[c], half_omega2[c]
            m, v = M[i, c], V[i, c]
            for j in range(K):
                phase[j] += m * om[j]
            for j in range(K):
                amp[j] -= v * hw[j]
        for j in range(K):
            la = amp[j]
            x = min(max(la, _LOG_AMP_FLOOR), 0.0)
            q = np.floor(x * _LOG2E + 0.5)  # a float: float->int64 conversion does not vectorise
            r = (x - q * _LN2_HI) - q * _LN2_LO
            p = 1.0 + r * (1.0 + r * (_E2 + r * (_E3 + r * (_E4 + r * (_E5 + r * (
                _E6 + r * (_E7 + r * (_E8 + r * (_E9 + r * (_E10 + r * (_E11 + r * _E12)))))))))))
            pow2_bits[j] = (np.int64(np.int32(q)) + 1023) << 52
            amp[j] = scale * p if la >= _LOG_AMP_FLOOR else 0.0
        for j in range(K):
            amp[j] *= pow2[j]
        for j in range(K):
            x = phase[j]
            c_, s_ = _sincos(x)
            cs[j] = c_
            sn[j] = s_
            n_big += abs(x) > TRIG_LIMIT
        if multiply:
            re2, im2 = other[i, :K], other[i, K:]
            for j in range(K):
                t = cs[j] * re2[j] - sn[j] * im2[j]
                sn[j] = cs[j] * im2[j] + sn[j] * re2[j]
                cs[j] = t
        o_re, o_im = out[i, :K], out[i, K:]  # 1-D row slices, see cos_sin_kernel
        for j in range(K):
            o_re[j] = amp[j] * cs[j]
        for j in range(K):
            o_im[j] = amp[j] * sn[j]
    return n_big


@numba.njit(**_JIT)
def complex_multiply_kernel(out, other, scale):
    """``out <- scale * out * other`` for ``(n, 2K)`` arrays holding ``[Re, Im]``."""
    n, K2 = out.shape
    K = K2 // 2
    re = np.empty(K)
    im = np.empty(K)
    for i in range(n):
        re[:] = out[i, :K]  # private copies, see phase_cf_kernel
        im[:] = out[i, K:]
        o_re, o_im, re2, im2 = out[i, :K], out[i, K:], other[i, :K], other[i, K:]
        for j in range(K):
            o_re[j] = scale * (re[j] * re2[j] - im[j] * im2[j])
            o_im[j] = scale * (re[j] * im2[j] + im[j] * re2[j])
    return 0


# Below this many entries one thread is faster than handing half the rows to another.
_THREAD_MIN = 100_000
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pmkjit-elementwise")


def run_rows(kernel, row_args: tuple, shared_args: tuple, n_entries: int, threads: bool = True) -> int:
    """Run ``kernel(*row_args, *shared_args)`` over rows, on two threads when large.

    Parameters
    ----------
    kernel : compiled kernel returning an int count, or None
    row_args : tuple of ndarray
        Arrays whose leading axis is the rows; each thread gets a contiguous half.
    shared_args : tuple
        Arguments passed whole to every call.
    n_entries : int
        Amount of work, compared with the threading threshold.
    threads : bool
        ``False`` runs inline (callers that are themselves on worker threads).

    Returns
    -------
    int
        Sum of the kernel's return values (0 for kernels returning None).
    """
    n = row_args[0].shape[0]
    if not threads or n_entries < _THREAD_MIN or n < 2:
        return int(kernel(*row_args, *shared_args) or 0)
    half = n // 2
    first = _POOL.submit(kernel, *(a[:half] for a in row_args), *shared_args)
    second = kernel(*(a[half:] for a in row_args), *shared_args)
    return int(first.result() or 0) + int(second or 0)
