"""The fast projection path: ClickHouse decodes the Avro bodies and maps them to rows itself.

The Python path (``rows.py``: decode every record into a typed event, map it to a dict, insert
the dicts) costs several times the insert it feeds (`benchmarks/ingest.py` times both paths). Here the single-object records of
one fetch are laid, as they are on the log, into an Avro Object Container File (one per event
type: the current writer schema in its header, the records in one block), and one
``INSERT … SELECT <the row mapping of rows.py, in SQL> FROM file(…, 'Avro')`` projects them.

It must give byte-identical rows to the Python path (``dart replay`` compares checksums), and
every record the Python path would reject must still reach the dead-letter topic with its
error. So a record takes this path only when ClickHouse can show it is one the SQL mapping
renders exactly (``Plan.checks``): every string valid UTF-8 (fastavro decodes strictly), packed arrays a
whole number of floats, map keys distinct (a dict keeps one), action texts and coordinates that
``json.dumps`` writes the way the SQL writes them, and the body ending where the record does (a
sentinel after each body). Anything else (old schema versions, garbage, the odd non-ASCII
action) is decoded by the Python path, which dead-letters what does not decode.

Each container record is ``_seq`` (its index in the fetch), the record as it is on the log
(marker, fingerprint, body) and 8 sentinel bytes, read with a wrapper schema that adds those
fields around the event's own.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import cache
from itertools import chain
from typing import Any

from dart.data.rows import to_row
from dart.data.store import Store, StoreError
from dart.errors import DecodeError
from dart.events import (
    ActionChosen,
    Event,
    ObservationEmitted,
    RolloutRequested,
    TrajectoryFinished,
    WeightsPublished,
    decode,
)
from dart.events.codec import HEADER_BYTES, MARKER, SCHEMA_DIR, fingerprint, load_schema
from dart.events.examples import all_examples

log = logging.getLogger(__name__)

Record = Any
"""A consumed record: anything with ``.value`` (the single-object bytes); aiokafka's ConsumerRecord."""

END = b"\x00dart\xffend"
"""Sentinel written after every body: a body that does not end where its record does makes the
next 8 bytes read differ from it (or fails the parse), and the record goes to the Python path."""

_SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


# ---------------------------------------------------------------- Avro schema -> ClickHouse


_PRIMITIVE = {"string": "String", "bytes": "String", "int": "Int32", "long": "Int64", "double": "Float64",
              "float": "Float32", "boolean": "Bool"}


def _q(name: str) -> str:
    return f"`{name}`"


def ch_type(t: Any) -> str:
    """The ClickHouse type ClickHouse's Avro input reads an Avro type into (timestamps as Int64)."""
    if isinstance(t, str):
        return _PRIMITIVE[t]
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        if len(t) != 2 or len(branches) != 1:
            raise ValueError(f"only [null, T] unions are projected, got {t!r}")
        return f"Nullable({ch_type(branches[0])})"
    kind = t["type"]
    if kind == "record":
        return "Tuple(" + ", ".join(f"{_q(f['name'])} {ch_type(f['type'])}" for f in t["fields"]) + ")"
    if kind == "array":
        return f"Array({ch_type(t['items'])})"
    if kind == "map":
        return f"Map(String, {ch_type(t['values'])})"
    if kind == "enum":
        return "Enum8(" + ", ".join(f"'{s}' = {i}" for i, s in enumerate(t["symbols"])) + ")"
    if kind == "fixed":
        return f"FixedString({t['size']})"
    return ch_type(kind)


def _strings(expr: str, t: Any) -> list[str]:
    """SQL strings that, joined, hold every string inside ``expr`` (of Avro type ``t``)."""
    if t == "string":
        return [expr]
    if isinstance(t, str):
        return []
    if isinstance(t, list):
        (branch,) = [b for b in t if b != "null"]
        return [f"ifNull({e}, '')" for e in _strings(expr, branch)] if branch == "string" else []
    kind = t["type"]
    if kind == "record":
        return [e for f in t["fields"] for e in _strings(f"tupleElement({expr}, '{f['name']}')", f["type"])]
    if kind == "array":
        inner = _strings("x", t["items"])
        return [f"arrayStringConcat(arrayMap(x -> {_joined(inner)}, {expr}), {_NL})"] if inner else []
    if kind == "map":
        inner = _strings("v", t["values"])
        return [f"arrayStringConcat(mapKeys({expr}), {_NL})"] + (
            [f"arrayStringConcat(arrayMap(v -> {_joined(inner)}, mapValues({expr})), {_NL})"] if inner else [])
    return []


