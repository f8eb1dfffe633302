"""Figures that hold: every side of a comparison measured pass by pass, interleaved, summarised
as the median and spread of the passes, compared as the ratio of the medians.

A best-of-N ratio on a shared machine says little (one side's lucky pass against the other's
unlucky one). Running side A, then B, then A again ... puts a busy moment on both sides, and
the median of at least five passes per side is what a reader can expect to see again; the
spread (min..max, and the half-range as a share of the median) says how much to trust it.

    from passes import interleave, report

    rates = interleave({"raw": lambda i: run_raw(i), "avro": lambda i: run_avro(i)}, passes=5)
    print(report(rates, "events/s"))
    print(ratio_line(rates, "avro", "raw", goal=0.8))
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass

MIN_PASSES = 5
"""Fewer passes give a median that moves with one unlucky pass."""


@dataclass(frozen=True, slots=True)
class Summary:
    """Median and spread of one side's passes."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def spread(self) -> float:
        """Half the range as a share of the median (0.1: the passes lie within ±10 % of it)."""
        return (self.high - self.low) / 2 / self.median if self.median else float("nan")

    def as_dict(self, digits: int = 1) -> dict[str, object]:
        return {"median": round(self.median, digits), "min": round(self.low, digits), "max": round(self.high, digits),
                "passes": [round(v, digits) for v in self.values]}


def interleave(sides: Mapping[str, Callable[[int], float]], passes: int = MIN_PASSES, *,
               on_pass: Callable[[int, str, float], None] | None = None) -> dict[str, Summary]:
    """Run each side once per pass, in the order given, ``passes`` times; each call gets the pass
    index and returns that pass's figure. ``on_pass(i, side, value)`` sees each as it comes."""
    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    got: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(passes):
        for name, run in sides.items():
            value = float(run(i))
            got[name].append(value)
            if on_pass is not None:
                on_pass(i, name, value)
    return {name: Summary(tuple(v)) for name, v in got.items()}


def ratio(summaries: Mapping[str, Summary], num: str, den: str) -> float:
    """Ratio of the medians (not the median of per-pass ratios: each median stands on its own)."""
    return summaries[num].median / summaries[den].median


def line(name: str, s: Summary, unit: str, fmt: str = ",.0f") -> str:
    """``name: median unit (min..max, ±spread, N passes)``."""
    return (f"{name}: {s.median:{fmt}} {unit} median (min {s.low:{fmt}}, max {s.high:{fmt}}, "
            f"±{s.spread:.0%}, {len(s.values)} passes)")


def report(summaries: Mapping[str, Summary], unit: str, fmt: str = ",.0f") -> str:
    width = max(map(len, summaries))
    return "\n".join(line(f"{name:<{width}}", s, unit, fmt) for name, s in summaries.items())


def ratio_line(summaries: Mapping[str, Summary], num: str, den: str, *, goal: float | None = None) -> str:
    text = f"ratio {num}/{den} = {ratio(summaries, num, den):.2f} (ratio of medians"
    if len(summaries[num].values) < MIN_PASSES:
        text += f"; only {len(summaries[num].values)} passes: not a figure to quote"
    return text + (f"; goal >= {goal:.2f})" if goal is not None else ")")


def pass_line(unit: str, fmt: str = ",.0f") -> Callable[[int, str, float], None]:
    """An ``on_pass`` printing each pass as it ends (a long benchmark shows it is alive)."""
    def show(i: int, side: str, value: float) -> None:
        print(f"  pass {i + 1} {side}: {value:{fmt}} {unit}", flush=True)
    return show
