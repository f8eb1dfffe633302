"""Trajectory pictures: markers land where the action is (pixel checks), and a real synthetic
trajectory sent through the broker renders as step PNGs, a strip and an HTML page."""

from __future__ import annotations

import asyncio
import html
import uuid

import pytest
from PIL import Image

from dart.agent.actions import to_wire
from dart.agent.uitars import render_response
from dart.blobs import LocalBlobStore
from dart.bus import BusConfig
from dart.cli import build_parser
from dart.data.draw import CLICK, DRAG, LABEL, RIGHT, SCROLL, TEXT_BOX, draw_action, marker_radius
from dart.data.manager import DataManager
from dart.data.store import Store
from dart.data.trace import load_trace, render_trace
from dart.env.synthetic import generate_tasks, oracle_trace, render_png, screen_of
from dart.errors import DartError
from dart.events import (
    ActionChosen,
    ObservationEmitted,
    ParsedAction,
    ReplyRoute,
    RewardAssigned,
    TrajectoryFinished,
    TrajectoryStatus,
)
from tests.data.factories import RUN, SAMPLING, T0, task
from tests.data.test_manager import config, run_until, send_all

WHITE = (255, 255, 255)


def blank(w: int = 200, h: int = 160) -> Image.Image:
    return Image.new("RGB", (w, h), WHITE)


def near(px: tuple[int, ...], color: tuple[int, int, int], tol: int = 40) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(px, color, strict=False))


def ring_hits(img: Image.Image, x: int, y: int, r: int, color) -> int:
    """Pixels of ``color`` on the circle of radius r around (x, y), out of 16 probes."""
    import math

    probes = [(round(x + r * math.cos(k * math.pi / 8)), round(y + r * math.sin(k * math.pi / 8))) for k in range(16)]
    return sum(near(img.getpixel(p), color) for p in probes)


def test_click_is_a_red_ring_and_cross_at_the_point_and_nowhere_else() -> None:
    img = blank()
    out = draw_action(img, ParsedAction(kind="click", x=60, y=50))
    r = marker_radius(img)
    assert out is not img and img.getpixel((60, 50)) == WHITE          # the input is not touched
    assert near(out.getpixel((60, 50)), CLICK)                          # the cross centre
    assert ring_hits(out, 60, 50, r, CLICK) >= 14
    assert ring_hits(out, 140, 110, r, CLICK) == 0                      # nothing drawn elsewhere
    assert out.getpixel((140, 110)) == WHITE


def test_scale_maps_screen_pixels_onto_an_enlarged_image() -> None:
    out = draw_action(blank(400, 320), ParsedAction(kind="click", x=60, y=50), scale=2.0)
    assert near(out.getpixel((120, 100)), CLICK) and out.getpixel((60, 50)) == WHITE


def test_double_click_has_two_rings_and_right_click_another_colour() -> None:
    img = blank()
    r = marker_radius(img)
    dbl = draw_action(img, ParsedAction(kind="left_double", x=100, y=80))
    assert ring_hits(dbl, 100, 80, r, CLICK) >= 14 and ring_hits(dbl, 100, 80, round(r * 1.6), CLICK) >= 14
    one = draw_action(img, ParsedAction(kind="click", x=100, y=80))
    assert ring_hits(one, 100, 80, round(r * 1.6), CLICK) == 0
    right = draw_action(img, ParsedAction(kind="right_single", x=100, y=80))
    assert ring_hits(right, 100, 80, r, RIGHT) >= 14 and ring_hits(right, 100, 80, r, CLICK) == 0


def test_drag_is_an_arrow_from_start_to_end() -> None:
    out = draw_action(blank(), ParsedAction(kind="drag", x=20, y=80, end_x=180, end_y=80))
    assert all(near(out.getpixel((x, 80)), DRAG) for x in range(30, 170, 10))   # the shaft
    assert near(out.getpixel((178, 80)), DRAG)                                  # the head at the end
    assert out.getpixel((100, 20)) == WHITE and out.getpixel((195, 80)) == WHITE


@pytest.mark.parametrize(("direction", "dx", "dy"), [("up", 0, -1), ("down", 0, 1), ("left", -1, 0), ("right", 1, 0)])
def test_scroll_arrow_points_in_the_scroll_direction(direction, dx, dy) -> None:
    img = blank()
    r = marker_radius(img)
    out = draw_action(img, ParsedAction(kind="scroll", x=100, y=80, direction=direction))
    assert near(out.getpixel((100 + dx * 2 * r, 80 + dy * 2 * r)), SCROLL)       # along the arrow
    assert out.getpixel((100 - dx * 2 * r, 80 - dy * 2 * r)) == WHITE            # nothing behind it


def test_typed_text_and_hotkeys_sit_in_a_box_at_the_top_and_terminal_kinds_label_the_bottom() -> None:
    img = blank(300, 200)
    typed = draw_action(img, ParsedAction(kind="type", text="hello\n"))
    top = [typed.getpixel((x, y)) for x in range(0, 300, 4) for y in range(0, 40, 2)]
    bottom = [typed.getpixel((x, y)) for x in range(0, 300, 4) for y in range(150, 200, 2)]
    assert sum(near(p, TEXT_BOX, 10) for p in top) > 50 and not any(near(p, TEXT_BOX, 10) for p in bottom)
    keys = draw_action(img, ParsedAction(kind="hotkey", text="ctrl c"))
    assert any(near(keys.getpixel((x, 15)), TEXT_BOX, 10) for x in range(0, 300, 4))
    for kind in ("finished", "call_user", "invalid"):
        out = draw_action(img, ParsedAction(kind=kind, text="why" if kind == "invalid" else None))
        low = [out.getpixel((x, y)) for x in range(0, 300, 4) for y in range(150, 200, 2)]
        assert sum(near(p, LABEL[kind], 10) for p in low) > 30, kind
        assert all(out.getpixel((x, 10)) == WHITE for x in range(0, 300, 10))


