"""Pure parts of the VM layer: names, templates, lifecycle policy, heartbeats, wire protocol."""

from __future__ import annotations

import gzip
import struct
import zlib

import pytest

from dart.agent.actions import Click, Drag, Hotkey, InvalidAction, Scroll, Type, to_wire
from dart.env.guest_agent import protocol
from dart.env.libvirt import domain, policy, tinyguest
from dart.env.libvirt.backend import png_size
from dart.env.libvirt.config import VmPoolConfig
from dart.env.libvirt.policy import Timings, Verdict, VmState, VmStats
from dart.errors import ConfigError, EnvError


def test_pool_domain_names_match_exactly_not_by_bare_prefix():
    assert domain.domain_name("dart-vm", 3, 1) == "dart-vm-3-1"
    assert domain.parse_name("dart-vm", "dart-vm-3-1") == (3, 1)
    names = ["dart-vm-0-0", "dart-vm-12-3", "dart-vm-b-0-0", "dart-vmx-0-0", "dart-vm-0", "other", "dart-vm-1-0-x"]
    assert domain.leftovers("dart-vm", names) == ["dart-vm-0-0", "dart-vm-12-3"]
    assert domain.leftovers("dart-vm-b", names) == ["dart-vm-b-0-0"]


def test_template_check_names_the_unknown_variable_and_the_missing_disk():
    with pytest.raises(ConfigError, match=r"\$\{kernel\}"):
        domain.check_template("<name>${name}</name><kernel>${kernel}</kernel>", {}, has_disk=False)
    domain.check_template("<name>${name}</name><kernel>${kernel}</kernel>", {"kernel": "/k"}, has_disk=False)
    with pytest.raises(ConfigError, match="no \\$\\{disk\\}"):
        domain.check_template("<name>${name}</name>", {}, has_disk=True)
    with pytest.raises(ConfigError, match="stray"):
        domain.check_template("<name>${name}</name> costs $5", {}, has_disk=False)


def test_render_escapes_values_but_not_the_metadata_element():
    xml = domain.render("<d><name>${name}</name><m>${metadata}</m><x>${net}</x></d>",
                        values={"name": "a&b", "metadata": domain.metadata_xml("p", 1, 2)}, extra={"net": "<n>"})
    assert "<name>a&amp;b</name>" in xml
    assert 'pool="p" slot="1" generation="2"' in xml
    assert "<x>&lt;n&gt;</x>" in xml


def test_snapshot_xml_asks_for_memory_only_when_running():
    assert "<memory snapshot='internal'/>" in domain.snapshot_xml("s", with_memory=True)
    assert "<memory snapshot='no'/>" in domain.snapshot_xml("s", with_memory=False)


def test_config_refuses_bad_values_naming_the_field():
    with pytest.raises(ConfigError, match="name_prefix"):
        VmPoolConfig(name_prefix="1bad prefix")
    with pytest.raises(ConfigError, match="agent_urls"):
        VmPoolConfig(size=2, agent_urls=("http://127.0.0.1:5000",))
    with pytest.raises(ConfigError, match="quarantine_after"):
        VmPoolConfig(quarantine_after=0)


def test_policy_recycles_after_k_successes_and_on_each_failure_then_quarantines():
    stats = VmStats()
    verdicts = []
    for _ in range(3):
        stats, v = policy.after_outcome(stats, ok=True, recycle_after=3, quarantine_after=2)
        verdicts.append(v)
    assert verdicts == [Verdict.KEEP, Verdict.KEEP, Verdict.RECYCLE]
    stats = policy.after_rebuild(stats)
    assert (stats.trajectories, stats.trajectories_total, stats.recycles) == (0, 3, 1)
    stats, v1 = policy.after_outcome(stats, ok=False, error="boom", recycle_after=3, quarantine_after=2)
    stats, v2 = policy.after_outcome(stats, ok=False, error="boom again", recycle_after=3, quarantine_after=2)
    assert (v1, v2) == (Verdict.RECYCLE, Verdict.QUARANTINE)
    assert (stats.failures_in_row, stats.failures_total, stats.last_error) == (2, 2, "boom again")


def test_a_success_ends_a_run_of_failures():
    stats, _ = policy.after_outcome(VmStats(), ok=False, recycle_after=0, quarantine_after=2)
    stats, v = policy.after_outcome(stats, ok=True, recycle_after=0, quarantine_after=2)
    assert v == Verdict.KEEP and stats.failures_in_row == 0
    stats, v = policy.after_outcome(stats, ok=False, recycle_after=0, quarantine_after=2)
    assert v == Verdict.RECYCLE and stats.failures_total == 2


