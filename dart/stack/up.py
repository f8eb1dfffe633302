"""`dart up CONFIG`: a whole asynchronous RL run on one machine.

    broker  -> tasks on the log -> tiny policy + SFT warm start -> held-out eval (warm)
            -> data manager, env workers, rollout workers, trainer (supervised processes)
            -> RL for `rl_minutes` with a live display -> clean stop -> held-out eval (RL)

Ctrl-C at any point stops the services with SIGTERM (each finishes its record in hand and
commits) and then the broker; the summary of what happened is printed and written to
``WORKDIR/summary.json``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dart.agent.model import load_policy_with
from dart.agent.tiny import build_tiny
from dart.agent.weight_format import WEIGHTS_FILE
from dart.blobs import LocalBlobStore
from dart.bus import BusConfig, DevBroker, Producer, ensure_topics
from dart.config import as_mapping
from dart.data.cli import sql_client
from dart.data.experience import samples_as_experience
from dart.data.report import build_report, write_plots
from dart.env.catalogue import task_events
from dart.errors import BlobError
from dart.events import now_ms
from dart.log import list_segments
from dart.log.restore import import_archive
from dart.recipe.config import make_dev_tasks, make_tasks
from dart.recipe.episodes import evaluate, success_by_instruction
from dart.recipe.measure import outcomes_to_json, paired_gain, success
from dart.recipe.preset import warm_start_kind
from dart.recipe.warmstart import oracle_samples, warm_start
from dart.rundir import mark_stopped, tensorboard_dir, write_descriptor
from dart.stack.config import StackConfig, downloads_root
from dart.stack.osworld import OsworldPool, osworld_pool, wait_until_serving
from dart.stack.progress import Display, Progress, Snapshot, render
from dart.stack.select import Published, policy_at, published_versions, select_version
from dart.stack.services import service_configs, service_specs, write_configs
from dart.stack.supervisor import Supervisor
from dart.train.checkpoint import latest_checkpoint, read_state

log = logging.getLogger(__name__)

SERVE_START_S = 300.0
"""How long `dart up` waits for the `dart serve` it started to answer (torch and the model load
first, which takes minutes on a loaded 2-core machine)."""


def say(line: str) -> None:
    print(f"[dart up] {line}", flush=True)


def register_tasks(bus: BusConfig, run_id: str, tasks: list[dict[str, Any]], split: str,
                   backend: str = "synthetic") -> None:
    producer = Producer(bus, client_id="dart-up")
    for event in task_events(tasks, run_id=run_id, producer="dart-up", split=split, backend=backend):
        producer.send_nowait(event)
    producer.close()


def import_oracle_experience(bus: BusConfig, run_id: str, tasks: list[dict[str, Any]], policy: Any,
                             store: LocalBlobStore, cfg: StackConfig) -> int:
    """Oracle solutions of ``tasks`` into the experience pool (events on the log, origin=oracle),
    so the data manager can inject a success into a group whose online rollouts all failed."""
    events, trajectories = samples_as_experience(
        oracle_samples(tasks, policy, store, cfg), run_id=run_id, origin="oracle", at_ms=now_ms(),
        decode=lambda ids: policy.tokenizer.decode(ids, skip_special_tokens=True))
    producer = Producer(bus, client_id="dart-up-experience")
    for event in events:
        producer.send_nowait(event)
    producer.close()
    return trajectories


def _shown(path: Path) -> str:
    """``path`` relative to the current directory where it is under it (as a user would type it)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def free_port() -> int:
    """A TCP port free on the loopback interface now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def load_checkpoint_policy(base_dir: Path, checkpoint: Path | None) -> Any:
    """The policy of ``base_dir`` with the weights of a trainer checkpoint (if any)."""
    return load_policy_with(base_dir, None if checkpoint is None else (checkpoint / WEIGHTS_FILE).read_bytes())


Outcomes = list[tuple[dict[str, Any], bool]]
"""Held-out episodes as (task, solved), for the success per instruction."""


def up(cfg: StackConfig, *, stop_after_s: float | None = None, config_file: Path | None = None) -> dict[str, Any]:
    """Run the whole thing; returns the summary (also written to WORKDIR/summary.json). While it
    runs, WORKDIR/run.json says where the run's broker, topics, store and blobs are (`--run WORKDIR`)."""
    t_start = time.monotonic()
    recipe = cfg.recipe
    train, held_out, pool = run_tasks(cfg)
    workdir = cfg.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config").mkdir(exist_ok=True)
    store = LocalBlobStore(workdir / "blobs")
    summary: dict[str, Any] = {"run_id": cfg.run_id, "pipeline": cfg.pipeline, "workdir": str(workdir)}
    warm_outcomes: Outcomes = []

    broker = None
    if not cfg.bootstrap:
        broker = DevBroker(log_path=workdir / "broker.log").start()
        say(f"dev broker (tansu) on {broker.bootstrap}")
    # A reply partition per env worker (worker i reads partition i): none reads another's answers.
    bus = BusConfig(bootstrap=cfg.bootstrap or broker.bootstrap, prefix=f"dart-{cfg.run_id}",  # type: ignore[union-attr]
                    partitions={"rollout.actions": max(4, cfg.env.workers)})
    # Every service serves Prometheus /metrics on a port of its own and writes it to WORKDIR/metrics/<name>.port.
    for stale in (workdir / "metrics").glob("*.port"):
        stale.unlink()
    supervisor = Supervisor(workdir / "logs", base_env={"DART_BOOTSTRAP": bus.bootstrap,
                                                        "DART_METRICS_DIR": str(workdir / "metrics"),
                                                        "DART_RUN_ID": cfg.run_id})
    try:
        ensure_topics(bus)
        if not (broker is not None and restore_log(workdir / "log", bus)):
            register_tasks(bus, cfg.run_id, train, "train", backend=cfg.env.backend if pool is not None else "synthetic")
            register_tasks(bus, cfg.run_id, held_out, "eval")
        # Once the topics and the tasks are there: a `dart tail --run` started as soon as run.json
        # appears finds them (written before, a fast reader could find no topic yet).
        write_descriptor(workdir, run_id=cfg.run_id, bootstrap=bus.bootstrap, prefix=bus.prefix, config=config_file,
                         pid=os.getpid())
        say(f"run {cfg.run_id!r} in {workdir}: topics {bus.prefix}.* on {bus.bootstrap}; read it with --run, e.g. "
            f"`dart tail --run {_shown(workdir)} dart.trajectories`")
        if pool is not None:
            say(f"{pool.describe()}; on {bus.topics.tasks}")
        else:
            say(f"{len(train)} training and {len(held_out)} held-out {recipe.preset!r} tasks on {bus.topics.tasks}")
        warm_dir = warm_policy(cfg, workdir, store, train, summary)
        if cfg.evaluate:
            t0 = time.monotonic()
            summary["warm_success"] = held_out_success(warm_dir, None, held_out, cfg, store, phase=1,
                                                       outcomes=warm_outcomes)
            warm = success(warm_outcomes)
            summary.update(warm_se=warm.se, eval_tasks=warm.tasks, warm_eval_s=round(time.monotonic() - t0, 1))
            say(f"warm start: held-out success {warm.points()} over {warm.tasks} tasks "
                f"({recipe.held_out_episodes} episodes, {summary['warm_eval_s']:.0f} s)")
        if cfg.experience_tasks:
            n = import_oracle_experience(bus, cfg.run_id, train[: cfg.experience_tasks],
                                         load_checkpoint_policy(warm_dir, None), store, cfg)
            say(f"experience pool: {n} oracle trajectories on the log (injected into all-fail groups)")
        # What the services ran with: each one's config object as its process was given it.
        summary["services"] = {name: as_mapping(obj)
                               for name, (_, obj) in start_services(cfg, supervisor, workdir, bus).items()}
        summary.update(_rl_phase(cfg, supervisor, workdir, stop_after_s=stop_after_s, broker=broker, bus=bus))
    except KeyboardInterrupt:
        say("interrupted: stopping every service cleanly")
        summary["interrupted"] = True
    finally:
        stop_services(supervisor)
        if broker is not None:
            broker.stop()
        mark_stopped(workdir)

    report_dir = write_run_report(workdir)
    if report_dir is not None:
        summary["report"] = str(report_dir)
    checkpoint = latest_checkpoint(workdir / "checkpoints")
    summary["final_checkpoint"] = str(checkpoint) if checkpoint else None
    if cfg.evaluate and not summary.get("interrupted") and "warm_success" in summary:
        policy = rl_policy(cfg, workdir, store, Path(summary["warm_model"]), checkpoint, summary)
        t0 = time.monotonic()
        rl_outcomes: Outcomes = []
        summary["rl_success"] = evaluate(policy, held_out, recipe.held_out_episodes, store=store, cfg=cfg,
                                         phase=2, outcomes=rl_outcomes)
        summary["delta"] = summary["rl_success"] - summary["warm_success"]
        rl, gain = success(rl_outcomes), paired_gain(warm_outcomes, rl_outcomes)
        summary.update(rl_se=rl.se, delta_se=gain.se, rl_eval_s=round(time.monotonic() - t0, 1))
        summary["held_out_by_instruction"] = by_instruction(warm_outcomes, rl_outcomes)
        (workdir / "held_out.json").write_text(json.dumps(
            {"warm": outcomes_to_json(warm_outcomes), "rl": outcomes_to_json(rl_outcomes)}))
        say(f"RL policy: held-out success {rl.points()} over {rl.tasks} tasks ({recipe.held_out_episodes} episodes, "
            f"{summary['rl_eval_s']:.0f} s); gain {gain.points(signed=True)} points (paired over the same tasks)")
        if report_dir is not None:
            with open(report_dir / "report.txt", "a") as fh:
                fh.write(held_out_lines(summary) + "\n")
    summary["total_s"] = round(time.monotonic() - t_start, 1)
    summary["recipe"] = _jsonable(asdict(recipe))
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    _print_summary(summary)
    return summary


