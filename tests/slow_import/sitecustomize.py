"""Test hook, active only with MAELM_SLOW_TRAIN_IMPORT=<seconds> and this folder on PYTHONPATH:
delays the import of `maelm_jax.train`, so a test can make one process of a multi-process
run reach its first error much later than another (test_multiprocess.py)."""

import os
import sys
import time


class _SlowTrainImport:
    def find_spec(self, name, path=None, target=None):
        if name == "maelm_jax.training.train":
            time.sleep(float(os.environ["MAELM_SLOW_TRAIN_IMPORT"]))
        return None  # the normal finders do the import


if os.environ.get("MAELM_SLOW_TRAIN_IMPORT"):
    sys.meta_path.insert(0, _SlowTrainImport())
