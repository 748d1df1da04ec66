"""The one size parser (torchrig.sizes) behind ``up --memory/--shm-size`` and ``bench --min-size/--max-size``."""

from __future__ import annotations

import pytest

from torchrig.errors import UsageError
from torchrig.sizes import parse_size


@pytest.mark.parametrize(
    ("text", "size_bytes"),
    [
        ("4096", 4096),
        ("1.5K", 1536),
        ("512m", 512 << 20),
        ("512MB", 512 << 20),
        ("16g", 16 << 30),
        ("16Gi", 16 << 30),
        ("4GiB", 4 << 30),
        (" 2 TiB ", 2 << 40),
    ],
)
def test_sizes_read_as_binary_units(text: str, size_bytes: int) -> None:
    assert parse_size(text) == size_bytes


@pytest.mark.parametrize(
    ("text", "what", "message"),
    [
        ("lots", "--memory", "malformed --memory 'lots'"),
        ("-1g", "--shm-size", "malformed --shm-size '-1g'"),
        ("4XB", "--max-size", "malformed --max-size '4XB'"),
        ("", "--min-size", "malformed --min-size ''"),
        ("GiB", "size", "malformed size 'GiB'"),
        ("0", "--memory", "--memory '0' is below one byte"),
        ("0.5", "--min-size", "--min-size '0.5' is below one byte"),
    ],
)
def test_bad_sizes_name_the_option(text: str, what: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_size(text, what)
    assert str(err.value) == message or message in str(err.value)
    assert err.value.hint


def test_one_parse_size_in_src() -> None:
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "torchrig"
    found = [
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if re.search(r"^def parse_size\b", p.read_text(), re.M)
    ]
    assert found == ["sizes.py"]
