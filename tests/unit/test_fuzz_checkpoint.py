"""Fuzz the contents of every file of a run folder that ``torchrig export`` and ``torchrig train --resume`` read.

The seed is a real run folder, made once per session by a tiny real CPU training (GPT tiny, 2 steps, a
checkpoint after each): ``run.json``, ``metrics.jsonl``, ``checkpoints/latest`` and, in each ``step-N/``,
``meta.json``, DCP's ``.metadata`` and the shard ``__0_0.distcp``. Each example changes one file (values of
its JSON replaced or removed, a hostile ``model_spec``, the checksum record's names, DCP's storage records,
damaged or random bytes) and runs the real command on the copy in a forked child bounded in time and
memory (tests/fuzzkit.py): ``export`` up to writing its .pt2 (the checkpoint verified, loaded into the model
and run), ``train --resume`` for real. Each call: exit 0, 1 or 2, never an internal error or a traceback;
a damaged data file is named; a resume that skips the newest checkpoint says so.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import json
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
torch = pytest.importorskip("torch")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuzzkit  # noqa: E402

fuzzkit.register_profiles()
fuzzkit.preload()
# what a first optimizer step and a DCP load import on first use: imported once here, every forked call
# starts warm (0.6 s a call instead of 2-4 s)
for _mod in (
    "torch._dynamo",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.checkpoint.default_planner",
    "torch.utils.flop_counter",
):
    __import__(_mod)

TRAIN = [
    "train",
    "--model",
    "gpt",
    "--size",
    "tiny",
    "--steps",
    "2",
    "--device",
    "cpu",
    "--data",
    "synthetic",
]
TRAIN += ["--no-tensorboard", "--seed", "0", "--workers", "0"]
REAL_TRAIN = ("torchrig.train.loop.train",)
COMMANDS = {
    "export": ["export", "run", "--format", "pt2", "--batch", "1", "--seq-len", "8"],
    "resume": ["--json", *TRAIN, "--out", "run", "--resume"],
    "new-run": [*TRAIN, "--out", "run"],  # refused (the folder holds a run) before anything trains
}
NEWEST = "run/checkpoints/step-000002"


_RUN: Path | None = None


def real_run() -> Path:
    """The seed run folder (made once per session): ``train`` for real, in a bounded child."""
    global _RUN
    if _RUN is None:
        work = Path(tempfile.mkdtemp(prefix="torchrig-fuzz-run-"))
        atexit.register(shutil.rmtree, work, True)  # the session's end (forked calls leave by os._exit)
        out = fuzzkit.run_main(
            [*TRAIN, "--ckpt-every", "1", "--keep-ckpts", "0", "--out", "run"],
            cwd=work,
            real=REAL_TRAIN,
            time_limit_s=300,
        )
        assert out.code == 0, out.describe()
        shutil.rmtree(work / "state", ignore_errors=True)
        _RUN = work / "run"
    return _RUN


def _signed(meta: bytes, name: str, data: bytes) -> bytes:
    """``meta.json`` with ``name``'s size and SHA-256 re-recorded for ``data``: the content reaches its
    reader instead of failing the checksum (a checkpoint saved without checksums, or crafted)."""
    doc = json.loads(meta)
    doc["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return json.dumps(doc, indent=2).encode()


# ---------------------------------------------------------------- hostile values for the structured files

HUGE = [2**31, 2**40, 2**62, 10**30, -1, 0, -(2**63), "64", 1.5, None, [], {}, True, "NaN"]
NAMES = [
    "../run.json",
    "/dev/zero",
    "/etc/passwd",
    "..",
    ".",
    "",
    "a/b",
    "step-000001",
    "meta.json",
    "x" * 300,
]


def model_spec_mutation(spec: dict):
    """A ``model_spec`` asking for another (often huge) model, or of the wrong shape."""

    @st.composite
    def build(draw):
        s = copy.deepcopy(spec)
        for _ in range(draw(st.integers(1, 3))):
            where = draw(st.sampled_from(["top", "size", "kind", "drop"]))
            if where == "top":
                s[draw(st.sampled_from(["context", "vocab", "num_classes", "image_size"]))] = draw(
                    st.sampled_from(HUGE)
                )
            elif where == "size":
                key = draw(st.sampled_from(["layers", "heads", "width", "vocab", "blocks"]))
                s.setdefault("size_info", {})[key] = draw(st.sampled_from([*HUGE, [2**20] * 4, [1, 1], [-1]]))
            elif where == "kind":
                s["model"] = draw(st.sampled_from(["resnet", "gpt", "x", None, 1]))
            else:
                s.pop(draw(st.sampled_from(sorted(s))), None)
        return s

    return build()


def meta_content(seed: bytes):
    """meta.json: generic JSON mutations, a hostile model_spec, or hostile names in its checksum record."""
    doc = json.loads(seed)

    @st.composite
    def files_names(draw):
        d = copy.deepcopy(doc)
        files = d["files"]
        old = draw(st.sampled_from(sorted(files)))
        files[draw(st.sampled_from(NAMES))] = files.pop(old)
        return json.dumps(d).encode()

    @st.composite
    def spec(draw):
        d = copy.deepcopy(doc)
        d["model_spec"] = draw(model_spec_mutation(doc["model_spec"]))
        return json.dumps(d).encode()

    return st.one_of(fuzzkit.json_content(seed), spec(), files_names())


def dcp_metadata_content(seed: bytes):
    """DCP's .metadata: its records with hostile sizes, offsets, lengths, dtypes or file names (pickled
    again), or damaged bytes."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    from torchrig.train.checkpoint import read_dcp_metadata

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / ".metadata").write_bytes(seed)
        md = read_dcp_metadata(Path(tmp) / ".metadata")
    keys = sorted(k for k in md.state_dict_metadata if k.startswith("model."))
    ints = st.sampled_from([v for v in HUGE if isinstance(v, int) and not isinstance(v, bool)])

    @st.composite
    def records(draw):
        m = copy.deepcopy(md)
        for _ in range(draw(st.integers(1, 3))):
            what = draw(st.sampled_from(["size", "chunk", "dtype", "kind", "drop", "storage"]))
            key = draw(st.sampled_from(keys))
            entry = m.state_dict_metadata.get(key)
            if what == "storage":
                idx = draw(st.sampled_from(sorted(m.storage_data, key=str)))
                info = m.storage_data[idx]
                field = draw(st.sampled_from(["relative_path", "offset", "length"]))
                value = draw(st.sampled_from(NAMES)) if field == "relative_path" else draw(ints)
                m.storage_data[idx] = type(info)(**{**vars(info), field: value})
            elif what == "drop":
                m.state_dict_metadata.pop(key, None)
            elif what == "kind":
                m.state_dict_metadata[key] = BytesStorageMetadata()
            elif isinstance(entry, TensorStorageMetadata):
                if what == "size":
                    dims = list(entry.size) or [1]
                    dims[draw(st.integers(0, len(dims) - 1))] = draw(ints)
                    entry.size = torch.Size([max(d, 0) for d in dims]) if draw(st.booleans()) else dims
                elif what == "chunk" and entry.chunks:
                    c = entry.chunks[0]
                    n = len(c.sizes) or 1
                    vals = [draw(ints) for _ in range(n)]
                    entry.chunks[0] = type(c)(offsets=torch.Size([abs(v) for v in vals]), sizes=c.sizes)
                elif what == "dtype":
                    entry.properties.dtype = draw(st.sampled_from([torch.int8, torch.float64, torch.bool]))
        return pickle.dumps(m)

    return st.one_of(records(), fuzzkit.damaged(seed), st.binary(max_size=256))


