"""Pure helpers for a pool's domains: names, the XML template, snapshot XML.

Names are ``<prefix>-<slot>-<generation>``: the slot is the pool position a VM fills (it keeps
its static agent URL across replacements); the generation counts replacements of that slot,
so a quarantined domain can stay defined next to the VM that replaced it.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from pathlib import Path
from xml.sax.saxutils import escape

from dart.errors import ConfigError

METADATA_NS = "https://github.com/dart-rl/dart/libvirt/1"
TEMPLATE_VARS = ("name", "uuid", "memory_mib", "vcpus", "disk", "vm_dir", "metadata", "agent_token", "agent_token_file")
"""Variables the pool always provides; ``template_vars`` adds more."""


def domain_name(prefix: str, slot: int, generation: int) -> str:
    return f"{prefix}-{slot}-{generation}"


def parse_name(prefix: str, name: str) -> tuple[int, int] | None:
    """(slot, generation) if ``name`` is one of this pool's domains, else None.

    Exact pattern, not a bare prefix match: pool ``dart-vm`` must never claim ``dart-vm-b-0-0``.
    """
    m = re.fullmatch(re.escape(prefix) + r"-(\d+)-(\d+)", name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def leftovers(prefix: str, names: Iterable[str]) -> list[str]:
    """The names that belong to pool ``prefix`` (what start-up must destroy), sorted."""
    return sorted(n for n in names if parse_name(prefix, n) is not None)


def metadata_xml(prefix: str, slot: int, generation: int) -> str:
    """The ``<metadata>`` child that marks a domain as this pool's (visible in ``virsh dumpxml``)."""
    return (
        f'<dart:vm xmlns:dart="{METADATA_NS}" pool="{escape(prefix)}" slot="{slot}" generation="{generation}"/>'
    )


def template_placeholders(template: str) -> set[str]:
    """Every ``${name}`` / ``$name`` the template uses."""
    names = set()
    for m in string.Template.pattern.finditer(template):
        name = m.group("named") or m.group("braced")
        if name:
            names.add(name)
        if m.group("invalid") is not None:
            raise ConfigError(f"domain template has a stray '$' at offset {m.start()}; write '$$' for a literal $")
    return names


def check_template(template: str, extra: Mapping[str, str], *, has_disk: bool) -> None:
    """Refuse, at start-up, a template that would fail to render or would ignore the disk."""
    used = template_placeholders(template)
    unknown = used - set(TEMPLATE_VARS) - set(extra)
    if unknown:
        raise ConfigError(
            f"domain template uses ${{{sorted(unknown)[0]}}}, which is neither a pool variable "
            f"({', '.join(TEMPLATE_VARS)}) nor in template_vars"
        )
    if "name" not in used:
        raise ConfigError("domain template must set <name>${name}</name>")
    if has_disk and "disk" not in used:
        raise ConfigError("base_image is set but the domain template has no ${disk}; add a <disk> with it")


def render(template: str, *, values: Mapping[str, str | int], extra: Mapping[str, str]) -> str:
    """The domain XML for one VM. Pool values are XML-escaped; a pool value wins over ``extra``."""
    merged = {k: escape(str(v)) for k, v in extra.items()}
    merged.update({k: (str(v) if k == "metadata" else escape(str(v))) for k, v in values.items()})
    try:
        return string.Template(template).substitute(merged)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"domain template cannot be rendered: missing or bad variable {exc}") from exc


def snapshot_xml(name: str, *, with_memory: bool) -> str:
    """``<domainsnapshot>`` for an internal snapshot (memory + disk of a running guest, or disk only)."""
    memory = "<memory snapshot='internal'/>" if with_memory else "<memory snapshot='no'/>"
    return (
        f"<domainsnapshot><name>{escape(name)}</name>"
        f"<description>dart pool reset point</description>{memory}</domainsnapshot>"
    )


def read_template(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read domain template {path}: {exc}; set template in the pool config") from exc
