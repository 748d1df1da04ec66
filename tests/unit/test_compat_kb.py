"""Loading the real knowledge base: every build's facts parse, lookups by NVML names, and the parse cache."""

from __future__ import annotations

import pytest

from torchrig.compat import kb as kbmod
from torchrig.compat import load_kb
from torchrig.compat import versions as V
from torchrig.compat.rules import arch_coverage


def test_every_build_and_gpu_parses():
    kb = load_kb()
    assert kb.releases and kb.gpus and kb.toolkits and kb.branches
    for b in kb.all_builds():
        for a in (*b.variant.arch_list, *b.variant.ptx):
            V.parse_arch(a)
        if b.cuda:
            assert kb.toolkit(b.cuda).version == V.cuda_major_minor(b.cuda)
    for g in kb.gpus:
        assert kb.find_gpu(g.name) is g
        arch_coverage(g.compute_capability, ["sm_80"])


def test_releases_newest_first_and_pypi_default_exists():
    kb = load_kb()
    versions = [V.parse_release(r.version) for r in kb.releases]
    assert versions == sorted(versions, reverse=True)
    for r in kb.releases:
        assert kb.find_build(r.version).is_pypi_default


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA H100 80GB HBM3",
        "Tesla V100-SXM2-32GB",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA GeForce RTX 4090",
        "Tesla T4",
    ],
)
def test_nvml_names(name):
    assert load_kb().find_gpu(name).name == name


def test_cache_is_written_reused_and_survives_corruption(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHRIG_CACHE_DIR", str(tmp_path))
    build = kbmod.load_kb.__wrapped__  # past the per-process lru_cache
    first = build()
    files = list(tmp_path.glob("kb-*.pickle"))
    assert len(files) == 1
    again = build()
    assert again == first and again is not first  # read back from the file
    files[0].write_bytes(b"not a pickle")
    assert build() == first  # rebuilt from the TOML files
    assert (
        kbmod.build_kb(*(kbmod._load_docs()[n] for n in ("gpus", "cuda", "drivers", "torch", "platforms")))
        == first
    )


def test_jetson_is_not_an_x86_wheel_target():
    kb = load_kb()
    jetson = next(g for g in kb.gpus if g.segment == "embedded")
    from torchrig.compat import check

    r = check(kb, gpus=[jetson], driver=None, build=kb.find_build("2.8.0"))
    assert r.verdict.value == "fails" and "embedded_platform" in r.codes
    assert r.fixes[0].kind == "platform" and "JetPack" in r.fixes[0].summary
