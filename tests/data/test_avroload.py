"""The ClickHouse projection path (avroload.py) against the Python one (rows.py), in real chdb:
the same rows byte for byte, and every record Python would reject still rejected, with the
Python decoder's own error."""

from __future__ import annotations

import array
import contextlib
import io
import json
import math
import random
import re
import uuid
from dataclasses import replace
from types import SimpleNamespace

import fastavro
import pytest

from dart.data import avroload, projection
from dart.data.replay import compare, format_checks
from dart.data.rows import TABLES
from dart.data.store import Store
from dart.errors import DecodeError
from dart.events import (
    ActionChosen,
    DeadLetter,
    Event,
    ParsedAction,
    WorkerHeartbeat,
    decode,
    encode,
)
from dart.events.codec import MARKER, SCHEMA_DIR, fingerprint, registry
from dart.events.examples import action_chosen, all_examples
from tests.data.factories import group, heartbeat

pytestmark = pytest.mark.clickhouse


def records(values: list[bytes | None]) -> list[SimpleNamespace]:
    return [SimpleNamespace(value=v) for v in values]


def project_both(store: Store, values: list[bytes | None]) -> avroload.Projected:
    """Project through ClickHouse into ``store`` and through Python into a twin; assert equal tables."""
    twin = Store(store.client, f"py{uuid.uuid4().hex[:8]}", store.target)
    twin.migrate()
    try:
        good = []
        for v in values:
            with contextlib.suppress(DecodeError):
                good.append(decode(v))
        projection.write_events(twin, good)
        done = avroload.project_records(store, records(values), projection.write_events)
        checks, diffs = compare(store.query, store.database, twin.query, twin.database, TABLES)
        assert all(c.equal for c in checks), format_checks(checks, diffs)
        assert done.events == len(good)
        return done
    finally:
        twin.command(f"DROP DATABASE {twin.database}")


def action(**kw) -> ActionChosen:
    return replace(action_chosen(), event_id=str(uuid.uuid4()), **kw)


def test_clickhouse_writes_every_event_type_as_the_python_path_does(store: Store) -> None:
    rng = random.Random(3)
    events: list[Event] = [*all_examples()]
    events += group("task-é", [1.0, 0.0, None], steps=3)[0]
    events += [heartbeat("env-1", 4), replace(heartbeat("env-2", 2), policy_version=7, metrics={}, info={})]
    # Coordinates as the parser gives them (pixels, fractions, negatives, -0.0), texts and
    # directions, padding past the response, no tokens at all, unicode outside the actions.
    for _ in range(200):
        coords = [rng.choice([float(rng.randrange(4000)), rng.uniform(-3000, 3000), round(rng.uniform(0, 1), 4),
                              -0.0, None]) for _ in range(4)]
        n = rng.randrange(0, 40)
        events.append(action(
            actions=[ParsedAction(kind=rng.choice(["click", "drag", "type", "scroll"]), x=coords[0], y=coords[1],
                                  end_x=coords[2], end_y=coords[3], text=rng.choice([None, "", "hello world/~!",
                                                                                   "ctrl c", "it's"]),
                                  direction=rng.choice([None, "down"]))] * rng.randrange(0, 3),
            response_text="Thought: 日本語 ✓\nAction: wait()", response_token_ids=list(range(n)),
            entropies=[rng.uniform(0, 8) for _ in range(n + rng.choice([0, 0, 7]))],
            logprobs=[-rng.uniform(0, 3) for _ in range(n)], newer_version_seen=rng.choice([None, 5])))
    done = project_both(store, [encode(e) for e in events])
    assert done.by_sql == len(events) and not done.failed


def test_actions_json_dumps_would_write_differently_take_the_python_path(store: Store) -> None:
    def one(**kw) -> ActionChosen:
        return action(actions=[ParsedAction(kind="type", **kw)])

    # Within ' '..'~' both write only \" and \\ as escapes, alike (the tables are compared either way).
    same = [one(x=1.0, text="/home/user ~ `{}[]|<>&*"), one(x=0.0001, y=123456789012345.0),
            one(text="".join(map(chr, range(32, 127)))), one(text='say "hi"'), one(text="C:\\temp"),
            one(text="ends in \\"), one(text='\\"quoted\\"'), one(text="a\\nb \\u00e9 \\\\t")]
    different = [one(text="café"), one(text="tab\there"), one(text="line\nbreak"), one(text="nul\x00"),
                 one(text="\x7f"), one(x=0.00001), one(x=1e16), one(x=math.nan), one(y=math.inf),
                 one(end_x=-math.inf), one(x=1.5e300)]
    done = project_both(store, [encode(e) for e in same + different])
    assert done.by_sql == len(same) and not done.failed


