"""`dart up CONFIG`, `dart eval` and `dart replay` (the store rebuilt from the log, or one logged
decision re-run: both read across services, so they live in the composition root)."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

from dart.config import build, load_yaml

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "synthetic.yaml"


def register(sub: Any) -> None:
    p = sub.add_parser("up", help="run the whole stack on this machine: broker, services, warm start, RL, eval")
    p.add_argument("config", nargs="?", type=Path, default=DEFAULT_CONFIG, help="stack YAML (default: %(default)s)")
    p.add_argument("--workdir", type=Path, help="override the config's workdir")
    p.add_argument("--rl-minutes", type=float, help="override the length of the RL phase")
    p.add_argument("--pipeline", choices=["decoupled", "coupled"], help="override the pipeline")
    p.add_argument("--max-updates", type=int, help="override the RL phase's update budget")
    p.add_argument("--seed", type=int, help="override recipe.seed (weights, task sampling, SFT, sampling)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("eval", help="held-out success of a policy (a model dir, a checkpoint or the run's latest)")
    p.add_argument("config", nargs="?", type=Path, default=DEFAULT_CONFIG, help="stack YAML (tasks and prompt)")
    p.add_argument("--model", type=Path, help="policy directory (default: WORKDIR/warm)")
    p.add_argument("--checkpoint", type=Path, help="trainer checkpoint dir (step-N) whose weights to load")
    p.add_argument("--latest", action="store_true", help="the run's latest trainer checkpoint")
    p.add_argument("--episodes", type=int, help="evaluation episodes (default: the recipe's)")
    p.set_defaults(func=cmd_eval)

    from dart.data.cli import add_replay_args

    p = sub.add_parser("replay", help="rebuild the projection from the log into a fresh store and prove it "
                                      "equal to the live one, table by table (exit 1 on any difference); "
                                      "`replay decision RUN_DIR ROLLOUT_ID STEP` re-runs one logged decision, "
                                      "`replay update RUN_DIR VERSION` one logged trainer update")
    add_replay_args(p)
    p.set_defaults(func=cmd_replay)


def load_stack_config(path: Path, args: argparse.Namespace | None = None) -> Any:
    from dart.stack.config import StackConfig

    data = load_yaml(path)
    if args is not None:
        for flag, key in (("workdir", "workdir"), ("rl_minutes", "rl_minutes"), ("pipeline", "pipeline"),
                          ("max_updates", "max_updates")):
            if getattr(args, flag, None) is not None:
                data[key] = str(getattr(args, flag)) if flag == "workdir" else getattr(args, flag)
        if getattr(args, "seed", None) is not None:
            data["recipe"] = {**(data.get("recipe") or {}), "seed": args.seed}
    return build(StackConfig, data)


def cmd_up(args: argparse.Namespace) -> int:
    from dart.stack.services import service_sections
    from dart.stack.up import up

    cfg = load_stack_config(args.config, args)
    # Refuse config mistakes in any service before anything starts.
    service_sections(cfg, workdir=cfg.workdir.resolve(), model_dir=cfg.workdir.resolve() / "warm")
    # SIGTERM (kill, a supervisor, CI) takes Ctrl-C's path: every service stopped cleanly, the
    # summary written; without this `dart up` died at once and left its services running.
    signal.signal(signal.SIGTERM, _interrupt)
    summary = up(cfg)
    return 1 if summary.get("interrupted") else 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_eval(args: argparse.Namespace) -> int:
    import dataclasses

    from dart.blobs import LocalBlobStore
    from dart.recipe.config import make_tasks
    from dart.recipe.episodes import evaluate
    from dart.stack.up import latest_checkpoint, load_checkpoint_policy

    cfg = load_stack_config(args.config, args)
    workdir = cfg.workdir.resolve()
    recipe = cfg.recipe if args.episodes is None else dataclasses.replace(cfg.recipe, eval_episodes=args.episodes)
    checkpoint = args.checkpoint or (latest_checkpoint(workdir / "checkpoints") if args.latest else None)
    model = args.model or (workdir / "warm")
    _, held_out = make_tasks(recipe)
    policy = load_checkpoint_policy(model, checkpoint)
    rate = evaluate(policy, held_out, recipe.eval_episodes, store=LocalBlobStore(workdir / "blobs"), recipe=recipe,
                    phase=3)
    what = f"{model}" + (f" + {checkpoint.name}" if checkpoint else "")
    print(f"held-out success of {what}: {rate:.1%} over {recipe.eval_episodes} episodes")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from dart.data.cli import cmd_replay as replay_store
    from dart.errors import ConfigError

    if args.target[:1] == ["update"]:
        if len(args.target) != 3 or not args.target[2].isdigit():
            raise ConfigError("replay update: expected RUN_DIR VERSION (VERSION a number)")
        from dart.recipe.debug import replay_update

        update = replay_update(Path(args.target[1]), int(args.target[2]))
        print(update.text())
        return 0 if update.identical else 1
    if args.target[:1] != ["decision"]:
        return replay_store(args)
    if len(args.target) != 4 or not args.target[3].isdigit():
        raise ConfigError("replay decision: expected RUN_DIR ROLLOUT_ID STEP (STEP a number)")
    from dart.recipe.debug import replay_decision

    _, run_dir, rollout_id, step = args.target
    result = replay_decision(Path(run_dir), rollout_id, int(step), worker_config=args.worker_config)
    print(result.text())
    return 0 if result.identical else 1
