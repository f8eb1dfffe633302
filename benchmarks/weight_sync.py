"""Weight sync: "version published -> every one of N rollout workers serving it", two paths.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/weight_sync.py                 # tiny .. 1.0B, N = 1, 2
    PYTHONPATH=$PWD .venv/bin/python benchmarks/weight_sync.py --sizes tiny,26m --versions 1

Per model size (random Qwen2.5-VL in bfloat16, built once under ``--workdir``) and N: one dev
broker topic prefix, N real rollout-worker processes (`dart rollout-worker`, hf engine,
``transfer.kind: direct`` with ranks 1..N) and, in this process, the trainer's publication step
exactly as the trainer runs it: ``WeightTransfer.publish`` of a checkpoint directory, then the
``WeightsPublished`` event. ``blobs`` publishes with :class:`BlobTransfer` (no weights group yet,
so the workers fetch from the blob store); ``direct`` with :class:`DirectSender` (gloo group of
the trainer and the N workers; the blob store still gets its copy, concurrently). Each version's
time runs from the start of ``publish`` to the last worker's ``WeightsLoaded`` (its
``event_time``: after the swap), so it covers storing, moving, verifying, parsing and swapping.

Bytes moved: the version's safetensors size x N (what reaches the workers); bandwidth = that /
time. For ``direct`` the broadcast alone (``bcast_s``) is also reported. Results:
``benchmarks/results/weight_sync.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dart.agent.config import TransferConfig  # noqa: E402
from dart.agent.tiny import TinySize, build_tiny  # noqa: E402
from dart.agent.weight_format import WEIGHTS_FILE, write_weights  # noqa: E402
from dart.blobs import LocalBlobStore  # noqa: E402
from dart.bus import BusConfig, Consumer, DevBroker, Producer, ensure_topics  # noqa: E402
from dart.events import WeightsLoaded  # noqa: E402
from dart.train.engine import free_port  # noqa: E402
from dart.train.weight_publish import weights_published  # noqa: E402
from dart.train.weight_send import BlobTransfer, DirectSender  # noqa: E402

SIZES = {
    "tiny": TinySize(),
    "26m": TinySize(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                    num_key_value_heads=4),
    "160m": TinySize(hidden_size=1024, intermediate_size=2816, num_hidden_layers=14, num_attention_heads=16,
                     num_key_value_heads=4),
    "1.0b": TinySize(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=16,
                     num_key_value_heads=4),
}


@dataclass
class Row:
    size: str
    params: int
    bytes: int
    path: str
    workers: int
    version: int
    write_s: float
    """The trainer's checkpoint writer: the state dict to its ``model.safetensors`` (fsynced), untimed
    in ``serving_s`` (a checkpoint is written for every update, published or not)."""
    publish_s: float
    """publish() returned (blob stored; for direct also the broadcast done)."""
    serving_s: float
    """publish start -> the last worker's WeightsLoaded."""
    bcast_s: float
    fetch_s: float
    """Slowest worker's fetch (blob: read + verify + parse; direct: waiting for the staged tensors)."""
    swap_s: float

    @property
    def moved(self) -> int:
        return self.bytes * self.workers


