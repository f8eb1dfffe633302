"""``rule_relativeTime``: a rules object whose expected values name dates relative to today
("next Monday", "10th next month", ...), filled in when the task is scored.

Placeholders in the expected strings: ``{Year}`` 2024, ``{Month}`` Jan, ``{MonthFull}``
January, ``{month}`` january, ``{MonthD}`` 1, ``{DayD}`` 5, ``{Day0D}`` 05, ``{DoW}`` Mon.
With a ``to`` phrase the expected keys split in two halves, in order: the first half takes the
``from`` date, the second the ``to`` date.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
from typing import Any

from dart.env.evaluators.registry import EvalContext, register_getter
from dart.errors import ConfigError

_DAYS = [d.lower() for d in calendar.day_name]
_ORDINAL_WORDS = {"first": 1, "second": 2, "third": 3, "fourth": 4}
_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
                 "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}


def _add_months(d: dt.date, n: int) -> dt.date:
    month0 = d.month - 1 + n
    year, month = d.year + month0 // 12, month0 % 12 + 1
    return d.replace(year=year, month=month, day=min(d.day, calendar.monthrange(year, month)[1]))


def relative_date(phrase: str, today: dt.date) -> dt.date:
    """The date a phrase of OSWorld's tasks names (pure)."""
    p = " ".join(phrase.lower().replace("split", "").split())
    if p == "today" or p == "this month":
        return today
    if p == "tomorrow":
        return today + dt.timedelta(days=1)
    if m := re.fullmatch(r"next (\w+)", p):
        if m.group(1) in _DAYS:  # the first such weekday after today
            ahead = (_DAYS.index(m.group(1)) - today.weekday() - 1) % 7 + 1
            return today + dt.timedelta(days=ahead)
        if m.group(1) == "month":
            return _add_months(today.replace(day=1), 1)
    if m := re.fullmatch(r"next week (\w+)", p):
        monday = today - dt.timedelta(days=today.weekday()) + dt.timedelta(days=7)
        return monday + dt.timedelta(days=_DAYS.index(m.group(1)))
    if m := re.fullmatch(r"(\d+)(?:st|nd|rd|th) next month", p):
        return _add_months(today.replace(day=1), 1).replace(day=int(m.group(1)))
    if m := re.fullmatch(r"(\w+) (\w+) (\w+) months? later", p):
        nth, day, count = m.groups()
        first = _add_months(today.replace(day=1), int(_NUMBER_WORDS.get(count, count)))
        ahead = (_DAYS.index(day) - first.weekday()) % 7
        return first + dt.timedelta(days=ahead + 7 * (_ORDINAL_WORDS[nth] - 1))
    raise ConfigError(f"rule_relativeTime: cannot read the date phrase {phrase!r}")


def fill(template: str, d: dt.date) -> str:
    """A template's placeholders filled from ``d``."""
    values = {
        "Year": str(d.year), "Month": calendar.month_abbr[d.month], "MonthFull": calendar.month_name[d.month],
        "month": calendar.month_name[d.month].lower(), "MonthD": str(d.month), "DayD": str(d.day),
        "Day0D": f"{d.day:02d}", "DoW": calendar.day_abbr[d.weekday()],
    }
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), template)


def resolve(rules: dict[str, Any], today: dt.date) -> dict[str, Any]:
    """The rules with every expected template filled (pure)."""
    rel = rules.get("relativeTime") or {}
    start = relative_date(str(rel.get("from", "today")), today)
    end = relative_date(str(rel["to"]), today) if "to" in rel else start
    expected = rules.get("expected", {})
    keys = list(expected)
    half = (len(keys) + 1) // 2 if "to" in rel else len(keys)
    filled = {k: fill(v, start if i < half else end) if isinstance(v, str) else v
              for i, (k, v) in enumerate(expected.items())}
    return {**rules, "expected": filled}


@register_getter("rule_relativeTime")
async def rule_relative_time(env: Any, params: dict[str, Any], ctx: EvalContext) -> dict[str, Any]:
    """The task's rules with today's dates filled in (in ``rules.timezone`` if given)."""
    rules = params.get("rules")
    if not isinstance(rules, dict):
        raise ConfigError("rule_relativeTime without 'rules'")
    tz = None
    if rules.get("timezone"):
        from zoneinfo import ZoneInfo

        tz = ZoneInfo(rules["timezone"])
    return resolve(rules, dt.datetime.now(tz).date())
