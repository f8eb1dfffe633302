"""A tiny random-weight Qwen2.5-VL for CPU tests and the learning recipe.

:func:`build_tiny` writes a seeded, random-weight Qwen2.5-VL (about 0.4 M parameters by
default, see :class:`TinySize`) with a byte-level BPE tokenizer trained offline on
UI-TARS-style text, the Qwen2-VL special tokens, a Qwen2-VL chat template and a
``Qwen2VLImageProcessor`` config, through ``save_pretrained``: a directory
:func:`dart.agent.model.load_policy` loads like any released checkpoint. Pure module; torch,
transformers and tokenizers are imported inside the functions.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dart.agent.model import CHAT_TEMPLATE, SPECIAL_TOKENS, STOP_TOKENS
from dart.agent.prompt import COMPUTER_USE_PROMPT
from dart.errors import ConfigError

TINY_VOCAB_SIZE = 2048
TINY_PIXELS = (4 * 28 * 28, 16384 * 28 * 28)
"""(min_pixels, max_pixels) of the tiny image processor: wide, so that images the prompt
builder has already smart-resized pass through unchanged."""



_CORPUS_WORDS = (
    "I need to click the button on the screen then type text into the field open file menu save "
    "close window cell column row table sheet slide page browser search bar address icon dialog "
    "OK Cancel settings task is done now next first so let us select copy paste scroll down up left "
    "right wait for loading finished the document editor terminal desktop toolbar tab new name value"
)


def tiny_corpus(n: int = 3000) -> list[str]:
    """Synthetic UI-TARS answers and prompt text the tiny tokenizer is trained on.

    Fixed (seed 0) so every tiny model shares one tokenizer. Covers Thought/Action syntax,
    every action name, box tokens, digits and coordinates, key names, so responses tokenize
    compactly.
    """
    rng = random.Random(0)
    words = _CORPUS_WORDS.split()
    keys = ["ctrl", "shift", "alt", "enter", "tab", "esc", "c", "v", "s", "a", "z", "f4", "super", "space"]

    def pt() -> str:
        return f"({rng.randint(0, 1999)},{rng.randint(0, 1199)})"

    def action() -> str:
        k = rng.randrange(11)
        box = f"'<|box_start|>{pt()}<|box_end|>'" if rng.random() < 0.5 else f"'{pt()}'"
        return [
            f"click(start_box={box})",
            f"left_double(start_box={box})",
            f"right_single(start_box={box})",
            f"drag(start_box={box}, end_box='{pt()}')",
            f"hotkey(key='{' '.join(rng.sample(keys, rng.randint(1, 3)))}')",
            f"type(content='{' '.join(rng.sample(words, 3))}\\n')",
            f"scroll(start_box={box}, direction='{rng.choice(['up', 'down', 'left', 'right'])}')",
            "wait()",
            f"finished(content='{' '.join(rng.sample(words, 2))}')",
            "call_user()",
            f"click(point='<point>{rng.randint(0, 1999)} {rng.randint(0, 1199)}</point>')",
        ][k]

    lines = [COMPUTER_USE_PROMPT.format(language="English", instruction="")] * 20
    for _ in range(n):
        thought = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
        lines.append(f"Thought: {thought.capitalize()}.\nAction: {action()}")
    lines.append("0 1 2 3 4 5 6 7 8 9 10 100 1000 1920 1080 1932 1092")
    return lines


def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


@dataclass(frozen=True, kw_only=True)
class TinySize:
    """Size of the tiny model :func:`build_tiny` writes (defaults: about 0.4 M parameters)."""

    hidden_size: int = 64
    """Width of the language model (a multiple of 2 * num_attention_heads: M-RoPE needs it)."""
    intermediate_size: int = 128
    """MLP width of the language model."""
    num_hidden_layers: int = 2
    """Decoder layers of the language model."""
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vision_depth: int = 2
    """Blocks of the vision tower (the last one attends globally, the others in windows)."""
    vision_hidden_size: int = 32
    """Width of the vision tower (a multiple of vision_num_heads)."""
    vision_num_heads: int = 2
    rope_theta: float = 1_000_000.0
    """Base of the language model's rotary frequencies."""
    mrope_section: tuple[int, ...] | None = None
    """Split of half a head's rotary frequencies between the temporal / height / width position
    ids, cycling t, h, w (so more than 3 entries interleave them); they must sum to
    head_dim // 2. None: Qwen's contiguous split, where the width axis gets the lowest
    frequencies (with a tiny head, almost none: the model can hardly tell left from right)."""

    def __post_init__(self) -> None:
        head_dim, rem = divmod(self.hidden_size, self.num_attention_heads)
        if rem or head_dim % 2 or head_dim // 2 < 3:
            raise ConfigError(
                f"hidden_size {self.hidden_size} must split into {self.num_attention_heads} heads of an "
                "even size >= 6 (M-RoPE cuts each head into 3 sections)"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.vision_depth < 1 or self.num_hidden_layers < 1:
            raise ConfigError("vision_depth and num_hidden_layers must be >= 1")
        if self.vision_hidden_size % self.vision_num_heads:
            raise ConfigError("vision_hidden_size must be a multiple of vision_num_heads")
        if self.rope_theta <= 1.0:
            raise ConfigError(f"rope_theta must be > 1, got {self.rope_theta}")
        half = self.hidden_size // self.num_attention_heads // 2
        if self.mrope_section is not None and (sum(self.mrope_section) != half or min(self.mrope_section) < 1):
            raise ConfigError(f"mrope_section {self.mrope_section} must be positive and sum to head_dim // 2 = {half}")

    @property
    def rope_sections(self) -> list[int]:
        """The M-RoPE split used (``mrope_section`` or Qwen's contiguous t, h, w split)."""
        if self.mrope_section is not None:
            return list(self.mrope_section)
        half = self.hidden_size // self.num_attention_heads // 2
        t = half // 4
        h = (half - t) // 2
        return [t, h, half - t - h]


def build_tiny(out_dir: str | Path, *, seed: int = 0, size: TinySize | None = None) -> Path:
    """Write a tiny random-weight Qwen2.5-VL policy to ``out_dir``; returns the directory.

    Reproducible: the same seed gives the same weights (and byte-identical safetensors); the
    tokenizer does not depend on the seed. Takes a few seconds on a CPU (mostly imports).
    ``size`` changes the widths and depths (default :class:`TinySize`, about 0.4 M parameters).
    """
    import torch
    from transformers import GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    size = size or TinySize()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(TINY_VOCAB_SIZE)
    vocab = tokenizer.get_vocab()
    ids = {t: vocab[t] for t in SPECIAL_TOKENS}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(vocab),
            "hidden_size": size.hidden_size,
            "intermediate_size": size.intermediate_size,
            "num_hidden_layers": size.num_hidden_layers,
            "num_attention_heads": size.num_attention_heads,
            "num_key_value_heads": size.num_key_value_heads,
            "max_position_embeddings": 32768,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": size.rope_theta,
                "mrope_section": size.rope_sections,
            },
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": size.vision_depth,
            "hidden_size": size.vision_hidden_size,
            "intermediate_size": 2 * size.vision_hidden_size,
            "num_heads": size.vision_num_heads,
            "out_hidden_size": size.hidden_size,
            "fullatt_block_indexes": [size.vision_depth - 1],
            "window_size": 112,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=[ids[t] for t in STOP_TOKENS],
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"],
        do_sample=False,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    Qwen2VLImageProcessorPil(min_pixels=TINY_PIXELS[0], max_pixels=TINY_PIXELS[1]).save_pretrained(out)
    meta = {"seed": seed, "vocab_size": len(vocab), "size": asdict(size)}
    (out / "dart_tiny.json").write_text(json.dumps(meta) + "\n")
    return out


