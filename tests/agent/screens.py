"""Small screenshots and step contexts for tests of the prompt, the model and the engines."""

from __future__ import annotations

import io

from dart.agent.prompt import PromptConfig
from dart.events import HistoryTurn
from dart.events.manifest import PromptContext

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
