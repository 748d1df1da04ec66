"""The host daemon: one root process that owns the Docker engine and the GPU leases of a shared server.

Users are not in the ``docker`` group; their ``torchrig up/ps/down/exec/logs/gpus`` talk to the daemon over
a Unix socket, and the daemon knows who they are from the kernel (``SO_PEERCRED``), checks that they own
what they touch (:mod:`~torchrig.hostd.policy`), cross-checks leases with the containers and NVML
(:mod:`~torchrig.hostd.reality`), checks bind mounts as the caller (:mod:`~torchrig.hostd.access`), and
appends every decision to an audit log in its root-only state folder. Modules: ``protocol`` (the wire),
``server`` (the socket), ``service`` (the verbs), ``client`` (the commands' side), ``unit`` (systemd).
"""
