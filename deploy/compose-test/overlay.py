"""Lay fast.yaml over the service configs of deploy/compose/: `overlay.py SRC_DIR OVERRIDES OUT_DIR`
writes every *.yaml of SRC_DIR to OUT_DIR, each merged with its entry in OVERRIDES (mappings
merged key by key, anything else replaced). Needs PyYAML (run it in the dart image)."""

import sys
from pathlib import Path
from typing import Any

import yaml


def merged(base: Any, extra: Any) -> Any:
    if isinstance(base, dict) and isinstance(extra, dict):
        return {**base, **{k: merged(base.get(k), v) for k, v in extra.items()}}
    return extra


def main(src: str, overrides: str, out: str) -> None:
    extra = yaml.safe_load(Path(overrides).read_text()) or {}
    unknown = set(extra) - {p.name for p in Path(src).glob("*.yaml")}
    if unknown:
        sys.exit(f"overlay: {overrides} names files {src} does not have: {sorted(unknown)}")
    for path in sorted(Path(src).glob("*.yaml")):
        body = merged(yaml.safe_load(path.read_text()), extra.get(path.name, {}))
        (Path(out) / path.name).write_text(f"# {path} with {overrides}\n" + yaml.safe_dump(body, sort_keys=False))


if __name__ == "__main__":
    main(*sys.argv[1:])