def run_tasks(cfg: StackConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]], OsworldPool | None]:
    """(training tasks, held-out tasks, the OSWorld pool when the tasks are OSWorld's). An OSWorld
    pool with nothing left to run is refused here, before anything starts."""
    if cfg.tasks.source == "osworld":
        pool = osworld_pool(cfg.tasks, backend=cfg.env.backend, downloads=downloads_root(cfg.tasks))
        return pool.tasks, [], pool
    train, held_out = make_tasks(cfg.recipe)
    return train, held_out, None


def warm_policy(cfg: StackConfig, workdir: Path, store: LocalBlobStore, train: list[dict[str, Any]],
                summary: dict[str, Any]) -> Path:
    """The policy RL starts from, where the recipe's preset put it (the services' ``model``):
    the config's ``warm_model``, a random tiny one for OSWorld (no oracle demonstrations), else
    the recipe's SFT warm start (``sft_s`` into ``summary``)."""
    recipe = cfg.recipe
    t0 = time.monotonic()
    kind = warm_start_kind(recipe, warm_model=cfg.warm_model, osworld=cfg.osworld)
    if kind == "given":
        warm_dir = cfg.warm_model.resolve()  # type: ignore[union-attr]
        say(f"warm start: the given policy {warm_dir}")
    elif kind == "random":
        warm_dir = build_tiny(workdir / "init", seed=recipe.seed, size=recipe.model)
        say(f"policy: a tiny random-weight Qwen2.5-VL in {warm_dir} (no warm start: OSWorld tasks come "
            "without oracle demonstrations; give warm_model for a trained one)")
    else:
        say(f"warm start: tiny Qwen2.5-VL, SFT on {recipe.sft_demos} oracle demonstrations "
            f"({recipe.sft_steps} optimiser steps of {recipe.sft_micro_batch})")
        warm_dir = warm_start(cfg, workdir, store, train, log=say)
        summary["sft_s"] = round(time.monotonic() - t0, 1)
        say(f"warm start written to {warm_dir} in {summary['sft_s']} s")
    summary["warm_model"] = str(warm_dir)
    return warm_dir