def _with_bytes(event: Event, **fields) -> bytes:
    """Single-object bytes of ``event`` with some Avro fields replaced by raw values."""
    name = type(event).__name__
    schema = fastavro.parse_schema(json.loads((SCHEMA_DIR / f"{name}.avsc").read_text()))
    record = {**registry().encode_dict(event), **fields}
    buf = io.BytesIO()
    buf.write(MARKER + fingerprint(json.loads((SCHEMA_DIR / f"{name}.avsc").read_text())))
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def test_records_that_do_not_decode_come_back_with_the_python_decoders_error(store: Store) -> None:
    good = [encode(e) for e in group("t", [1.0, 0.0], steps=2)[0]]
    a = encode(action())
    utf8 = encode(action(response_text="Zébra")).replace("Zébra".encode(), b"Z\xc3\x28bra")
    beat = encode(heartbeat("env-9", 1)).replace(b"env-9", b"env\xed\xa0\x80")   # an encoded surrogate
    bad = [None, b"", b"xx", b"\xc3\x01garbage!", b"not avro at all", MARKER + b"\x00" * 8 + b"\x02",
           a[:-7], a + b"\x00", a + END_LIKE, utf8, beat,
           _with_bytes(action(), entropies=b"\x00" * 5), _with_bytes(action(), response_token_ids=b"\x01\x02\x03")]
    for v in bad:
        with pytest.raises(DecodeError):
            decode(v)
    values = [good[0], *bad[:6], good[1], *bad[6:], *good[2:]]
    done = project_both(store, values)
    assert [id(r.value) for r, _ in done.failed] == [id(v) for v in bad]
    for rec, exc in done.failed:
        with pytest.raises(DecodeError) as again:
            decode(rec.value)
        assert _no_addresses(str(exc)) == _no_addresses(str(again.value))
    # A body ClickHouse cannot parse (the cut action) sends every action of the fetch through
    # Python; the other types' records were written by ClickHouse.
    assert done.by_sql == sum(not isinstance(decode(v), ActionChosen) for v in good) > 0


def _no_addresses(message: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x?", message)       # fastavro names some objects by address


END_LIKE = avroload.END   # a record followed by a copy of the sentinel must still be caught


def test_a_record_of_the_previous_schema_version_takes_the_python_path(store: Store) -> None:
    beat = heartbeat("env-3", 2)
    old_schema = json.loads((SCHEMA_DIR / "history" / "WorkerHeartbeat.v0.avsc").read_text())
    current = registry().encode_dict(beat)
    buf = io.BytesIO()
    buf.write(MARKER + fingerprint(old_schema))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(old_schema),
                               {f["name"]: current[f["name"]] for f in old_schema["fields"]})
    assert isinstance(decode(buf.getvalue()), WorkerHeartbeat)
    done = project_both(store, [buf.getvalue(), encode(heartbeat("env-4", 2))])
    assert done.by_sql == 1 and done.events == 2


def test_the_python_path_alone_when_clickhouse_decoding_is_off(store: Store) -> None:
    values = [encode(e) for e in all_examples() if not isinstance(e, DeadLetter)]
    done = avroload.project_records(store, records(values), projection.write_events, clickhouse_decode=False)
    assert done.by_sql == 0 and done.events == len(values)


def test_masked_mean_in_sql_is_pythons_bit_for_bit(store: Store) -> None:
    rng = random.Random(11)
    events = []
    for _ in range(300):
        n = rng.randrange(1, 500)
        ent = array.array("f", [rng.uniform(0, 12) * 10 ** rng.randrange(-4, 3) for _ in range(n)])
        events.append(action(response_token_ids=list(range(rng.randrange(0, n + 5))), entropies=ent))
    done = project_both(store, [encode(e) for e in events])
    assert done.by_sql == len(events)
