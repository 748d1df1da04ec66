"""Fuzz ``check --collect-env FILE`` with what a paste can hold: real reports damaged, fields with arbitrary
values, several thousand GPUs, huge lines, NUL bytes, binary. Each call: exit 0, 1 or 2, a one-line error,
never an internal error or a traceback, bounded in time and memory (tests/fuzzkit.py). The reader itself is
also fed arbitrary text directly (it never raises but a one-line InputError)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuzzkit  # noqa: E402
from torchrig.compat.collectenv import read_report  # noqa: E402
from torchrig.errors import InputError  # noqa: E402

fuzzkit.register_profiles()
fuzzkit.preload()

REPORTS = sorted((fuzzkit.FIXTURES / "collect_env").glob("*.txt"))
LABELS = [
    "PyTorch version",
    "CUDA used to build PyTorch",
    "ROCM used to build PyTorch",
    "OS",
    "Python platform",
    "Is CUDA available",
    "GPU models and configuration",
    "Nvidia driver version",
    "Architecture",
    "[pip3] torch=",
    "[conda] pytorch",
    "GPU 0",
]
VALUES = st.one_of(
    st.text(max_size=60),
    st.sampled_from(
        [
            "Could not collect",
            "No CUDA",
            "N/A",
            "None",
            "2.8.0+cu128",
            "2.5.0a0+e000cf0ad9.nv24.10",
            "2.3.0a0+ebedce2",
            "2.1.0a0+41361538.nv23.06",
            "12.8",
            "570.86.10",
            "GPU 0: NVIDIA H100 80GB HBM3",
            "Linux-5.10.120-tegra-aarch64-with-glibc2.29",
            "2.5.1 cuda126_mkl_py312_h30b5a27_303 conda-forge",
            "2.0.1 py3.10_cuda11.8_cudnn8.7.0_0 pytorch",
            "9" * 5000,
        ]
    ),
)


@st.composite
def reports(draw) -> bytes:
    """A report made of the labels the reader looks for, with arbitrary values, or a real one damaged, or
    arbitrary bytes; sometimes with a huge line or thousands of GPU lines."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        lines = [f"{draw(st.sampled_from(LABELS))}: {draw(VALUES)}" for _ in range(draw(st.integers(0, 12)))]
        text = "\n".join(lines)
        if draw(st.booleans()):
            text += "\nGPU models and configuration:\n" + "".join(f"GPU {i}: A{i}\n" for i in range(3000))
        if draw(st.booleans()):
            text += "\nPyTorch version: " + "2." * draw(st.integers(1000, 200_000))
        return text.encode("utf-8", "surrogatepass")
    if kind == 1:
        seed = draw(st.sampled_from(REPORTS)).read_bytes()
        return draw(fuzzkit.damaged(seed))
    if kind == 2:
        return draw(st.text(max_size=2000)).encode("utf-8", "surrogatepass")
    return draw(st.binary(max_size=2000))


@given(content=reports(), json_out=st.booleans())
def test_check_collect_env_fuzz(content, json_out):
    argv = ["check", "--collect-env", "r.txt", *(["--json"] if json_out else [])]
    fuzzkit.check(fuzzkit.call(argv, files={"r.txt": content}))


@given(text=st.text(max_size=3000))
def test_the_reader_never_raises_but_a_one_line_input_error(text):
    try:
        r = read_report(text)
    except InputError as err:
        assert "\n" not in err.one_line()
        return
    assert all(isinstance(g, str) and g and "\n" not in g for g in r.gpus)
