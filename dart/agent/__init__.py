"""The agent core: what a GUI agent *is*, shared by every service and owned by none.

- :mod:`dart.agent.actions` — the action language: typed actions (click, type, hotkey, …) and
  their wire form on ``ActionChosen``.
- :mod:`dart.agent.uitars` — UI-TARS model text <-> typed actions, with the coordinate frames of
  UI-TARS-1.5 / Qwen2.5-VL and UI-TARS 1.0 / Qwen2-VL. Model text is parsed, never executed.
- :mod:`dart.agent.prompt` — observation + history -> model input. The rollout workers build
  prompts with it and the trainer rebuilds them with it, so both feed the policy the same tokens
  (``ActionChosen.prompt_hash`` proves it per step).
- :mod:`dart.agent.model` — loading, saving and re-scoring a policy; :mod:`dart.agent.weight_format`
  — the weight format of a policy version (the trainer writes it, rollout workers read it);
  :mod:`dart.agent.tiny` — a tiny random-weight Qwen2.5-VL for CPU runs.

Layering: the four services (``dart.env``, ``dart.rollout``, ``dart.data``, ``dart.train``)
import this package and the kernel (``dart.events``, ``dart.bus``, ``dart.blobs``,
``dart.config``, ``dart.errors``, ``dart.events.manifest``), never each other; this package imports
only the kernel, and no bus client (tests/test_layout.py holds all three rules).
"""