def latest_content(seed: bytes):
    names = [f"{n}\n".encode() for n in NAMES] + [b"step-000001\n", b"step-999999\n", b"\xff\xfe\n", b""]
    return st.one_of(st.sampled_from(names), fuzzkit.damaged(seed), st.binary(max_size=64))


def jsonl_content(seed: bytes):
    """metrics.jsonl: one line mutated as JSON, or replaced by hostile text, or the whole file damaged."""
    lines = seed.decode().splitlines()
    hostile = ["[1, 2]", '"x"', "null", '{"step": "NaN"}', '{"step": [1]}', '{"step": 1e999}', "[" * 100_000]

    @st.composite
    def one_line(draw):
        out = list(lines)
        i = draw(st.integers(0, len(out) - 1))
        out[i] = draw(
            st.one_of(
                fuzzkit.json_content(out[i].encode()).map(lambda b: b.decode("utf-8", "replace")),
                st.sampled_from(hostile),
            )
        )
        return "\n".join(out).encode("utf-8", "surrogatepass")

    return st.one_of(one_line(), fuzzkit.damaged(seed), st.binary(max_size=256))


# (what, the file in the scratch folder, its content strategy, whether meta.json's checksum may be re-made,
#  the commands that read it)
TARGETS = [
    ("meta.json", f"{NEWEST}/meta.json", meta_content, False, ("export", "resume")),
    (".metadata", f"{NEWEST}/.metadata", dcp_metadata_content, True, ("export", "resume")),
    ("shard", f"{NEWEST}/__0_0.distcp", lambda s: fuzzkit.damaged(s), True, ("export", "resume")),
    ("latest", "run/checkpoints/latest", latest_content, False, ("export", "resume")),
    ("run.json", "run/run.json", fuzzkit.json_content, False, ("resume", "new-run")),
    ("metrics.jsonl", "run/metrics.jsonl", jsonl_content, False, ("resume", "new-run")),
]
CASES = [(t, c) for t in TARGETS for c in t[4]]


