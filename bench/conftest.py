# SPDX-License-Identifier: Apache-2.0
"""Benchmarks: `pytest bench --benchmark-only`. benchmark.group is the operation, so one table
compares the backends (and the baselines) side by side."""
import pytest

from rocketstore import testing


@pytest.fixture(params=testing.backend_params())
def backend(request):
    return testing.load_backend(request.param)
