"""Remapping the image's user to the host UID/GID: /etc/passwd and /etc/group rewrites."""

from __future__ import annotations

import pytest

from torchrig.runtime.identity import RemapConflict, remap_group, remap_passwd

PASSWD = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\ntorch:x:1000:1000::/home/torch:/bin/bash\n"
GROUP = "root:x:0:\nusers:x:100:\ntorch:x:1000:\n"


def test_remap_keeps_name_and_home():
    text, home = remap_passwd(PASSWD, "torch", 4321, 4322)
    assert home == "/home/torch"
    assert "torch:x:4321:4322::/home/torch:/bin/bash" in text.splitlines()
    assert text.splitlines()[0] == "root:x:0:0:root:/root:/bin/bash"
    assert "torch:x:4322:" in remap_group(GROUP, "torch", 1000, 4322).splitlines()


def test_conflicts_are_refused():
    with pytest.raises(RemapConflict, match="'daemon'"):
        remap_passwd(PASSWD, "torch", 1, 1)
    with pytest.raises(RemapConflict, match="no user 'dev'"):
        remap_passwd(PASSWD, "dev", 4321, 4321)


def test_hand_over_changes_only_root_owned_entries(tmp_path):
    import os

    from torchrig.runtime.up import hand_over

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    (tmp_path / "theirs").write_text("y")
    os.chown(tmp_path / "theirs", 1234, 1234)
    (tmp_path / "link").symlink_to("/etc/passwd")
    if os.getuid() != 0:
        import pytest

        pytest.skip("chown needs root")
    assert hand_over(str(tmp_path), 1000, 1001) == 4  # the root, d, d/f, link (not the link's target)
    assert (tmp_path / "d" / "f").stat().st_uid == 1000 and (tmp_path / "theirs").stat().st_uid == 1234
    assert os.lstat(tmp_path / "link").st_uid == 1000 and os.stat("/etc/passwd").st_uid == 0


def test_host_key_is_kept_per_name_and_recorded_once(tmp_path):
    from torchrig.runtime import hostkey

    a = hostkey.ensure("env-a", tmp_path)
    assert a is not None and a.public.startswith("ssh-ed25519 ")
    assert (tmp_path / "hostkeys" / "env-a").stat().st_mode & 0o777 == 0o700
    assert hostkey.ensure("env-a", tmp_path) == a and hostkey.ensure("env-b", tmp_path) != a
    hostkey.record(a, "env-a")
    line = hostkey.record(a, "env-a")
    assert (tmp_path / "known_hosts").read_text() == line + "\n" and line.startswith("env-a ssh-ed25519 ")
