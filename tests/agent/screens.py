"""Fixtures of the rollout tests: one tiny random Qwen2.5-VL per session, small screenshots."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from dart.events import HistoryTurn
from dart.manifest import PromptContext
from dart.rollout.prompt import PromptConfig

SMALL = PromptConfig(min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28)
"""Prompt settings that keep test screenshots to at most 16 image tokens."""


def png(color: str | tuple[int, int, int], size: tuple[int, int] = (160, 100)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def context(store, *, steps: int = 2, instruction: str = "Open the file") -> PromptContext:
    """A step context whose screenshots live in ``store``: ``steps`` earlier turns, then the current one."""
    colors = ["red", "blue", "green", "yellow", "white", "black", "gray", "purple"]
    digests = [store.put(png(colors[i % len(colors)])) for i in range(steps + 1)]
    history = [
        HistoryTurn(
            step_index=i, screenshot_digest=digests[i], response_text=f"Thought: step {i}\nAction: wait()"
        )
        for i in range(steps)
    ]
    return PromptContext(
        instruction=instruction,
        step_index=steps,
        screenshot_digest=digests[-1],
        screen_width=160,
        screen_height=100,
        history=history,
    )


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from dart.rollout.model import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def policy(tiny_dir):
    from dart.rollout.model import load_policy

    return load_policy(tiny_dir)


@pytest.fixture
def store(tmp_path):
    from dart.blobs import LocalBlobStore

    return LocalBlobStore(tmp_path / "blobs")