def held_out_success(model_dir: Path, checkpoint: Path | None, held_out: list[dict[str, Any]], cfg: StackConfig,
                     store: LocalBlobStore, *, phase: int, outcomes: Outcomes) -> float:
    """Held-out success of ``model_dir`` (with a trainer checkpoint's weights, if any)."""
    return evaluate(load_checkpoint_policy(model_dir, checkpoint), held_out, cfg.recipe.held_out_episodes, store=store,
                    cfg=cfg, phase=phase, outcomes=outcomes)


def rl_policy(cfg: StackConfig, workdir: Path, store: LocalBlobStore, warm_model: Path, checkpoint: Path | None,
              summary: dict[str, Any], published: list[Published] | None = None) -> Any:
    """The policy the run hands over: the dev check's pick when the recipe asks for one, else (or
    when the check cannot run: a version's weights missing from the blob store) the last checkpoint.
    ``published``: the run's versions (default: read from its store)."""
    if cfg.recipe.dev_tasks:
        try:
            picked = dev_selection(cfg, published_versions(workdir) if published is None else published, store,
                                   warm_model, summary)
        except BlobError as exc:
            summary["dev_check_error"] = str(exc)
            say(f"dev check stopped ({exc}): the last checkpoint is handed over")
        else:
            if picked is not None:
                return picked
    return load_checkpoint_policy(warm_model, checkpoint)


