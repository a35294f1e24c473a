"""scikit-learn's handwritten digits (1797 8x8 images, 10 classes), read
without importing scikit-learn.

The data ships inside scikit-learn as datasets/data/digits.csv.gz, so nothing
is downloaded. `import sklearn.datasets` pulls in SciPy and costs about a
second of CPU in every rank process; this reads the same file the same way
(numpy.loadtxt), so load_digits() here returns the very arrays
sklearn.datasets.load_digits() does.
"""

import importlib.util
import os
from types import SimpleNamespace

import numpy as np


def digits_path() -> str:
    """The digits file inside the installed scikit-learn (found, not imported)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the digits examples read scikit-learn's digits: pip install scikit-learn")
    return os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")


def load_digits() -> SimpleNamespace:
    """images (N, 8, 8), data (N, 64) as float64 in 0..16, target (N,) as int."""
    table = np.loadtxt(digits_path(), delimiter=",")
    data = table[:, :-1]
    return SimpleNamespace(data=data, images=data.reshape(-1, 8, 8),
                           target=table[:, -1].astype(int))
