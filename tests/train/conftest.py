"""Fixtures of the trainer tests: the tiny random Qwen2.5-VL and batches with real prompt hashes."""

from __future__ import annotations

import io
import random

import pytest

from dart.agent.prompt import PromptConfig, blob_image_loader, build_messages, encode_prompt, prompt_hash
from dart.events import HistoryTurn
from dart.events.manifest import BatchManifest, PromptContext, Sample

SMALL = PromptConfig(min_pixels=4 * 28 * 28, max_pixels=4 * 28 * 28, max_images=2, max_turns=3)
"""Prompt settings that keep every screenshot at 4 image tokens."""

COLORS = ["red", "blue", "green", "yellow", "white", "black", "gray", "purple", "orange", "cyan"]


def png(color: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (56, 56), color).save(buf, "PNG")
    return buf.getvalue()


def make_manifest(store, policy, *, seq: int, groups: int = 2, per_group: int = 3, steps: int = 2,
                  seed: int = 0, prompt_cfg: PromptConfig = SMALL, run_id: str = "test") -> BatchManifest:
    """A batch as the data manager would assemble it: every step's prompt hashed with the real
    builder, responses scored by the policy itself (rollout log-probs = the model's, perturbed)."""
    from dart.agent.model import score_response

    rng = random.Random(seed)
    load = blob_image_loader(store)
    samples = []
    for g in range(groups):
        for r in range(per_group):
            rollout_id = f"s{seed}-g{g}-r{r}"
            reward = float(rng.random() < 0.5) if r > 1 else float(r == 0)
            digests = [store.put(png(rng.choice(COLORS))) for _ in range(steps)]
            history: list[HistoryTurn] = []
            for step in range(steps):
                ctx = PromptContext(instruction=f"task {g}: open the file", step_index=step,
                                    screenshot_digest=digests[step], screen_width=56, screen_height=56,
                                    history=list(history))
                inputs = encode_prompt(policy.tokenizer, policy.image_processor, *build_messages(ctx, load, prompt_cfg))
                text = f"Thought: step {step}\nAction: click(start_box='({rng.randint(0, 55)},{rng.randint(0, 55)})')"
                response = policy.tokenizer(text, add_special_tokens=False)["input_ids"][: 6 + step]
                logprobs, entropies = score_response(policy.model, inputs, response)
                logprobs = [min(0.0, lp + rng.gauss(0.0, 0.05)) for lp in logprobs]
                samples.append(Sample(
                    rollout_id=rollout_id, step_index=step, task_id=f"task{g}", group_id=f"grp{seq}-{g}",
                    context=ctx, prompt_hash=prompt_hash(inputs.input_ids), response_token_ids=response,
                    rollout_logprobs=logprobs, entropies=entropies, policy_version=0, reward=reward,
                ))
                history.append(HistoryTurn(step_index=step, screenshot_digest=digests[step], response_text=text))
    return BatchManifest(batch_id=f"batch-{seq}", seq=seq, run_id=run_id, samples=samples)


@pytest.fixture(scope="session")
def tiny_policy(tiny_dir):
    from dart.agent.model import load_policy

    return load_policy(tiny_dir)