def test_vm_heartbeat_carries_state_health_timings_and_event():
    timings = Timings()
    timings.record("revert", 0.25)
    timings.record("revert", 0.5)
    hb = policy.vm_heartbeat(run_id="r", producer="env-1", vm_name="dart-vm-0-1", state=VmState.QUARANTINED,
                             health="quarantined: probe", host="h", pid=7, busy=False, busy_s=1, idle_s=2,
                             uptime_s=3, stats=VmStats(failures_in_row=3, last_error="probe"), timings=timings,
                             info={"event": "quarantined"})
    assert (hb.worker_id, hb.role, hb.state, hb.health) == ("env-1/dart-vm-0-1", "vm", "quarantined", "quarantined: probe")
    assert hb.metrics["vm/revert_s"] == 0.5 and hb.metrics["vm/failures_in_row"] == 3.0
    assert hb.info == {"domain": "dart-vm-0-1", "last_error": "probe", "event": "quarantined"}
    metrics = policy.pool_metrics([timings], ready=1, busy=0, quarantined=1, building=0)
    assert metrics["vm/revert_s_p50"] == 0.375 and metrics["vm/revert_s_max"] == 0.5


def test_exec_request_takes_argv_lists_splits_strings_and_refuses_shell():
    assert protocol.parse_exec({"command": ["ls", "-l"]}).argv == ("ls", "-l")
    assert protocol.parse_exec({"command": "echo 'a b' c", "shell": False}).argv == ("echo", "a b", "c")
    with pytest.raises(protocol.ProtocolError, match="--allow-shell"):
        protocol.parse_exec({"command": "echo $HOME", "shell": True})
    assert protocol.parse_exec({"command": "echo $HOME", "shell": True}, allow_shell=True).argv == (
        "sh", "-c", "echo $HOME")
    for bad in ({"command": []}, {"command": [1]}, {"command": "a 'b"}, {"command": ["a"], "timeout": -1},
                {"command": ["a"], "shell": "yes"}, ["ls"]):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse_exec(bad)


def test_action_bodies_round_trip_every_kind_and_reject_bad_fields():
    for action in (Click(x=1, y=2), Drag(x=1, y=2, end_x=3, end_y=4), Hotkey(keys=("ctrl", "c")),
                   Type(content="hi\n"), Scroll(x=5, y=6, direction="down")):
        assert protocol.parse_action(protocol.action_body(to_wire(action))) == action
    assert isinstance(protocol.parse_action({"kind": "click", "x": 1}), InvalidAction)
    assert isinstance(protocol.parse_action({"kind": "explode"}), InvalidAction)
    for bad in ({"kind": "click", "x": "1", "y": 2}, {"kind": "click", "x": float("nan"), "y": 1},
                {"kind": "type", "text": "a", "code": "import os"}, {"x": 1}, "click"):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse_action(bad)


def test_exec_response_has_the_osworld_shape():
    assert protocol.exec_response(1, "o", "e") == {"status": "error", "output": "o", "error": "e", "returncode": 1}


def test_window_search_escapes_the_title():
    argv = protocol.window_search_argv(protocol.parse_window({"window_name": "a.b (1)", "strict": True}))
    assert argv[-2:] == ["--name", r"^a\.b\ \(1\)$"]


def test_png_size_reads_ihdr_and_refuses_other_bytes():
    ihdr = struct.pack(">IIBBBBB", 640, 480, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    assert png_size(png) == (640, 480)
    with pytest.raises(EnvError):
        png_size(b"GIF89a" + b"\0" * 30)


def test_initramfs_is_a_newc_archive_with_init_and_busybox(tmp_path):
    fake_busybox = tmp_path / "busybox"
    fake_busybox.write_bytes(b"\x7fELF" + b"x" * 1001)
    raw = gzip.decompress(tinyguest.build_initramfs(fake_busybox))
    names, off = [], 0
    while True:
        assert raw[off:off + 6] == b"070701"
        size, namesize = int(raw[off + 54:off + 62], 16), int(raw[off + 94:off + 102], 16)
        name = raw[off + 110:off + 110 + namesize - 1].decode()
        off += 110 + namesize
        off += -off % 4
        data = raw[off:off + size]
        off += size + (-size % 4)
        if name == "TRAILER!!!":
            break
        names.append((name, len(data)))
    assert ("init", len(tinyguest.INIT_SCRIPT)) in names and ("bin/busybox", 1005) in names
