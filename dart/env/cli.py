"""``dart actions parse`` and ``dart tasks check``: the parser and the task pool at the shell.

Backend capabilities come from the backend package itself where it says what it runs
(``SETUP_TYPES`` or ``SETUP_TYPE`` in ``dart.env.<backend>`` or its ``setup`` module, plus ``register_evaluators()`` / ``register()`` to add its
metrics and getters); :data:`FALLBACK_SETUP_TYPES` covers a backend that does not say yet.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from dart.agent.actions import to_wire
from dart.agent.uitars import parse_response
from dart.config import progress
from dart.env.catalogue import task_events
from dart.env.downloads import DownloadCache, task_urls, url_name
from dart.env.live_check import live_check
from dart.env.tasks import TaskPool, check_pool, ids_of, load_id_list, load_tasks
from dart.errors import ConfigError

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_EXAMPLES = REPO_ROOT.parent / "shared" / "data" / "osworld" / "examples"
BACKENDS = ("xdesktop", "synthetic", "libvirt")
FALLBACK_SETUP_TYPES: dict[str, frozenset[str]] = {
    # Steps a local X desktop can do with no network: start programs, open files, wait, focus.
    "xdesktop": frozenset({"launch", "execute", "command", "open", "sleep", "activate_window"}),
    # The synthetic backend renders its own screens from the spec in its setup step.
    "synthetic": frozenset({"synthetic_screen"}),
    # The OSWorld in-VM server endpoints (files arrive by upload from the host).
    "libvirt": frozenset({"launch", "execute", "command", "open", "sleep", "activate_window", "download"}),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    actions = subparsers.add_parser("actions", help="UI-TARS action text tools")
    asub = actions.add_subparsers(dest="actions_command", metavar="SUBCOMMAND")
    asub.required = True
    p = asub.add_parser(
        "parse",
        help="parse UI-TARS model text (stdin) into actions (JSON on stdout)",
        description=_parse.__doc__,
    )
    p.add_argument("--screen", required=True, type=_screen, help="screen size WxH in pixels, e.g. 1920x1080")
    p.add_argument(
        "--convention", choices=("qwen25vl", "qwen2vl"), default="qwen25vl", help="coordinate convention"
    )
    p.add_argument("--full", action="store_true", help="print thought/reflection/summary too (a JSON object)")
    p.set_defaults(func=_parse)

    tasks = subparsers.add_parser("tasks", help="OSWorld-format task files")
    tsub = tasks.add_subparsers(dest="tasks_command", metavar="SUBCOMMAND")
    tsub.required = True
    c = tsub.add_parser(
        "check", help="what in these tasks cannot run, and held-out overlap", description=_check.__doc__
    )
    c.add_argument(
        "paths", nargs="+", metavar="PATH", help="task file, folder of task files, or id-list file"
    )
    c.add_argument("--holdout", type=Path, help="id-list file of held-out test tasks (e.g. test_all.json)")
    c.add_argument("--backend", choices=BACKENDS, default="libvirt", help="backend whose setup steps count")
    c.add_argument(
        "--examples",
        type=Path,
        default=DEFAULT_EXAMPLES,
        help=f"OSWorld examples folder (default {DEFAULT_EXAMPLES})",
    )
    c.add_argument("--quiet", action="store_true", help="print only the summary")
    c.add_argument("--live", action="store_true",
                   help="xdesktop: run each runnable task's setup, then its evaluator before any action; "
                        "every task must score 0")
    c.add_argument("--sample", type=int, help="--live: check this many runnable tasks, picked at random")
    c.add_argument("--seed", type=int, default=0, help="--live: seed of --sample")
    c.add_argument("--task-timeout-s", type=float, default=180.0, help="--live: time limit of setup, and of scoring")
    c.add_argument("--downloads", type=Path, help="--live: download cache folder (default $DART_DOWNLOADS or .dart/blobs)")
    c.set_defaults(func=_check)

    f = tsub.add_parser(
        "fetch", help="fill the download cache with the files these tasks fetch from URLs",
        description=_fetch.__doc__,
    )
    f.add_argument("paths", nargs="+", metavar="PATH", help="task file, folder of task files, or id-list file")
    f.add_argument("--examples", type=Path, default=DEFAULT_EXAMPLES, help="OSWorld examples folder")
    f.add_argument("--downloads", type=Path, help="download cache folder (default $DART_DOWNLOADS or .dart/blobs)")
    f.add_argument("--from", dest="inbox", type=Path,
                   help="take files from this folder (named as the missing-file error says) instead of the network")
    f.add_argument("--list", action="store_true", help="only list the URLs not in the cache, with their inbox names")
    f.add_argument("--timeout-s", type=float, default=120.0, help="time limit of one download")
    f.set_defaults(func=_fetch)

    # Deferred: loads the Kafka clients and fastavro, and every `dart` command imports this module.
    from dart.bus.cli import add_bus_args

    pub = tsub.add_parser("publish", help="put tasks on the tasks topic (OSWorld files or generated synthetic ones)")
    pub.add_argument("paths", nargs="*", metavar="PATH", help="task file, folder of task files, or id-list file")
    pub.add_argument("--synthetic", metavar="PRESET", help="generate synthetic tasks of this preset instead")
    pub.add_argument("--count", type=int, default=100, help="--synthetic: how many")
    pub.add_argument("--seed", type=int, default=0, help="--synthetic: first generator seed")
    pub.add_argument("--split", choices=["train", "eval", "holdout"], default="train",
                     help="the split the tasks are published as (default %(default)s)")
    pub.add_argument("--backend", choices=BACKENDS, default="synthetic", help="backend that runs them")
    pub.add_argument("--holdout", type=Path, help="id-list file of held-out test tasks: refuse overlaps")
    pub.add_argument("--examples", type=Path, default=DEFAULT_EXAMPLES, help="OSWorld examples folder")
    pub.add_argument("--run-id", default="dev", help="run id stamped on the events")
    add_bus_args(pub)
    pub.set_defaults(func=_publish)


def _publish(args: argparse.Namespace) -> int:
    """Publish tasks; a pool with an unsupported part or a held-out overlap is refused first."""
    # Deferred: loads the Kafka clients and fastavro, and every `dart` command imports this module.
    from dart.bus import Producer, ensure_topics
    from dart.bus.cli import bus_from_args

    if args.synthetic:
        # Deferred: loads Pillow, and every `dart` command imports this module.
        from dart.env.synthetic import generate_tasks

        tasks = generate_tasks(args.count, preset=args.synthetic, seed=args.seed, split=args.split)
    else:
        if not args.paths:
            raise ConfigError("give task PATHs or --synthetic PRESET")
        holdout = ids_of(load_id_list(args.holdout)) if args.holdout else None
        pool = TaskPool.load(args.paths, caps=backend_capabilities(args.backend), holdout_ids=holdout,
                             examples_root=args.examples)
        tasks = [dict(t.raw, domain=t.domain) for t in pool]
    bus = bus_from_args(args)
    ensure_topics(bus)
    producer = Producer(bus, client_id="dart-tasks-publish")
    for event in task_events(tasks, run_id=args.run_id, producer="dart-tasks-publish", split=args.split,
                             backend=args.backend):
        producer.send_nowait(event)
    producer.close()
    print(f"published {len(tasks)} {args.split} tasks for the {args.backend} backend on {bus.topics.tasks}")
    return 0


def _screen(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"screen must look like 1920x1080, got {text!r}") from None
    if w <= 0 or h <= 0:
        raise argparse.ArgumentTypeError(f"screen must be positive, got {text!r}")
    return w, h


def _parse(args: argparse.Namespace) -> int:
    """Read one model answer on stdin; print its actions as a JSON list of wire records
    (kind, x, y, end_x, end_y, text, direction) in screen pixels. Unreadable text prints an
    ``invalid`` record with the reason; the exit status is 0 either way."""
    r = parse_response(sys.stdin.read(), screen=args.screen, convention=args.convention)
    actions = [dataclasses.asdict(to_wire(a)) for a in r.actions]
    out: Any = actions
    if args.full:
        out = {"thought": r.thought, "reflection": r.reflection, "summary": r.summary, "actions": actions}
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")
    return 0


def backend_capabilities(backend: str):
    """Capabilities of ``backend``: its own SETUP_TYPES and evaluators when its package
    declares them, else :data:`FALLBACK_SETUP_TYPES`, plus every registered metric and getter."""
    # Deferred: loads numpy, and every `dart` command imports this module.
    from dart.env.evaluators import capabilities

    if backend not in FALLBACK_SETUP_TYPES:
        raise ConfigError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    setup = FALLBACK_SETUP_TYPES[backend]
    mod, setup_mod = _backend_modules(backend)
    for m in (mod, setup_mod):
        declared, single = getattr(m, "SETUP_TYPES", None), getattr(m, "SETUP_TYPE", None)
        if declared or isinstance(single, str):
            setup = frozenset(declared) if declared else frozenset({single})
            break
    hook = getattr(mod, "register_evaluators", None) or getattr(mod, "register", None)
    if callable(hook):
        hook()
    return capabilities(setup, getattr(setup_mod, "UNAVAILABLE_PROGRAMS", None))


def _backend_modules(backend: str) -> tuple[Any, Any]:
    """The backend's package and its setup module (None for one it lacks, or when they cannot be
    imported here: an optional dependency of that backend is missing)."""
    try:
        if backend == "xdesktop":
            # Deferred: loads aiohttp and Pillow, and every `dart` command imports this module.
            from dart.env import xdesktop
            from dart.env.xdesktop import setup as xdesktop_setup

            return xdesktop, xdesktop_setup
        if backend == "libvirt":
            # Deferred: loads libvirt and aiohttp, and every `dart` command imports this module.
            from dart.env import libvirt
            from dart.env.libvirt import setup as libvirt_setup

            return libvirt, libvirt_setup
        # Deferred: loads Pillow, and every `dart` command imports this module.
        from dart.env import synthetic

        return synthetic, None
    except ImportError as exc:
        log.warning("cannot import the %s backend (%s); using the fallback setup types", backend, exc)
        return None, None


def _check(args: argparse.Namespace) -> int:
    """Load the tasks (folders, task files, id lists resolved against --examples), print each
    task's setup steps, getters and metrics this project cannot run on --backend, a summary,
    and any overlap with --holdout. Exit 0 if they would load as a training pool, else 1."""
    caps = backend_capabilities(args.backend)
    tasks = load_tasks(args.paths, examples_root=args.examples)
    holdout = ids_of(load_id_list(args.holdout)) if args.holdout else frozenset()
    report = check_pool(tasks, caps, holdout)
    by_id = {t.id: t for t in tasks}
    if not args.quiet:
        for tid, parts in report.unsupported.items():
            print(f"{by_id[tid].domain or '-'}/{tid}: {', '.join(parts)}")
    parts_count = Counter(p for parts in report.unsupported.values() for p in parts)
    print(
        f"\n{len(tasks)} tasks on backend {args.backend}: {len(tasks) - len(report.unsupported)} runnable, "
        f"{len(report.unsupported)} need parts not supported yet"
    )
    for part, n in parts_count.most_common(15 if args.quiet else None):
        print(f"  {n:4d}  {part}")
    if report.duplicate_ids:
        print(f"duplicate task ids: {', '.join(report.duplicate_ids)}")
    if holdout:
        print(f"held-out overlap ({args.holdout}): {len(report.holdout_overlap)} of {len(tasks)} tasks")
        if report.holdout_overlap and not args.quiet:
            for tid in report.holdout_overlap:
                print(f"  {tid}")
    if args.live:
        return _live([t for t in tasks if t.id not in report.unsupported], args)
    if report.ok:
        print("pool OK")
        return 0
    print("REFUSED: " + " | ".join(report.problems(limit=3)), file=sys.stderr)
    return 1


def _live(tasks: list[Any], args: argparse.Namespace) -> int:
    """Setup + evaluator-before-acting on a real desktop for the runnable tasks; exit 0 if all score 0."""
    import asyncio
    import random

    # Deferred: loads aiohttp and Pillow, and every `dart` command imports this module.
    from dart.env.xdesktop import XDesktopBackend, XDesktopConfig

    if args.backend != "xdesktop":
        raise ConfigError("--live runs on the xdesktop backend; pass --backend xdesktop")
    if args.sample is not None and args.sample < len(tasks):
        tasks = sorted(random.Random(args.seed).sample(tasks, args.sample), key=lambda t: (t.domain, t.id))
    cfg = XDesktopConfig(downloads=str(args.downloads or ""))
    print(f"\nlive check of {len(tasks)} runnable tasks (setup, then the evaluator before any action):")

    def show(r: Any) -> None:
        score = "" if r.score is None else f" score={r.score:g}"
        print(f"  {r.outcome:21s} {r.domain}/{r.task_id} {r.seconds:5.1f}s{score} {r.detail}", flush=True)

    results = asyncio.run(live_check(tasks, lambda: XDesktopBackend(cfg, slot=0),
                                     timeout_s=args.task_timeout_s, on_result=show))
    counts = Counter(r.outcome for r in results)
    print("live: " + ", ".join(f"{n} {k}" for k, n in counts.most_common()))
    return 0 if all(r.ok for r in results) else 1


def _fetch(args: argparse.Namespace) -> int:
    """Put every file the tasks read from a URL (download steps, cloud_file and cache_file
    getters) into the download cache: from --from DIR where files were copied by hand, else
    from the network. Prints one line per URL still missing; exit 0 when none is."""
    cache = DownloadCache(args.downloads)
    tasks = load_tasks(args.paths, examples_root=args.examples)
    urls = list(dict.fromkeys(u for t in tasks for u in task_urls(t)))
    todo = [u for u in urls if not cache.has(u)]
    missing: list[tuple[str, str]] = []
    for url in todo if args.list else progress(todo, desc="fetch", unit="file"):
        if args.list:
            missing.append((url, "not fetched"))
        elif args.inbox is not None:
            source = args.inbox / url_name(url)
            if source.is_file():
                cache.put_file(url, source)
            else:
                missing.append((url, f"no {source}"))
        else:
            r = cache.fetch(url, timeout_s=args.timeout_s)
            if r.digest is None:
                missing.append((url, r.error))
    for url, why in missing:
        print(f"missing {url_name(url)}  {url}  ({why})")
    print(f"{len(tasks)} tasks read {len(urls)} URLs: {len(urls) - len(missing)} in the cache {cache.root}, "
          f"{len(missing)} missing")
    return 1 if missing else 0
