"""Trainer throughput: tokens/s of one update with and without micro-batching, and weight-publish MB/s.

One update = the trainer's real path after the manifest is loaded: prompts rebuilt from the blob
store and hash-checked, advantages, micro-batches, forward/backward (with the k3 reference
forward), clip, AdamW step. "Without micro-batching" is one sample per forward/backward (pure
gradient accumulation); "with" packs ``--micro`` samples (right-padded) into each pass.
Publishing = write ``model.safetensors`` + ``config.json`` (fsynced) and put both in the blob store.

    .venv/bin/python benchmarks/train_throughput.py [--samples 32] [--micro 8] [--updates 3] [--model DIR]
"""

from __future__ import annotations

import argparse
import io
import random
import tempfile
import time
from pathlib import Path

import torch

from dart.agent.model import load_policy
from dart.agent.prompt import PromptConfig, blob_image_loader, build_messages, encode_prompt, prompt_hash
from dart.agent.tiny import build_tiny
from dart.agent.weight_format import write_weights
from dart.blobs import LocalBlobStore
from dart.events import HistoryTurn
from dart.events.manifest import BatchManifest, PromptContext, Sample
from dart.train.config import EngineConfig, OptimConfig, TrainerConfig
from dart.train.trainer import Trainer
from dart.train.weight_publish import put_weights

PROMPT = PromptConfig(min_pixels=16 * 28 * 28, max_pixels=16 * 28 * 28, max_images=3, max_turns=5)


def png(i: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (112, 112), ((37 * i) % 256, (91 * i) % 256, (53 * i) % 256)).save(buf, "PNG")
    return buf.getvalue()


def manifest(store: LocalBlobStore, policy, samples: int, steps: int = 4) -> BatchManifest:  # type: ignore[no-untyped-def]
    rng = random.Random(0)
    load = blob_image_loader(store)
    out: list[Sample] = []
    traj = 0
    while len(out) < samples:
        digests = [store.put(png(traj * steps + s)) for s in range(steps)]
        history: list[HistoryTurn] = []
        for step in range(steps):
            ctx = PromptContext(instruction="open the report and save it as pdf", step_index=step,
                                screenshot_digest=digests[step], screen_width=112, screen_height=112,
                                history=list(history))
            inputs = encode_prompt(policy.tokenizer, policy.image_processor, *build_messages(ctx, load, PROMPT))
            text = f"Thought: I click the button {step}\nAction: click(start_box='({rng.randint(0, 99)},{rng.randint(0, 99)})')"
            ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Sample(rollout_id=f"r{traj}", step_index=step, task_id=f"t{traj // 4}", group_id=f"g{traj // 4}",
                              context=ctx, prompt_hash=prompt_hash(inputs.input_ids), response_token_ids=ids,
                              rollout_logprobs=[-7.5] * len(ids), entropies=[7.0] * len(ids), policy_version=0,
                              reward=float(traj % 2)))
            history.append(HistoryTurn(step_index=step, screenshot_digest=digests[step], response_text=text))
        traj += 1
    return BatchManifest(batch_id="bench", seq=0, run_id="bench", samples=out[:samples])


def update_rate(model: Path, store: LocalBlobStore, batch: BatchManifest, micro: int, updates: int,
                root: Path) -> tuple[float, float, float, float]:
    """(response tokens/s, sequence tokens/s, s per update, CPU s per update) over ``updates``
    updates after a warm-up. CPU time is this process's: on a shared machine it is the steadier
    of the two."""
    trainer = Trainer(TrainerConfig(model=model, checkpoint_dir=root / f"ckpt-{micro}", blobs=str(store.root),
                                    prompt=PROMPT, optim=OptimConfig(lr=1e-5),
                                    engine=EngineConfig(micro_batch_samples=micro, threads=torch.get_num_threads())), store)
    trainer.update(trainer.prepare(batch))  # warm-up
    seq_tokens = resp_tokens = 0
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(updates):
        prepared = trainer.prepare(batch)
        seq_tokens += sum(int(b.attention_mask_B_L.sum()) for b in prepared.batches)
        report = trainer.update(prepared)
        assert report is not None
        resp_tokens += report.num_tokens
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return resp_tokens / elapsed, seq_tokens / elapsed, elapsed / updates, cpu / updates


def publish_rate(state: dict[str, torch.Tensor], root: Path, store: LocalBlobStore) -> tuple[float, float]:
    """(MB, MB/s) of writing and storing one version of ``state``."""
    out = root / f"publish-{len(state)}"
    start = time.perf_counter()
    write_weights(state, "{}", out)
    refs = put_weights(store, out)
    elapsed = time.perf_counter() - start
    mb = sum(r.size_bytes for r in refs) / 1e6
    return mb, mb / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32, help="samples per batch")
    parser.add_argument("--micro", type=int, default=8, help="samples per micro-batch in the micro-batched run")
    parser.add_argument("--updates", type=int, default=3, help="timed updates per mode")
    parser.add_argument("--model", type=Path, help="policy directory (default: a fresh tiny model)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: CPU time is meaningful)")
    parser.add_argument("--publish-mb", type=int, default=256, help="size of the synthetic state dict to publish")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = args.model or build_tiny(root / "tiny")
        store = LocalBlobStore(root / "blobs")
        policy = load_policy(model)
        batch = manifest(store, policy, args.samples)
        one = update_rate(model, store, batch, 1, args.updates, root)
        many = update_rate(model, store, batch, args.micro, args.updates, root)
        print(f"update, {args.samples} samples, 1 sample per pass:   {one[0]:8.0f} response tok/s "
              f"{one[1]:9.0f} seq tok/s  {one[2]:.3f} s/update ({one[3]:.3f} CPU s)")
        print(f"update, {args.samples} samples, {args.micro} per micro-batch:  {many[0]:8.0f} response tok/s "
              f"{many[1]:9.0f} seq tok/s  {many[2]:.3f} s/update ({many[3]:.3f} CPU s)")
        print(f"micro-batching speed-up: {many[0] / one[0]:.2f}x wall, {one[3] / many[3]:.2f}x CPU time "
              f"({torch.get_num_threads()} threads)")
        mb, rate = publish_rate(policy.model.state_dict(), root, store)
        print(f"weight publish, tiny model: {mb:7.1f} MB at {rate:7.1f} MB/s")
        big = {f"w{i}": torch.randn(1 << 20) for i in range(args.publish_mb // 4)}
        mb, rate = publish_rate(big, root, store)
        print(f"weight publish, synthetic:  {mb:7.1f} MB at {rate:7.1f} MB/s")


if __name__ == "__main__":
    main()
