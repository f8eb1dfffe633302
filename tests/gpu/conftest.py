"""The CUDA checks (``tests/gpu``): skipped wherever torch sees no CUDA device, CI included.

On a GPU host they run alone, without the suite's root conftest (its broker needs the Kafka
clients): ``deploy/gpu/cuda_check.sh`` passes ``--confcutdir tests/gpu`` and ``-c /dev/null``, so
the ``gpu`` marker is registered here rather than read from pyproject.toml.
"""

from __future__ import annotations


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped here)")