def _expect(what: str, command: str, rel: str, content: bytes, signed: bool, out: fuzzkit.Outcome) -> None:
    """Beyond the fuzz contract: a damaged file is named, and a resume that skips the newest says so."""
    name = Path(rel).name
    changed = content != (real_run().parent / rel).read_bytes()
    text = out.out + out.err
    if what in (".metadata", "shard") and changed and not signed:
        # the checksum no longer matches: export refuses, resume falls back; both name the file
        assert name in text, f"the damaged {name} is not named\n" + out.describe()
        if command == "export":
            assert out.code == 2, out.describe()
    if command == "export" and out.code == 2 and what != "latest":
        assert name in text or "step-000002" in text, out.describe()
    if command == "resume" and out.code == 0:
        summary = json.loads(out.out)["summary"]
        if summary["resumed_from"] != 2 and what in ("meta.json", ".metadata", "shard"):
            # the newest checkpoint was skipped: the user is told which and why
            assert "step-000002" in out.err, "a silent fall-back\n" + out.describe()
    if command == "new-run":
        assert out.code == 2 and "--resume" in out.err, out.describe()


@pytest.mark.parametrize("target,command", CASES, ids=[f"{t[0]}-{c}" for t, c in CASES])
@given(data=st.data())
def test_checkpoint_content_fuzz(target, command, data):
    what, rel, strategy, may_sign, _ = target
    run = real_run()
    seed = (run.parent / rel).read_bytes()
    content = data.draw(strategy(seed), label="content")
    files = {rel: content}
    signed = may_sign and data.draw(st.booleans(), label="checksum re-made")
    if signed:
        meta = (run.parent / NEWEST / "meta.json").read_bytes()
        files[f"{NEWEST}/meta.json"] = _signed(meta, Path(rel).name, content)
    real = REAL_TRAIN if command == "resume" else ()
    out = fuzzkit.call(COMMANDS[command], files=files, trees={"run": run}, real=real)
    fuzzkit.check(out)
    _expect(what, command, rel, content, signed, out)


def test_the_seed_run_exports_and_resumes_as_saved():
    """The unmutated run folder: export loads and runs it (up to writing), resume continues at step 2, a new
    run there is refused: the fuzz starts from a valid folder."""
    run = real_run()
    out = fuzzkit.call(COMMANDS["export"], trees={"run": run})
    assert out.code == fuzzkit.REACHED_EXIT, out.describe()
    out = fuzzkit.call(COMMANDS["resume"], trees={"run": run}, real=REAL_TRAIN)
    assert out.code == 0 and json.loads(out.out)["summary"]["resumed_from"] == 2, out.describe()
    out = fuzzkit.call(COMMANDS["new-run"], trees={"run": run})
    assert out.code == 2 and "already holds another run" in out.err, out.describe()


