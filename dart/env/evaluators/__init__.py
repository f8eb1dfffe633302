"""Evaluators: OSWorld-style metrics and getters in open registries, and the task scorer.

Importing this package registers the built-ins: getters that read the environment through
``EnvAccess`` (``vm_file``, ``vm_command_line``, ``vm_command_error``, ``list_directory``,
screen/window sizes, the default video player), the task's own values (``rule``,
``rule_relativeTime``) and the download cache (``cloud_file``, ``cache_file``); metrics for
text and rules (metrics_basic; metrics_rules: the task's rules object over text, lists and
settings files; metrics_json), spreadsheets (metrics_table with
table_rules), documents and PDFs (metrics_docs, metrics_writer), decks (metrics_slides),
browsers (metrics_chrome), pictures, VLC and archives (metrics_media), and checks that read one
file format each for a single task: pictures, decks, MP3 tags, e-books, PDFs (metrics_formats).
Backends add their own with :func:`register_metric` / :func:`register_getter` (the xdesktop
backend: browser and app getters).
"""

from __future__ import annotations

from dart.env.evaluators import getters as _getters  # noqa: F401  (registers the built-ins)
from dart.env.evaluators import metrics_basic as _metrics_basic  # noqa: F401
from dart.env.evaluators import metrics_chrome as _metrics_chrome  # noqa: F401
from dart.env.evaluators import metrics_docs as _metrics_docs  # noqa: F401
from dart.env.evaluators import metrics_formats as _metrics_formats  # noqa: F401
from dart.env.evaluators import metrics_json as _metrics_json  # noqa: F401
from dart.env.evaluators import metrics_media as _metrics_media  # noqa: F401
from dart.env.evaluators import metrics_rules as _metrics_rules  # noqa: F401
from dart.env.evaluators import metrics_slides as _metrics_slides  # noqa: F401
from dart.env.evaluators import metrics_table as _metrics_table  # noqa: F401
from dart.env.evaluators import metrics_writer as _metrics_writer  # noqa: F401
from dart.env.evaluators import relative_time as _relative_time  # noqa: F401
from dart.env.evaluators.evaluate import clamp_score, combine, evaluate_task, fetch
from dart.env.evaluators.files import FileContent, as_file
from dart.env.evaluators.getters import command_argv
from dart.env.evaluators.registry import (
    SUPPORTED_GETTERS,
    SUPPORTED_METRICS,
    EvalContext,
    capabilities,
    get_getter,
    get_metric,
    register_getter,
    register_metric,
    uses_final_action,
)

__all__ = [
    "SUPPORTED_GETTERS",
    "SUPPORTED_METRICS",
    "EvalContext",
    "FileContent",
    "as_file",
    "capabilities",
    "clamp_score",
    "combine",
    "command_argv",
    "evaluate_task",
    "fetch",
    "get_getter",
    "get_metric",
    "register_getter",
    "register_metric",
    "uses_final_action",
]