def _joined(parts: list[str]) -> str:
    # A newline between the parts: a sequence cut at the end of one part, or continuation bytes
    # at the start of the next, stay invalid UTF-8 in the joined string.
    return parts[0] if len(parts) == 1 else "concat(" + f", {_NL}, ".join(parts) + ")"


_NL = "'\\n'"
"""SQL literal of a newline."""


def _checks_of_schema(schema: dict[str, Any]) -> list[str]:
    """Checks that hold when fastavro would read every string and map of ``schema`` the same."""
    strings = [e for f in schema["fields"] for e in _strings(_q(f["name"]), f["type"])]
    maps = [_q(f["name"]) for f in schema["fields"] if isinstance(f["type"], dict) and f["type"]["type"] == "map"]
    # A dict keeps one value per key; a Map keeps every entry.
    return [f"isValidUTF8({_joined(strings)})"] + [f"length(arrayDistinct(mapKeys({m}))) = length({m})" for m in maps]


# ---------------------------------------------------------------- the row mapping in SQL


def _sampling(field: str = "sampling") -> dict[str, str]:
    return {c: f"tupleElement({_q(field)}, '{c}')"
            for c in ("temperature", "top_p", "max_new_tokens", "seed", "frequency_penalty")}


# json.dumps([asdict(a) for a in actions], separators=(",", ":")) as ClickHouse writes it: the
# same JSON for printable-ASCII texts without '"' or '\\' (json.dumps escapes the rest, ClickHouse
# only some) and finite coordinates, except that repr(float) ends integral values in ".0".
_ACTIONS_JSON = (r"""replaceRegexpAll(toJSONString(actions), '"(x|y|end_x|end_y)":(-?[0-9]+)([,}])', """
                 r"""'"\\1":\\2.0\\3')""")
_JSON_SETTINGS = "output_format_json_escape_forward_slashes = 0"
_JSON_SAFE = (
    # Nothing outside ' '..'~'; no coordinate of 16+ integral digits, below 1e-4 or with an
    # exponent (where repr() and ClickHouse may differ).
    r"""NOT match(toJSONString(actions), '[^ -~]|":-?([0-9]{16}|0\\.0000|[0-9.]*e)')""",
    # No escape but \" and \\ (within ' '..'~' both write only these two, alike): none is left
    # once those pairs are taken out, left to right as a reader of JSON pairs them.
    r"""position(replaceRegexpAll(toJSONString(actions), '\\\\[\\\\"]', ''), '\\') = 0""",
    # NaN and infinities (json.dumps: NaN, Infinity; ClickHouse: null): x * 0 is 0 only for finite x.
    "arraySum(arrayMap(a -> " + " + ".join(f"ifNull(tupleElement(a, '{c}'), 0) * 0" for c in ("x", "y", "end_x", "end_y"))
    + ", actions)) = 0",
)


_TOKENS = "reinterpret(response_token_ids, 'Array(Int32)')"
_ENTROPIES = "reinterpret(entropies, 'Array(Float32)')"
_N_MEAN = "least(intDiv(length(response_token_ids), 4), intDiv(length(entropies), 4))"

