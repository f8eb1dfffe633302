"""The UI-TARS-1.5 computer-use prompt: one builder for the rollout workers and the trainer.

Pure module (no bus, no clock). The rollout worker and the trainer must feed the policy the
same tokens for the same step, so both call, in this order::

    messages, images = build_messages(ctx, load_image, cfg)            # PromptContext -> chat
    inputs = encode_prompt(tokenizer, image_processor, messages, images)  # chat -> tensors
    prompt_hash(inputs.token_ids())                                    # == ActionChosen.prompt_hash

Chat structure (as UI-TARS-1.5 is prompted in OSWorld)::

    system     "You are a helpful assistant."
    user       COMPUTER_USE_PROMPT (action space + the task instruction), or with
               ``template: compact`` only COMPACT_PROMPT (the instruction)
    [user      screenshot of history turn i]      # only the newest max_images - 1 turns
    assistant  answer of history turn i            # the newest max_turns turns
    ...
    user       current screenshot

Screenshots are smart-resized (factor 28, pixel budget [min_pixels, max_pixels]) before they
reach the image processor; UI-TARS-1.5 answers in pixels of that resized image.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from dart.agent.uitars import smart_resize as uitars_smart_resize
from dart.config import require
from dart.errors import ConfigError, DecodeError

if TYPE_CHECKING:
    import torch
    from PIL import Image

    from dart.blobs import BlobStore
    from dart.events.manifest import PromptContext

SYSTEM_PROMPT = "You are a helpful assistant."

COMPUTER_USE_PROMPT = r"""You are a GUI agent. You are given a task and your action history, with screenshots. You need to perform the next action to complete the task.

## Output Format
```
Thought: ...
Action: ...
```

## Action Space
click(start_box='<|box_start|>(x1,y1)<|box_end|>')
left_double(start_box='<|box_start|>(x1,y1)<|box_end|>')
right_single(start_box='<|box_start|>(x1,y1)<|box_end|>')
drag(start_box='<|box_start|>(x1,y1)<|box_end|>', end_box='<|box_start|>(x3,y3)<|box_end|>')
hotkey(key='')
type(content='') #If you want to submit your input, use "\n" at the end of `content`.
scroll(start_box='<|box_start|>(x1,y1)<|box_end|>', direction='down or up or right or left')
wait() #Sleep for 5s and take a screenshot to check for any changes.
finished(content='xxx') # Use escape characters \\', \\", and \\n in content part to ensure we can parse the content in normal python string format.
call_user() # Submit the task and call the user when the task is unsolvable, or when you need the user's help.

## Note
- Use {language} in `Thought` part.
- Write a small plan and finally summarize your next action (with its target element) in one sentence in `Thought` part.

## User Instruction
{instruction}
"""
"""The UI-TARS-1.5 computer-use instruction; ``{language}`` and ``{instruction}`` are filled in."""

COMPACT_PROMPT = "## User Instruction\n{instruction}\n"
"""``template: compact``: the instruction alone (~10 tokens instead of ~300), for a policy trained
here from scratch (the tiny CPU model), which never needs the action-space text; a released
UI-TARS checkpoint expects the full prompt."""

TEMPLATES = {"uitars": COMPUTER_USE_PROMPT, "compact": COMPACT_PROMPT}

IMAGE_PAD = "<|image_pad|>"
IMAGE_FACTOR = 28
"""Patch size 14 x spatial merge 2: resized sides are multiples of this."""

Message = dict[str, Any]
ImageLoader = Callable[[str], "Image.Image | bytes"]


@dataclass(frozen=True, kw_only=True)
class PromptConfig:
    """How a step's prompt is built (defaults: UI-TARS-1.5 / DART)."""

    max_images: int = 5
    """Screenshots in the prompt: the current one plus those of the newest max_images - 1 turns."""
    max_turns: int = 35
    """Previous answers kept in the prompt (newest first); older turns are dropped."""
    min_pixels: int = 100 * 28 * 28
    """Smallest smart-resized screenshot, in pixels."""
    max_pixels: int = 16384 * 28 * 28
    """Largest smart-resized screenshot, in pixels (1920x1080 -> 1932x1092 fits)."""
    language: str = "English"
    """Language the model is told to think in."""
    template: Literal["uitars", "compact"] = "uitars"
    """User text before the screenshots: ``uitars`` (the UI-TARS-1.5 computer-use prompt) or
    ``compact`` (the instruction alone; for models trained from scratch, half the tokens per step
    of the tiny model)."""

    def __post_init__(self) -> None:
        require(self.max_images >= 1, "max_images", f"must be >= 1, got {self.max_images}")
        require(self.max_turns >= 0, "max_turns", f"must be >= 0, got {self.max_turns}")
        require(
            0 < self.min_pixels <= self.max_pixels,
            "min_pixels",
            f"need 0 < min_pixels <= max_pixels, got {self.min_pixels} / {self.max_pixels}",
        )
        require(self.template in TEMPLATES, "template", f"must be one of {sorted(TEMPLATES)}, got {self.template!r}")


