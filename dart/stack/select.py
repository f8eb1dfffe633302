"""Which policy a run hands over: the last one, or the best of its checks on dev tasks.

A short RL phase on a tiny model does not rise steadily: a seed can peak and sag, or jump late.
With ``recipe.dev_tasks`` set, ``dart up`` checks the published policy every
``recipe.check_every`` updates (and the last one) on dev tasks — training-split tasks that are
never trained on and are not held-out tasks — and evaluates the best of them on the held-out
tasks. The held-out tasks play no part in the choice, so the held-out figure stays an unbiased
measure of the policy handed over. Every version's weights are in the blob store (the weights
topic names them), so no extra checkpoint has to be kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dart.agent.model import load_policy_with
from dart.blobs import BlobStore
from dart.data.cli import sql_client
from dart.rundir import RunMissing


@dataclass(frozen=True, slots=True)
class Published:
    """One published policy version: when, and where its weights are."""

    version: int
    at_ms: int
    digest: str


def published_versions(workdir: Path) -> list[Published]:
    """The run's published policy versions, oldest first (from its store's ``weights`` table)."""
    client = sql_client(None, f"chdb://{workdir / 'chdb'}", "dart")
    try:
        rows = client.query("""SELECT version, toUnixTimestamp64Milli(any(event_time)),
                               any(blob_digests[indexOf(blob_names, 'model.safetensors')])
                               FROM weights FINAL GROUP BY version ORDER BY version""").result_rows
    finally:
        client.close()
    return [Published(int(v), int(at), str(d)) for v, at, d in rows]


def published_version(workdir: Path, version: int) -> Published:
    """The run's published ``version``; RunMissing names the versions there are."""
    if not (workdir / "chdb").is_dir():
        raise RunMissing(f"no store {workdir / 'chdb'}: the run's published versions are read from it")
    published = published_versions(workdir)
    found = next((p for p in published if p.version == version), None)
    if found is None:
        have = f"v{published[0].version}..v{published[-1].version}" if published else "none"
        raise RunMissing(f"version {version} was not published in {workdir} (published: {have})")
    return found


def selected_version(workdir: Path) -> int | None:
    """The version a finished run handed over after its dev check (``summary.json``), else None."""
    path = workdir / "summary.json"
    if not path.is_file():
        raise RunMissing(f"no {path}: a finished run's summary names the version it handed over "
                         "(`dart up` writes it at the end)")
    picked = json.loads(path.read_text()).get("selected_version")
    return None if picked is None else int(picked)


def versions_to_check(versions: Sequence[int], every: int) -> list[int]:
    """The versions a run checks: every ``every``-th update after the start, and the last one."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    trained = sorted(v for v in set(versions) if v > 0)
    picked = [v for v in trained if v % every == 0]
    if trained and trained[-1] not in picked:
        picked.append(trained[-1])
    return picked


def pick_best(checks: Sequence[tuple[int, float]]) -> int:
    """The version with the highest dev success; on a tie the later one (more trained)."""
    if not checks:
        raise ValueError("no checks to pick from")
    return max(checks, key=lambda c: (c[1], c[0]))[0]


def policy_at(warm_model: Path, store: BlobStore, published: Published) -> Any:
    """The warm start's model with the weights of one published version."""
    return load_policy_with(warm_model, store.get(published.digest))


@dataclass(frozen=True, slots=True)
class Selection:
    """The checks a run made and the version it kept."""

    checks: tuple[tuple[int, float], ...]
    """(version, dev success) in version order."""
    version: int
    last: int
    """The last published version (the one handed over without a selection)."""

    def describe(self, dev_tasks: int) -> str:
        shown = ", ".join(f"v{v} {100 * s:.1f} %" for v, s in self.checks)
        return f"dev check on {dev_tasks} tasks: {shown}; v{self.version} kept"


def select_version(published: Sequence[Published], *, every: int,
                   dev_success: Callable[[Published], float]) -> Selection | None:
    """Check the versions :func:`versions_to_check` names with ``dev_success`` and keep the best;
    None when no trained version was published."""
    by_version = {p.version: p for p in published}
    todo = versions_to_check(list(by_version), every)
    if not todo:
        return None
    checks = tuple((v, dev_success(by_version[v])) for v in todo)
    return Selection(checks=checks, version=pick_best(checks), last=todo[-1])
