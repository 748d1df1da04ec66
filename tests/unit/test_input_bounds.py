"""Every input typed and bounded: the bad inputs the fuzz suite found, each a one-line error with exit 2.

Each case runs ``torchrig.cli.main`` in a forked child bounded in time and memory (tests/fuzzkit.py), in a
scratch folder holding the fuzz corpus under ``c/`` (binary, non-UTF-8, deeply nested, null files ...).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuzzkit
from torchrig.errors import InputError

fuzzkit.preload()
FACTS = json.loads(fuzzkit.DOCTOR_SNAPSHOT.read_text())


def usage_error(argv, *, env=None, files=None, needle=""):
    out = fuzzkit.call(argv, env=env, files=files)
    fuzzkit.check(out)
    assert out.code == 2, out.describe()
    assert out.err.count("\n") == 1 and out.err.startswith("torchrig: error: "), out.describe()
    assert needle in out.err, out.describe()
    return out


@pytest.mark.parametrize(
    "argv,needle",
    [
        # non-UTF-8 or binary files
        (["doctor", "--facts", "c/binary.bin"], "not UTF-8"),
        (["doctor", "--facts", "c/latin1.txt"], "not UTF-8"),
        (["doctor", "--facts", "c/nul.json"], "NUL"),
        (["bench", "--from-json", "c/binary.bin"], "not UTF-8"),
        (["gpus", "--inventory", "c/utf16.json"], "not UTF-8"),
        (["image", "render", "c/binary.bin"], "not UTF-8"),
        (["up", "--dry-run", "--spec", "c/binary.bin"], "not UTF-8"),
        (["cluster", "slurm", "--spec", "c/latin1.txt", "--", "train.py"], "not UTF-8"),
        # deeply nested JSON and TOML
        (["doctor", "--facts", "c/deep.json"], "deeper"),
        (["doctor", "--facts", "c/deepobj.json"], "deeper"),
        (["bench", "--from-json", "c/deep.json"], "deeper"),
        (["gpus", "--inventory", "c/deep.json"], "deeper"),
        (["image", "render", "c/deep.toml"], "deeper"),
        # devices and folders where a file belongs; /dev/zero never ends
        (["doctor", "--facts", "/dev/zero"], "not a regular file"),
        (["image", "render", "/dev/zero"], "not a regular file"),
        (["bench", "--from-json", "c/dir"], "folder"),
        (["doctor", "--facts", "c/nan.json"], "not JSON"),
        (["doctor", "--facts", "c/bignum.json"], "facts file"),
        # overflowing numbers
        (["train", "--seed", str(2**64)], "--seed must be at most"),
        (["train", "--steps", "1" + "0" * 30], "--steps must be at most"),
        (["train", "--micro-batch", str(2**40)], "--micro-batch must be at most"),
        (["train", "--lr", "inf"], "--lr must be a finite number"),
        (
            ["launch", "--dry-run", "--cpu", "--rdzv-timeout", str(10**30), "x.py"],
            "--rdzv-timeout must be at most",
        ),
        (["launch", "--dry-run", "--cpu", "--collective-timeout", "9" * 5000, "x.py"], "invalid int value"),
        (["doctor", "--timeout", "1e400"], "--timeout must be a finite number"),
        (["matrix", "--newest", str(10**20)], "--newest must be at most"),
        (["export", "run", "--batch", str(10**20)], "--batch must be at most"),
        (
            ["cluster", "k8s", "--nodes", str(10**20), "--image", "a:b", "--", "x.py"],
            "--nodes must be at most",
        ),
        (["logs", "env", "--tail", str(10**30)], "--tail must be at most"),
        (["down", "env", "--timeout", str(10**30)], "--timeout must be at most"),
        # 400 digits: more than a float holds (the message must not format it as one)
        *(
            (argv, f"{opt} must be at most")
            for opt, argv in [
                ("--newest", ["matrix", "--newest", "9" * 400]),
                ("--nproc-per-node", ["bench", "--dry-run", "--nproc-per-node", "9" * 400]),
                ("--nproc-per-node", ["launch", "--dry-run", "--cpu", "--nproc-per-node", "9" * 400, "x.py"]),
                ("--seed", ["train", "--seed", "9" * 400]),
                ("--steps", ["train", "--steps", "9" * 400]),
                ("--nodes", ["cluster", "slurm", "--nodes", "9" * 400, "--", "x.py"]),
            ]
        ),
        (["bench", "--dry-run", "--max-size", "9" * 400], "--max-size"),
        (["bench", "--dry-run", "--min-size", "9" * 30 + "t"], "more than 1 PiB"),
        # values that used to be accepted silently
        (["launch", "--dry-run", "--gpus", "-1", "x.py"], "--gpus"),
        (
            ["launch", "--dry-run", "--cpu", "--nproc-per-node", "0", "x.py"],
            "--nproc-per-node must be at least 1",
        ),
        (
            ["launch", "--dry-run", "--cpu", "--nproc-per-node", "100000000", "x.py"],
            "--nproc-per-node must be at most",
        ),
        (["doctor", "--timeout", "nan"], "--timeout must be a finite number"),
        (["doctor", "--timeout", "-1"], "--timeout must be positive"),
        (["up", "--dry-run", "--image", "x", "--wait", "nan"], "--wait must be a finite number"),
        (["up", "--dry-run", "--image", "x", "--cpus", "-3"], "--cpus"),
        (["up", "--dry-run", "--image", "x", "--cpus", "nan"], "--cpus"),
        (["cluster", "slurm", "--cpus-per-task", "-4", "--", "x.py"], "--cpus-per-task must be at least 1"),
        (["cluster", "k8s", "--namespace", "Team_A", "--image", "a:b", "--", "x.py"], "namespace"),
        (["cluster", "k8s", "--namespace", "a" * 64, "--image", "a:b", "--", "x.py"], "namespace"),
        # --out / --record / -o at a device, a file or a folder
        (["train", "--out", "/dev/null"], "is not a folder"),
        (["train", "--out", "c/facts.json"], "is not a folder"),
        (["train", "--out", "c/facts.json/run"], "is not a folder"),
        (["doctor", "--record", "/dev/full"], "No space left"),
        (["doctor", "--record", "c/dir"], "--record"),
        (["cluster", "slurm", "-o", "c/dir", "--", "x.py"], "c/dir"),
        (["init", "--force", "/dev/full"], "No space left"),
        # characters a TOML string cannot hold (an undecodable argv byte arrives as a surrogate)
        (["init", "--python", "\udcff"], "undecodable"),
        (["init", "--driver", "5\x1b[1m"], "control"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, needle):
    usage_error(argv, needle=needle)


def test_null_sections_in_facts_are_refused_or_read_as_skipped():
    """A facts file whose sections are JSON null: doctor reads them as not probed, or names the key."""
    data = dict(FACTS, driver=None, nvml=None, torch=None)
    out = fuzzkit.call(["doctor", "--facts", "f.json"], files={"f.json": json.dumps(data).encode()})
    fuzzkit.check(out)
    data = dict(FACTS, nvml={"status": "ok", "gpus": None, "p2p": [None]})
    out = fuzzkit.call(["doctor", "--facts", "f.json"], files={"f.json": json.dumps(data).encode()})
    fuzzkit.check(out)


def test_facts_with_a_huge_gpu_count_do_not_make_doctor_allocate():
    data = json.loads(json.dumps(FACTS))
    data["torch"]["device_count"] = 10**12
    usage_error(
        ["doctor", "--facts", "f.json"], files={"f.json": json.dumps(data).encode()}, needle="device_count"
    )


@pytest.mark.parametrize(
    "var,value",
    [("TORCHRIG_JUPYTER_PORT", "abc"), ("TORCHRIG_SSH_PORT", "99999999"), ("TORCHRIG_JUPYTER_PORT", "-1")],
)
def test_a_non_integer_port_in_the_environment(var, value):
    usage_error(["serve", "--dry-run"], env={var: value}, needle=var)


@pytest.mark.parametrize("name", ["binary.bin", "deep.json", "list.json"])
def test_serve_image_config_and_secrets_decoded_safely(name):
    usage_error(["serve", "--dry-run"], env={"TORCHRIG_IMAGE_CONFIG": f"c/{name}"})
    usage_error(["serve", "--dry-run", "--services", "jupyter"], env={"JUPYTER_TOKEN_FILE": "c/binary.bin"})


def test_launch_dry_run_at_the_largest_rank_count_is_quick():
    out = fuzzkit.call(["launch", "--dry-run", "--json", "--cpu", "--nproc-per-node", "4096", "x.py"])
    fuzzkit.check(out)
    assert out.code == 0 and out.elapsed_s < 20, out.describe()


def test_bench_report_fields_are_typed():
    data = json.loads((fuzzkit.FIXTURES / "bench" / "cpu-gloo-2proc-torch2.13.json").read_text())
    data["collectives"][0]["size_bytes"] = None
    usage_error(
        ["bench", "--from-json", "f.json"], files={"f.json": json.dumps(data).encode()}, needle="size_bytes"
    )


def test_lock_file_damaged_is_one_line():
    usage_error(
        ["up", "--dry-run", "--spec", "c/spec.toml"],
        files={"c/torchrig.lock.json": b"\xff\xfe"},
        needle="lock",
    )
    usage_error(
        ["image", "build", "c/spec.toml", "--locked"],
        files={"c/torchrig.lock.json": b"[[[]]]"},
        needle="lock",
    )


@pytest.mark.parametrize(
    "name,content,needle",
    [
        ("odd.bin", b"\x01\x02\x03", "odd"),
        ("floats.npy", fuzzkit.CORPUS_TEXT["floats.npy"], "integers"),
        ("badhdr.npy", fuzzkit.CORPUS_TEXT["badhdr.npy"], "not a readable token file"),
        ("empty.bin", b"", "token file"),
    ],
)
def test_odd_length_or_float_token_files(tmp_path, name, content, needle):
    pytest.importorskip("numpy")
    from torchrig.train.data import TokenFile

    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError, match=needle):
        TokenFile(path, seq_len=4, vocab=50304)
