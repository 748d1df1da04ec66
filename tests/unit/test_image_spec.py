"""torchrig.toml: defaults, validation, and one-line errors that name the file, the key and the allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchrig.errors import SpecError
from torchrig.image.spec import load_spec, parse_spec
from torchrig.image.stack import ResolvedStack, choose_base, load_bases, stack_from_wheelhouse


def test_defaults():
    spec = parse_spec({"torch": {"version": "2.8.0", "variant": "cpu"}})
    assert spec.python == "3.11" and spec.variant == "runtime" and spec.services.enabled == ("jupyter", "ssh")
    assert (spec.user.name, spec.user.uid, spec.user.gid) == ("torch", 1000, 1000)
    assert spec.workdir == "/workspace" and spec.base is None


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"image": {"variant": "dev"}}, "[image] variant = 'dev': allowed: runtime, devel"),
        ({"torch": {"variant": "cuda12"}}, "[torch] variant = 'cuda12': allowed: 'cpu', a CUDA variant"),
        ({"user": {"uid": 0}}, "[user] uid = 0: allowed: an integer 1..65535"),
        ({"user": {"name": "root"}}, "[user] name = 'root'"),
        ({"services": {"ssh": "yes"}}, "[services] ssh = 'yes': allowed: true or false"),
        ({"image": {"base": "debian:latest"}}, "[image] base = 'debian:latest'"),
        ({"image": {"base": "debian"}}, "[image] base = 'debian'"),
        ({"image": {"workdir": "relative/dir"}}, "[image] workdir"),
        ({"torch": {"versoin": "2.8.0"}}, "unknown key 'versoin' in [torch]; did you mean: version"),
        ({"servics": {}}, "unknown section [servics]; did you mean: services"),
        ({"schema_version": 7}, "schema_version = 7: allowed: 1"),
        ({"torch": {"version": "auto"}}, "[torch] gpus is empty"),
    ],
)
def test_invalid_values_name_file_key_and_allowed(data, fragment):
    data = {"torch": {"version": "2.8.0", "variant": "cpu"}, **data} if "torch" not in data else data
    with pytest.raises(SpecError) as err:
        parse_spec(data, "my/torchrig.toml")
    line = err.value.one_line()
    assert line.startswith("my/torchrig.toml: ") and fragment in line and "\n" not in line


def test_auto_needs_gpus_unless_cpu():
    assert parse_spec({"torch": {"version": "auto", "variant": "cpu"}}).torch.variant == "cpu"
    spec = parse_spec({"torch": {"gpus": ["H100"], "min_driver": "535.104.05"}})
    assert spec.torch.version == "auto" and spec.torch.gpus == ("H100",)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(SpecError) as err:
        load_spec(tmp_path / "nope.toml")
    assert err.value.one_line().endswith("nope.toml: no such spec file; write one with 'torchrig init'")
    bad = tmp_path / "torchrig.toml"
    bad.write_text("[torch\nversion=")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(bad)


def test_cli_invalid_spec_exit_2_one_line(cli, tmp_path):
    spec = tmp_path / "torchrig.toml"
    spec.write_text('[image]\nvariant = "dev"\n[torch]\nversion = "2.8.0"\nvariant = "cpu"\n')
    r = cli("image", "render", str(spec))
    assert r.code == 2 and r.err.count("\n") == 1 and "Traceback" not in r.err
    assert r.err.startswith(f"torchrig: error: {spec}: [image] variant = 'dev': allowed: runtime, devel")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--wheelhouse", "/nonexistent-wheels"], "--wheelhouse /nonexistent-wheels: not a directory"),
        (["--ca-cert", "/nonexistent.pem"], "--ca-cert /nonexistent.pem: no such file"),
    ],
)
def test_cli_bad_build_inputs_exit_2(cli, tmp_path, args, fragment):
    spec = tmp_path / "torchrig.toml"
    spec.write_text('[torch]\nversion = "2.8.0"\nvariant = "cpu"\n')
    r = cli("image", "build", str(spec), *args)
    assert r.code == 2 and r.err.count("\n") == 1 and fragment in r.err


def test_cli_ca_cert_must_be_pem(cli, tmp_path):
    spec = tmp_path / "torchrig.toml"
    spec.write_text('[torch]\nversion = "2.8.0"\nvariant = "cpu"\n')
    junk = tmp_path / "ca.der"
    junk.write_bytes(b"\x30\x82binary")
    r = cli("image", "render", str(spec), "--ca-cert", str(junk))
    assert r.code == 2 and "not a PEM certificate" in r.err and r.err.count("\n") == 1


def test_cli_missing_spec_exit_2(cli, tmp_path):
    r = cli("image", "render", str(tmp_path / "torchrig.toml"))
    assert r.code == 2 and "no such spec file" in r.err and r.err.count("\n") == 1


def test_init_writes_a_valid_commented_spec(cli, tmp_path):
    path = tmp_path / "torchrig.toml"
    r = cli("init", str(path), "--variant", "cpu", "--torch", "2.8.0")
    assert r.code == 0 and path.exists()
    text = path.read_text()
    assert text.count("#") > 15  # commented
    spec = load_spec(path)
    assert (spec.torch.version, spec.torch.variant) == ("2.8.0", "cpu")
    again = cli("init", str(path))
    assert again.code == 2 and "exists; pass --force" in again.err and again.err.count("\n") == 1
    assert cli("init", str(path), "--force", "--gpu", "RTX 4090", "--devel").code == 0
    spec = load_spec(path)
    assert (
        spec.torch.gpus == ("RTX 4090",) and spec.variant == "devel" and spec.torch.min_driver is None
    )  # no --driver: none assumed


def test_init_rejects_bad_values(cli, tmp_path):
    r = cli("init", str(tmp_path / "t.toml"), "--variant", "cuda")
    assert r.code == 2 and "[torch] variant = 'cuda'" in r.err and not (tmp_path / "t.toml").exists()


def test_base_choice_by_variant_and_python():
    rows, _ = load_bases()
    cpu = ResolvedStack(torch="2.8.0", variant="cpu", python="3.12")
    spec = parse_spec({"torch": {"version": "2.8.0", "variant": "cpu"}, "python": {"version": "3.12"}})
    assert choose_base(spec, cpu, rows, None).image.startswith("python:3.12.")
    gpu = ResolvedStack(torch="2.8.0", variant="cu128", python="3.11", cuda="12.8")
    devel = parse_spec({"torch": {"version": "2.8.0", "variant": "cu128"}, "image": {"variant": "devel"}})
    with pytest.raises(
        SpecError, match=r"\[python\] version = '3.11': the CUDA 12.8 devel base has Python 3.12"
    ):
        choose_base(devel, gpu, rows, None)
    assert choose_base(devel, gpu, rows, "my/base:1.0").image == "my/base:1.0"
    for row in rows:
        assert ":latest" not in row["image"] and row["source"].startswith("https://")


def test_wheelhouse_fallback_reads_the_torch_wheel(tmp_path):
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    spec = parse_spec({"torch": {"version": "2.13.0", "variant": "cpu"}})
    found = stack_from_wheelhouse(spec, Path(tmp_path))
    assert found is not None and found.label == "2.13.0+cpu" and found.source == "wheelhouse"
    other = parse_spec({"torch": {"version": "2.13.0", "variant": "cpu"}, "python": {"version": "3.12"}})
    assert stack_from_wheelhouse(other, Path(tmp_path)) is None


def test_auto_resolves_through_the_compatibility_engine(tmp_path):
    from torchrig.image.pipeline import ImageOptions, make_plan

    spec = tmp_path / "torchrig.toml"
    spec.write_text('[torch]\ngpus = ["H100"]\nmin_driver = "550.54.15"\n')
    plan = make_plan(ImageOptions(spec=spec))
    s = plan.stack
    assert s.cuda and s.arch_list and "sm_90" in s.arch_list and s.min_driver and s.source == "knowledge base"
    assert plan.stack_tag == f"torchrig/pytorch:{s.torch}-{s.variant}-py3.11-runtime"
    assert plan.base.image.startswith("python:3.11.")


def test_cli_devel_with_a_python_the_base_lacks_exit_2(cli, tmp_path):
    spec = tmp_path / "torchrig.toml"
    spec.write_text('[torch]\nversion = "2.8.0"\nvariant = "cu128"\n[image]\nvariant = "devel"\n')
    r = cli("image", "render", str(spec))
    assert r.code == 2 and r.err.count("\n") == 1
    assert "[python] version = '3.11': the CUDA 12.8 devel base has Python 3.12" in r.err


def test_cli_render_json_names_the_stack(cli, tmp_path):
    spec = tmp_path / "torchrig.toml"
    spec.write_text('[torch]\nversion = "2.8.0"\nvariant = "cu128"\n')
    r = cli("image", "render", str(spec), "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["tag"] == "torchrig/pytorch:2.8.0-cu128-py3.11-runtime"
    assert doc["stack"]["org.torchrig.cudnn"] == "9.10.2.21" and doc["dockerfile"].startswith(
        "# Rendered by torchrig"
    )


def test_cli_build_without_an_engine_exit_2(cli, tmp_path):
    spec = tmp_path / "torchrig.toml"
    spec.write_text('[torch]\nversion = "2.8.0"\nvariant = "cpu"\n')
    r = cli("image", "build", str(spec), env={"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    assert r.code == 2 and r.err.count("\n") == 1
    assert f"cannot reach the Docker engine at unix://{tmp_path}/no-docker.sock" in r.err
    assert "sudo systemctl start docker" in r.err


LOCK = Path(__file__).resolve().parents[1] / "fixtures" / "image" / "lock-2.13.0-cpu-jupyter-ssh.json"
TEST_SPEC = '[torch]\nversion = "2.13.0"\nvariant = "cpu"\n[image]\nname = "torchrig-test/pytorch"\n'


def _locked_plan(tmp_path, lock_text: str | None):
    from torchrig.image.pipeline import ImageOptions, make_plan

    (tmp_path / "torchrig.toml").write_text(TEST_SPEC)
    if lock_text is not None:
        (tmp_path / "torchrig.lock.json").write_text(lock_text)
    return make_plan(
        ImageOptions(spec=tmp_path / "torchrig.toml", locked=True, base="torchrig-test/debian:bookworm")
    )


def test_locked_build_pins_what_the_lock_recorded(tmp_path):
    from torchrig.image import context, render

    plan = _locked_plan(tmp_path, LOCK.read_text())
    text = render.render_dockerfile(plan)
    assert "openssh-server=1:9.2p1-2+deb12u10" in text and "tini=0.19.0-1+b3" in text
    assert "python3.11=3.11.2-6+deb12u8 python3.11-venv=3.11.2-6+deb12u8" in text
    assert "COPY torchrig-files/locked.txt /etc/torchrig/locked.txt" in text
    assert "-c /etc/torchrig/locked.txt torch==2.13.0+cpu" in text
    assert "-c /tmp/torchrig-layers.txt -c /etc/torchrig/locked.txt jupyterlab==4.6.6" in text
    wheel = tmp_path / "torchrig-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    locked = context.plan_context(plan, wheel, None, None).texts["torchrig-files/locked.txt"].splitlines()
    assert "jupyterlab==4.6.6" in locked and "torch==2.13.0+cpu" in locked
    assert not any(line.startswith("torchrig==") for line in locked)


def test_locked_refuses_a_missing_or_stale_lock(cli, tmp_path):
    (tmp_path / "torchrig.toml").write_text(TEST_SPEC)
    r = cli("image", "render", str(tmp_path / "torchrig.toml"), "--locked")
    assert r.code == 2 and r.err.count("\n") == 1 and "--locked: no torchrig.lock.json beside" in r.err
    stale = LOCK.read_text().replace(
        '"org.torchrig.torch": "2.13.0+cpu"', '"org.torchrig.torch": "2.12.0+cpu"'
    )
    (tmp_path / "torchrig.lock.json").write_text(stale)
    r = cli("image", "render", str(tmp_path / "torchrig.toml"), "--locked")
    assert r.code == 2 and "records torch '2.12.0+cpu' but the spec resolves to 2.13.0+cpu" in r.err


def test_init_into_an_unwritable_place_is_one_line_exit_2(cli):
    r = cli("init", "--force", "/proc/no-such-dir/torchrig.toml")
    assert r.code == 2 and r.err.count("\n") == 1 and "cannot write /proc/no-such-dir/torchrig.toml" in r.err


def test_the_images_page_shows_the_errors_render_gives(tmp_path):
    """docs/images.md's two mistakes, each in a torchrig.toml of its own, and `torchrig image render` as the
    page writes it: exit 2 and the page's line."""
    import docblocks  # tests/docblocks.py

    node = "tests/unit/test_image_spec.py::test_the_images_page_shows_the_errors_render_gives"
    (block,) = docblocks.tested_by(docblocks.ROOT / "docs" / "images.md", node)
    specs = [
        '[torch]\nversion = "2.13.0"\nvariant = "cpu"\n[image]\nvariant = "dev"\n',
        '[torch]\nversoin = "2.13.0"\nvariant = "cpu"\n',
    ]
    steps = block.steps()
    assert len(steps) == len(specs)
    for spec, (cmd, shown) in zip(specs, steps, strict=True):
        (tmp_path / "torchrig.toml").write_text(spec)
        r = docblocks.run(cmd, tmp_path)
        assert r.returncode == 2 and r.stderr.splitlines() == docblocks.shown_lines(shown), r.stderr
