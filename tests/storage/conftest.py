"""The storage suite runs on every backend of the ``url`` fixture (tests/conftest.py): a SQLite
file and the local PostgreSQL."""

from __future__ import annotations

import pytest


@pytest.fixture
def repo(url: str):
    from storage import open_repository

    repository = open_repository(url)
    yield repository
    repository.close()


DEVICE = {
    "name": "NVIDIA H100 80GB HBM3",
    "sm_count": 132,
    "compute_capability": "9.0",
    "driver_version": "570.86.15",
    "cuda_version": "12.8",
}


@pytest.fixture
def device() -> dict:
    """A device as open_study takes it."""
    return dict(DEVICE)


@pytest.fixture
def study_args():
    """A factory of Repository.open_study keyword arguments for a small attention problem."""

    def make(**overrides):
        args = {
            "family": "attention",
            "template_hash": "0123456789abcdef",
            "space": {"block_m": [64, 128], "block_n": [32, 64]},
            "shape": [4, 16, 4096, 128],
            "dtype": "fp16",
            "flags": {"causal": True},
            "device": dict(DEVICE),
            "sampler": "tpe",
            "replay": False,
            "settings": {"n_trials": 10, "seed": 0},
        }
        args.update(overrides)
        return args

    return make
