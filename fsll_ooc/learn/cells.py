"""Sets of flat cell indices, fast: the corrective step's gathers out of core deduplicate millions of them."""
from __future__ import annotations

import numpy as np

__all__ = ["unique_inverse"]


def unique_inverse(flat: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(flat, return_inverse=True)`` for indices in ``[0, size)``, the same arrays.

    When the table is at most four times as long as ``flat`` the sort is replaced by a
    mark per cell and a position lookup (``O(len(flat) + size)``, no more memory than the
    sort's own temporaries); otherwise ``np.unique`` itself.
    """
    flat = np.asarray(flat, np.int64).reshape(-1)
    if size > 4 * flat.size:
        uniq, inv = np.unique(flat, return_inverse=True)
        return uniq, inv.reshape(-1)
    mark = np.zeros(size, dtype=bool)
    mark[flat] = True
    uniq = np.flatnonzero(mark)
    del mark
    pos = np.empty(size, dtype=np.int64)  # read only at the marked cells
    pos[uniq] = np.arange(uniq.size, dtype=np.int64)
    return uniq, pos[flat]
