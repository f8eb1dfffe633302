"""The trainer's host copy of its weights: one buffer, reused, exact."""

from __future__ import annotations

import torch

from dart.train.config import EngineConfig, OptimConfig
from dart.train.engine import build_engine
from dart.train.staging import HostStaging


def state(seed: int, rows: int = 5) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(rows, 3, generator=gen).to(torch.bfloat16),
            "t": torch.randn(3, rows, generator=gen).t(),                # not contiguous
            "n": torch.arange(7, dtype=torch.int64), "e": torch.empty(0)}


def test_copies_are_exact_and_land_in_one_reused_buffer():
    staging = HostStaging()
    assert not staging.pin                                                 # no CUDA here: nothing to pin for
    first = staging.copy(state(0))
    assert all(torch.equal(first[k], v) and first[k].dtype == v.dtype for k, v in state(0).items())
    ptr, size = first["w"].data_ptr(), staging.nbytes
    second = staging.copy(state(1))
    assert second["w"].data_ptr() == ptr and staging.nbytes == size       # the same memory, refilled
    assert all(torch.equal(second[k], v) for k, v in state(1).items())
    assert torch.equal(first["w"], second["w"])                            # views: the old copy is overwritten
    assert all(t.data_ptr() % 64 == 0 for t in second.values() if t.numel())


def test_a_new_layout_gets_a_new_buffer():
    staging = HostStaging()
    staging.copy(state(0))
    grown = staging.copy(state(2, rows=9))
    assert grown["w"].shape == (9, 3) and torch.equal(grown["t"], state(2, rows=9)["t"])


def test_full_state_dict_without_a_staging_is_owned_and_with_one_is_its_views(tiny_dir):
    from dart.agent.model import load_policy

    engine = build_engine(load_policy(tiny_dir).model, OptimConfig(lr=1e-3), EngineConfig(device="cpu", dtype="float32"))
    own = engine.full_state_dict()
    staging = HostStaging()
    staged = engine.full_state_dict(staging)
    live = engine.policy.state_dict()
    assert own.keys() == live.keys() == staged.keys()
    assert all(torch.equal(own[k], v) and torch.equal(staged[k], v) for k, v in live.items())
    with torch.no_grad():
        next(engine.policy.parameters()).add_(1.0)
    assert all(torch.equal(own[k], staged[k]) for k in own)                # both copies, not the live weights
    again = engine.full_state_dict(staging)
    assert all(torch.equal(again[k], v) for k, v in engine.policy.state_dict().items())
    assert not all(torch.equal(own[k], again[k]) for k in own)            # the owned copy kept the old weights
