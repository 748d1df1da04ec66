"""Loading the real knowledge base: every build's facts parse, lookups by NVML names, and the parse cache."""

from __future__ import annotations

import pytest

from torchrig import data
from torchrig.compat import kb as kbmod
from torchrig.compat import load_kb
from torchrig.compat import versions as V
from torchrig.compat.rules import arch_coverage
from torchrig.errors import InputError


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


def test_parsed_from_the_data_files_on_each_start_with_nothing_written(tmp_path, monkeypatch):
    """No cache on disk (the parse is ~40 ms): nothing under the cache folders, and the result is the data."""
    monkeypatch.setenv("TORCHRIG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    fresh = kbmod.load_kb.__wrapped__()  # past the per-process lru_cache
    assert list(tmp_path.iterdir()) == []
    assert fresh == kbmod.build_kb(*(data.load(n) for n in ("gpus", "cuda", "drivers", "torch", "platforms")))
    assert fresh == load_kb()


def test_a_damaged_data_file_is_one_line_naming_it(monkeypatch):
    """A row missing a key or a file of another schema: an InputError naming the row or file (exit 2)."""
    gpus = dict(data.load("gpus"))
    gpus["gpu"] = [{"name": "Broken GPU"}]
    docs = [gpus, data.load("cuda"), data.load("drivers"), data.load("torch")]
    with pytest.raises(InputError, match=r"bad gpu row 'Broken GPU': KeyError\('id'\)") as err:
        kbmod.build_kb(*docs)
    assert "reinstall torchrig" in err.value.one_line() and "\n" not in err.value.one_line()
    with pytest.raises(InputError, match=r"cuda.toml has schema_version 9, expected 1"):
        kbmod.build_kb(docs[0] | {"gpu": []}, {"schema_version": 9}, *docs[2:])
    with pytest.raises(InputError, match=r"torchrig's data file 'torchrig.data/missing.toml'"):
        data.packaged("torchrig.data", "missing.toml")


def test_jetson_is_not_an_x86_wheel_target():
    kb = load_kb()
    jetson = next(g for g in kb.gpus if g.segment == "embedded")
    from torchrig.compat import check

    r = check(kb, gpus=[jetson], driver=None, build=kb.find_build("2.8.0"))
    assert r.verdict.value == "fails" and "embedded_platform" in r.codes
    assert r.fixes[0].kind == "platform" and "JetPack" in r.fixes[0].summary
