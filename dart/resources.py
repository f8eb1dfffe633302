"""Files dart reads at run time that live outside ``dart/`` in the repository: the Avro schemas
(``schemas/``, their source of truth), the shipped stack configs (``configs/``) and the libvirt
domain template (``deploy/libvirt/``).

A wheel carries copies of them as package data under ``dart/_data/`` (``setup.py`` copies
:data:`SOURCES` there when it builds); an installed dart reads those through
``importlib.resources``. A checkout (the tests, an editable install) has no ``dart/_data`` and
reads the repository's own files, so there is one copy to edit.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# name under dart/_data -> (directory in the repository, glob of the files the wheel carries)
SOURCES: dict[str, tuple[str, str]] = {
    "schemas": ("schemas", "**/*.avsc"),
    "configs": ("configs", "*.yaml"),
    "libvirt": ("deploy/libvirt", "*.tmpl"),
}
PACKAGE_DIR = "_data"
_REPO = Path(__file__).resolve().parents[1]


def resource_dir(name: str) -> Path:
    """The directory holding the ``name`` files of :data:`SOURCES` (package data, else the checkout's)."""
    if name not in SOURCES:
        raise KeyError(f"no resource directory {name!r}; known: {sorted(SOURCES)}")
    packaged = files("dart") / PACKAGE_DIR / name
    if packaged.is_dir():
        # A wheel installs into a directory, so the Traversable is a filesystem path.
        return Path(str(packaged))
    return _REPO / SOURCES[name][0]


def config_path(name: str) -> Path:
    """A shipped stack config, e.g. ``config_path("synthetic.yaml")``."""
    return resource_dir("configs") / name
