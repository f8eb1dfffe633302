"""`dart broker`, `dart topics ensure|list`, `dart tail`: the bus commands.

Connection settings come from flags, then ``--run RUN_DIR`` (what `dart up` wrote there), then a
config file's ``bus:`` section, then the environment (DART_BOOTSTRAP, DART_TOPIC_PREFIX), then defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import time
from typing import Any

from dart.bus.broker import DevBroker, broker_answers, ensure_topics
from dart.bus.config import BusConfig
from dart.bus.consumer import read_topic
from dart.bus.topics import CATALOGUE
from dart.config import build, config_mapping
from dart.errors import BusError, ConfigError
from dart.events import to_json_dict
from dart.rundir import add_run_arg, live_bus, run_of


def add_bus_args(p: argparse.ArgumentParser, *, config: bool = True, run: bool = True) -> None:
    """--bootstrap, --prefix, --run (unless ``run`` is False: the command names a run's directory
    for something else) and (unless the command takes ``[CONFIG] [KEY=VALUE ...]``) --config."""
    g = p.add_argument_group("event log")
    if run:
        add_run_arg(p)
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
        data["bootstrap"], data["prefix"] = live_bus(run, configured=os.environ.get("DART_BOOTSTRAP"),
                                                     secret=bool(base.security.password))
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


def cmd_broker(args: argparse.Namespace) -> int:
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
    cfg = bus_from_args(args)
    created = ensure_topics(cfg)
    for name in cfg.topics.all():
        print(f"{name:32s} {'created' if name in created else 'exists'}")
    return 0


def cmd_topics_list(args: argparse.Namespace) -> int:
    cfg = bus_from_args(args)
    for spec in CATALOGUE:
        retention = "forever" if spec.retention_ms < 0 else f"{spec.retention_ms // 3_600_000} h"
        print(f"{cfg.topics.name(spec.suffix):28s} partitions={cfg.partitions_of(spec.suffix)} key={spec.key_field or '-':10s} "
              f"retention={retention:8s} {'compacted ' if spec.compacted else ''}"
              f"events={','.join(e.__name__ for e in spec.events)}  # {spec.doc}")
    return 0


def cmd_tail(args: argparse.Namespace) -> int:
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
    suffixes = [spec.suffix for spec in CATALOGUE]
    for prefix in (f"{cfg.prefix}.", "dart.", ""):
        if given.startswith(prefix) and given[len(prefix):] in suffixes:
            return cfg.topics.name(given[len(prefix):])
    raise ConfigError(f"no topic {given!r} in the catalogue; one of: {', '.join(suffixes)} "
                      f"(with the prefix {cfg.prefix!r}: {cfg.topics.name(suffixes[0])}, ...)")


def require_broker(cfg: BusConfig) -> None:
    """BusError naming the address and the fix unless a broker answers there."""
    if not broker_answers(cfg.bootstrap, timeout_s=3.0, security=cfg.security):
        raise BusError(f"no broker answers on {cfg.bootstrap}: during `make run` name the run "
                       f"(--run runs/local), else start one (`dart broker`) or give its address (--bootstrap HOST:PORT)")