# Column -> SQL per table where the column is not the Avro field of the same name.
# Every expression reproduces the function of rows.py for the same table exactly.
OVERRIDES: dict[type[Event], dict[str, str]] = {
    RolloutRequested: _sampling(),
    ObservationEmitted: {
        "history_step_index": "tupleElement(history, 'step_index')",
        "history_screenshot_digest": "tupleElement(history, 'screenshot_digest')",
        "history_response_text": "tupleElement(history, 'response_text')",
        "reply_topic": "tupleElement(reply, 'topic')", "reply_partition": "tupleElement(reply, 'partition')",
        "reply_worker": "tupleElement(reply, 'worker_id')", **_sampling(),
    },
    ActionChosen: {
        "action_kinds": "tupleElement(actions, 'kind')",
        "actions_json": _ACTIONS_JSON,
        "response_token_ids": _TOKENS,
        "logprobs": "reinterpret(logprobs, 'Array(Float32)')",
        "entropies": _ENTROPIES,
        "num_tokens": "intDiv(length(response_token_ids), 4)",
        # masked_mean: arraySum adds in order in Float64, as Python's sum() does (tested bit for bit).
        "mean_entropy": f"if({_N_MEAN} > 0, arraySum(arraySlice({_ENTROPIES}, 1, {_N_MEAN})) / {_N_MEAN}, 0.)",
        **_sampling(),
    },
    TrajectoryFinished: {
        "status": "toString(status)",
        "min_policy_version": "if(empty(step_policy_versions), 0, arrayMin(step_policy_versions))",
        "max_policy_version": "if(empty(step_policy_versions), 0, arrayMax(step_policy_versions))",
        "started_at": "fromUnixTimestamp64Milli(started_at, 'UTC')",
    },
    WeightsPublished: {
        "blob_names": "tupleElement(blobs, 'name')", "blob_digests": "tupleElement(blobs, 'digest')",
        "blob_sizes": "tupleElement(blobs, 'size_bytes')",
    },
}
_ENVELOPE = {"event_time": "fromUnixTimestamp64Milli(event_time, 'UTC')"}
_EXTRA_OK: dict[type[Event], tuple[str, ...]] = {ActionChosen: _JSON_SAFE}


@dataclass(frozen=True, slots=True)
class Plan:
    """How one event type (its current schema) is projected by ClickHouse."""

    cls: type[Event]
    table: str
    header: bytes
    """Container file header: magic, the wrapper schema, no codec, the sync marker."""
    sync: bytes
    insert: str
    """``INSERT INTO {db}.table (…) SELECT … FROM {source} WHERE {filter}``."""
    checks: tuple[str, ...]
    """Each true for a row the mapping renders exactly as rows.py would."""
    structure: str

    @property
    def ok(self) -> str:
        return " AND ".join(f"({c})" for c in self.checks)


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _plan(cls: type[Event], example: Event) -> Plan:
    name = cls.SCHEMA.rsplit(".", 1)[-1]
    schema = load_schema(SCHEMA_DIR / f"{name}.avsc")
    table, row = to_row(example)
    wrapper = {**schema, "fields": [{"name": "_seq", "type": "long"},
                                    {"name": "_head", "type": {"type": "fixed", "name": "DartHead", "size": HEADER_BYTES}},
                                    *schema["fields"],
                                    {"name": "_end", "type": {"type": "fixed", "name": "DartEnd", "size": len(END)}}]}
    structure = ", ".join(f"{_q(f['name'])} {ch_type(f['type'])}" for f in wrapper["fields"])
    avro_fields = {f["name"] for f in schema["fields"]}
    exprs = {**_ENVELOPE, **OVERRIDES.get(cls, {})}
    select = []
    for column in row:
        if column not in exprs and column not in avro_fields:
            raise ValueError(f"{table}.{column} has no SQL in dart/data/avroload.py (and no Avro field of its name)")
        select.append(exprs.get(column, _q(column)))
    packed = [f"length({_q(f.name)}) % 4 = 0" for f in fields(cls) if f.metadata.get("avro", "").startswith("packed")]
    checks = [f"_end = unhex('{END.hex()}')", *packed, *_EXTRA_OK.get(cls, [])]
    checks += _checks_of_schema(schema)
    columns = ", ".join(_q(c) for c in row)
    insert = (f"INSERT INTO {{db}}.{table} ({columns}) SELECT {', '.join(select)} FROM {{source}} WHERE {{filter}}"
              f" SETTINGS {_JSON_SETTINGS}")
    sync = fingerprint(schema) * 2
    meta = {"avro.schema": json.dumps(wrapper).encode(), "avro.codec": b"null"}
    header = b"Obj\x01" + _zigzag(len(meta)) + b"".join(
        _zigzag(len(k)) + k.encode() + _zigzag(len(v)) + v for k, v in meta.items()) + b"\x00" + sync
    return Plan(cls, table, header, sync, insert, tuple(checks), structure)


@cache
def plans() -> dict[bytes, Plan]:
    """Plan per current writer fingerprint (8 bytes as on the wire); older versions are not here."""
    out = {}
    for example in all_examples():
        cls = type(example)
        name = cls.SCHEMA.rsplit(".", 1)[-1]
        out[fingerprint(load_schema(SCHEMA_DIR / f"{name}.avsc"))] = _plan(cls, example)
    return out


# ---------------------------------------------------------------- I/O


