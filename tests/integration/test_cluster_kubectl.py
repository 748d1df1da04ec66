"""`torchrig cluster k8s --apply` with the real kubectl client, against a cluster that is not there."""

from __future__ import annotations

import shutil

import pytest


@pytest.mark.parametrize("kind", ["job", "jobset"])
def test_cli_apply_with_kubectl_and_no_cluster_is_one_line_exit_1(cli, tmp_path, kind):
    """The real kubectl client, pointed at a server that is not there."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl is not installed")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: none\n  cluster: {server: 'https://127.0.0.1:9'}\n"
        "contexts:\n- name: none\n  context: {cluster: none, user: none}\ncurrent-context: none\n"
        "users:\n- name: none\n  user: {token: x}\n"
    )
    out = tmp_path / "job.yaml"
    r = cli(
        "cluster", "k8s", "--kind", kind, "--image", "img:1", "-o", str(out), "--apply", "--", "train.py",
        env={"KUBECONFIG": str(kubeconfig)}, timeout=180,
    )  # fmt: skip
    assert r.code == 1, r
    assert "kubectl apply failed:" in r.err and "kubectl cluster-info" in r.err and r.err.count("\n") == 1
    assert "127.0.0.1:9" in r.err  # kubectl's own error, naming the server it could not reach
