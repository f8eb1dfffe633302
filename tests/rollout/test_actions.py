from __future__ import annotations

from dart.events import ObservationEmitted, ReplyRoute, Sampling
from dart.rollout.config import RolloutWorkerConfig
from dart.rollout.service import actions_of


def obs(width: int = 1920, height: int = 1080) -> ObservationEmitted:
    return ObservationEmitted.new(
        run_id="t",
        producer="env",
        rollout_id="r",
        request_id="q",
        task_id="t",
        group_id="g",
        step_index=0,
        instruction="x",
        screenshot_digest="0" * 64,
        screen_width=width,
        screen_height=height,
        history=[],
        reply=ReplyRoute(topic="a", partition=0, worker_id="env"),
        sampling=Sampling(temperature=1.0, top_p=1.0, max_new_tokens=8, seed=1),
        max_steps=5,
        env_worker="env",
        slot=0,
    )


def test_real_ui_tars_answer_maps_to_screen_pixels():
    cfg = RolloutWorkerConfig(model="m")
    [click] = actions_of("Thought: xxx\nAction: click(start_box='(197,525)')", obs(), cfg)
    assert click.kind == "click"
    assert round(click.x, 1) == 195.8 and round(click.y, 1) == 519.2


def test_garbled_answer_is_an_invalid_action_not_an_exception():
    cfg = RolloutWorkerConfig(model="m")
    for text in ["", "539Y51\ufffdclose Cell", "Action: click(start_box='(1,", "Action: rm -rf /()"]:
        actions = actions_of(text, obs(), cfg)
        assert actions and actions[0].kind == "invalid"
