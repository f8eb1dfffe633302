"""`dart tasks check --live`: outcomes from scripted backends, and the app check of the pool."""

from __future__ import annotations

import asyncio

from dart.env.cli import backend_capabilities
from dart.env.downloads import MissingDownload
from dart.env.live_check import live_check
from dart.env.tasks import Task, unsupported_parts
from dart.errors import EnvError


def task(tid: str, launch: str = "mousepad") -> Task:
    return Task.from_dict({"id": tid, "instruction": "i",
                           "config": [{"type": "launch", "parameters": {"command": [launch]}}],
                           "evaluator": {"func": "exact_match", "result": {"type": "rule", "rules": {}},
                                         "expected": {"type": "rule", "rules": {}}}})


class Scripted:
    """reset/evaluate per task id: 'zero', 'one', 'missing', 'setup', 'eval', 'hang'."""

    def __init__(self, plan: dict[str, str]) -> None:
        self.plan = plan
        self.closed = False

    async def reset(self, t: Task) -> None:
        kind = self.plan[t.id]
        if kind == "missing":
            raise MissingDownload("missing file https://x/y")
        if kind == "setup":
            raise EnvError("no window named like 'Calc'")
        if kind == "hang":
            await asyncio.sleep(10)

    async def evaluate(self, t: Task, *, final_action):
        if self.plan[t.id] == "eval":
            raise EnvError("guest gone")
        return (1.0 if self.plan[t.id] == "one" else 0.0), {"metrics": []}

    async def close(self) -> None:
        self.closed = True


def test_each_outcome_is_reported_and_the_slot_is_closed():
    plan = {"a": "zero", "b": "one", "c": "missing", "d": "setup", "e": "eval", "f": "hang"}
    backend = Scripted(plan)
    results = asyncio.run(live_check([task(t) for t in plan], lambda: backend, timeout_s=0.5))
    assert [r.outcome for r in results] == ["zero", "scores_before_acting", "missing_file", "setup_failed",
                                            "eval_failed", "setup_failed"]
    assert results[0].ok and not any(r.ok for r in results[1:])
    assert "TimeoutError" in results[-1].detail and "Calc" in results[3].detail
    assert backend.closed


def test_xdesktop_refuses_tasks_that_start_programs_debian_does_not_package():
    caps = backend_capabilities("xdesktop")
    assert unsupported_parts(task("vs", "code"), caps) == ["app:code"]
    assert unsupported_parts(task("ok", "/usr/bin/thunderbird"), caps) == []
