"""OSWorld task files load into typed tasks; pools refuse unsupported parts and held-out overlap."""

from __future__ import annotations

import json

import pytest

from dart.env.tasks import (
    Capabilities,
    EvaluatorSpec,
    Getter,
    SetupStep,
    Task,
    TaskPool,
    check_pool,
    ids_of,
    load_id_list,
    load_task,
    load_tasks,
    unsupported_parts,
)
from dart.errors import ConfigError
from tests.conftest import SHARED

OSWORLD = SHARED / "data" / "osworld"
EXAMPLES = OSWORLD / "examples"

ALL = Capabilities(frozenset({"launch", "sleep"}), frozenset({"vm_file", "rule"}), frozenset({"exact_match"}))


def _task(**evaluator) -> dict:
    return {
        "id": "t1",
        "instruction": "do it",
        "snapshot": "os",
        "source": "test",
        "related_apps": ["os"],
        "config": [{"type": "launch", "parameters": {"command": ["xterm"]}}],
        "evaluator": evaluator
        or {"func": "exact_match", "result": {"type": "rule", "rules": {"expected": 1}}},
    }


def test_all_369_osworld_files_load_into_typed_tasks():
    tasks = load_tasks([EXAMPLES])
    assert len(tasks) == 369
    assert len({t.id for t in tasks}) == 369
    domains = {t.domain for t in tasks}
    assert domains == {p.name for p in EXAMPLES.iterdir() if p.is_dir()}
    assert len(domains) == 10
    for t in tasks:
        ev = t.evaluator
        assert len(ev.funcs) == len(ev.results) == len(ev.expected) == len(ev.options) >= 1
        assert ev.conj in ("and", "or")
        assert all(isinstance(s, SetupStep) for s in (*t.config, *ev.postconfig))
        assert all(g is None or isinstance(g, Getter) for g in (*ev.results, *ev.expected))
    assert sum("infeasible" in t.evaluator.funcs for t in tasks) == 30
    assert len(set(tasks)) == 369  # tasks hash by id


def test_single_values_and_lists_normalise_to_parallel_tuples():
    single = EvaluatorSpec.from_dict(
        {"func": "compare_table", "result": {"type": "vm_file", "path": "/a.xlsx", "dest": "a.xlsx"}}
    )
    assert single.funcs == ("compare_table",)
    assert single.results == (Getter("vm_file", {"path": "/a.xlsx", "dest": "a.xlsx"}),)
    assert single.expected == (None,) and single.options == ({},) and single.conj == "and"
    many = EvaluatorSpec.from_dict(
        {
            "func": ["exact_match", "check_include_exclude"],
            "conj": "or",
            "result": [
                {"type": "vm_command_line", "command": "ls"},
                {"type": "vm_command_line", "command": "pwd"},
            ],
            "expected": [{"type": "rule", "rules": {"expected": "x"}}, None],
            "options": [None, {"k": 1}],
            "postconfig": [{"type": "sleep", "parameters": {"seconds": 1}}],
        }
    )
    assert many.funcs == ("exact_match", "check_include_exclude") and many.conj == "or"
    assert many.expected[1] is None and many.options == ({}, {"k": 1})
    assert many.postconfig == (SetupStep("sleep", {"seconds": 1}),)
    shared = EvaluatorSpec.from_dict({"func": ["exact_match", "exact_match"], "options": {"k": 2}})
    assert shared.options == ({"k": 2}, {"k": 2}) and shared.results == (None, None)


@pytest.mark.parametrize(
    ("evaluator", "message"),
    [
        ({"func": ["a", "b"], "result": [{"type": "vm_file"}]}, "1 getters for 2 funcs"),
        ({"func": "a", "conj": "xor"}, "conj"),
        ({"func": []}, "empty"),
        ({"func": "a", "result": {"path": "/x"}}, "'type'"),
        ({"func": "a", "options": [{}, {}]}, "2 option sets for 1 funcs"),
        ({"result": {"type": "vm_file"}}, "'func'"),
    ],
)
def test_malformed_evaluators_are_config_errors_naming_the_field(evaluator, message):
    with pytest.raises(ConfigError, match=message):
        Task.from_dict(_task(**evaluator))


