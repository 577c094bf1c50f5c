"""Threads for the driver's IO-bound work: reading and writing many files at once (pyarrow releases the GIL
while it decodes, encodes and compresses)."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def threads() -> int:
    return min(os.cpu_count() or 1, 8)


def thread_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(x) for x in items]``, run on a pool of threads; the first error is raised after all finish."""
    items = list(items)
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(threads(), len(items)), thread_name_prefix="bitlake-io") as pool:
        return list(pool.map(fn, items))


def ordered_map(fn: Callable[[T], R], items: Iterable[T], ahead: int) -> Iterator[R]:
    """``fn(x)`` for each of ``items``, in order, computed on threads at most ``ahead`` items ahead of the
    consumer, so at most ``ahead`` results are held at once; an error is raised in its place, once the threads
    under way finish."""
    pending: deque[Future] = deque()
    with ThreadPoolExecutor(max_workers=max(1, ahead), thread_name_prefix="bitlake-io") as pool:
        for x in items:
            if len(pending) >= ahead:
                yield pending.popleft().result()
            pending.append(pool.submit(fn, x))
        while pending:
            yield pending.popleft().result()
