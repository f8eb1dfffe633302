"""``dart tasks check --live``: evaluator hygiene on a real desktop.

For each task: run its setup on a fresh slot, then its evaluator before any action. A task
must score 0 then; one that already scores 1 has a broken evaluator or a setup that did not do
its job. Setup and evaluator failures are reported with their reasons (a missing download
separately: it is fixed by ``dart tasks fetch``, not by the task).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from dart.env.downloads import MissingDownload
from dart.env.tasks import Task

Outcome = Literal["zero", "scores_before_acting", "missing_file", "setup_failed", "eval_failed"]


@dataclass(frozen=True, slots=True)
class LiveResult:
    task_id: str
    domain: str
    outcome: Outcome
    score: float | None
    detail: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.outcome == "zero"


def _why(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return " ".join(text.split())[:300]


async def check_one(backend: object, task: Task, *, timeout_s: float) -> LiveResult:
    """Setup, then the evaluator with no action taken, on ``backend`` (an xdesktop slot)."""
    t0 = time.monotonic()

    def result(outcome: Outcome, score: float | None, detail: str) -> LiveResult:
        return LiveResult(task.id, task.domain, outcome, score, detail, round(time.monotonic() - t0, 1))

    try:
        await asyncio.wait_for(backend.reset(task), timeout_s)  # type: ignore[attr-defined]
    except MissingDownload as exc:
        return result("missing_file", None, _why(exc))
    except Exception as exc:  # every setup failure is reported, whatever raised it
        return result("setup_failed", None, _why(exc))
    try:
        score, details = await asyncio.wait_for(
            backend.evaluate(task, final_action=None), timeout_s)  # type: ignore[attr-defined]
    except MissingDownload as exc:
        return result("missing_file", None, _why(exc))
    except Exception as exc:  # every evaluator failure is reported, whatever raised it
        return result("eval_failed", None, _why(exc))
    if score == 0.0:
        return result("zero", score, "")
    return result("scores_before_acting", score, str(details.get("metrics")))


async def live_check(tasks: Iterable[Task], make_backend: Callable[[], object], *, timeout_s: float,
                     on_result: Callable[[LiveResult], None] = lambda r: None) -> list[LiveResult]:
    """Every task in turn on one slot (its reset stops the previous task's apps)."""
    backend = make_backend()
    out = []
    try:
        for task in tasks:
            r = await check_one(backend, task, timeout_s=timeout_s)
            on_result(r)
            out.append(r)
    finally:
        await backend.close()  # type: ignore[attr-defined]
    return out