def dev_selection(cfg: StackConfig, published: list[Published], store: LocalBlobStore, warm_model: Path,
                  summary: dict[str, Any]) -> Any | None:
    """The best of the run's dev checks (:mod:`dart.stack.select`), its version and the checks into
    ``summary``; None when no trained version was published."""
    recipe = cfg.recipe
    dev = make_dev_tasks(recipe)
    t0 = time.monotonic()

    def dev_success(p: Published) -> float:
        rate = evaluate(policy_at(warm_model, store, p), dev, len(dev), store=store, cfg=cfg,
                        phase=100 + p.version)
        say(f"dev check: v{p.version} solves {100 * rate:.1f} % of {len(dev)} dev tasks")
        return rate

    chosen = select_version(published, every=recipe.check_every, dev_success=dev_success)
    if chosen is None:
        return None
    summary.update(selected_version=chosen.version, last_version=chosen.last, dev_tasks=len(dev),
                   dev_checks=[list(c) for c in chosen.checks], dev_s=round(time.monotonic() - t0, 1))
    say(f"{chosen.describe(len(dev))} ({summary['dev_s']:.0f} s; the held-out tasks play no part in the choice)")
    # one policy in memory at a time: the kept version is loaded again from its blob
    return policy_at(warm_model, store, next(p for p in published if p.version == chosen.version))


def by_instruction(warm: Outcomes, rl: Outcomes) -> list[dict[str, Any]]:
    """Which skills the warm start brought and which RL added (make run: which colours it reads)."""
    warm_by = success_by_instruction(warm)
    return [{"instruction": ins, "tasks": n, "warm": warm_by.get(ins, (n, None))[1], "rl": rate}
            for ins, (n, rate) in success_by_instruction(rl).items()]


