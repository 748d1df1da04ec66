"""The first real error of a build step's log, from pip output recorded on this machine."""

from __future__ import annotations

from pathlib import Path

from torchrig.image.steplog import ErrorScan, first_error

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "image"


def _lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def test_a_missing_bdist_wheel_is_named_not_see_above():
    found = first_error(_lines("pip-wheel-no-bdist-wheel.txt"))
    assert found is not None and found.text == "error: invalid command 'bdist_wheel'"


def test_an_unreachable_index_names_the_connection_not_no_matching_distribution():
    found = first_error(_lines("pip-index-connection-refused.txt"))
    assert found is not None and found.text == "Connection refused"
    assert found.hint is not None and "--wheelhouse" in found.hint


def test_an_untrusted_certificate_is_the_cause():
    # pip's retry warning as the issue recorded it: five of these, then "No matching distribution found"
    retry = (
        "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after "
        "connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] "
        "certificate verify failed: self-signed certificate in certificate chain (_ssl.c:1006)'))': /simple/x/"
    )
    lines = [retry] * 5 + ["ERROR: No matching distribution found for x==1"]
    found = first_error(lines)
    assert found is not None
    assert found.text == "certificate verify failed: self-signed certificate in certificate chain"
    assert "--ca-cert" in (found.hint or "")


def test_apt_and_pip_plain_errors_and_the_first_one_wins():
    assert first_error(["+ apt-get install foo", "E: Unable to locate package foo"]).text == (  # type: ignore[union-attr]
        "E: Unable to locate package foo"
    )
    lines = [
        "ERROR: Could not find a version that satisfies the requirement x==9 (from versions: 1.0)",
        "ERROR: No matching distribution found for x==9",
    ]
    assert first_error(lines).text.startswith("ERROR: Could not find a version")  # type: ignore[union-attr]
    assert first_error(["all good", "+ echo error: not output"]) is None


def test_the_scan_keeps_a_cause_over_an_earlier_plain_error():
    scan = ErrorScan()
    for line in ["ERROR: first plain", "HTTP error 403 while getting https://x/", "ERROR: later"]:
        scan.feed(line)
    assert scan.result is not None and scan.result.text.startswith("HTTP error 403")
