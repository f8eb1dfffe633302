"""What `dart up` needs for OSWorld tasks: the pool it publishes, and a policy server it can wait on.

The pool is what ``dart tasks check`` calls runnable on the backend (every setup step, getter and
metric supported), narrowed by the ``tasks:`` section (domains, a count) and, offline, to the
tasks whose files are all in the download cache: a task whose file is missing would only ever
end as an infra error.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dart.env.cli import DEFAULT_EXAMPLES, backend_capabilities
from dart.env.downloads import DownloadCache, task_urls
from dart.env.tasks import check_pool, load_tasks
from dart.errors import ConfigError
from dart.stack.config import TasksSection


@dataclass(frozen=True, kw_only=True)
class OsworldPool:
    tasks: list[dict[str, Any]]
    """Task dicts as on disk, with their ``domain`` (what TaskRegistered carries)."""
    found: int
    """Task files read."""
    unsupported: int
    """Left out: a part the backend cannot run (``dart tasks check`` names it)."""
    not_cached: int
    """Left out: a file from a URL that is not in the download cache (``dart tasks fetch``)."""
    domains: Counter[str] = field(default_factory=Counter)

    def describe(self) -> str:
        by_domain = ", ".join(f"{d} {n}" for d, n in sorted(self.domains.items()))
        return (f"{len(self.tasks)} OSWorld tasks ({by_domain}) of {self.found} read: {self.unsupported} need parts "
                f"this backend lacks, {self.not_cached} a file not in the download cache")


def osworld_pool(section: TasksSection, *, backend: str, downloads: Path) -> OsworldPool:
    """The OSWorld tasks of a run; ConfigError when none is left, naming why."""
    examples = Path(section.examples) if section.examples else DEFAULT_EXAMPLES
    tasks = load_tasks(section.paths or [examples], examples_root=examples)
    report = check_pool(tasks, backend_capabilities(backend), frozenset())
    runnable = [t for t in tasks if t.id not in report.unsupported and
                (not section.domains or t.domain in section.domains)]
    cache = DownloadCache(downloads)
    cached = [t for t in runnable if not section.offline or all(cache.has(u) for u in task_urls(t))]
    kept = sorted(cached, key=lambda t: (t.domain, t.id))[: section.max_tasks or None]
    pool = OsworldPool(tasks=[dict(t.raw, domain=t.domain) for t in kept], found=len(tasks),
                       unsupported=len(report.unsupported), not_cached=len(runnable) - len(cached),
                       domains=Counter(t.domain for t in kept))
    if not pool.tasks:
        raise ConfigError(f"tasks: no task left to run ({pool.describe()}); fill the download cache {downloads} "
                          "with `dart tasks fetch`, or widen tasks.paths / tasks.domains")
    return pool


def wait_until_serving(base_url: str, *, timeout_s: float, alive: Callable[[], bool]) -> float:
    """Block until the OpenAI-compatible server at ``base_url`` lists its models; seconds waited.

    ConfigError when ``alive()`` turns false (the server process exited) or after ``timeout_s``."""
    t0 = time.monotonic()
    url = base_url.rstrip("/") + "/models"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if json.loads(reply.read()).get("data"):
                    return time.monotonic() - t0
        except (OSError, ValueError, urllib.error.URLError):
            pass
        if not alive():
            raise ConfigError(f"the policy server for {base_url} exited before it answered (see its log)")
        if time.monotonic() - t0 > timeout_s:
            raise ConfigError(f"no answer from {url} after {timeout_s:.0f} s; is rollout.base_url right?")
        time.sleep(0.5)
