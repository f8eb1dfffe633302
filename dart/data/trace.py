"""`dart trace ROLLOUT_ID`: one trajectory as pictures, from the projection and the blob store.

Writes ``<out>/<rollout_id>/``: ``step_NNN.png`` (each step's screenshot with its actions drawn
on it), ``strip.png`` (every step with its thought, policy version, mean log-prob and entropy
under it, and a header) and ``index.html`` (the same as a page; images are files next to it,
so it needs no network). Model text is shown as text, escaped, never executed.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from dart.agent.uitars import parse_response
from dart.data.draw import INK, RGB, draw_actions, fit_width, font, stack, text_panel, vstack
from dart.data.rows import masked_mean
from dart.errors import DartError
from dart.events import ParsedAction

Query = Callable[[str, dict], Sequence[Sequence[object]]]
PANEL_W = 360
"""Width of one step in the strip."""
PAGE_W = 640
"""Smallest width of a step image on the page (small screens are enlarged, pixels kept crisp)."""
COLUMNS = 4


@dataclass(frozen=True, slots=True)
class StepView:
    step_index: int
    screenshot_digest: str
    screen: tuple[int, int]
    response_text: str
    actions: tuple[ParsedAction, ...]
    policy_version: int | None
    """None: the step has no recorded action (the trajectory ended while it waited)."""
    mean_logprob: float
    mean_entropy: float
    num_tokens: int


@dataclass(frozen=True, slots=True)
class TraceView:
    rollout_id: str
    task_id: str
    instruction: str
    status: str
    reward: float | None
    num_steps: int
    origin: str
    steps: tuple[StepView, ...]


def load_trace(query: Query, db: str, rollout_id: str) -> TraceView:
    """The trajectory's outcome and every step (a redo's latest execution wins, like the batcher's)."""
    head = query(f"""SELECT task_id, status, num_steps, reward, has_reward, origin
                     FROM {db}.trajectory_rewards WHERE rollout_id = {{r:String}}""", {"r": rollout_id})
    rows = query(
        f"""SELECT o.step_index, o.instruction, o.screenshot_digest, o.screen_width, o.screen_height, o.task_id,
               a.in_reply_to, a.response_text, a.actions_json, a.policy_version, a.logprobs, a.mean_entropy,
               a.num_tokens
        FROM (SELECT * FROM {db}.observations FINAL WHERE rollout_id = {{r:String}}) AS o
        LEFT JOIN (SELECT * FROM {db}.actions FINAL WHERE rollout_id = {{r:String}}) AS a ON a.in_reply_to = o.event_id
        ORDER BY o.step_index, o.event_time DESC LIMIT 1 BY o.step_index""", {"r": rollout_id})
    if not head and not rows:
        raise DartError(f"rollout {rollout_id!r} is not in the projection {db} (check the id, --database, --url)")
    steps = tuple(StepView(
        step_index=int(r[0]), screenshot_digest=str(r[2]), screen=(int(r[3]), int(r[4])),
        response_text=str(r[7] or ""), actions=tuple(ParsedAction(**a) for a in json.loads(r[8] or "[]")),
        policy_version=int(r[9]) if r[6] else None, mean_logprob=masked_mean(list(r[10] or ()), int(r[12] or 0)),
        mean_entropy=float(r[11] or 0.0), num_tokens=int(r[12] or 0)) for r in rows)
    if head:
        task_id, status, num_steps, reward, has_reward, origin = head[0]
    else:
        task_id, status, num_steps, reward, has_reward, origin = rows[0][5], "unfinished", len(rows), None, 0, "?"
    return TraceView(rollout_id=rollout_id, task_id=str(task_id), instruction=str(rows[0][1]) if rows else "",
                     status=str(status), reward=float(reward) if has_reward else None, num_steps=int(num_steps),
                     origin=str(origin), steps=steps)


def thought_of(step: StepView) -> str:
    """The ``Thought:`` (or ``Reflection:``) of the response, parsed like the env parses it."""
    screen = step.screen if min(step.screen) > 0 else (1000, 1000)
    parsed = parse_response(step.response_text, screen=screen)
    return parsed.thought or parsed.reflection or ""


def action_text(step: StepView) -> str:
    """The ``Action:`` part of the response (or the action kinds if there is none)."""
    _, sep, tail = step.response_text.rpartition("Action:")
    return tail.strip() if sep else ", ".join(a.kind for a in step.actions) or "(no action)"


