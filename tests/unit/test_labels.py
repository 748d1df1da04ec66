"""``$TORCHRIG_LABELS``: one parser for up and image build; the labels image build sends with ``/build``."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchrig.errors import UsageError
from torchrig.image.pipeline import ImageOptions, build_labels, tag_digest
from torchrig.labels import labels_from_env, parse_labels

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def test_labels_parse_in_order_and_skip_empty_entries():
    assert parse_labels(" team=vision, cost.center=42 ,") == (("team", "vision"), ("cost.center", "42"))
    assert parse_labels("torchrig.test=ab12cd34ef56") == (("torchrig.test", "ab12cd34ef56"),)
    assert parse_labels("empty=") == (("empty", ""),)
    assert labels_from_env({}) == () and labels_from_env({"TORCHRIG_LABELS": "a=1"}) == (("a", "1"),)


@pytest.mark.parametrize(
    "text",
    [
        "nokey",
        "Bad Key=1",
        "=v",
        "UPPER=1",
        "torchrig.managed=1",  # the owner bookkeeping of up
        "torchrig.user=eve",
        "org.torchrig.torch=2.9.1+cu130",  # an image's stack: pre-flight reads it
        "org.torchrig.base.reference=sha256:0",
        "org.opencontainers.image.title=x",
    ],
)
def test_malformed_or_torchrig_own_keys_are_refused(text):
    with pytest.raises(UsageError) as err:
        parse_labels(f"ok=1,{text}")
    assert "malformed TORCHRIG_LABELS entry" in err.value.message and repr(text) in err.value.message


def test_build_sends_the_extra_labels_and_the_base_digest():
    opts = ImageOptions(spec=Path("torchrig.toml"), extra_labels=(("torchrig.test", "s1"), ("team", "v")))
    assert build_labels(opts, "sha256:abc") == {
        "torchrig.test": "s1",
        "team": "v",
        "org.torchrig.base.reference": "sha256:abc",
    }
    assert build_labels(ImageOptions(spec=Path("x")), None) == {"org.torchrig.base.reference": "unknown"}


def test_content_tag_digest_covers_the_extra_labels():
    ctx = "0123456789" * 6 + "abcd"
    assert tag_digest(ctx, ()) == ctx  # no labels: the tag a build without them always had
    one = tag_digest(ctx, (("torchrig.test", "s1"),))
    assert one != ctx and one == tag_digest(ctx, (("torchrig.test", "s1"),))
    assert one != tag_digest(ctx, (("torchrig.test", "s2"),))  # another session: another image, another tag
    both = (("a", "1"), ("b", "2"))
    assert tag_digest(ctx, both) == tag_digest(ctx, both[::-1])


def test_cli_image_build_bad_labels_exit_2_before_the_engine(cli, tmp_path):
    spec = tmp_path / "torchrig.toml"
    spec.write_text('[torch]\nversion = "2.8.0"\nvariant = "cpu"\n')
    r = cli("image", "build", str(spec), env={**NO_ENGINE, "TORCHRIG_LABELS": "org.torchrig.cuda=none"})
    assert r.code == 2 and r.err.count("\n") == 1 and "Traceback" not in r.err, r.err
    assert r.err.startswith("torchrig: error: malformed TORCHRIG_LABELS entry 'org.torchrig.cuda=none'")
    # render makes nothing on the engine, so it does not read the variable
    ok = cli("image", "render", str(spec), env={**NO_ENGINE, "TORCHRIG_LABELS": "bad"})
    assert ok.code == 0, ok.err