def start_services(cfg: StackConfig, supervisor: Supervisor, workdir: Path,
                   bus: BusConfig) -> dict[str, tuple[str, Any]]:
    """Write every service's config and start it under ``supervisor``; rollout workers of a
    ``dart serve`` start once it answers. Returns the configs (:func:`service_configs`)."""
    sections = service_configs(cfg, serve_port=free_port())
    write_configs(sections, {"bootstrap": bus.bootstrap, "prefix": bus.prefix}, workdir / "config")
    specs = service_specs(sections, workdir / "config",
                          nice={"env": cfg.env.nice, "rollout": cfg.rollout.nice, "serve": cfg.rollout.nice})
    rollouts = [spec for spec in specs if spec.name.startswith("rollout-")] if "serve" in sections else []
    for spec in specs:
        if spec not in rollouts:
            supervisor.start(spec)
    if "serve" in sections:
        # Rollout workers start once the policy server answers (the other services start
        # meanwhile): their first requests would spend the engine's retries on a server still loading.
        url = f"http://127.0.0.1:{sections['serve'][1].port}/v1"
        waited = wait_until_serving(url, timeout_s=SERVE_START_S,
                                    alive=lambda: supervisor.services["serve"].proc.poll() is None)
        say(f"dart serve answers on {url} ({waited:.0f} s after dart up started it)")
    for spec in rollouts:
        supervisor.start(spec)
    if "metrics" in sections:
        say(f"watch it: tensorboard --logdir {tensorboard_dir(workdir, cfg.run_id).parent} --host 127.0.0.1; "
            f"Prometheus /metrics "
            f"ports in {workdir / 'metrics'}/<service>.port")
    return sections


def stop_services(supervisor: Supervisor) -> None:
    """Producers first; the data manager last, so it projects everything they wrote (on SIGTERM it
    stops deciding, drains the log's tail into the store, then exits). The archiver goes after
    the data manager: the log's last records reach the archive. The metrics sink reads on to the
    log's end once nothing writes to it any more."""
    if not supervisor.services:
        return
    producers = [n for n in supervisor.services if n not in ("data-manager", "archiver", "metrics")]
    supervisor.stop(producers)
    for last in ("data-manager", "archiver", "metrics"):
        if last in supervisor.services:
            supervisor.stop([last])


def write_run_report(workdir: Path) -> Path | None:
    """`dart report` of the finished run into WORKDIR/report (text + PNGs), from its store once
    the data manager has let go of it; a report that cannot be made is said, never fatal."""
    if not (workdir / "chdb").exists():
        return None
    out = workdir / "report"
    try:
        client = sql_client(None, f"chdb://{workdir / 'chdb'}", "dart")
        try:
            report = build_report(lambda sql: client.query(sql).result_rows)
        finally:
            client.close()
        out.mkdir(exist_ok=True)
        (out / "report.txt").write_text(report.text() + "\n")
        write_plots(report, out)
    except Exception as exc:  # the run's results stand without their report
        say(f"no report: {type(exc).__name__}: {exc}")
        return None
    say(f"report of the run in {out} (report.txt, learning.png, success_by_time.png, ...)")
    return out


def restore_log(log_dir: Path, bus: BusConfig) -> bool:
    """Rebuild the fresh dev broker from an existing run directory's archive; False when there is none."""
    if not list_segments(log_dir):
        return False
    done = import_archive(log_dir, bus)
    say(f"log restored from {log_dir}: {sum(done.records.values())} records of {len(done.records)} topics at their "
        f"offsets, positions of {len(done.groups)} consumer groups ({done.seconds} s)")
    return True


def recover_broker(broker: DevBroker, supervisor: Supervisor, bus: BusConfig, log_dir: Path) -> None:
    """The dev broker died: stop every service, start the broker again on its port, restore it
    from the archive (records at their offsets, group positions), then start the services again.

    The archiver stops first, so what it had fetched but not yet written reaches its files;
    what the broker acknowledged and the archiver never fetched is lost (the window that
    ``archiver.flush_interval_s`` bounds)."""
    say(f"the broker on {broker.bootstrap} died: stopping the services, rebuilding it from {log_dir}")
    names = list(supervisor.services)
    if "archiver" in supervisor.services:
        supervisor.stop(["archiver"], timeout_s=15.0)
    supervisor.stop([n for n in names if n != "archiver"], timeout_s=15.0)
    broker.start()
    ensure_topics(bus)
    restore_log(log_dir, bus)
    supervisor.start_again(names)


