"""The Docker Engine adapter (Docker SDK for Python): the only module of ``runtime`` that talks to dockerd.

It turns an :class:`~torchrig.runtime.plan.UpPlan` into ``containers.create`` arguments, and engine state
into plain :class:`EnvRecord` records. Shell equivalents: ``docker create/start/ps/logs/exec/rm``.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig.contract import ENV_LABEL_PREFIX
from torchrig.errors import EngineUnavailable, InputError
from torchrig.inputfiles import read_bytes
from torchrig.runtime.plan import ImageFacts, Ulimit, UpPlan

PROBE_LABEL = f"{ENV_LABEL_PREFIX}probe"
_ULIMIT_FLAGS = {"memlock": "l", "stack": "s", "nofile": "n", "nproc": "u", "core": "c"}
_KIB_LIMITS = {"memlock", "stack", "core"}  # sh's ulimit prints these in KiB


class _RlimitRefused(Exception):
    """runc could not set a ulimit the container asked for."""


LIVE_STATES = frozenset({"created", "running", "restarting", "paused"})
START_HINT = (
    "start it: 'sudo systemctl start docker' (or 'sudo dockerd &'); if it runs, check DOCKER_HOST "
    "and that your user may use it ('sudo usermod -aG docker $USER', then log in again)"
)
NO_GPU_RUNTIME_HINT = (
    "install the NVIDIA Container Toolkit and configure Docker for it "
    "('sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker')"
)


@dataclass(frozen=True)
class EnvRecord:
    """A torchrig environment as the engine sees it."""

    name: str
    id: str
    user: str
    image: str
    state: str  # created | running | exited | dead | ...
    status: str  # the engine's human status ("Up 3 minutes")
    gpu_uuids: tuple[str, ...]
    gpu_labels: tuple[str, ...]
    ports: dict[str, tuple[str, int]]  # service -> (host ip, host port)
    container_user: str | None
    created: str
    owner_uid: int | None = None  # the real UID that made it (label torchrig.uid); None: unknown

    def owned_by(self, uid: int) -> bool:
        return self.owner_uid is not None and self.owner_uid == uid

    @property
    def alive(self) -> bool:
        return self.state in LIVE_STATES


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v for v in (value or "").split(",") if v)


class Engine:
    """A connected engine. Build with :meth:`connect`; every error becomes a one-line torchrig error."""

    def __init__(self, client: Any) -> None:
        import docker

        self.client = client
        self.errors = docker.errors
        self.types = docker.types

    @classmethod
    def connect(cls, timeout_s: float = 30) -> Engine:
        try:
            import docker
        except ImportError:  # the SDK is an extra: say how to get it, never a traceback
            raise EngineUnavailable(
                "the Docker SDK for Python is not installed", hint="pip install 'torchrig[docker]'"
            ) from None

        where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        try:
            client = docker.from_env(timeout=int(timeout_s))
            client.ping()
        except Exception as err:  # DockerException, requests' ConnectionError, PermissionError ...
            reason = str(err).split("(")[0].strip() or type(err).__name__
            raise EngineUnavailable(
                f"cannot reach the Docker engine at {where} ({reason})", hint=START_HINT
            ) from None
        return cls(client)

    # ---- images ---------------------------------------------------------------------------------
    def image(self, ref: str) -> ImageFacts:
        try:
            img = self.client.images.get(ref)
        except self.errors.ImageNotFound:
            raise InputError(
                f"image {ref!r} is not on this host",
                hint="build it with 'torchrig image build', or 'docker pull' it first",
            ) from None
        except self.errors.APIError as err:
            raise InputError(f"image {ref!r}: {err.explanation or err}") from None
        config = img.attrs.get("Config") or {}
        return ImageFacts(
            ref=ref,
            id=img.id,
            labels=dict(config.get("Labels") or {}),
            user=config.get("User") or None,
            workdir=config.get("WorkingDir") or None,
        )

    def cdi_available(self) -> bool:
        """CDI device names work when the engine has CDI enabled and the host has an nvidia.com/gpu spec."""
        try:
            dirs = self.client.info().get("CDISpecDirs") or []
        except self.errors.APIError:
            return False
        for d in dirs:
            for spec in sorted(Path(d).glob("*")) if Path(d).is_dir() else []:
                try:  # a CDI spec is a few KB; a FIFO or a device there is skipped, not waited on
                    if b"nvidia.com/gpu" in read_bytes(spec, "CDI spec", max_bytes=16 * 2**20):
                        return True
                except InputError:
                    continue
        return False

    # ---- environments ---------------------------------------------------------------------------
    def _record(self, c: Any) -> EnvRecord:
        attrs = c.attrs
        labels = attrs.get("Config", {}).get("Labels") or {}
        ports: dict[str, tuple[str, int]] = {}
        published = (attrs.get("NetworkSettings") or {}).get("Ports") or {}
        wanted = {
            "jupyter": labels.get(f"{ENV_LABEL_PREFIX}jupyter_port"),
            "ssh": labels.get(f"{ENV_LABEL_PREFIX}ssh_port"),
        }
        for service, cport in wanted.items():
            binding = published.get(f"{cport}/tcp") if cport else None
            if binding:
                ports[service] = (binding[0]["HostIp"], int(binding[0]["HostPort"]))
        state = attrs.get("State") or {}
        return EnvRecord(
            name=c.name,
            id=c.id,
            user=labels.get(f"{ENV_LABEL_PREFIX}user", "?"),
            image=labels.get(f"{ENV_LABEL_PREFIX}image", ""),
            state=state.get("Status", c.status),
            status=_human_status(state),
            gpu_uuids=_split(labels.get(f"{ENV_LABEL_PREFIX}gpus")),
            gpu_labels=_split(labels.get(f"{ENV_LABEL_PREFIX}gpu_labels")),
            ports=ports,
            container_user=labels.get(f"{ENV_LABEL_PREFIX}container_user") or None,
            created=attrs.get("Created", ""),
            owner_uid=int(labels[f"{ENV_LABEL_PREFIX}uid"])
            if labels.get(f"{ENV_LABEL_PREFIX}uid", "").isdigit()
            else None,
        )

    def environments(self) -> list[EnvRecord]:
        """Every torchrig-managed container, alive or not, oldest first."""
        try:
            # ignore_removed: a container removed (or still being created) between the engine's list and
            # its inspection is skipped, not an error: other users start and remove theirs at any time
            found = self.client.containers.list(
                all=True, filters={"label": f"{ENV_LABEL_PREFIX}managed=1"}, ignore_removed=True
            )
        except self.errors.APIError as err:
            raise EngineUnavailable(
                f"the Docker engine failed to list containers: {err.explanation or err}", hint=START_HINT
            ) from None
        out = []
        for c in found:
            try:
                c.reload()  # list() omits NetworkSettings.Ports of some states
            except self.errors.NotFound:
                continue
            out.append(self._record(c))
        return sorted(out, key=lambda r: r.created)

    def live_names(self) -> tuple[set[str], float]:
        """Names of alive managed containers and the time just before they were listed (for reconciling)."""
        listed_at = time.time()
        return {r.name for r in self.environments() if r.alive}, listed_at

    def find(self, name: str) -> EnvRecord:
        envs = self.environments()
        for r in envs:
            if r.name == name or (r.id.startswith(name) and len(name) >= 12):
                return r
        from torchrig.fuzzy import did_you_mean

        raise InputError(
            f"no torchrig environment named {name!r}",
            hint=did_you_mean(name, [r.name for r in envs]) or "see 'torchrig ps'",
        )

    def exists(self, name: str) -> bool:
        try:
            self.client.containers.get(name)
        except self.errors.NotFound:
            return False
        return True

    # ---- create / start / remove -----------------------------------------------------------------
    def create_kwargs(self, plan: UpPlan) -> dict[str, Any]:
        """``containers.create`` arguments; :meth:`UpPlan.docker_run` is the same request as a command line.

        No ``init``: the image runs tini as PID 1 (its ENTRYPOINT), and Docker's init on top of it would be
        a second one ("Tini is not running as PID 1")."""
        t = self.types
        kwargs: dict[str, Any] = {
            "image": plan.image_id,
            "name": plan.name,
            "hostname": plan.name,
            "detach": True,
            "labels": dict(plan.labels),
            "environment": plan.env,
            "shm_size": plan.shm_size_bytes,
            "ulimits": [t.Ulimit(name=u.name, soft=u.soft, hard=u.hard) for u in plan.ulimits],
            "ports": {f"{p.container_port}/tcp": (p.host_ip, p.host_port) for p in plan.ports},
            "mounts": [
                t.Mount(target=m.target, source=m.source, type=m.type, read_only=m.read_only)
                for m in plan.mounts
            ],
            "device_requests": [
                t.DeviceRequest(
                    driver=d.driver,
                    device_ids=list(d.device_ids),
                    capabilities=[list(c) for c in d.capabilities],
                )
                for d in plan.device_requests
            ],
            "security_opt": list(plan.security_opt),
            "cap_drop": list(plan.cap_drop),
            "cap_add": list(plan.cap_add),
        }
        if plan.pids_limit:
            kwargs["pids_limit"] = plan.pids_limit
        if plan.command:
            kwargs["command"] = list(plan.command)
        if plan.run_as:
            kwargs["user"] = f"{plan.run_as[0]}:{plan.run_as[1]}"
        if plan.memory_bytes:
            kwargs["mem_limit"] = plan.memory_bytes
        if plan.nano_cpus:
            kwargs["nano_cpus"] = plan.nano_cpus
        return kwargs

    def ulimit_max(
        self, image_id: str, wanted: tuple[Ulimit, ...], labels: dict[str, str]
    ) -> dict[str, int] | None:
        """The most this engine lets a container have of each ``wanted`` ulimit ({} when all of them fit).

        A short-lived probe container of the image (``sh``, no network) first starts with the wanted limits;
        when runc may not set them ("setting rlimit ... operation not permitted": the engine lacks
        CAP_SYS_RESOURCE) a second one reads the hard limits containers get (``ulimit -H``). Both are removed
        whatever happens. None when the image cannot run the probe (no ``sh``)."""
        wanted = tuple(u for u in wanted if u.name in _ULIMIT_FLAGS)
        if not wanted:
            return {}
        names = tuple(u.name for u in wanted)
        try:
            self._probe(image_id, names, wanted, labels)
            return {}
        except _RlimitRefused:
            pass
        except Exception:  # APIError, a timeout: the engine could not tell
            return None
        try:
            out = self._probe(image_id, names, (), labels)
        except Exception:
            return None
        found: dict[str, int] = {}
        for u, line in zip(wanted, out.split(), strict=False):
            if line == "unlimited":
                found[u.name] = -1
            elif line.isdigit():
                found[u.name] = int(line) * 1024 if u.name in _KIB_LIMITS else int(line)
        return found

    def _probe(
        self, image_id: str, names: tuple[str, ...], ulimits: tuple[Ulimit, ...], labels: dict[str, str]
    ) -> str:
        """``ulimit -H`` of each of ``names`` in a throwaway container started with ``ulimits``; its output."""
        script = "; ".join(f"ulimit -H -{_ULIMIT_FLAGS[n]}" for n in names)
        c = self.client.containers.create(
            image_id,
            entrypoint=["sh", "-c", script],
            name=f"torchrig-probe-{secrets.token_hex(4)}",
            labels={**labels, PROBE_LABEL: "1"},
            network_mode="none",
            user="0",
            detach=True,
            ulimits=[self.types.Ulimit(name=u.name, soft=u.soft, hard=u.hard) for u in ulimits],
        )
        try:
            try:
                c.start()
            except self.errors.APIError as err:
                if "rlimit" in str(err.explanation or err):
                    raise _RlimitRefused() from None
                raise
            result = c.wait(timeout=60)
            if result.get("StatusCode") != 0:
                raise self.errors.APIError("probe failed")
            return bytes(c.logs(stdout=True, stderr=False)).decode(errors="replace")
        finally:
            with contextlib.suppress(self.errors.APIError):
                c.remove(force=True)

    def create(self, plan: UpPlan) -> str:
        try:
            c = self.client.containers.create(**self.create_kwargs(plan))
        except self.errors.APIError as err:
            if err.status_code == 409:
                raise InputError(
                    f"a container named {plan.name!r} already exists",
                    hint="pick another --name, or 'torchrig down' it",
                ) from None
            raise InputError(
                f"the engine refused to create {plan.name!r}: {err.explanation or err}"
            ) from None
        return str(c.id)

    def ensure_volume(self, name: str, labels: dict[str, str]) -> bool:
        """Create the named volume when missing (labelled as torchrig's); True when it was created."""
        try:
            self.client.volumes.get(name)
            return False
        except self.errors.NotFound:
            pass
        try:
            self.client.volumes.create(name=name, labels={**labels, f"{ENV_LABEL_PREFIX}volume": "1"})
        except self.errors.APIError as err:
            raise InputError(f"cannot create volume {name!r}: {err.explanation or err}") from None
        return True

    def volume_labels(self, name: str) -> dict[str, str] | None:
        """A named volume's labels; None when there is no such volume."""
        try:
            return dict(self.client.volumes.get(name).attrs.get("Labels") or {})
        except self.errors.NotFound:
            return None

    def workspace_volumes(self, env: str) -> list[tuple[str, dict[str, str]]]:
        """The volumes labelled as the workspace of environment ``env``: (name, labels)."""
        found = self.client.volumes.list(filters={"label": f"{ENV_LABEL_PREFIX}workspace={env}"})
        return [(str(v.name), dict(v.attrs.get("Labels") or {})) for v in found]

    def remove_volume(self, name: str) -> bool:
        """Remove a named volume; False when it was gone already."""
        try:
            self.client.volumes.get(name).remove()
        except self.errors.NotFound:
            return False
        except self.errors.APIError as err:
            raise InputError(
                f"cannot remove volume {name!r}: {err.explanation or err}",
                hint="is another container using it? see 'docker ps -a --filter volume=" + name + "'",
            ) from None
        return True

    def put_files(
        self,
        container_id: str,
        files: dict[str, bytes],
        uid: int,
        mode: int,
        gid: int = 0,
        parents: bool = False,
    ) -> None:
        """Copy files into a created container (before start): secrets never touch the host disk.

        ``parents`` creates their directories (root, 0755), e.g. ``/run/secrets``."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for d in sorted({str(Path(p).parent).lstrip("/") for p in files}) if parents else ():
                info = tarfile.TarInfo(d)
                info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, 0, 0
                tar.addfile(info)
            for path, data in files.items():
                info = tarfile.TarInfo(path.lstrip("/"))
                info.size, info.mode, info.uid, info.gid = len(data), mode, uid, gid
                tar.addfile(info, io.BytesIO(data))
        self.client.api.put_archive(container_id, "/", buf.getvalue())

    def own_dirs(self, container_id: str, dirs: list[str], uid: int, gid: int, mode: int = 0o755) -> None:
        """Hand directories (not their contents) to ``uid:gid`` with ``mode``, made when missing, before start.

        Through a named volume's mount point this sets the volume's root."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for d in dirs:
                info = tarfile.TarInfo(d.strip("/"))
                info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, uid, gid
                tar.addfile(info)
        self.client.api.put_archive(container_id, "/", buf.getvalue())

    def get_file(self, container_id: str, path: str) -> bytes:
        """One file of a (created) container, as ``docker cp`` reads it."""
        stream, _ = self.client.api.get_archive(container_id, path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member else None
            return f.read() if f else b""

    def start(self, container_id: str) -> None:
        try:
            self.client.api.start(container_id)
        except self.errors.APIError as err:
            text = str(err.explanation or err)
            if "could not select device driver" in text or "unresolvable CDI devices" in text:
                raise EngineUnavailable(
                    f"this Docker engine cannot give containers GPUs ({text})", hint=NO_GPU_RUNTIME_HINT
                ) from None
            if "port is already allocated" in text or "address already in use" in text:
                raise InputError(
                    f"a host port of this environment was taken while it started ({text})",
                    hint="run the same 'torchrig up' again: the engine then picks a free port",
                ) from None
            if "setting rlimit" in text and "operation not permitted" in text:
                raise EngineUnavailable(
                    "the Docker engine may not raise the container's ulimits (memlock=-1 needs dockerd to run with "
                    "LimitMEMLOCK=infinity and CAP_SYS_RESOURCE)",
                    hint="set LimitMEMLOCK=infinity in docker.service and restart dockerd, or pass a lower "
                    "--ulimit memlock=BYTES",
                ) from None
            raise InputError(f"the engine could not start the container: {text}") from None

    def inspect(self, container_id: str) -> dict[str, Any]:
        return dict(self.client.api.inspect_container(container_id))

    def remove(self, name_or_id: str, stop_timeout_s: int = 10) -> bool:
        """Stop (SIGTERM, then SIGKILL after the timeout) and remove; False when it was already gone."""
        try:
            c = self.client.containers.get(name_or_id)
        except self.errors.NotFound:
            return False
        try:
            if c.status in ("running", "restarting", "paused"):
                c.stop(timeout=stop_timeout_s)
            c.remove(force=True)
        except self.errors.NotFound:
            return False
        except self.errors.APIError as err:
            if "removal of container" in str(err) and "already in progress" in str(err):
                return True
            raise
        return True

    def remove_own(self, name: str, extra_labels: tuple[tuple[str, str], ...], owner_uid: int | None) -> None:
        """Remove ``name`` if it is a torchrig container of ``owner_uid`` (one this ``up`` was creating)."""
        try:
            labels = self.client.api.inspect_container(name)["Config"]["Labels"] or {}
        except self.errors.APIError:
            return
        mine = labels.get(f"{ENV_LABEL_PREFIX}managed") == "1" and labels.get(
            f"{ENV_LABEL_PREFIX}uid"
        ) == str(owner_uid)
        if mine:
            self.remove(name, stop_timeout_s=2)

    def logs(self, name: str, *, tail: int | None, follow: bool, timestamps: bool) -> Iterator[bytes]:
        c = self.client.containers.get(name)
        return c.logs(
            stream=True, follow=follow, tail=tail if tail is not None else "all", timestamps=timestamps
        )

    def exec(
        self, name: str, argv: list[str], user: str | None, workdir: str | None
    ) -> tuple[int, Iterator[tuple[bytes | None, bytes | None]]]:
        api = self.client.api
        try:
            ex = api.exec_create(name, argv, user=user or "", workdir=workdir, stdout=True, stderr=True)
        except self.errors.APIError as err:
            raise InputError(
                f"cannot run a command in {name!r}: {err.explanation or err}",
                hint="is it running? see 'torchrig ps'",
            ) from None
        stream = api.exec_start(ex["Id"], stream=True, demux=True)
        return ex["Id"], stream

    def exec_exit_code(self, exec_id: Any) -> int:
        return int(self.client.api.exec_inspect(exec_id).get("ExitCode") or 0)


def _human_status(state: dict[str, Any]) -> str:
    status = state.get("Status", "?")
    if status == "exited":
        return f"exited ({state.get('ExitCode')})"
    if state.get("OOMKilled"):
        return f"{status} (OOM-killed)"
    return str(status)