@cache
def _separators(n: int) -> tuple[bytes, ...]:
    """What goes before record i of a container (the previous record's sentinel, then i as _seq)."""
    return (_zigzag(0), *(END + _zigzag(i) for i in range(1, n)))


def _write_container(path: str, plan: Plan, records: Sequence[Record]) -> None:
    n = len(records)
    seps = _separators(1 << max(n - 1, 0).bit_length())[:n]   # cached per power of two
    values = [r.value for r in records]
    size = sum(map(len, values)) + sum(map(len, seps)) + len(END)
    # Streamed through the file buffer: joining first would allocate (and fault in) the size of
    # the fetch twice.
    with open(path, "wb", buffering=1 << 20) as f:
        f.write(plan.header + _zigzag(n) + _zigzag(size))
        f.writelines(chain.from_iterable(zip(seps, values, strict=True)))
        f.write(END + plan.sync)


def _insert(store: Store, plan: Plan, path: str, n: int) -> list[int]:
    """Project the container at ``path``; returns the indexes of the records left to Python."""
    structure = plan.structure.replace("\\", "\\\\").replace("'", "\\'")
    source = f"file('{path}', 'Avro', '{structure}')"
    sql = plan.insert.replace("{db}", store.database).replace("{source}", source)
    # One query in the usual case: any record not known to render exactly stops the insert
    # (one block: nothing is written), then the few are found and the rest inserted without them.
    try:
        store.command(sql.replace("{filter}", f"throwIf(NOT ({plan.ok}), 'needs the Python path') = 0"))
        return []
    except StoreError as exc:
        log.debug("%s: the SQL projection of %d records stopped (%s); finding the records it cannot take",
                  plan.table, n, exc)
    try:
        rest = sorted(int(r[0]) for r in store.query(
            f"SELECT _seq FROM {source} WHERE NOT ({plan.ok}) SETTINGS {_JSON_SETTINGS}"))
        if len(rest) < n:
            store.command(sql.replace("{filter}", plan.ok))
        return rest
    except StoreError as exc:
        # The container does not even parse (a corrupt body): every record goes through Python,
        # which names the bad ones; the insert above may have written some rows, which the
        # Python path writes again (same event_id, same row: ReplacingMergeTree keeps one).
        log.debug("%s: the container of %d records does not parse (%s)", plan.table, n, exc)
        return list(range(n))


@dataclass(frozen=True, slots=True)
class Projected:
    """What one call of :func:`project_records` did."""

    events: int
    """Records projected (by either path)."""
    by_sql: int
    """Of which ClickHouse decoded and mapped."""
    failed: list[tuple[Record, DecodeError]]
    """Records that do not decode, with the Python decoder's error (for the dead-letter topic)."""


def project_records(store: Store, records: Sequence[Record], python: Callable[[Store, Sequence[Event]], int],
                    clickhouse_decode: bool = True) -> Projected:
    """Project consumed records (one insert per event type and path).

    ``python`` writes decoded events the Python way (``projection.write_events``): it takes the
    records this path leaves (other schema versions, records it cannot show it renders exactly,
    every record when the store is a server), so every table gets the same rows either way.
    """
    by_plan: dict[bytes, list[int]] = {}
    slow: list[int] = []
    known = plans() if clickhouse_decode and store.target.kind == "chdb" else {}
    for i, rec in enumerate(records):
        v = rec.value
        fp = bytes(v[2:HEADER_BYTES]) if v is not None and len(v) > HEADER_BYTES and v[:2] == MARKER else b""
        if fp in known:
            by_plan.setdefault(fp, []).append(i)
        else:
            slow.append(i)
    by_sql = len(records) - len(slow)
    for fp, indexes in by_plan.items():
        fd, path = tempfile.mkstemp(prefix="dart-ingest-", suffix=".avro", dir=_SCRATCH)
        os.close(fd)
        try:
            _write_container(path, known[fp], [records[i] for i in indexes])
            rest = _insert(store, known[fp], path, len(indexes))
            by_sql -= len(rest)
            slow += [indexes[j] for j in rest]
        finally:
            os.unlink(path)
    events: list[Event] = []
    failed: list[tuple[Record, DecodeError]] = []
    for i in sorted(slow):                     # log order, for the dead-letter topic too
        try:
            events.append(decode(records[i].value))
        except DecodeError as exc:
            failed.append((records[i], exc))
    if events:
        python(store, events)
    return Projected(len(records) - len(failed), by_sql, failed)