def _rl_phase(cfg: StackConfig, supervisor: Supervisor, workdir: Path, *, stop_after_s: float | None,
              broker: DevBroker | None = None, bus: BusConfig | None = None) -> dict:
    budget_s = stop_after_s if stop_after_s is not None else cfg.rl_minutes * 60
    progress = Progress(workdir / "chdb")
    display = Display()
    t0 = time.monotonic()
    snap = progress.snapshot()
    recoveries = 0
    stopped_by = "clock"
    last_count = t0
    while True:
        time.sleep(1.0)
        if broker is not None and bus is not None and not broker.running:
            recover_broker(broker, supervisor, bus, workdir / "log")
            recoveries += 1
        supervisor.poll()
        elapsed = time.monotonic() - t0
        if display.due() or elapsed >= budget_s:
            snap = progress.snapshot()
            display.show(render(snap, supervisor.status(), elapsed_s=elapsed, budget_s=budget_s,
                                events=supervisor.events, max_updates=cfg.max_updates))
        # the update budget from the trainer's checkpoints (a directory listing, not a query
        # through the data manager, which has better things to do with the CPU)
        if cfg.max_updates and (done := updates_done(workdir / "checkpoints")) >= cfg.max_updates:
            stopped_by = "updates"
            say(f"{done} of {cfg.max_updates} updates done in {elapsed / 60:.1f} min")
            snap = progress.snapshot()
            break
        if elapsed >= budget_s:
            say(f"RL phase over after {elapsed / 60:.1f} min")
            break
        if cfg.max_trajectories and time.monotonic() - last_count >= 5.0:
            last_count = time.monotonic()
            snap = progress.snapshot()
            if snap.trajectories >= cfg.max_trajectories:
                stopped_by = "trajectories"
                say(f"{snap.trajectories} trajectories done")
                break
        if supervisor.any_failed():
            stopped_by = "failure"
            say("a service failed for good: stopping (see the logs under " f"{workdir / 'logs'})")
            break
    # the projection may lag a beat behind the trainer's last checkpoint
    done, version = trainer_progress(workdir / "checkpoints")
    if stopped_by == "updates":
        snap = settle(progress, snap, updates=done, version=version)
    updates = max(snap.updates, done)
    out = {"rl_s": round(time.monotonic() - t0, 1), "updates": updates, "trajectories": snap.trajectories,
           "policy_version": max(snap.version, version), "trajectories_success": snap.successes,
           "infra_errors": snap.infra_errors, "utilisation": snap.utilisation,
           "staleness_mean": snap.staleness_mean, "by_version": snap.by_version, "broker_restores": recoveries,
           "stopped_by": stopped_by, "max_updates": cfg.max_updates}
    note = budget_note(stopped_by, updates, cfg.max_updates, budget_s)
    if note:
        out["budget_note"] = note
        say(note)
    return out


def settle(progress: Progress, snap: Snapshot, *, updates: int, version: int, timeout_s: float = 30.0) -> Snapshot:
    """After the last update: wait (a bounded while) until the projection holds it and every rollout
    worker has loaded its weights, so the summary and the report describe the run to its end."""
    deadline = time.monotonic() + timeout_s
    def behind(s: Snapshot) -> bool:
        return bool(s.error) or s.updates < updates or 0 <= s.served < version

    while behind(snap) and time.monotonic() < deadline:
        time.sleep(1.0)
        snap = progress.snapshot()
    if behind(snap):
        say(f"the projection shows {snap.updates} updates and v{snap.served} served after {timeout_s:.0f} s "
            f"(the trainer is at {updates} updates, v{version}); stopping anyway")
    return snap