def test_load_task_takes_domain_from_folder_and_names_the_file_on_error(tmp_path):
    d = tmp_path / "vlc"
    d.mkdir()
    (d / "t1.json").write_text(json.dumps(_task()))
    t = load_task(d / "t1.json")
    assert (t.id, t.domain, t.related_apps) == ("t1", "vlc", ("os",))
    assert t.config == (SetupStep("launch", {"command": ["xterm"]}),)
    assert t.raw["instruction"] == "do it"
    (d / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"bad\.json"):
        load_task(d / "bad.json")
    with pytest.raises(ConfigError, match="no task file"):
        load_tasks([tmp_path / "missing"])


def test_id_lists_resolve_against_the_examples_folder():
    train = load_id_list(OSWORLD / "dart_trainset_181.json")
    test = load_id_list(OSWORLD / "test_all.json")
    assert len(ids_of(train)) == 181 and len(ids_of(test)) == 369
    assert ids_of(train) <= ids_of(test)
    tasks = load_tasks([OSWORLD / "dart_trainset_181.json"], examples_root=EXAMPLES)
    assert {t.id for t in tasks} == ids_of(train)
    assert len(load_tasks([OSWORLD / "test_nogdrive.json"], examples_root=EXAMPLES)) == 361
    with pytest.raises(ConfigError, match="examples_root"):
        load_tasks([OSWORLD / "dart_trainset_181.json"])


def test_unresolvable_ids_name_the_missing_tasks(tmp_path):
    (tmp_path / "ids.json").write_text(json.dumps({"os": ["nope-1"]}))
    with pytest.raises(ConfigError, match="os/nope-1"):
        load_tasks([tmp_path / "ids.json"], examples_root=EXAMPLES)


def test_unsupported_parts_name_setup_getters_metrics_and_options():
    t = Task.from_dict(
        {
            **_task(
                func=["exact_match", "compare_pptx_files"],
                result=[{"type": "vm_file", "path": "/a"}, {"type": "vm_file", "path": "/b"}],
                expected=[{"type": "cloud_file", "path": "http://x"}, {"type": "rule", "rules": {}}],
                postconfig=[{"type": "download", "parameters": {}}],
            ),
            "config": [{"type": "googledrive", "parameters": {}}, {"type": "launch", "parameters": {}}],
        }
    )
    assert unsupported_parts(t, ALL) == [
        "setup:googledrive",
        "postconfig:download",
        "getter:cloud_file",
        "metric:compare_pptx_files",
    ]
    checked = Capabilities(
        ALL.setup_types, ALL.getters, ALL.metrics, option_checks={"exact_match": lambda o: ["x"]}
    )
    assert "option:exact_match:x" in unsupported_parts(t, checked)
    assert unsupported_parts(Task.from_dict(_task()), ALL) == []


def test_pool_refuses_unsupported_tasks_at_load_naming_ids_and_parts():
    good = Task.from_dict(_task())
    bad = Task.from_dict({**_task(func="compare_pdfs"), "id": "t2"})
    with pytest.raises(ConfigError, match=r"t2: metric:compare_pdfs"):
        TaskPool.of([good, bad], caps=ALL)
    pool = TaskPool.of([good], caps=ALL)
    assert pool.ids == ("t1",) and len(pool) == 1 and pool.get("t1") is good
    with pytest.raises(ConfigError, match="duplicate"):
        TaskPool.of([good, good], caps=ALL)
    with pytest.raises(ConfigError, match="empty"):
        TaskPool.of([], caps=ALL)


def test_dart_trainset_is_refused_against_the_osworld_test_list():
    """DART's 181 training tasks all sit inside OSWorld's test set: a pool of them is refused."""
    holdout = ids_of(load_id_list(OSWORLD / "test_all.json"))
    everything = Capabilities(frozenset(), frozenset(), frozenset())
    report = check_pool(
        load_tasks([OSWORLD / "dart_trainset_181.json"], examples_root=EXAMPLES), everything, holdout
    )
    assert len(report.holdout_overlap) == 181
    with pytest.raises(ConfigError, match="181 tasks are in the held-out test list"):
        TaskPool.load(
            [OSWORLD / "dart_trainset_181.json"], caps=ALL, holdout_ids=holdout, examples_root=EXAMPLES
        )


def test_pool_of_supported_tasks_outside_the_holdout_loads(tmp_path):
    (tmp_path / "t1.json").write_text(json.dumps(_task()))
    pool = TaskPool.load([tmp_path], caps=ALL, holdout_ids={"other"})
    assert pool.ids == ("t1",)
    assert [t.domain for t in pool] == [tmp_path.name]
