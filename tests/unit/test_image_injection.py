"""No input becomes code in the Dockerfile: for arbitrary text in every field that reaches the render, the
result is a one-line error, or a Dockerfile whose parsed instructions have the same structure as with a
benign value (the same instructions; in each, the same words, shell operators and expansions).

The parser below follows Docker's rules for what matters here (https://docs.docker.com/reference/dockerfile/):
comment lines are dropped, a line ending in the escape character ``\\`` continues, the first word is the
instruction. Each instruction's arguments are then scanned as sh reads them (Docker passes a shell-form RUN
to ``/bin/sh -c``; its own word splitting and ``$`` substitution in ENV/LABEL/WORKDIR follow the same
quoting): quotes, backslashes, unquoted operators, and ``$``/backquote expansions outside single quotes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchrig.errors import UsageError
from torchrig.image import render
from torchrig.image.pipeline import lock_pins
from torchrig.image.spec import ImageSpec, index_url, parse_spec, spec_path
from torchrig.image.stack import BaseChoice, ImagePlan, ResolvedStack

OPERATORS = set(";&|<>()\n")


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, as Docker's parser splits them."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in dockerfile.split("\n"):
        if line.strip().startswith("#"):
            continue  # a comment, also inside a continued instruction
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1]  # Docker drops the escape and the newline
            continue
        text = (pending + line).strip()
        pending = ""
        if text:
            word, _, rest = text.partition(" ")
            out.append((word.upper(), rest.strip()))
    assert not pending.strip(), "a continuation at the end of the file"
    return out


def shape(args: str) -> list[str]:
    """Words ('W'), unquoted operators and expansions ('$', '`') of ``args`` as sh would read them."""
    events: list[str] = []
    quote: str | None = None
    in_word = False
    i = 0
    while i < len(args):
        c = args[i]
        if quote is None and c in OPERATORS:
            events.append(c)
            in_word = False
        elif quote is None and c in " \t":
            in_word = False
        else:
            if not in_word:
                events.append("W")
                in_word = True
            if quote == "'":
                quote = None if c == "'" else quote
            elif c == "\\":
                i += 1  # the next character is literal
            elif c in "$`":
                events.append(c)
            elif quote == '"' and c == '"':
                quote = None
            elif quote is None and c in "'\"":
                quote = c
        i += 1
    assert quote is None, f"an unterminated {quote} quote"
    return events


def structure(dockerfile: str) -> list[tuple[str, list[str]]]:
    return [(name, shape(args)) for name, args in instructions(dockerfile)]


# ---------------------------------------------------------------- the parser itself


def test_the_parser_sees_an_injected_instruction_and_command():
    benign = "FROM x\nRUN set -eux; \\\n    echo ok\n"
    assert instructions(benign) == [("FROM", "x"), ("RUN", "set -eux;     echo ok")]
    assert structure(benign) != structure("FROM x\nRUN set -eux; \\\n    echo ok\nRUN id\n")
    assert structure(benign) != structure("FROM x\nRUN set -eux; \\\n    echo ok; id\n")
    assert structure(benign) != structure("FROM x\nRUN set -eux; \\\n    echo $(id)\n")
    assert structure(benign) == structure("FROM x\nRUN set -eux; \\\n    echo 'a;$(id)'\n")


# ---------------------------------------------------------------- every field


STACK = ResolvedStack(torch="2.13.0", variant="cpu", python="3.11")
BENIGN_SPEC = {
    "torch": {"version": "2.13.0", "variant": "cpu"},
    "packages": {"pip": ["tqdm"], "apt": ["htop"]},
}


def plan(spec: ImageSpec, **kw) -> ImagePlan:
    return ImagePlan(
        spec=spec,
        stack=STACK,
        base=BaseChoice(image="torchrig-test/debian:bookworm", python_from="auto", source="--base"),
        jupyterlab="4.6.6",
        torchrig_requires=("packaging>=23",),
        **kw,
    )


def spec_with(section: str, key: str, value: object) -> dict:
    data = json.loads(json.dumps(BENIGN_SPEC))
    data.setdefault(section, {})[key] = value
    return data


BENIGN = structure(render.render_dockerfile(plan(parse_spec(BENIGN_SPEC))))
BENIGN_URL = structure(
    render.render_dockerfile(plan(parse_spec(BENIGN_SPEC), pip_index_url="https://x.org/s"))
)

NASTY = [
    "x\nRUN id",
    "x; id",
    "x && id",
    "$(id)",
    "`id`",
    "x' ; id ; '",
    'x" ; id ; "',
    "x \\\nRUN id",
    "x\r\nRUN id",
    "/w\nRUN id",
    "https://x.org/s\nRUN id",
    "https://x.org/s;id",
    "https://x.org/$(id)",
    "https://x.org/s' id '",
    'foo; os_name == "$(id)"',
    "foo @ https://x.org/a.whl; os_name == \"'$(id)'\"",
    "htop=1.0; id",
    "htop=1:2.0-1$(id)",
    "/workspace/../etc",
    "# escape=`",
]
TEXT = st.one_of(
    st.sampled_from(NASTY), st.text(max_size=40), st.text(alphabet=" \n\\$`'\";&|()<>#=/:@a1.-", max_size=30)
)


def one_line_or_same(make_plan, benign=BENIGN) -> None:
    try:
        p = make_plan()
    except UsageError as err:  # SpecError is one
        assert "\n" not in err.one_line() and err.exit_code == 2
        return
    assert structure(render.render_dockerfile(p)) == benign


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT)
def test_a_pip_requirement(value):
    one_line_or_same(lambda: plan(parse_spec(spec_with("packages", "pip", [value]))))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT)
def test_an_apt_package(value):
    one_line_or_same(lambda: plan(parse_spec(spec_with("packages", "apt", [value]))))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT)
def test_the_workdir(value):
    one_line_or_same(lambda: plan(parse_spec(spec_with("image", "workdir", value))))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT)
def test_the_spec_pip_index_url(value):
    one_line_or_same(lambda: plan(parse_spec(spec_with("image", "pip_index_url", value))), BENIGN_URL)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT)
def test_the_pip_index_url_option(value):
    def make() -> ImagePlan:
        try:
            url = index_url(value)
        except ValueError:
            raise UsageError(f"--pip-index-url {value!r}: not a URL") from None
        return plan(parse_spec(BENIGN_SPEC), pip_index_url=url)

    one_line_or_same(make, BENIGN_URL)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT)
def test_the_spec_path(value):
    def make() -> ImagePlan:
        return plan(parse_spec(BENIGN_SPEC, spec_path(value or "x")))

    one_line_or_same(make)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT)
def test_the_spec_image_name_and_base(value):
    one_line_or_same(lambda: plan(parse_spec(spec_with("image", "name", value))))
    one_line_or_same(lambda: plan(parse_spec(spec_with("user", "name", value))))


LOCK = {
    "pip_freeze": ["numpy==2.3.1", "torch==2.13.0+cpu"],
    "apt_packages": ["htop=3.2.2-2", "tini=0.19.0-1"],
    "base_reference": "torchrig-test/debian@sha256:" + "0" * 64,
}


def locked_structure(lock: dict) -> list:
    p = plan(parse_spec(BENIGN_SPEC), locked=lock_pins(lock, Path("torchrig.lock.json")))
    return structure(render.render_dockerfile(p))


LOCKED = locked_structure(LOCK)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT, st.sampled_from(["pip_freeze", "apt_packages", "base_reference"]))
def test_a_lock_file_field(value, key):
    lock = json.loads(json.dumps(LOCK))
    if key == "base_reference":
        lock[key] = value
    else:
        lock[key] = [*lock[key], value]
    try:
        pins = lock_pins(lock, Path("torchrig.lock.json"))
    except UsageError as err:
        assert "\n" not in err.one_line() and err.exit_code == 2
        return
    assert all("\n" not in line and not line.startswith("-") for line in pins.pip)  # the constraint file
    p = plan(parse_spec(BENIGN_SPEC), locked=pins)
    assert structure(render.render_dockerfile(p)) == LOCKED


@pytest.mark.parametrize(
    "args",
    [
        ["--pip-index-url", "https://x.org/s\nRUN id"],
        ["--pip-index-url", "https://x.org/$(id)"],
    ],
)
def test_cli_bad_pip_index_url_is_one_line_exit_2(cli, tmp_path, args):
    spec = tmp_path / "torchrig.toml"
    spec.write_text('[torch]\nversion = "2.13.0"\nvariant = "cpu"\n')
    r = cli("image", "render", str(spec), *args)
    assert r.code == 2 and r.err.count("\n") == 1 and "--pip-index-url" in r.err, r.err


def test_cli_bad_spec_fields_are_one_line_exit_2(cli, tmp_path):
    spec = tmp_path / "torchrig.toml"
    for bad in (
        '[packages]\npip = ["tqdm\\nRUN id"]',
        '[packages]\napt = ["htop; id"]',
        '[image]\nworkdir = "/w$(id)"',
    ):
        spec.write_text('[torch]\nversion = "2.13.0"\nvariant = "cpu"\n' + bad + "\n")
        r = cli("image", "render", str(spec))
        assert r.code == 2 and r.err.count("\n") == 1, r.err


def test_ca_cert_with_a_private_key_is_refused_and_only_certificates_travel(cli, tmp_path):
    import subprocess

    from torchrig.image.context import certificates

    key, crt = tmp_path / "ca.key", tmp_path / "ca.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
         "-days", "1", "-subj", "/CN=torchrig-test-ca"],
        check=True, capture_output=True,
    )  # fmt: skip
    bundle = tmp_path / "bundle.pem"
    bundle.write_text("# corporate proxy\n" + crt.read_text() + "junk\n" + crt.read_text())
    assert certificates(bundle) == crt.read_text() * 2  # the two certificates, nothing else
    spec = tmp_path / "torchrig.toml"
    spec.write_text('[torch]\nversion = "2.13.0"\nvariant = "cpu"\n')
    for leaky in (crt.read_text() + key.read_text(), key.read_text() + crt.read_text()):
        bundle.write_text(leaky)
        r = cli("image", "render", str(spec), "--ca-cert", str(bundle))
        assert r.code == 2 and r.err.count("\n") == 1 and "PRIVATE KEY" in r.err, r.err
