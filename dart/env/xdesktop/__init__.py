"""A real X desktop on this machine (Xvfb + openbox + mousepad / LibreOffice), one display
per slot, driven with xdotool.

Public API::

    XDesktopBackend(XDesktopConfig(width=1280, height=800, ...), slot=i)   # an EnvBackend
    xdotool_argvs(action, screen=(w, h)) -> list[argv]; run_argvs(argvs, env=...)
    local_tasks() -> list[Task]; oracle_plan(task_id) -> list[Action]
"""

from dart.env.xdesktop.backend import XDesktopBackend, XDesktopConfig
from dart.env.xdesktop.display import XDisplay, require_tools
from dart.env.xdesktop.getters import register as register_evaluators
from dart.env.xdesktop.oracle import PLANS, local_tasks, oracle_plan
from dart.env.xdesktop.setup import SETUP_TYPES, TASKS_DIR, resolve_path
from dart.env.xdotool import KEYSYMS, UnknownKey, key_combo, keysym, run_argvs, xdotool_argvs

__all__ = [
    "KEYSYMS",
    "PLANS",
    "SETUP_TYPES",
    "TASKS_DIR",
    "UnknownKey",
    "XDesktopBackend",
    "XDesktopConfig",
    "XDisplay",
    "key_combo",
    "keysym",
    "local_tasks",
    "oracle_plan",
    "register_evaluators",
    "require_tools",
    "resolve_path",
    "run_argvs",
    "xdotool_argvs",
]
