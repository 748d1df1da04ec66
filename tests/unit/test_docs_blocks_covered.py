"""Every shell block of README.md and docs/**/*.md is run by a named test, or says why it is not run here.

The marks are described in tests/docblocks.py: ``<!-- doctest -->`` (run by
tests/integration/test_docs_tutorials.py, key lines asserted), ``<!-- tested-by: tests/x.py::test_y -->``
(a test that reads the block from its document and runs it) and ``<!-- not-run: why -->`` (a block that
needs a GPU names the test or tools/gpu script that runs it on the GPU machine). A new block without a mark,
a mark naming a test that does not exist or does not read that document, or a GPU block with nobody to
run it, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import docblocks  # tests/docblocks.py

ROOT = docblocks.ROOT
DOCS = docblocks.documents()
KINDS = ("doctest", "tested-by", "not-run")
DOCTEST_PLACES = ("", "slurm-login", "gpu")  # gpu: tests/gpu/test_docs_gpu.py runs them
GPU_RUNNER = re.compile(r"(tests/gpu/[\w/]+\.py::\w+|tools/gpu/[\w./-]+)")


def _test_defined(node: str) -> str | None:
    """None when ``tests/x.py::test_y`` is a test function of that file, else what is wrong."""
    path, _, name = node.partition("::")
    file = ROOT / path
    if not path.startswith("tests/") or not file.is_file():
        return f"{path} is not a file under tests/"
    if not name or not re.search(rf"^def {re.escape(name)}\(", file.read_text(), re.M):
        return f"{path} has no test function {name!r}"
    return None


def problems(block: docblocks.Block) -> list[str]:
    """What is wrong with ``block``'s mark (nothing for a block without commands)."""
    if not block.commands():
        return []
    if block.kind not in KINDS:
        return [
            f"{block.where}: a shell block with commands and no mark; put one of <!-- doctest -->, "
            "<!-- tested-by: tests/PATH.py::test_name -->, <!-- not-run: why --> right before its fence"
        ]
    detail = block.detail
    if block.kind == "doctest":
        return [] if detail in DOCTEST_PLACES else [f"{block.where}: unknown doctest place {detail!r}"]
    if block.kind == "tested-by":
        nodes = detail.split()
        out = [f"{block.where}: {why}" for n in nodes if (why := _test_defined(n))]
        out += [
            f"{block.where}: {n.partition('::')[0]} never names {block.doc.name}, so it cannot read this block"
            for n in nodes
            if not _test_defined(n) and block.doc.name not in (ROOT / n.partition("::")[0]).read_text()
        ]
        return out or ([] if nodes else [f"{block.where}: tested-by names no test"])
    if len(detail) < 20:
        return [f"{block.where}: not-run needs its reason (at least a sentence), got {detail!r}"]
    if re.search(r"\bGPUs?\b", detail):
        runners = GPU_RUNNER.findall(detail)
        if not runners:
            return [
                f"{block.where}: needs a GPU, so it names what runs it there (tests/gpu/...::test, tools/gpu/...)"
            ]
        out = []
        for r in runners:
            why = _test_defined(r) if "::" in r else (None if (ROOT / r).is_file() else f"no file {r}")
            if why:
                out.append(f"{block.where}: {why}")
        return out
    return []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shell_block_is_run_or_says_why_not(doc):
    found = [p for b in docblocks.shell_blocks(doc) for p in problems(b)]
    assert not found, "\n".join(found)


def test_the_docs_have_shell_blocks_of_each_kind():
    kinds = {b.kind for d in DOCS for b in docblocks.shell_blocks(d) if b.commands()}
    assert set(KINDS) <= kinds


def _block(tmp_path: Path, text: str) -> docblocks.Block:
    doc = tmp_path / "page.md"
    doc.write_text(text)
    return docblocks.shell_blocks(doc)[0]


def test_an_unmarked_or_wrongly_marked_block_is_caught(tmp_path):
    def said(text: str) -> str:
        return " ".join(problems(_block(tmp_path, text)))

    assert "no mark" in said("Run:\n\n```console\n$ torchrig doctor\n```\n")
    assert "no mark" in said("```bash\ntorchrig gpus\n```\n")
    assert said("```console\nonly output, no command\n```\n") == ""
    assert "no test function" in said(
        "<!-- tested-by: tests/unit/test_docs.py::test_nothing -->\n```bash\ntorchrig ps\n```\n"
    )
    assert "never names page.md" in said(
        "<!-- tested-by: tests/unit/test_docs.py::test_relative_links_resolve -->\n```bash\ntorchrig ps\n```\n"
    )
    assert "its reason" in said("<!-- not-run: later -->\n```bash\ntorchrig ps\n```\n")
    assert "names what runs it" in said(
        "<!-- not-run: needs a GPU, which this machine lacks -->\n```bash\ntorchrig bench\n```\n"
    )
    assert "no test function" in said(
        "<!-- not-run: needs a GPU: tests/gpu/test_bench_gpu.py::test_nope -->\n```bash\ntorchrig bench\n```\n"
    )
    assert "unknown doctest place" in said("<!-- doctest: mars -->\n```console\n$ torchrig ps\n```\n")


def test_console_steps_keep_shown_lines_and_join_continued_lines(tmp_path):
    block = _block(
        tmp_path,
        "<!-- doctest -->\n```console\n$ torchrig cluster slurm --nodes 2 \\\n    -o job.sbatch -- t.py\n"
        "wrote job.sbatch\n\n...\n  valid: bash -n: ok\n$ bash -n job.sbatch\n```\n",
    )
    steps = block.steps()
    assert [c for c, _ in steps] == [
        "torchrig cluster slurm --nodes 2 -o job.sbatch -- t.py",
        "bash -n job.sbatch",
    ]
    assert docblocks.shown_lines(steps[0][1]) == ["wrote job.sbatch", "valid: bash -n: ok"]
    assert docblocks.output_has("x\n  valid:  bash -n: ok\n", "valid: bash -n: ok")
    assert docblocks.output_has("[  2.3s] step 1/2: FROM debian:bookworm AS os\n", "step 1/2: FROM debian…")
    assert not docblocks.output_has("wrote other.sbatch\n", "wrote job.sbatch")
