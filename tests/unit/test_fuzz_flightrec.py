"""Fuzz the flight records ``torchrig launch`` reads after a failed or hung job, through its real summary path.

Seeds: the recorded dumps (gloo on this machine, NCCL on an H200) in tests/fixtures/launch. Each example
writes the ranks' records into a log folder, one of them changed: its plain data with values replaced,
removed or multiplied (thousands of entries or process groups), re-pickled or written as JSON, or damaged
or random bytes. Then, in a forked child bounded in time and memory (tests/fuzzkit.py), what
``supervise.execute`` does once torchrun has ended: find the records, read them, build the result with the
hang summary of the recorded attempt, and render the launch report as text and JSON. Each call: no
exception, no traceback, within the bounds. (Pickles naming a callable are refused by safepickle.)
"""

from __future__ import annotations

import copy
import json
import pickle
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuzzkit  # noqa: E402
from torchrig.launch import flightrec  # noqa: E402

fuzzkit.register_profiles()
fuzzkit.preload()

FIX = fuzzkit.FIXTURES / "launch"
SEEDS = {
    "gloo-hang": FIX / "gloo-2rank-rank1-sleeps-flight-record",
    "gloo-desync": FIX / "gloo-2rank-desync-flight-record",
    "nccl-h200": FIX / "nccl-1rank-h200-kernel-ahead-hang-record",
}
ATTEMPT = FIX / "gloo-2rank-rank1-sleeps-hang-watchdog"  # the recorded attempt the summary reads

HOSTILE = [
    *fuzzkit.JSON_REPLACEMENTS,
    float("nan"),
    float("inf"),
    10**5000,  # more digits than int -> str converts
    b"\xff\x00",
    (1, 2),
    ("0",),
    ("0", "default_pg", "x"),
    [[2**62] * 3],
    "[0, 1, 'x']",
    "[" * 200,
    {"ranks": "[0, 1]"},
]


def _records(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob(f"{flightrec.PREFIX}*"))}


def record_content(seed: bytes):
    """A record's plain data mutated (values, removals, sizes) as a pickle or JSON, or damaged bytes."""
    doc = flightrec.loads(seed)

    @st.composite
    def mutated(draw):
        d = copy.deepcopy(doc)
        for _ in range(draw(st.integers(1, 4))):
            slots = fuzzkit._json_slots(d)
            if not slots:
                break
            container, key = draw(st.sampled_from(slots))
            op = draw(st.integers(0, 5))
            if op == 0 and isinstance(container, dict):
                del container[key]
            elif op == 1 and isinstance(container[key], list) and container[key]:
                container[key] = container[key] * draw(st.sampled_from([2, 1000, 20_000]))  # sizes
            elif op == 2 and isinstance(container[key], dict) and container[key]:
                first = next(iter(container[key].values()))
                n = draw(st.sampled_from([100, 5000]))
                container[key] = {**container[key], **{str(i): first for i in range(n)}}  # many groups
            else:
                container[key] = copy.deepcopy(draw(st.sampled_from(HOSTILE)))
        if draw(st.booleans()):
            try:
                return json.dumps(d, default=repr).encode()  # PyTorch's JSON dump starts with "{"
            except ValueError:  # a number JSON cannot write (over 4300 digits): the pickle holds it
                pass
        return pickle.dumps(d, protocol=draw(st.sampled_from([2, 4, 5])))

    deep = pickle.dumps({"entries": [], "pg_status": {"0": {"x": 1}}, "pg_config": {"0": {"ranks": "[0]"}}})
    return st.one_of(
        mutated(),
        fuzzkit.damaged(seed),
        st.binary(max_size=256),
        st.just(deep),
        st.just(b"{" + b'"a":[' * 50_000),  # JSON nested past the recursion limit
    )


def summarize(log_dir: Path, stopped: bool) -> int:
    """In the child: the launcher's reading of a finished job's records, its result and report."""
    from torchrig.launch import supervise
    from torchrig.launch.plan import LaunchRequest
    from torchrig.launch.run import LaunchReport, plan_for

    plan, _ = plan_for(LaunchRequest(script="ok.py", cpu=True, nproc_per_node=2, log_dir=str(log_dir)))
    paths = supervise.flight_records(log_dir, 0.0)
    flight = supervise.read_flight_records(paths, {0, 1})
    stop = supervise.Stop("hang-timeout", "no rank logged for 4 s (--hang-timeout)") if stopped else None
    agent = (ATTEMPT / "torchrun.txt").read_text()
    result = supervise._result(plan, ATTEMPT, 1, stop, agent, 5.0, flight)
    result = replace(result, flight_records=paths, flight=flight, stopped_by=stop and stop.by)
    report = LaunchReport(plan, (), result, False)
    print(report.render_text())
    print(json.dumps(report.to_json()))
    return report.exit_code


@pytest.mark.parametrize("seed", list(SEEDS))
@given(data=st.data())
def test_flight_record_fuzz(seed, data):
    records = _records(SEEDS[seed])
    name = data.draw(st.sampled_from(sorted(records)), label="record")
    records[name] = data.draw(record_content(records[name]), label="content")
    stopped = data.draw(st.booleans(), label="hung")
    with tempfile.TemporaryDirectory(prefix="torchrig-fuzz-fr-") as tmp:
        log_dir = Path(tmp) / "logs"
        log_dir.mkdir()
        for n, content in records.items():
            (log_dir / n).write_bytes(content)
        out = fuzzkit.run_bounded(lambda: summarize(log_dir, stopped), [seed, name], cwd=Path(tmp))
    fuzzkit.check(out)
    assert out.code == 1, out.describe()  # a failed job's report, whatever its records hold
    assert "flight record" in out.out, out.describe()


def test_the_recorded_records_give_their_verdict_through_the_same_path():
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "logs"
        log_dir.mkdir()
        for n, content in _records(SEEDS["gloo-hang"]).items():
            (log_dir / n).write_bytes(content)
        out = fuzzkit.run_bounded(lambda: summarize(log_dir, True), ["gloo-hang"], cwd=Path(tmp))
    assert out.code == 1 and "rank 1 never called collective #2" in out.out, out.describe()


def test_values_of_any_type_in_a_record_are_read_as_unknown():
    """What the fuzzing found first: a frame's line as a list, a group as a number, a sequence number
    too long to print, sizes that are not lists."""
    entry = {
        "collective_seq_id": 10**5000,
        "process_group": 0,
        "profiling_name": ["x"],
        "frames": [{"filename": "a.py", "line": [3], "name": None}],
        "input_dtypes": "Float",
        "input_sizes": 3,
    }
    rec = {
        "entries": [entry],
        "pg_status": {0: {"last_enqueued_collective": "2", "last_completed_collective": []}},
    }
    v = flightrec.analyze({0: rec, 1: {"entries": [], "pg_status": {"0": {"last_enqueued_collective": 1}}}})
    assert v is not None and v.headline
