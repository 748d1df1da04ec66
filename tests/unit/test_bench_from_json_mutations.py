"""``bench --from-json`` on every single-field mutation of a real result file: each field (every leaf and
every container) replaced by a hostile value of another kind, or removed. Each call: exit 0, 1 or 2, never
an internal error (3). In process: about 2,000 calls."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path

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


def test_no_single_field_mutation_of_a_real_result_is_an_internal_error(tmp_path):
    seed = json.loads(FIXTURE.read_text())
    target = tmp_path / "bench.json"
    crashes = []
    for path in _paths(seed):
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
