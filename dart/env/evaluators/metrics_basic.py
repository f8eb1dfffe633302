"""Text, rule and outcome metrics (OSWorld names and semantics), pure functions of values.

``result`` is what the agent produced (None: it is not there, so the score is 0). ``expected``
comes from the task; when a metric needs it and it is missing the evaluation cannot be done,
which is an environment failure (:class:`EnvError`), never a 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dart.agent.actions import CallUser
from dart.env.evaluators.files import as_file
from dart.env.evaluators.registry import register_metric
from dart.errors import EnvError


def need_expected(expected: Any, metric: str) -> Any:
    if expected is None:
        raise EnvError(f"{metric}: the expected value could not be fetched; check the task's expected getter")
    return expected


def _rules(expected: Any, metric: str) -> Mapping[str, Any]:
    rules = need_expected(expected, metric)
    if not isinstance(rules, Mapping):
        raise EnvError(f"{metric}: expected a rules object, got {type(rules).__name__}")
    return rules


def as_text(value: Any) -> str | None:
    """A getter's value as text: a string as is, a file decoded as UTF-8."""
    if value is None or isinstance(value, str):
        return value
    f = as_file(value)
    return None if f is None else f.text()


@register_metric("infeasible", uses_final_action=True)
def infeasible(result: Any, expected: Any = None, **options: Any) -> float:
    """1 only if the agent itself declared the task infeasible (its last action is CallUser).
    Running out of steps (no final action) or finishing is 0: giving up by timeout earns nothing."""
    return 1.0 if isinstance(result, CallUser) else 0.0


@register_metric("exact_match")
def exact_match(result: Any, expected: Any, **options: Any) -> float:
    """``result == rules["expected"]`` (the expected getter is a ``rule``)."""
    rules = need_expected(expected, "exact_match")
    want = rules["expected"] if isinstance(rules, Mapping) else rules
    return 1.0 if result is not None and result == want else 0.0


@register_metric("check_include_exclude")
def check_include_exclude(result: Any, expected: Any, **options: Any) -> float:
    """1 if every ``rules["include"]`` string is in the result and no ``rules["exclude"]`` one is."""
    rules = _rules(expected, "check_include_exclude")
    text = as_text(result)
    if text is None:
        return 0.0
    include, exclude = rules.get("include", []), rules.get("exclude", [])
    return 1.0 if all(s in text for s in include) and not any(s in text for s in exclude) else 0.0


def _normalise(text: str, *, ignore_blanks: bool, ignore_case: bool) -> str:
    if ignore_blanks:
        text = re.sub(r"\s+", " ", text).strip()
    return text.lower() if ignore_case else text


@register_metric("compare_text_file")
def compare_text_file(result: Any, expected: Any, **options: Any) -> float:
    """1 if the two text files are equal (options: ``ignore_blanks`` collapses runs of
    whitespace, ``ignore_case``)."""
    got = as_text(result)
    if got is None:
        return 0.0
    want = as_text(need_expected(expected, "compare_text_file")) or ""
    kw = {
        "ignore_blanks": bool(options.get("ignore_blanks")),
        "ignore_case": bool(options.get("ignore_case")),
    }
    return 1.0 if _normalise(got, **kw) == _normalise(want, **kw) else 0.0


@register_metric("compare_csv")
def compare_csv(result: Any, expected: Any, **options: Any) -> float:
    """1 if the CSV's lines equal those of the expected file (or of any of several expected
    files). Options: ``strict=False`` strips each line, ``ignore_case``."""
    got = as_text(result)
    if got is None:
        return 0.0
    golds = need_expected(expected, "compare_csv")
    strict, ignore_case = options.get("strict", True), bool(options.get("ignore_case"))

    def lines(text: str) -> list[str]:
        out = text.splitlines()
        out = out if strict else [s.strip() for s in out]
        return [s.lower() for s in out] if ignore_case else out

    for gold in golds if isinstance(golds, list) else [golds]:
        want = as_text(gold)
        if want is not None and lines(got) == lines(want):
            return 1.0
    return 0.0
