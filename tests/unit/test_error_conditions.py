"""Every error raised has a declared code, given exactly its template's fields; docs/errors.md lists them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from outbox.core.errors import Conditions, ConfigError, OutboxError
from sinks.errors import SinkError, raised_in_tasks
from tests import error_docs
from tests.helpers import REPO

LIBRARY = [
    *REPO.glob("outbox/**/*.py"),
    *REPO.glob("sinks/**/*.py"),
    *REPO.glob("migrations/**/*.py"),  # installed as outbox.migrations
    *REPO.glob("devtools/outbox_dev/**/*.py"),
]
CODE = re.compile(r"^[A-Z][A-Z0-9_]+$")
CLASSES = {
    "OutboxError",
    "ConfigError",
    "ServiceUnavailable",
    "Standby",
    "NotReady",
    "Fenced",
    "DataLossError",
    "SinkError",
}


def raises() -> list[tuple[str, str, frozenset[str]]]:
    """(where, code, keyword names) of each `error("CODE", ...)` / `.message("CODE", ...)` call."""
    found = []
    for path in LIBRARY:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            first = node.args[0]
            if (
                name in ("error", "message")
                and isinstance(first, ast.Constant)
                and CODE.match(str(first.value))
            ):
                assert all(k.arg for k in node.keywords), f"{path}:{node.lineno}: fields by name only"
                names = frozenset(str(k.arg) for k in node.keywords)
                found.append((f"{path.relative_to(REPO)}:{node.lineno}", str(first.value), names))
    return found


def test_each_raise_names_a_declared_code_with_exactly_its_templates_fields() -> None:
    declared = error_docs.all_conditions()  # a code declared twice fails here
    found = raises()
    assert len(found) > 140, "the scan finds the raises"
    wrong = [
        f"{where}: {code} {'is not declared' if code not in declared else f'fields {sorted(names)}'}"
        for where, code, names in found
        if code not in declared or declared[code].fields != names
    ]
    assert not wrong, wrong
    named = {  # a code chosen before one call raises it (outbox/core/config.py's URL checks)
        node.value
        for path in LIBRARY
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
    }
    unused = sorted(set(declared) - {code for _, code, _ in found} - named)
    assert not unused, f"declared and never raised: {unused}"


def test_no_library_error_is_raised_without_a_code() -> None:
    bare = []
    for path in LIBRARY:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in CLASSES
                and not any(k.arg == "code" for k in node.keywords)
            ):
                bare.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not bare, f"raise these through their half's error(CODE, ...): {bare}"


def test_an_error_leads_with_its_code_keeps_it_through_pickling_and_a_half_reaches_the_base() -> None:
    import pickle

    from outbox.errors import error

    exc = error(
        "CONFIG_SCHEMA_INVALID",
        **{f: "x" for f in error_docs.all_conditions()["CONFIG_SCHEMA_INVALID"].fields},
    )
    assert isinstance(exc, ConfigError) and exc.code == "CONFIG_SCHEMA_INVALID"
    assert str(exc) == f"[CONFIG_SCHEMA_INVALID] {exc.message}"
    again = pickle.loads(pickle.dumps(exc))  # as a Spark task's error reaches the driver
    assert (type(again), again.code, str(again)) == (ConfigError, exc.code, str(exc))
    with pytest.raises(KeyError):
        Conditions().error("NO_SUCH_CODE")
    assert str(OutboxError("words")) == "[OUTBOX_ERROR] words"


def test_docs_errors_md_lists_every_code_as_the_tables_declare_it() -> None:
    written = error_docs.PATH.read_text() if error_docs.PATH.exists() else ""
    assert written == error_docs.render(), "docs/errors.md is stale: run `python -m tests.error_docs`"
    assert all(f"`{code}`" in written for code in error_docs.all_conditions())


def test_the_tables_modules_are_where_the_docs_say() -> None:
    for path, _ in error_docs.HALVES.values():
        assert Path(REPO, path).exists(), path


def test_a_condition_a_task_raised_is_found_in_sparks_error_around_it() -> None:
    """The first of ours in Spark's error, as it stands on a traceback's last line; not Spark's."""
    worker = (
        "An error occurred while calling o123.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed:"
        " org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/sinks/postgres/decoded.py", line 90, in __call__\n'
        "{last}\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException\n"
    )
    refused = (
        "outbox.core.errors.ConfigError: [REGISTRY_REFUSED_CLIENT] the schema registry at"
        " http://r:8080/apis/ccompat/v7 refused this client (HTTP 401): check its credentials"
    )
    found = raised_in_tasks(RuntimeError(worker.format(last=refused)))
    assert isinstance(found, ConfigError) and found.code == "REGISTRY_REFUSED_CLIENT"
    assert str(found) == refused.split(": ", 1)[1]
    fenced = raised_in_tasks(
        RuntimeError(worker.format(last="outbox.core.errors.Fenced: [SINK_ROW_REFUSED] x"))
    )
    assert fenced is not None and fenced.code == "SINK_ROW_REFUSED"  # any class of ours, not only *Error
    row = raised_in_tasks(
        RuntimeError(worker.format(last="sinks.errors.SinkError: [SINK_ROW_REFUSED] sink s: no"))
    )
    assert isinstance(row, SinkError) and str(row) == "[SINK_ROW_REFUSED] sink s: no"
    for theirs in (
        "pyspark.errors.exceptions.captured.AnalysisException: [UNRESOLVED_COLUMN] x",
        "ValueError: [NOT_OURS] y",
    ):
        assert raised_in_tasks(RuntimeError(worker.format(last=theirs))) is None
