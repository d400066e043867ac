"""Late-interaction scoring on the server."""

from __future__ import annotations

import numpy as np


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """PyLate's MaxSim: for each query vector its best dot product with a document
    vector, summed (a raw sum, not divided by the number of query vectors)."""
    if query.shape[0] == 0 or document.shape[0] == 0:
        return 0.0
    return float((query.astype(np.float64) @ document.T.astype(np.float64)).max(axis=1).sum())