def build_model(name: str, workdir: Path) -> Path:
    out = workdir / f"model-{name}"
    if (out / WEIGHTS_FILE).exists():
        return out
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # random weights written in bf16, as a GPU policy would be
    try:
        t0 = time.perf_counter()
        build_tiny(out, seed=0, size=SIZES[name])
        print(f"built {name} in {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        torch.set_default_dtype(previous)
    return out


def base_state(model: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The policy's ``state_dict()`` as the trainer publishes it (its names, bf16), and its config."""
    from dart.agent.model import load_policy

    policy = load_policy(model, "cpu", dtype="bfloat16")
    return policy.model.state_dict(), policy.model.config.to_json_string()


def version_dir(base: tuple[dict[str, torch.Tensor], str], version: int, out: Path) -> Path:
    """A checkpoint directory of version ``version``, written by the trainer's writer: the policy
    with its first tensor changed (new bytes, so the content-addressed store really stores it)."""
    state, config_json = base
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    first = next(iter(state))
    write_weights({**state, first: state[first] + version * 1e-3}, config_json, out)
    return out


def start_workers(bus: BusConfig, model: Path, store: Path, transfer: dict, n: int, workdir: Path) -> list:
    procs = []
    for rank in range(1, n + 1):
        cfg = workdir / f"worker-{rank}.yaml"
        cfg.write_text(yaml.safe_dump({
            "bus": {"bootstrap": bus.bootstrap, "prefix": bus.prefix},
            "rollout": {"model": str(model), "dtype": "bfloat16", "blobs": str(store), "worker_id": f"rollout-{rank}",
                        "run_id": "bench", "group": f"rollout-{bus.prefix}", "max_concurrency": 1, "heartbeat_s": 60.0, "hf": {"threads": 1},
                        "transfer": {**transfer, "rank": rank}},
        }))
        log = (workdir / f"worker-{rank}.log").open("ab")
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-m", "dart.cli", "rollout-worker", "--config", str(cfg)],
                                      cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def stop_workers(procs: list) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Loaded:
    """WeightsLoaded events as they arrive on the heartbeats topic."""

    def __init__(self, bus: BusConfig) -> None:
        self.events: list[WeightsLoaded] = []

        async def handle(delivered) -> None:
            if isinstance(delivered.event, WeightsLoaded):
                self.events.append(delivered.event)

        self.consumer = Consumer(bus, topics=[bus.topics.heartbeats], group=f"bench-{uuid.uuid4().hex[:6]}",
                                 handler=handle)
        self.task = asyncio.create_task(self.consumer.run())

    async def wait(self, version: int, n: int, timeout_s: float) -> list[WeightsLoaded]:
        deadline = time.monotonic() + timeout_s
        while True:
            got = [e for e in self.events if e.version == version]
            if len(got) >= n:
                bad = [e for e in got if not e.ok]
                if bad:
                    raise RuntimeError(f"version {version} refused: {bad[0].error}")
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"version {version}: {len(got)} of {n} workers after {timeout_s} s")
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        self.consumer.stop()
        await asyncio.wait([self.task], timeout=10)


async def wait_ready(procs: list, loaded_workers: int, workdir: Path, timeout_s: float) -> None:
    """Until every worker logged that its consumers started (it then follows the weights topic)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ready = sum("rollout-weights-" in (text := (workdir / f"worker-{r}.log").read_text(errors="replace"))
                    and "partitions" in text.split("rollout-weights-", 1)[1]
                    for r in range(1, len(procs) + 1))
        if ready >= loaded_workers:
            return
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"a worker exited with {p.returncode}; see {workdir}/worker-*.log")
        if time.monotonic() > deadline:
            raise TimeoutError("workers did not start")
        await asyncio.sleep(0.2)


async def measure(bus: BusConfig, store: LocalBlobStore, transfer, loaded: Loaded, *, name: str, params: int,
                  path: str, n: int, version: int, vdir: Path, write_s: float, timeout_s: float) -> Row:
    producer = Producer(bus, client_id="trainer")
    try:
        t0 = time.time()
        refs = await asyncio.to_thread(transfer.publish, version, vdir, store)
        published = time.time()
        await producer.send(weights_published(run_id="bench", producer="trainer", version=version, blobs=refs,
                                              train_step=version, batch_id=None))
        got = await loaded.wait(version, n, timeout_s)
    finally:
        await asyncio.to_thread(producer.close)
    done = max(e.event_time for e in got) / 1000.0
    size = (vdir / WEIGHTS_FILE).stat().st_size
    bcast = transfer.sent.get(version, 0.0) if isinstance(transfer, DirectSender) else 0.0
    row = Row(size=name, params=params, bytes=size, path=path, workers=n, version=version, write_s=write_s,
              publish_s=published - t0, serving_s=done - t0, bcast_s=bcast, fetch_s=max(e.fetch_s for e in got),
              swap_s=max(e.swap_s for e in got))
    print(f"  {name:>5} {path:>6} N={n} v{version}: serving {row.serving_s:.2f} s (write {row.write_s:.2f}, "
          f"publish {row.publish_s:.2f}, "
          f"bcast {row.bcast_s:.2f}, fetch {row.fetch_s:.2f}, swap {row.swap_s:.2f}); "
          f"{row.moved / 1e6 / row.serving_s:.0f} MB/s", flush=True)
    return row


async def run_point(broker: DevBroker, name: str, n: int, versions: int, workdir: Path, timeout_s: float) -> list[Row]:
    from safetensors import safe_open

    model = build_model(name, workdir)
    with safe_open(str(model / WEIGHTS_FILE), "pt") as f:
        params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118 - not iterable
    base = await asyncio.to_thread(base_state, model)
    bus = BusConfig(bootstrap=broker.bootstrap, prefix=f"ws{uuid.uuid4().hex[:8]}")
    ensure_topics(bus)
    blobs_dir = workdir / "blobs"
    shutil.rmtree(blobs_dir, ignore_errors=True)
    store = LocalBlobStore(blobs_dir)
    transfer = {"kind": "direct", "address": f"127.0.0.1:{free_port()}", "workers": n, "timeout_s": 120.0,
                "bucket_mb": 64}
    for old_log in workdir.glob("worker-*.log"):
        old_log.unlink()
    procs = start_workers(bus, model, blobs_dir, transfer, n, workdir)
    loaded = Loaded(bus)
    rows = []
    sender = None
    try:
        await wait_ready(procs, n, workdir, timeout_s)
        version = 0
        for path in ("blobs", "direct"):
            if path == "direct":
                sender = DirectSender(TransferConfig(**{**transfer, "rank": 0}))
                deadline = time.monotonic() + timeout_s
                while not sender.ready:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the weights group did not form")
                    await asyncio.sleep(0.1)
                await asyncio.sleep(TICK_WAIT)  # the workers' first tick: they know the group is up
            for _ in range(versions):
                version += 1
                t0 = time.perf_counter()
                vdir = await asyncio.to_thread(version_dir, base, version, workdir / f"{name}-v{version}")
                rows.append(await measure(bus, store, sender or BlobTransfer(), loaded, name=name, params=params,
                                          path=path, n=n, version=version, vdir=vdir,
                                          write_s=time.perf_counter() - t0, timeout_s=timeout_s))
                shutil.rmtree(vdir, ignore_errors=True)
    finally:
        if sender is not None:
            await asyncio.to_thread(sender.close)
        await loaded.close()
        stop_workers(procs)
        shutil.rmtree(blobs_dir, ignore_errors=True)
    return rows


TICK_WAIT = 0.5


def table(rows: list[Row]) -> str:
    """One line per (size, N, path), the best of its versions; ratios blob / direct."""
    best: dict[tuple[str, int, str], Row] = {}
    for r in rows:
        key = (r.size, r.workers, r.path)
        if key not in best or r.serving_s < best[key].serving_s:
            best[key] = r
    lines = ["| model | params | bytes | N | path | published → all serving | checkpoint write | "
             "publish (store [+ bcast]) | broadcast | slowest fetch | swap | bytes to workers | achieved | "
             "blobs / direct |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (size, n, path), r in best.items():
        other = best.get((size, n, "blobs"))
        ratio = f"{other.serving_s / r.serving_s:.2f}×" if path == "direct" and other else ""
        lines.append(f"| {size} | {r.params / 1e6:.1f} M | {r.bytes / 1e6:.1f} MB | {n} | {path} | {r.serving_s:.2f} s | "
                     f"{r.write_s:.2f} s | {r.publish_s:.2f} s | {r.bcast_s:.2f} s | {r.fetch_s:.2f} s | {r.swap_s:.2f} s | "
                     f"{r.moved / 1e6:.1f} MB | {r.moved / 1e6 / r.serving_s:.0f} MB/s | {ratio} |")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,26m,160m,1.0b", help=f"of {', '.join(SIZES)}")
    parser.add_argument("--workers", default="1,2", help="values of N")
    parser.add_argument("--versions", type=int, default=2, help="versions timed per path (the best is tabled)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dart-weight-sync"))
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "weight_sync")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    started = time.time()
    with DevBroker(log_path=args.workdir / "tansu.log") as broker:
        for name in args.sizes.split(","):
            for n in (int(x) for x in args.workers.split(",")):
                rows += await run_point(broker, name, n, args.versions, args.workdir, args.timeout_s)
    text = table(rows)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"command": "benchmarks/weight_sync.py " + " ".join(sys.argv[1:]), "started": started,
            "wall_s": time.time() - started, "machine": f"{os.cpu_count()} CPU cores (shared), no GPU, gloo on loopback"}
    args.out.with_suffix(".json").write_text(json.dumps({**meta, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(
        f"# Weight sync: published → every rollout worker serving\n\n`PYTHONPATH=$PWD .venv/bin/python "
        f"{meta['command']}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {meta['machine']}, "
        f"{meta['wall_s'] / 60:.1f} min)\n\n{text}\n")


if __name__ == "__main__":
    asyncio.run(main())
