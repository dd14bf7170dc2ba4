"""Row-blocked work spread over the machine's cores, with BLAS kept single-threaded.

A batched prediction chains matrix products and elementwise kernels on arrays of
tens of megabytes. Run as whole-batch steps, every step is a pass through main memory
and OpenBLAS's own threads synchronise at every call. Cutting the batch into row blocks
that stay in cache, and giving each core its own sequence of blocks (one Python thread
per core, BLAS limited to one thread so that the cores do not fight over it), keeps both
cores busy on cache-resident data: compiled kernels and BLAS release the GIL.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

__all__ = ["for_row_blocks", "n_workers", "single_threaded_blas"]

_local = threading.local()
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_blas_users = 0
_blas_limit = None
_controller = None


def n_workers() -> int:
    """Number of threads :func:`for_row_blocks` uses: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _get_pool(workers: int) -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None or _pool._max_workers < workers:
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pmkjit-blocks")
        return _pool


def _enter_single_threaded_blas() -> None:
    """Limit BLAS to one thread; reference-counted so that concurrent callers nest safely."""
    global _blas_users, _blas_limit, _controller
    with _lock:
        if _blas_users == 0:
            from threadpoolctl import ThreadpoolController

            if _controller is None:
                _controller = ThreadpoolController()  # scans loaded libraries once
            _blas_limit = _controller.limit(limits=1, user_api="blas")
        _blas_users += 1


def _exit_single_threaded_blas() -> None:
    global _blas_users, _blas_limit
    with _lock:
        _blas_users -= 1
        if _blas_users == 0:
            _blas_limit.restore_original_limits()
            _blas_limit = None


@contextmanager
def single_threaded_blas():
    """Run the enclosed linear algebra with BLAS on one thread.

    For factorisations of matrices of a few thousand rows (a KJIT operator's fit): on
    a 2-core machine where another process holds a core, OpenBLAS's spinning threads
    make them several times slower than one thread is, while on an idle machine one
    thread loses little at these sizes.
    """
    _enter_single_threaded_blas()
    try:
        yield
    finally:
        _exit_single_threaded_blas()


def for_row_blocks(fn: Callable[[int, int], None], n_rows: int, block_rows: int, workers: int | None = None) -> None:
    """Call ``fn(lo, hi)`` for consecutive row blocks ``[lo, hi)`` covering ``range(n_rows)``.

    Blocks are handed out in order to ``workers`` threads (default :func:`n_workers`;
    the calling thread is one of them), each taking the next block when it is done,
    with BLAS limited to one thread while they run. ``fn`` must only write rows ``lo:hi`` of shared outputs.
    Nested calls (from inside ``fn``) and single-block inputs run serially.

    Parameters
    ----------
    fn : callable ``(lo, hi) -> None``
    n_rows : int
    block_rows : int
        Rows per block (the last block may be shorter).
    workers : int, optional

    Notes
    -----
    The BLAS limit is process-wide while blocks run: matrix products started by other
    threads of the process during that time also run on one thread.
    """
    block_rows = max(1, int(block_rows))
    blocks = [(lo, min(lo + block_rows, n_rows)) for lo in range(0, n_rows, block_rows)]
    workers = min(n_workers() if workers is None else int(workers), len(blocks))
    if workers <= 1 or getattr(_local, "inside", False):
        for lo, hi in blocks:
            fn(lo, hi)
        return

    # Blocks are handed out one at a time rather than split in fixed halves: on a shared
    # machine a thread whose core is taken by another process simply does fewer blocks.
    next_block = iter(blocks)
    take = threading.Lock()

    def run() -> None:
        _local.inside = True
        try:
            while True:
                with take:
                    block = next(next_block, None)
                if block is None:
                    return
                fn(*block)
        finally:
            _local.inside = False

    pool = _get_pool(workers - 1)
    _enter_single_threaded_blas()
    try:
        futures = [pool.submit(run) for _ in range(workers - 1)]
        try:
            run()
        finally:
            errors = [f.exception() for f in futures]  # wait for all before leaving
        for err in errors:
            if err is not None:
                raise err
    finally:
        _exit_single_threaded_blas()
