"""The policy model: what a policy directory holds, loading and saving it, and re-scoring.

Pure module (no bus, no clock). torch / transformers are imported inside the functions so that
importing this module stays cheap.

- :func:`load_policy` loads any policy directory (the tiny model of :mod:`dart.agent.tiny` or
  UI-TARS-1.5-7B) through the real ``from_pretrained`` path. It loads the tokenizer and the image
  processor explicitly: ``AutoProcessor`` fails here because torchvision cannot import beside the
  CPU torch.
- :func:`save_policy` writes a directory :func:`load_policy` reads (weights in the published
  format of :mod:`dart.agent.weight_format`, configs, tokenizer, image processor).
- :func:`score_response` is the re-scoring forward pass: per-token log-probs and entropies of
  a response under a model, the quantity the engines report for the tokens they sampled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dart.agent.vision_attention import use_packed_vision_attention
from dart.agent.weight_format import check_state_dict, state_dict_from_bytes, write_weights
from dart.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from dart.agent.prompt import PromptInputs

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""The Qwen2-VL special tokens, in Qwen's order; the tiny tokenizer gives them ids 0..13."""

STOP_TOKENS: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")
"""Tokens that end an assistant turn."""

CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""The Qwen2-VL chat template (images become ``<|vision_start|><|image_pad|><|vision_end|>``)."""


@dataclass(frozen=True, slots=True)
class Policy:
    """A loaded policy: the HF model (eval mode) and what turns prompts into its inputs."""

    model: Any
    """``Qwen2_5_VLForConditionalGeneration`` (or any HF vision-language causal LM)."""
    tokenizer: Any
    image_processor: Any
    path: Path

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end a response (``<|im_end|>``, ``<|endoftext|>`` where the vocab has them)."""
        vocab = self.tokenizer.get_vocab()
        return tuple(vocab[t] for t in STOP_TOKENS if t in vocab)

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.stop_token_ids[-1])


# ---------------------------------------------------------------- loading


def load_policy(path: str | Path, device: str = "cpu", *, dtype: str | None = None) -> Policy:
    """Load a policy directory (``save_pretrained`` layout) onto ``device``, in eval mode, its vision
    tower's window attention batched (:mod:`dart.agent.vision_attention`).

    ``dtype`` is a torch dtype name ("float32", "bfloat16"); None keeps float32 on CPU and the
    checkpoint's dtype elsewhere. Raises ConfigError naming the directory when it is not one.
    """
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    root = Path(path)
    if not (root / "config.json").is_file():
        raise ConfigError(f"model path {root} has no config.json: build one with `dart model tiny {root}`")
    torch_dtype = getattr(torch, dtype) if dtype else (torch.float32 if device == "cpu" else "auto")
    try:
        tokenizer = AutoTokenizer.from_pretrained(root)
        image_processor = AutoImageProcessor.from_pretrained(root)
        model = AutoModelForImageTextToText.from_pretrained(root, dtype=torch_dtype)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the policy at {root}: {exc}") from exc
    # Same numbers as transformers' per-window SDPA, a handful of calls per layer instead of one per window.
    use_packed_vision_attention(model)
    model = model.to(device).eval()
    return Policy(model=model, tokenizer=tokenizer, image_processor=image_processor, path=root)


def load_policy_with(path: str | Path, weights: bytes | None) -> Policy:
    """:func:`load_policy` on CPU with other weights of the same model: a trainer checkpoint's or a
    published version's ``model.safetensors`` bytes (names, shapes and finiteness checked first;
    BlobCorrupted when they do not fit). None: the directory's own weights."""
    policy = load_policy(path)
    if weights is not None:
        state = state_dict_from_bytes(weights)
        check_state_dict(policy.model, state)
        policy.model.load_state_dict(state)
    return policy


def save_policy(policy: Policy, out: Path, *, state: Mapping[str, torch.Tensor] | None = None) -> Path:
    """Write a directory :func:`load_policy` reads: weights + config as published (``state``, or the
    model's own ``state_dict()``; a ZeRO-3 engine passes its gathered full state), the generation
    config, tokenizer and image processor. Returns ``out``."""
    model = policy.model
    write_weights(model.state_dict() if state is None else state, model.config.to_json_string(), out)
    model.generation_config.save_pretrained(out)
    policy.tokenizer.save_pretrained(out)
    policy.image_processor.save_pretrained(out)
    return out


# ---------------------------------------------------------------- re-scoring


def score_response(
    model: Any, inputs: PromptInputs, response_token_ids: list[int]
) -> tuple[list[float], list[float]]:
    """Log-probs and entropies (nats) of ``response_token_ids`` after the prompt, one forward pass.

    These are of the policy's own distribution (softmax of the raw logits, temperature 1, no
    top-p), the same quantity the engines report for the tokens they sampled. The response
    tokens are text, so ``mm_token_type_ids`` is extended with zeros over them.
    """
    import torch

    device = next(model.parameters()).device
    full = inputs.with_response(response_token_ids).to(device)
    with torch.no_grad():
        logits = model(**full.model_kwargs()).logits[0].float()
    n = len(response_token_ids)
    start = full.input_ids.shape[1] - n
    logp_T_V = torch.log_softmax(logits[start - 1 : start - 1 + n], dim=-1)
    target = full.input_ids[0, start:].unsqueeze(-1)
    logprobs = logp_T_V.gather(-1, target).squeeze(-1)
    entropies = -(logp_T_V.exp() * logp_T_V).sum(-1)
    return logprobs.tolist(), entropies.tolist()