def synthetic_trajectory(blobs: LocalBlobStore) -> tuple[list, dict, str]:
    """The oracle's solution of a real synthetic form task, as the env and rollout workers emit it."""
    t = generate_tasks(1, preset="forms", seed=2)[0]
    spec = screen_of(t)
    w, h = int(spec["width"]), int(spec["height"])
    rid, req, gid = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    events: list = [task(t["id"])]
    for i, (state, action) in enumerate(oracle_trace(t)):
        digest = blobs.put(render_png(spec, state))
        obs = ObservationEmitted.new(
            run_id=RUN, producer="env-1", rollout_id=rid, request_id=req, task_id=t["id"], group_id=gid,
            step_index=i, instruction=t["instruction"], screenshot_digest=digest, screen_width=w, screen_height=h,
            history=[], reply=ReplyRoute(topic="r", partition=0, worker_id="env-1"), sampling=SAMPLING,
            max_steps=30, env_worker="env-1", slot=0)
        text = render_response(f"Step {i}: I use {action.kind} <here> & go on.", [action], screen=(w, h))
        events += [obs, ActionChosen.new(
            run_id=RUN, producer="rollout-0", in_reply_to=obs.event_id, rollout_id=rid, request_id=req,
            task_id=t["id"], step_index=i, response_text=text, actions=[to_wire(action)],
            response_token_ids=[1, 2, 3, 4], logprobs=[-0.5, -1.5, -1.0, -9.0], entropies=[0.2, 0.4, 0.6, 0.0],
            policy_version=3, prompt_hash="p", prompt_tokens=10, finish_reason="stop", engine="hf", queue_s=0.0,
            generate_s=0.1, sampling=SAMPLING)]
    n = len(oracle_trace(t))
    events += [TrajectoryFinished.new(
        run_id=RUN, producer="env-1", rollout_id=rid, request_id=req, task_id=t["id"], group_id=gid, rollout_index=0,
        status=TrajectoryStatus("success"), finish_reason="done", num_steps=n, max_steps=30,
        step_policy_versions=[3] * n, env_worker="env-1", slot=0, reset_s=0.1, env_s=0.2, policy_wait_s=0.3,
        eval_s=0.1, started_at=T0),
        RewardAssigned.new(run_id=RUN, producer="env-1", rollout_id=rid, task_id=t["id"], group_id=gid, reward=1.0,
                           evaluator="synthetic", evaluator_version="1")]
    return events, t, rid


@pytest.mark.kafka
@pytest.mark.clickhouse
async def test_a_synthetic_trajectory_through_the_broker_renders_as_pictures(
        bus: BusConfig, store: Store, blobs: LocalBlobStore, tmp_path, chdb_path) -> None:
    events, t, rid = synthetic_trajectory(blobs)
    await send_all(bus, events)
    dm = DataManager(config(), bus, store=store, blobs=blobs)
    await run_until(dm, lambda: asyncio.sleep(0, dm.projected >= len(events)))
    view = load_trace(store.query, store.database, rid)
    kinds = [a.kind for s in view.steps for a in s.actions]
    assert kinds == ["click", "type", "click", "scroll", "click", "click"]
    assert (view.task_id, view.status, view.reward, view.num_steps) == (t["id"], "success", 1.0, 6)
    assert view.steps[0].mean_logprob == pytest.approx(-3.0) and view.steps[0].mean_entropy == pytest.approx(0.3)
    path = await asyncio.to_thread(render_trace, view, blobs.get, tmp_path / rid)
    page = path.read_text()
    assert html.escape(t["instruction"]) in page and "status</b> success" in page
    assert "Step 3: I use scroll &lt;here&gt; &amp; go on." in page and "<here>" not in page   # thought, escaped
    assert "v3  logp -3.000  H 0.300  (4 tok)" in page
    assert sorted(p.name for p in path.parent.glob("*.png")) == [*[f"step_{i:03d}.png" for i in range(6)], "strip.png"]
    # the first click is drawn where the action is (the page image is the 448 px screen enlarged to 640)
    first = view.steps[0].actions[0]
    img = Image.open(path.parent / "step_000.png").convert("RGB")
    s = 640 / 448
    assert img.size == (640, round(336 * s))
    assert near(img.getpixel((round(first.x * s), round(first.y * s))), CLICK)
    strip = Image.open(path.parent / "strip.png")
    assert strip.width > 4 * 360 and strip.height > 2 * 270
    # the command: same pictures from the chdb path and the blob directory
    args = build_parser().parse_args(["trace", rid, "--dsn", f"chdb://{chdb_path}", "--database", store.database,
                                      "--blobs", str(blobs.root), "--out", str(tmp_path / "cli")])
    assert await asyncio.to_thread(args.func, args) == 0
    assert (tmp_path / "cli" / rid / "step_005.png").read_bytes() == (path.parent / "step_005.png").read_bytes()
    args = build_parser().parse_args(["trace", "no-such-rollout", "--dsn", f"chdb://{chdb_path}",
                                      "--database", store.database, "--out", str(tmp_path / "cli")])
    with pytest.raises(DartError, match="'no-such-rollout' is not in the projection"):
        args.func(args)
