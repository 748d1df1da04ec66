"""``torchrig serve``, the image's entrypoint: JupyterLab with a token and a key-only OpenSSH server as the
non-root user, supervised (signals forwarded, a dead service stops the container), with a health check.

``config`` reads the image config, the environment and the mounted secrets; ``plan`` makes argv and files
(sshd_config, the SSH session environment); ``supervisor`` runs them; ``health`` probes them.
"""
