"""RNG state in a checkpoint: restored exactly, and loaded without running any code from the file."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch

from dart.errors import DecodeError
from dart.train.checkpoint import RNG_FILE, load_rng, rng_state


def draws() -> tuple:
    return random.random(), random.gauss(0, 1), float(np.random.rand()), float(np.random.randn()), torch.rand(3).tolist()


def test_rng_state_round_trips_exactly_through_the_file(tmp_path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leave a cached gaussian in both generators
    np.random.randn()
    torch.save(rng_state(), tmp_path / RNG_FILE)
    expected = draws()
    draws()
    load_rng(tmp_path)
    assert draws() == expected


class Boom:
    def __reduce__(self):
        import os

        return os.system, ("touch pwned-by-checkpoint",)


def test_a_crafted_pickle_in_rng_pt_is_refused_before_it_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / RNG_FILE).write_bytes(pickle.dumps({"format": "dart.rng.v2", "python": Boom()}))
    with pytest.raises(DecodeError, match="refused to unpickle"):
        load_rng(tmp_path)
    torch.save({"format": "dart.rng.v2", "torch": Boom()}, tmp_path / RNG_FILE)  # inside a torch zip too
    with pytest.raises(DecodeError, match="refused to unpickle"):
        load_rng(tmp_path)
    assert not (tmp_path / "pwned-by-checkpoint").exists()


def test_an_rng_file_of_the_wrong_shape_is_a_decode_error(tmp_path) -> None:
    torch.save({"format": "something else"}, tmp_path / RNG_FILE)
    with pytest.raises(DecodeError, match="not a dart RNG state"):
        load_rng(tmp_path)
    torch.save([1, 2], tmp_path / RNG_FILE)
    with pytest.raises(DecodeError):
        load_rng(tmp_path)
