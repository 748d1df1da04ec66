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