# ---------------------------------------------------------------- what the fuzzing found, each pinned


def _meta_with(**changes) -> bytes:
    doc = json.loads((real_run().parent / NEWEST / "meta.json").read_bytes())
    for path, value in changes.items():
        *head, last = path.split("__")
        node = doc
        for k in head:
            node = node[k]
        node[last] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    "change,key",
    [
        ({"model_spec__context": 2**31}, "model_spec.context"),
        ({"model_spec__size_info__layers": 10**6}, "model_spec.size_info.layers"),
        ({"model_spec__vocab": "512"}, "model_spec.vocab"),
        ({"model_spec__model": "resnet"}, "model_spec.size_info.blocks"),
    ],
)
def test_a_model_spec_beyond_the_bounds_is_refused_naming_the_key(change, key):
    out = fuzzkit.call(
        COMMANDS["export"], files={f"{NEWEST}/meta.json": _meta_with(**change)}, trees={"run": real_run()}
    )
    assert out.code == 2 and key in out.err and "step-000002/meta.json" in out.err, out.describe()
    assert out.err.count("\n") == 1, out.describe()


def test_a_model_spec_that_does_not_match_the_saved_weights_is_refused_before_building():
    """Within the bounds (a 256-layer GPT is a valid spec) but not the model .metadata records."""
    files = {
        f"{NEWEST}/meta.json": _meta_with(
            model_spec__size_info__layers=256, model_spec__size_info__width=4096
        )
    }
    out = fuzzkit.call(COMMANDS["export"], files=files, trees={"run": real_run()})
    assert out.code == 2 and "model_spec describes a model of 3077 tensors" in out.err, out.describe()
    assert out.elapsed_s < 10


def test_dcp_storage_records_pointing_outside_the_checkpoint_are_refused():
    from torchrig.train.checkpoint import read_dcp_metadata

    md = read_dcp_metadata(real_run() / "checkpoints" / "step-000002" / ".metadata")
    idx = next(iter(md.storage_data))
    md.storage_data[idx] = type(md.storage_data[idx])(
        **{**vars(md.storage_data[idx]), "relative_path": "/dev/zero"}
    )
    data = pickle.dumps(md)
    meta = _signed((real_run().parent / NEWEST / "meta.json").read_bytes(), ".metadata", data)
    files = {f"{NEWEST}/.metadata": data, f"{NEWEST}/meta.json": meta}
    out = fuzzkit.call(COMMANDS["export"], files=files, trees={"run": real_run()})
    assert out.code == 2 and "'/dev/zero', not a file of" in out.err and ".metadata" in out.err, (
        out.describe()
    )


def test_a_checksum_record_naming_a_device_is_a_problem_not_a_read():
    meta = json.loads((real_run().parent / NEWEST / "meta.json").read_bytes())
    meta["files"]["/dev/zero"] = {"bytes": 0, "sha256": "0" * 64}
    out = fuzzkit.call(
        COMMANDS["export"],
        files={f"{NEWEST}/meta.json": json.dumps(meta).encode()},
        trees={"run": real_run()},
    )
    assert out.code == 2 and "'/dev/zero', not a file of the checkpoint" in out.err, out.describe()


def test_a_resume_past_a_newest_checkpoint_with_a_damaged_meta_json_says_so():
    out = fuzzkit.call(
        COMMANDS["resume"], files={f"{NEWEST}/meta.json": b""}, trees={"run": real_run()}, real=REAL_TRAIN
    )
    assert out.code == 0 and json.loads(out.out)["summary"]["resumed_from"] == 1, out.describe()
    assert "not a newer one: step-000002:" in out.err and "meta.json is unreadable" in out.err, out.describe()


def test_a_damaged_metrics_jsonl_is_rewound_not_a_crash():
    out = fuzzkit.call(
        COMMANDS["resume"],
        files={"run/metrics.jsonl": b'\x80\n[1]\n{"step": "x"}\n'},
        trees={"run": real_run()},
        real=REAL_TRAIN,
    )
    assert out.code == 0, out.describe()


