"""``bench --from-json`` on every single-field mutation of a real result file: each field (every leaf and
every container) replaced by a hostile value of another kind, or removed. Each call: exit 0, 1 or 2, never
an internal error (3). In process: about 1,300 calls, one test per section of the file (spread over the
workers).

The collectives are 6 operations at 6 sizes each, every row read, checked and graded by the same code (the
grading takes the best row of an operation among those at or above its graded size, else among all: every size
here is below it, and a size mutated to 10**400 takes the other branch). Each field is mutated in the smallest
and the largest size of every operation, not in the 4 sizes between, which take the same path as those two."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path

import pytest

from torchrig.bench.grading import MIN_GRADED_COLLECTIVE_BYTES
from torchrig.cli import main

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "cpu-gloo-2proc-torch2.13.json"
# one of each kind: past 64 bits (and a float), text where a number is, a table where a list is; and removal
VALUES = [10**400, "x", {}, None]
REMOVE = object()


def _paths(value, at=()):
    if at:
        yield at
    children = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    )
    for k, v in children:
        yield from _paths(v, (*at, k))


SEED = json.loads(FIXTURE.read_text())


def _collective_rows_kept(rows: list[dict]) -> set[int]:
    """The smallest and the largest size of each operation."""
    by_op: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_op.setdefault(row["op"], []).append(i)
    kept = set()
    for idx in by_op.values():
        kept |= {min(idx, key=lambda i: rows[i]["size_bytes"]), max(idx, key=lambda i: rows[i]["size_bytes"])}
    return kept


def test_the_collectives_kept_are_each_operation_at_its_smallest_and_largest_size():
    rows = SEED["collectives"]
    kept = _collective_rows_kept(rows)
    assert len({rows[i]["op"] for i in kept}) == len({r["op"] for r in rows}) == 6 and len(kept) == 12
    assert {rows[i]["size_bytes"] for i in kept} == {
        min(r["size_bytes"] for r in rows),
        max(r["size_bytes"] for r in rows),
    }
    # every size is below the graded size: the grading reads all rows of an operation alike
    assert all(r["size_bytes"] < MIN_GRADED_COLLECTIVE_BYTES for r in rows)


@pytest.mark.parametrize("section", list(SEED))
def test_no_single_field_mutation_of_a_real_result_is_an_internal_error(tmp_path, section):
    seed = SEED
    target = tmp_path / "bench.json"
    crashes = []
    collectives_kept = _collective_rows_kept(seed["collectives"])
    for path in _paths(seed):
        if path[0] != section:
            continue
        if path[0] == "collectives" and len(path) > 1 and path[1] not in collectives_kept:
            continue
        for value in [*VALUES, REMOVE]:
            doc = copy.deepcopy(seed)
            node = doc
            for k in path[:-1]:
                node = node[k]
            if value is REMOVE:
                del node[path[-1]]
            else:
                node[path[-1]] = value
            target.write_text(json.dumps(doc))
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(["bench", "--from-json", str(target), "--no-plots", "--out", str(tmp_path / "o")])
            if code not in (0, 1, 2) or "internal error" in err.getvalue():
                crashes.append((path, repr(value)[:20], code, err.getvalue().strip()[:200]))
    assert not crashes, crashes[:10]