def stats_line(step: StepView) -> str:
    if step.policy_version is None:
        return f"step {step.step_index} - no action recorded"
    return (f"step {step.step_index}  v{step.policy_version}  logp {step.mean_logprob:.3f}  "
            f"H {step.mean_entropy:.3f}  ({step.num_tokens} tok)")


def placeholder(screen: tuple[int, int], digest: str) -> Image.Image:
    w, h = (max(64, screen[0]), max(64, screen[1]))
    img = Image.new("RGB", (w, h), (200, 200, 200))
    ImageDraw.Draw(img).text((6, 6), f"screenshot {digest[:12]}\nnot in the blob store", font=font(12), fill=INK)
    return img


def step_image(step: StepView, png: bytes | None, *, width: int) -> Image.Image:
    """The step's screenshot at ``width`` with its actions drawn on it."""
    shot = Image.open(io.BytesIO(png)).convert("RGB") if png else placeholder(step.screen, step.screenshot_digest)
    scaled, s = fit_width(shot, width)
    return draw_actions(scaled, step.actions, scale=s * shot.width / max(1, step.screen[0] or shot.width))


def header_lines(view: TraceView) -> list[tuple[str, RGB]]:
    reward = "-" if view.reward is None else f"{view.reward:g}"
    ok = (20, 130, 50) if view.status == "success" else (190, 30, 30)
    return [(f"task {view.task_id}   rollout {view.rollout_id}", INK), (f"instruction: {view.instruction}", INK),
            (f"status {view.status}   reward {reward}   steps {view.num_steps}   origin {view.origin}", ok)]


def strip(view: TraceView, shots: Sequence[Image.Image]) -> Image.Image:
    panels = [vstack([shot, text_panel([(stats_line(s), (40, 40, 160)), ("Thought: " + (thought_of(s) or "-"), INK),
                                        ("Action: " + action_text(s), (120, 30, 30))], PANEL_W)])
              for s, shot in zip(view.steps, shots, strict=True)]
    grid = stack(panels, columns=COLUMNS)
    return vstack([text_panel(header_lines(view), grid.width, size=15), grid])


def page(view: TraceView, images: Sequence[str]) -> str:
    """The HTML page (images by relative file name)."""
    e = html.escape
    reward = "-" if view.reward is None else f"{view.reward:g}"
    out = ["<!doctype html><html><head><meta charset='utf-8'>",
           f"<title>trace {e(view.rollout_id)}</title><style>body{{font-family:sans-serif;margin:16px}}"
           "figure{display:flex;gap:16px;margin:0 0 20px 0}pre{white-space:pre-wrap;max-width:600px}"
           "img{border:1px solid #999}</style></head><body>",
           f"<h1>task {e(view.task_id)}</h1><p><b>instruction:</b> {e(view.instruction)}</p>",
           f"<p><b>status</b> {e(view.status)} &nbsp; <b>reward</b> {e(reward)} &nbsp; <b>steps</b> {view.num_steps}"
           f" &nbsp; <b>origin</b> {e(view.origin)} &nbsp; <b>rollout</b> {e(view.rollout_id)}</p>",
           "<p><a href='strip.png'>all steps as one picture (strip.png)</a></p>"]
    for s, name in zip(view.steps, images, strict=True):
        out.append(f"<figure><img src='{e(name)}' alt='step {s.step_index}'><figcaption>"
                   f"<h3>{e(stats_line(s))}</h3><p><b>Thought:</b> {e(thought_of(s) or '-')}</p>"
                   f"<p><b>Action:</b> <code>{e(action_text(s))}</code></p>"
                   f"<details><summary>response</summary><pre>{e(s.response_text)}</pre></details>"
                   "</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)


def render_trace(view: TraceView, load_png: Callable[[str], bytes | None], out_dir: Path) -> Path:
    """Write the step PNGs, ``strip.png`` and ``index.html`` into ``out_dir``; returns the HTML path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = []
    thumbs = []
    for s in view.steps:
        png = load_png(s.screenshot_digest)
        full = step_image(s, png, width=max(PAGE_W, s.screen[0]))
        name = f"step_{s.step_index:03d}.png"
        full.save(out_dir / name)
        names.append(name)
        thumbs.append(step_image(s, png, width=PANEL_W))
    strip(view, thumbs).save(out_dir / "strip.png")
    path = out_dir / "index.html"
    path.write_text(page(view, names), encoding="utf-8")
    return path