def smart_resize(
    width: int, height: int, *, min_pixels: int, max_pixels: int, factor: int = IMAGE_FACTOR
) -> tuple[int, int]:
    """(width, height) of a screenshot after Qwen2.5-VL smart-resize (1920x1080 -> 1932x1092 at
    the UI-TARS defaults). The one rule lives in the UI-TARS parser, so the image the model sees
    and the coordinates its answers are mapped back from can never disagree."""
    try:
        h, w = uitars_smart_resize(height, width, factor, min_pixels, max_pixels)
    except ConfigError as exc:
        raise DecodeError(f"screenshot {width}x{height}: {exc}") from exc
    return w, h


def decode_image(data: Image.Image | bytes) -> Image.Image:
    """An RGB PIL image from PNG/JPEG bytes (or an image); DecodeError when unreadable."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(data, Image.Image):
        return data.convert("RGB")
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DecodeError(f"screenshot is not a readable image: {exc}") from exc


def blob_image_loader(store: BlobStore, *, cache_size: int = 64) -> Callable[[str], Image.Image]:
    """A ``load_image(digest)`` reading screenshots from a blob store, with a small LRU cache
    (consecutive steps of a trajectory share most of their screenshots)."""
    cache: OrderedDict[str, Image.Image] = OrderedDict()
    lock = threading.Lock()  # prompts are built on worker threads concurrently

    def load(digest: str) -> Image.Image:
        with lock:
            if digest in cache:
                cache.move_to_end(digest)
                return cache[digest]
        img = decode_image(store.get(digest))
        with lock:
            cache[digest] = img
            if len(cache) > cache_size:
                cache.popitem(last=False)
        return img

    return load


def plain_text(text: str) -> str:
    """Untrusted text (a task's instruction, the policy's earlier answers) with every ``<|``
    broken by a zero-width space, so the tokenizer can never read a special token out of it:
    a literal ``<|image_pad|>`` would claim an image slot, a literal ``<|im_end|>`` would end the
    turn (prompt injection). Rollout workers and the trainer both build prompts through here,
    so the hashes still agree."""
    return text.replace("<|", "<\u200b|")


def build_messages(
    ctx: PromptContext, load_image: ImageLoader, cfg: PromptConfig | None = None
) -> tuple[list[Message], list[Image.Image]]:
    """The chat for one step and its screenshots (smart-resized RGB), in order of appearance.

    ``load_image(digest)`` returns PNG/JPEG bytes or a PIL image. Messages use the
    transformers multimodal form: ``{"role", "content"}`` where user content is a list of
    ``{"type": "text", "text": ...}`` / ``{"type": "image"}`` items (the i-th image item is
    ``images[i]``) and system / assistant content is a string.
    """
    cfg = cfg or PromptConfig()
    turns = list(ctx.history)[-cfg.max_turns :] if cfg.max_turns else []
    with_image = set(range(len(turns) - (cfg.max_images - 1), len(turns))) if cfg.max_images > 1 else set()
    messages: list[Message] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": TEMPLATES[cfg.template].format(language=cfg.language, instruction=plain_text(ctx.instruction)),
                }
            ],
        },
    ]
    images: list[Image.Image] = []

    def add_screenshot(digest: str) -> None:
        img = decode_image(load_image(digest))
        size = smart_resize(*img.size, min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
        images.append(img if img.size == size else img.resize(size, resample=3))  # 3 = BICUBIC
        messages.append({"role": "user", "content": [{"type": "image"}]})

    for i, turn in enumerate(turns):
        if i in with_image:
            add_screenshot(turn.screenshot_digest)
        messages.append({"role": "assistant", "content": plain_text(turn.response_text)})
    add_screenshot(ctx.screenshot_digest)
    return messages, images


@dataclass(frozen=True, kw_only=True)
class PromptInputs:
    """Model inputs of one prompt (batch of 1), as ``Qwen2_5_VLForConditionalGeneration`` takes them.

    Why a shape of its own: it is the tokenised prompt, the one thing the HF engine and the
    trainer must build identically (its ``input_ids`` give the prompt hash both compare)."""

    input_ids: torch.Tensor
    """(1, T) int64; image placeholders already expanded to one token per merged patch."""
    attention_mask: torch.Tensor
    """(1, T) int64, all ones."""
    pixel_values: torch.Tensor | None
    """(patches, C*t*p*p) float; None when the prompt has no image."""
    image_grid_thw: torch.Tensor | None
    """(images, 3) int64 (t, h, w) patch grid of each image."""
    mm_token_type_ids: torch.Tensor
    """(1, T) int32: 1 at image tokens, 0 at text (needed for M-RoPE positions)."""

    def token_ids(self) -> list[int]:
        return [int(t) for t in self.input_ids[0].tolist()]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def with_response(self, response_token_ids: list[int]) -> PromptInputs:
        """The prompt followed by response tokens (text: ``mm_token_type_ids`` extended by 0)."""
        import torch

        ext = torch.tensor([list(response_token_ids)], dtype=self.input_ids.dtype, device=self.input_ids.device)
        return replace(
            self,
            input_ids=torch.cat([self.input_ids, ext], dim=1),
            attention_mask=torch.cat([self.attention_mask, torch.ones_like(ext)], dim=1),
            mm_token_type_ids=torch.cat(
                [self.mm_token_type_ids, torch.zeros_like(ext, dtype=self.mm_token_type_ids.dtype)], dim=1
            ),
        )

    def to(self, device: Any, dtype: Any = None) -> PromptInputs:
        """On ``device``; ``dtype`` (if given) applies to pixel_values only."""
        pv = self.pixel_values
        if pv is not None:
            pv = pv.to(device=device, dtype=dtype or pv.dtype)
        grid = self.image_grid_thw.to(device) if self.image_grid_thw is not None else None
        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            pixel_values=pv,
            image_grid_thw=grid,
            mm_token_type_ids=self.mm_token_type_ids.to(device),
        )

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``model(**kw)`` / ``model.generate(**kw)``."""
        kw: dict[str, Any] = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "mm_token_type_ids": self.mm_token_type_ids,
        }
        if self.pixel_values is not None:
            kw["pixel_values"] = self.pixel_values
            kw["image_grid_thw"] = self.image_grid_thw
        return kw


