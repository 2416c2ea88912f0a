"""Arenas filled with garbage before a plan runs, so that a plan reading a row no step wrote
shows it.

The executor's arenas are ``np.empty`` or memory an earlier run gave back to the pool
(``backends.arena_pool``): a row no step writes holds whatever was there, often zeros from a
fresh page, which can hide a plan that reads such a row (a padded slot taken as zero, a member
left out of a write). Poisoned, every float reads NaN, every integer a third of its largest
value and every bool True until a step writes it: a batch that reads any of them cannot equal
its instances run alone. ``pytest --poison-arenas`` runs a whole session so, and
``python -m tests.fuzz --poison-arenas`` the fuzzer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from autobatch.backends import flat_executor


def poison(array: np.ndarray | None) -> None:
    if array is None:  # a block: allocated by the step that writes it
        return
    if array.dtype.kind in "fc":
        array.fill(np.nan)
    elif array.dtype.kind in "iu":
        array.fill(np.iinfo(array.dtype).max // 3)
    elif array.dtype.kind == "b":
        array.fill(True)
    else:
        array.view(np.uint8).fill(0xAB)


@contextlib.contextmanager
def poisoned_arenas() -> Iterator[None]:
    """Every arena (pooled or new) and every block of a step poisoned when allocated."""
    arenas, block_array = flat_executor._arenas, flat_executor._block_array

    def poisoned(plan, pool):  # type: ignore[no-untyped-def]
        made, buffers = arenas(plan, pool)
        for arena in made:
            poison(arena)
        return made, buffers

    def poisoned_block(plan, write):  # type: ignore[no-untyped-def]
        block = block_array(plan, write)
        poison(block)
        return block

    flat_executor._arenas, flat_executor._block_array = poisoned, poisoned_block
    try:
        yield
    finally:
        flat_executor._arenas, flat_executor._block_array = arenas, block_array