def trainer_progress(checkpoint_dir: Path) -> tuple[int, int]:
    """(updates applied, newest policy version) from the trainer's newest checkpoint ((0, 0) before any)."""
    found = latest_checkpoint(checkpoint_dir)
    try:
        state = read_state(found) if found is not None else None
    except (OSError, ValueError):
        state = None
    return (state.step, state.version) if state is not None else (0, 0)


def updates_done(checkpoint_dir: Path) -> int:
    """Trainer updates so far: the step of its newest checkpoint (one per update, 0 = the start)."""
    return trainer_progress(checkpoint_dir)[0]


def budget_note(stopped_by: str, updates: int, max_updates: int, cap_s: float) -> str:
    """Why the RL phase ended short of its update budget, in words (empty when it did not)."""
    if not max_updates or updates >= max_updates:
        return ""
    if stopped_by == "clock":
        return (f"stopped at {updates} of {max_updates} updates: the {cap_s / 60:.0f}-minute cap came first "
                "(the machine was slower than planned)")
    return f"stopped at {updates} of {max_updates} updates: {stopped_by}"


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


MAX_INSTRUCTION_ROWS = 12
"""The summary lists held-out success per instruction when there are at most this many."""


def held_out_lines(s: dict[str, Any], *, indent: str = "held-out success ") -> str:
    """The summary's held-out success with standard errors over tasks: warm start, RL policy, gain."""
    def se(key: str) -> str:
        return f" ± {100 * s[key]:.1f}" if s.get(key) is not None else ""

    pad = " " * len(indent)
    tasks = f" over {s['eval_tasks']} held-out tasks" if s.get("eval_tasks") else ""
    lines = [f"{indent}warm start {100 * s['warm_success']:.1f} %{se('warm_se')}{tasks}"]
    if "rl_success" in s:
        picked = ""
        if s.get("selected_version") is not None:
            picked = (f" (v{s['selected_version']} of v{s['last_version']}: the best of {len(s['dev_checks'])} checks "
                      f"on {s['dev_tasks']} dev tasks)")
        lines.append(f"{pad}RL policy  {100 * s['rl_success']:.1f} %{se('rl_se')}{picked}")
        lines.append(f"{pad}gain       {100 * s['delta']:+.1f}{se('delta_se')} points"
                     + (" (standard errors over tasks; a gain's is paired over the same tasks)"
                        if s.get("delta_se") is not None else ""))
    return "\n".join(lines)


def _print_summary(s: dict[str, Any]) -> None:
    say("summary")
    print(f"  pipeline         {s['pipeline']}")
    if "updates" in s:
        planned = f" of {s['max_updates']}" if s.get("max_updates") else ""
        print(f"  RL phase         {s.get('rl_s', 0) / 60:.1f} min, {s['updates']}{planned} updates, "
              f"{s['trajectories']} trajectories ({s['infra_errors']} infra errors), policy v{s['policy_version']}")
        if s.get("budget_note"):
            print(f"                   {s['budget_note']}")
        util = ", ".join(f"{k} {v:.1%}" for k, v in s.get("utilisation", {}).items())
        print(f"  utilisation      {util or '-'}; mean staleness {s.get('staleness_mean', 0):.2f} versions")
    if "warm_success" in s:
        print(held_out_lines(s, indent="  held-out success "))
    rows = s.get("held_out_by_instruction") or []
    if 0 < len(rows) <= MAX_INSTRUCTION_ROWS:
        print("  by instruction   (held-out, warm start -> RL policy)")
        for row in rows:
            warm = "-" if row["warm"] is None else f"{row['warm']:.0%}"
            print(f"    {row['instruction'][:44]:<44} {row['tasks']:>4} tasks  {warm:>4} -> {row['rl']:>4.0%}")
    print(f"  total            {s['total_s'] / 60:.1f} min; details in {s['workdir']}/summary.json")
