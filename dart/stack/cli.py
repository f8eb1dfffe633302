"""`dart up CONFIG`, `dart eval` and `dart replay` (the store rebuilt from the log, or one logged
decision re-run: both read across services, so they live in the composition root)."""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path
from typing import Any

from dart.blobs import LocalBlobStore
from dart.config import add_config_args, build, config_from_args
from dart.errors import ConfigError
from dart.recipe.measure import success
from dart.resources import config_path, resource_dir
from dart.rundir import RunInfo, RunMissing, UntrustedRun, add_run_arg, run_of

DEFAULT_CONFIG = config_path("synthetic.yaml")


def register(sub: Any) -> None:
    p = sub.add_parser("up", help="run the whole stack on this machine: broker, services, warm start, RL, eval")
    add_config_args(p, default=DEFAULT_CONFIG, what=" of the stack")
    p.add_argument("--workdir", type=Path, help="override the config's workdir")
    p.add_argument("--rl-minutes", type=float, help="override the length of the RL phase")
    p.add_argument("--pipeline", choices=["decoupled", "coupled"], help="override the pipeline")
    p.add_argument("--max-updates", type=int, help="override the RL phase's update budget")
    p.add_argument("--seed", type=int, help="override recipe.seed (weights, task sampling, SFT, sampling)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("eval", help="held-out success of a policy (a model dir, a checkpoint, the run's latest "
                                    "or a published version)")
    add_config_args(p, default=DEFAULT_CONFIG, what=" of the stack (tasks and prompt)")
    p.add_argument("--model", type=Path, help="policy directory (default: WORKDIR/warm)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", type=Path, help="trainer checkpoint dir (step-N) whose weights to load")
    which.add_argument("--latest", action="store_true", help="the run's latest trainer checkpoint")
    which.add_argument("--version", type=int, metavar="N", help="published policy version N (its weights from the "
                                                                "run's blob store, as the weights topic names them)")
    which.add_argument("--selected", action="store_true", help="the version the run handed over (its dev check's "
                                                               "pick; without one, the latest checkpoint)")
    p.add_argument("--episodes", type=int, help="evaluation episodes (default: the recipe's)")
    p.add_argument("--json", action="store_true", help="the result as one JSON object (success, episodes, "
                                                       "model, checkpoint, version, by_instruction)")
    add_run_arg(p)  # its stack config (run.json names it) and workdir
    p.set_defaults(func=cmd_eval)

    # Deferred: loads the Kafka clients and fastavro, and every `dart` command imports this module.
    from dart.data.cli import add_replay_args

    p = sub.add_parser("replay", help="store (the default): rebuild the projection from the log and prove it "
                                      "equal to the live one; decision: re-run one logged decision; update: "
                                      "re-run one logged trainer update")
    p.__class__ = _ReplayParser
    rsub = p.add_subparsers(dest="replay_command", metavar="{store,decision,update}",
                            parser_class=argparse.ArgumentParser)
    r = rsub.add_parser("store", help="rebuild the projection from the log into a fresh store and prove it equal "
                                      "to the live one, table by table (exit 1 on any difference); `dart replay "
                                      "RUN_DIR` means `dart replay store RUN_DIR`")
    add_replay_args(r)
    r.set_defaults(func=cmd_replay_store)
    r = rsub.add_parser("decision", help="re-run the policy on a logged observation with the version that acted")
    r.add_argument("run_dir", nargs="?", help="the run's directory (or --run RUN_DIR)")
    add_run_arg(r, positional=_run_dir)
    r.add_argument("rollout_id", help="the trajectory")
    r.add_argument("step", type=int, help="its step index")
    r.add_argument("--worker-config", type=Path, help="the rollout worker's config "
                                                      "(default RUN_DIR/config/rollout-0.yaml)")
    r.set_defaults(func=cmd_replay_decision)
    r = rsub.add_parser("update", help="re-run one logged trainer update from its checkpoint and batch")
    r.add_argument("run_dir", nargs="?", help="the run's directory (or --run RUN_DIR)")
    add_run_arg(r, positional=_run_dir)
    r.add_argument("version", type=int, help="the policy version the update made")
    r.add_argument("--trainer-config", type=Path, help="the trainer's config (default RUN_DIR/config/trainer.yaml)")
    r.set_defaults(func=cmd_replay_update)


def _run_dir(args: argparse.Namespace) -> str | None:
    return args.run_dir


SHORTHANDS = {"workdir": "workdir", "rl_minutes": "rl_minutes", "pipeline": "pipeline",
              "max_updates": "max_updates", "seed": "recipe.seed"}
"""`dart up`'s flags and the dotted key each stands for."""


def load_stack_config(args: argparse.Namespace) -> Any:
    """The stack config of ``dart up|eval [CONFIG] [KEY=VALUE ...]``: the file, then the flags, then
    the overrides, laid over the recipe's preset of every service."""
    # Here, not at the top: the config types import torch, and `dart --help` should not wait for it.
    from dart.stack.config import StackConfig

    flags = {key: getattr(args, flag, None) for flag, key in SHORTHANDS.items()}
    return build(StackConfig, config_from_args(args, flags=flags))


def cmd_up(args: argparse.Namespace) -> int:
    # Deferred: loads torch, and every `dart` command imports this module.
    from dart.stack.up import up

    cfg = load_stack_config(args)  # every service's config built: a mistake is refused before anything starts
    # SIGTERM (kill, a supervisor, CI) takes Ctrl-C's path: every service stopped cleanly, the
    # summary written; without this `dart up` died at once and left its services running.
    signal.signal(signal.SIGTERM, _interrupt)
    summary = up(cfg, config_file=Path(args.config) if args.config else None)
    return 1 if summary.get("interrupted") else 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_eval(args: argparse.Namespace) -> int:
    import dataclasses

    # Deferred: loads torch, and every `dart` command imports this module.
    from dart.recipe.config import make_tasks
    from dart.recipe.episodes import evaluate, success_by_instruction
    from dart.stack.select import policy_at, published_version, selected_version
    from dart.stack.up import load_checkpoint_policy
    from dart.train.checkpoint import latest_checkpoint

    given = args.config or next((i for i in args.config_items or [] if "=" not in i), None)
    run = run_of(args)
    from_run = False
    if run is not None:
        if run.config is not None and given is None:
            given = args.config = str(run.config)
            from_run = not args.trust_run and not _ships_with_dart(Path(given))
        args.workdir = run.root
    if not Path(given or DEFAULT_CONFIG).is_file():
        raise RunMissing(f"no config file {given}: give the stack YAML `dart up` ran (e.g. configs/synthetic.yaml)")
    cfg = load_stack_config(args)
    if from_run:
        _check_run_config(cfg, run, Path(given))
    workdir = cfg.workdir.resolve()
    if args.episodes is not None:
        cfg = dataclasses.replace(cfg, recipe=dataclasses.replace(cfg.recipe, eval_episodes=args.episodes))
    recipe = cfg.recipe
    checkpoint = args.checkpoint or (latest_checkpoint(workdir / "checkpoints") if args.latest else None)
    model = args.model or (workdir / "warm")
    if not (model / "config.json").exists():
        raise RunMissing(f"no policy in {model}: a run's warm start writes WORKDIR/warm (`make run`; name the run "
                         f"with --run RUN_DIR), or give --model DIR")
    _, held_out = make_tasks(recipe)
    store = LocalBlobStore(workdir / "blobs")
    version = args.version if args.version is not None else selected_version(workdir) if args.selected else None
    if version is None and args.selected:
        checkpoint = latest_checkpoint(workdir / "checkpoints")
    if version is not None:
        policy = policy_at(model, store, published_version(workdir, version))
        checkpoint = None
    else:
        policy = load_checkpoint_policy(model, checkpoint)
    outcomes: list[tuple[dict[str, Any], bool]] = []
    rate = evaluate(policy, held_out, recipe.held_out_episodes, store=store, cfg=cfg, phase=3,
                    outcomes=outcomes)
    measured = success(outcomes)
    if args.json:
        print(json.dumps({"success": rate, "se": measured.se, "tasks": measured.tasks,
                          "episodes": recipe.held_out_episodes, "model": str(model),
                          "checkpoint": str(checkpoint) if checkpoint else None, "version": version,
                          "by_instruction": [{"instruction": ins, "tasks": n, "success": r}
                                             for ins, (n, r) in success_by_instruction(outcomes).items()]}))
        return 0
    weights = f" + {checkpoint.name}" if checkpoint else f" + v{version}" if version is not None else ""
    what = f"{model}{weights}"
    print(f"held-out success of {what}: {measured.points()} (standard error over tasks) over {measured.tasks} "
          f"tasks, {recipe.held_out_episodes} episodes")
    return 0


def _ships_with_dart(path: Path) -> bool:
    return path.resolve().parent == resource_dir("configs").resolve()


def _check_run_config(cfg: Any, run: RunInfo, path: Path) -> None:
    """A config run.json names that dart does not ship is data from the run directory: used only
    when all it can make `dart eval` do is play generated synthetic screens in-process (no
    desktop, no task files and their setup commands); any other is refused with the fix."""
    if cfg.env.backend == "synthetic" and cfg.tasks.source == "synthetic":
        return
    raise UntrustedRun(f"{run.root / 'run.json'} names the config {path} (env.backend {cfg.env.backend}, "
                       f"tasks.source {cfg.tasks.source}), not one dart ships: such a config chooses the "
                       f"environments and their setup commands, so give it yourself (`dart eval {path} "
                       f"--run {run.workdir}`) or pass --trust-run")


REPLAY_COMMANDS = ("store", "decision", "update")


class _ReplayParser(argparse.ArgumentParser):
    """`dart replay` without a subcommand (``dart replay RUN_DIR``, ``dart replay --config F``) is
    `dart replay store ...`, as it was before the subcommands."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        args = list(args or [])
        if not args or args[0] not in (*REPLAY_COMMANDS, "-h", "--help"):
            args = ["store", *args]
        return super().parse_known_args(args, namespace)


def cmd_replay_store(args: argparse.Namespace) -> int:
    # Deferred: loads the Kafka clients and fastavro, and every `dart` command imports this module.
    from dart.data.cli import cmd_replay as replay_store

    return replay_store(args)


def cmd_replay_update(args: argparse.Namespace) -> int:
    # Deferred: loads torch, and every `dart` command imports this module.
    from dart.replay.steps import replay_update

    run = _require_run_dir(args)
    update = replay_update(run, args.version, trainer_config=args.trainer_config)
    print(update.text())
    return 0 if update.identical else 1


def cmd_replay_decision(args: argparse.Namespace) -> int:
    # Deferred: loads torch, and every `dart` command imports this module.
    from dart.replay.steps import replay_decision

    run = _require_run_dir(args)
    result = replay_decision(run, args.rollout_id, args.step, worker_config=args.worker_config)
    print(result.text())
    return 0 if result.reproduced else 1


def _require_run_dir(args: argparse.Namespace) -> RunInfo:
    run = run_of(args)
    if run is None:
        raise ConfigError(f"replay {args.replay_command}: name the run directory (RUN_DIR or --run RUN_DIR)")
    if not run.log.is_dir():
        raise RunMissing(f"{run.workdir} is not a run directory with an archived log (no {run.log}): "
                         f"name the directory `dart up` ran in, e.g. runs/local")
    return run
