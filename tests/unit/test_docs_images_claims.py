"""docs/images.md's worked example of ``auto`` is what the code answers (the doc once showed a build the
resolver no longer picks)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "images.md"


def test_the_auto_example_is_what_init_and_render_give(cli, tmp_path):
    text = " ".join(DOC.read_text().split())
    m = re.search(r"`Stack: torch (\S+); … CUDA ([\d.]+), cuDNN ([\d.]+)`", text)
    assert m, "the example is gone from docs/images.md"
    torch, cuda, cudnn = m.groups()
    spec = tmp_path / "i.toml"
    assert cli("init", "--gpu", "H100", "--driver", "535.104.05", str(spec)).code == 0
    r = cli("image", "render", str(spec))
    assert r.code == 0, r.err
    assert f"Stack: torch {torch};" in r.out and f"CUDA {cuda}, cuDNN {cudnn}" in r.out, r.out[:600]
    newer = re.search(r"and the newer `(\S+)` as working with caveats", text).group(1)
    res = cli("resolve", "--gpu", "H100", "--driver", "535.104.05")
    assert res.code == 0 and torch in res.out and f"{newer} (works with caveats" in res.out, res.out
