"""``dart vm ls|clean`` (a pool's domains); ``dart guest-agent`` is registered from dart.env.guest_agent.cli."""

from __future__ import annotations

import argparse
import json
import sys

from dart.env.guest_agent import cli as agent_cli
from dart.env.libvirt import domain, hypervisor


def register(subparsers: argparse._SubParsersAction) -> None:
    agent_cli.register(subparsers)

    vm = subparsers.add_parser("vm", help="libvirt domains of a VM pool")
    vsub = vm.add_subparsers(dest="vm_command", metavar="SUBCOMMAND")
    vsub.required = True
    for name, fn, text in (("ls", _ls, "list the pool's domains (JSON lines)"),
                           ("clean", _clean, "destroy and undefine the pool's leftover domains")):
        c = vsub.add_parser(name, help=text, description=text)
        c.add_argument("--uri", default="qemu:///system", help="libvirt URI (default qemu:///system)")
        c.add_argument("--prefix", default="dart-vm", help="the pool's name_prefix (default dart-vm)")
        c.set_defaults(func=fn)


def _ls(args: argparse.Namespace) -> int:
    conn = hypervisor.open_connection(args.uri)
    try:
        for name in domain.leftovers(args.prefix, hypervisor.domain_names(conn)):
            dom = hypervisor.lookup(conn, name)
            if dom is None:
                continue
            snaps = dom.snapshotListNames(0) if dom else []
            print(json.dumps({"name": name, "running": hypervisor.is_running(dom), "snapshots": snaps}))
    finally:
        conn.close()
    return 0


def _clean(args: argparse.Namespace) -> int:
    conn = hypervisor.open_connection(args.uri)
    try:
        names = domain.leftovers(args.prefix, hypervisor.domain_names(conn))
        for name in names:
            hypervisor.remove(conn, name)
            print(f"removed {name}", file=sys.stderr)
    finally:
        conn.close()
    print(json.dumps({"removed": names}))
    return 0
