"""Everything else is in pyproject.toml. This only adds the package data that lives outside
``dart/`` in the repository (schemas, shipped configs, the libvirt template: see
dart/resources.py) to the wheel, under ``dart/_data/``. An editable install reads the
checkout's own files instead, so nothing is copied for it."""

import runpy
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
_resources = runpy.run_path(str(ROOT / "dart" / "resources.py"), run_name="dart_resources")


class BuildPyWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "dart" / _resources["PACKAGE_DIR"]
        for name, (source, pattern) in _resources["SOURCES"].items():
            found = sorted(p for p in (ROOT / source).glob(pattern) if p.is_file())
            if not found:
                raise FileNotFoundError(f"no {pattern} under {ROOT / source}: the wheel would lack {name}")
            for path in found:
                dest = target / name / path.relative_to(ROOT / source)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)


setup(cmdclass={"build_py": BuildPyWithData})