def render_prompt(tokenizer: Any, messages: list[Message]) -> str:
    """The chat as prompt text through the tokenizer's chat template (generation prompt added);
    one ``<|image_pad|>`` per image, not yet expanded."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompt(
    tokenizer: Any, image_processor: Any, messages: list[Message], images: list[Image.Image]
) -> PromptInputs:
    """Token ids and pixel tensors of a chat from :func:`build_messages`.

    Each ``<|image_pad|>`` becomes ``t*h*w / merge_size**2`` tokens of its image (what the
    Qwen2.5-VL processor does), so the result is exactly what the model is fed.
    """
    import torch

    text = render_prompt(tokenizer, messages)
    if text.count(IMAGE_PAD) != len(images):
        raise DecodeError(f"prompt has {text.count(IMAGE_PAD)} image slots but {len(images)} images")
    pixel_values = grid = None
    if images:
        feats = image_processor(images=images, return_tensors="pt")
        pixel_values, grid = feats["pixel_values"], feats["image_grid_thw"]
        merge = int(getattr(image_processor, "merge_size", 2))
        parts = text.split(IMAGE_PAD)
        counts = [int(g.prod()) // merge**2 for g in grid]
        text = parts[0] + "".join(IMAGE_PAD * n + rest for n, rest in zip(counts, parts[1:], strict=True))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    input_ids = torch.tensor([ids], dtype=torch.long)
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    mm = (input_ids == image_token_id).to(torch.int32)
    return PromptInputs(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        pixel_values=pixel_values,
        image_grid_thw=grid,
        mm_token_type_ids=mm,
    )


def prompt_hash(token_ids: Any) -> str:
    """sha256 hex of the prompt token ids as int32 little-endian (``ActionChosen.prompt_hash``).

    Accepts a list of ints or a 1-D / (1, T) tensor.
    """
    import numpy as np

    if hasattr(token_ids, "detach"):
        token_ids = token_ids.detach().cpu().reshape(-1).tolist()
    return hashlib.sha256(np.asarray(list(token_ids), dtype="<i4").tobytes()).hexdigest()
