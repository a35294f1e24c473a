"""examples/digits_data.py reads scikit-learn's digits without importing
scikit-learn: the arrays must be the very ones sklearn.datasets.load_digits()
returns, or every digits example would train on something else."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import digits_data  # noqa: E402


def test_load_digits_equals_scikit_learns():
    from sklearn.datasets import load_digits

    ours, theirs = digits_data.load_digits(), load_digits()
    for field in ("data", "images", "target"):
        mine, ref = getattr(ours, field), getattr(theirs, field)
        assert mine.dtype == ref.dtype and mine.shape == ref.shape, field
        assert np.array_equal(mine, ref), field
    assert ours.images.shape == (1797, 8, 8) and sorted(set(ours.target)) == list(range(10))