@pytest.mark.parametrize(
    "spec",
    [
        {"model": "gpt", "size_info": {"layers": n, "heads": 2, "width": 64}, "context": 64, "vocab": 512}
        for n in (1, 3, 12)
    ]
    + [
        {"model": "resnet", "size_info": {"blocks": b, "width": 16}, "num_classes": 10, "image_size": 32}
        for b in ([1, 1, 1, 1], [2, 2, 2, 2], [3, 4, 6, 3], [5])
    ],
)
def test_the_tensor_count_export_derives_is_the_models(spec):
    from torchrig.export.core import _tensor_count, checked_spec
    from torchrig.train.models import model_from_spec

    spec = checked_spec(spec, "meta.json")
    with torch.device("meta"):
        assert _tensor_count(spec) == len(model_from_spec(spec).state_dict())


# ---------------------------------------------------------------- files that are not small regular files

# What a hostile or unlucky run folder holds in place of a small file: each is refused (or passed over) at
# once, never waited on (a FIFO), never read without end (/dev/zero), never read whole (a sparse giant).
GROWTH_LIMIT_MIB = 512  # the child's resident memory beyond the parent it was forked from
READ_LIMIT_MIB = 256  # bytes read by the child: the checkpoint itself is ~2 MB

KINDS = {
    "fifo": lambda p: os.mkfifo(p),
    "dev-zero": lambda p: p.symlink_to("/dev/zero"),
    "folder": lambda p: p.mkdir(),
    "sparse-8g": lambda p: os.truncate(p.open("wb").name, 8 << 30),
}
SMALL_FILES = {
    "latest": "run/checkpoints/latest",
    "run.json": "run/run.json",
    "metrics.jsonl": "run/metrics.jsonl",
    "meta.json": f"{NEWEST}/meta.json",
    ".metadata": f"{NEWEST}/.metadata",
}
# refused with exit 2: the files a resume cannot do without reading; the others (a checkpoint's own files)
# make that checkpoint damaged, and the resume falls back to the one before, saying so
MUST_REFUSE = {"latest", "run.json", "metrics.jsonl"}


def _replace_with(rel: str, kind: str):
    def prepare(work: Path) -> None:
        target = work / rel
        target.unlink()
        KINDS[kind](target)

    return prepare


SPECIAL_CASES = [
    (c, n, k)
    for c in ("resume", "export")
    for n in SMALL_FILES
    for k in KINDS
    if not (c == "export" and n in ("run.json", "metrics.jsonl"))  # export reads only the checkpoint
]


@pytest.mark.parametrize("command,name,kind", SPECIAL_CASES)
def test_a_small_file_that_is_not_a_small_regular_file_is_refused_at_once(command, name, kind):
    rel = SMALL_FILES[name]
    real = REAL_TRAIN if command == "resume" else ()
    out = fuzzkit.call(
        COMMANDS[command], trees={"run": real_run()}, real=real, prepare=_replace_with(rel, kind)
    )
    fuzzkit.check(out)  # no exit 3, no traceback, within the time limit
    assert out.elapsed_s < 20, out.describe()
    assert out.grew_kib is not None and out.grew_kib < GROWTH_LIMIT_MIB * 1024, out.describe()
    assert out.read_bytes is not None and out.read_bytes < READ_LIMIT_MIB << 20, out.describe()
    if command == "resume" and name in MUST_REFUSE:
        assert out.code == 2 and Path(rel).name in out.err, out.describe()
    elif command == "resume":
        assert out.code in (0, 2), out.describe()
        if out.code == 0:  # the newest checkpoint was passed over, and the user told why
            assert "step-000002" in out.err, out.describe()
    else:
        assert out.code in (2, fuzzkit.REACHED_EXIT), out.describe()


def test_meta_json_step_out_of_range_is_damage_not_a_crash():
    for step in (-5, 10**30, 2**63):
        meta = _meta_with(step=step)
        out = fuzzkit.call(
            COMMANDS["resume"],
            files={f"{NEWEST}/meta.json": meta},
            trees={"run": real_run()},
            real=REAL_TRAIN,
        )
        fuzzkit.check(out)
        assert out.code in (0, 2), out.describe()
        if out.code == 0:
            assert json.loads(out.out)["summary"]["resumed_from"] == 1, out.describe()
            assert "outside 0..1000000000" in out.err, out.describe()
