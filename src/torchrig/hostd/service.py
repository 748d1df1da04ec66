"""The host daemon's verbs: each checks the caller against the owner, acts through the engine, and logs.

One :class:`HostService` per daemon. Every verb gets the kernel-given :class:`Caller` and the request's
checked arguments, and returns plain data (the same records the single-user commands print). The
ownership rules, in one place:

* ``up``: for yourself; ``--user OTHER`` is an admin's. Named volumes are yours (label ``torchrig.uid``)
  or new; host paths only if you can read them (and write them, for a writable mount), checked as you.
* ``ps``, ``volumes``: yours (an admin sees everyone's). ``gpus``: every GPU and who holds it.
* ``exec``, ``logs``: your own environments only; ``exec --root`` is an admin's (root in a container with
  a host folder mounted could read what its owner cannot).
* ``down``: yours; an admin's with ``--force``, and the audit log says whose it was.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchrig.accounts import account_name
from torchrig.contract import ENV_LABEL_PREFIX
from torchrig.errors import InputError, UsageError
from torchrig.hostd import reality
from torchrig.hostd.access import resolve_as
from torchrig.hostd.policy import Caller, Refused, audit_line, caller_of, may_act_on, refusal
from torchrig.report import jsonable
from torchrig.safefs import append_line, ensure_private_dir

Send = Callable[[str, bytes], None]  # (stream "out" | "err", bytes)
OWNER_LABEL = f"{ENV_LABEL_PREFIX}uid"
VOLUME_LABEL = f"{ENV_LABEL_PREFIX}volume"
MAX_SSH_KEY_BYTES = 16 * 1024
# the labels the daemon reads back as facts (owner, GPUs held): never from a request, whatever their order
DAEMON_KEYS = frozenset(
    f"{ENV_LABEL_PREFIX}{k}"
    for k in ("managed", "user", "uid", "volume", "image", "gpus", "gpu_labels", "container_user", "share",
              "jupyter", "ssh", "public")
)  # fmt: skip


class HostService:
    def __init__(self, state_dir: Path, admin_gid: int | None, inventory_path: str | None) -> None:
        self.state_dir = ensure_private_dir(state_dir)
        self.admin_gid = admin_gid
        self.inventory_path = inventory_path
        self.audit_path = self.state_dir / "audit.log"
        self.ledger_path = self.state_dir / "leases.sqlite3"
        self.ledger_for(None).close()  # created (and checked for links) at start, not at the first up

    # ---- plumbing --------------------------------------------------------------------------------------
    def audit(self, caller: Caller, verb: str, target: str, outcome: str, reason: str = "") -> None:
        append_line(self.audit_path, audit_line(caller, verb, target, outcome, reason))

    def engine(self) -> Any:
        from torchrig.runtime.engine import Engine

        return Engine.connect(timeout_s=60)

    def ledger_for(self, engine: Any, caller: Caller | None = None, notes: list[str] | None = None) -> Any:
        def report(d: reality.Discrepancy) -> None:
            if notes is not None and d.summary not in notes:
                notes.append(d.summary)
            if caller is not None:
                self.audit(caller, "reality", d.holder, "report", d.summary)

        return reality.CheckedLedger(
            self.ledger_path,
            envs=(lambda: engine.environments()) if engine is not None else list,
            processes=reality.gpu_processes,
            report=report,
        )

    # ---- verbs -----------------------------------------------------------------------------------------
    def whoami(self, caller: Caller, args: dict[str, Any], send: Send) -> dict[str, Any]:
        return {"uid": caller.uid, "gid": caller.gid, "user": caller.name, "admin": caller.admin}

    def ps(self, caller: Caller, args: dict[str, Any], send: Send) -> dict[str, Any]:
        from torchrig.runtime.lease import reconcile

        engine, notes = self.engine(), list[str]()
        ledger = self.ledger_for(engine, caller, notes)
        try:
            freed = reconcile(ledger, engine)
            ledger.check()
        finally:
            ledger.close()
        see_all = caller.admin and not args["mine"]
        envs = [e for e in engine.environments() if see_all or e.owned_by(caller.uid)]
        mine = {e.name for e in envs}
        return {
            "environments": [dict(jsonable(e), alive=e.alive) for e in envs],
            "freed_leases": jsonable([f for f in freed if see_all or f.container in mine]),
            "notes": notes,
        }

    def gpus(self, caller: Caller, args: dict[str, Any], send: Send) -> dict[str, Any]:
        from torchrig.errors import EngineUnavailable
        from torchrig.runtime.inventory import to_dict
        from torchrig.runtime.lease import reconcile
        from torchrig.runtime.nvml import current

        inv = current(self.inventory_path)
        notes: list[str] = []
        try:
            engine = self.engine()
        except EngineUnavailable as err:
            engine = None
            notes.append(f"holders not reconciled with the engine: {err.one_line()}")
        ledger = self.ledger_for(engine, caller, notes)
        try:
            if engine is not None:
                reconcile(ledger, engine)
            leases = ledger.leases()
        finally:
            ledger.close()
        return {"source": inv.source, "inventory": to_dict(inv), "leases": jsonable(leases), "notes": notes}

    def volumes(self, caller: Caller, args: dict[str, Any], send: Send) -> dict[str, Any]:
        engine = self.engine()
        out = []
        for v in engine.client.volumes.list(filters={"label": f"{VOLUME_LABEL}=1"}):
            labels = v.attrs.get("Labels") or {}
            uid = labels.get(OWNER_LABEL, "")
            owner = int(uid) if uid.isdigit() else None
            if caller.admin or owner == caller.uid:
                out.append(
                    {
                        "name": v.name,
                        "owner_uid": owner,
                        "user": _name(owner),
                        "created": v.attrs.get("CreatedAt"),
                    }
                )
        return {"volumes": sorted(out, key=lambda x: str(x["name"]))}

    def down(self, caller: Caller, args: dict[str, Any], send: Send) -> dict[str, Any]:
        from torchrig.runtime.lease import reconcile
        from torchrig.runtime.workspace import take_down

        if not args["names"]:
            raise UsageError("down: no environment named")
        if not 0 <= args["timeout_s"] <= 86400:
            raise UsageError("down: timeout_s must be within 0..86400")
        engine = self.engine()
        envs = [engine.find(n) for n in args["names"]]  # every name checked before anything is removed
        why = {}
        for env in envs:
            reason = may_act_on(caller, env.owner_uid, force=args["force"])
            if reason is None:
                self.audit(caller, "down", env.name, "refused", f"owner UID {env.owner_uid}")
                raise refusal(caller, repr(env.name), _owner(env.owner_uid), admin_hint=not caller.admin)
            why[env.name] = reason
        ledger = self.ledger_for(engine, caller)
        done = []
        try:
            for env in envs:
                record = take_down(
                    engine, ledger, env, timeout_s=args["timeout_s"], delete_volumes=bool(args.get("volumes"))
                )
                reason = (
                    "owner" if why[env.name] == "owner" else f"admin, environment of {_owner(env.owner_uid)}"
                )
                self.audit(caller, "down", env.name, "allowed", reason)
                for v in record["volumes_deleted"]:
                    self.audit(caller, "down", env.name, "allowed", f"deleted volume {v}")
                done.append(record)
            reconcile(ledger, engine)
        finally:
            ledger.close()
        return {"removed": done}

    def _own_env(self, caller: Caller, verb: str, name: str) -> Any:
        engine = self.engine()
        env = engine.find(name)
        if not (env.owned_by(caller.uid) or caller.uid == 0):
            self.audit(caller, verb, env.name, "refused", f"owner UID {env.owner_uid}")
            raise refusal(caller, f"environment {env.name!r}", _owner(env.owner_uid), admin_hint=False)
        return engine, env

    def logs(self, caller: Caller, args: dict[str, Any], send: Send) -> dict[str, Any]:
        if args["tail"] is not None and not 0 <= args["tail"] < 2**31:
            raise UsageError("logs: tail must be within 0..2147483647")
        engine, env = self._own_env(caller, "logs", args["name"])
        self.audit(caller, "logs", env.name, "allowed", "owner")
        for chunk in engine.logs(
            env.id, tail=args["tail"], follow=args["follow"], timestamps=args["timestamps"]
        ):
            send("out", chunk)
        return {"name": env.name, "state": env.state}

    def exec(self, caller: Caller, args: dict[str, Any], send: Send) -> dict[str, Any]:
        argv = args["argv"]
        if not argv:
            raise UsageError("no command given", hint=f"e.g. torchrig exec {args['name']} -- nvidia-smi")
        engine, env = self._own_env(caller, "exec", args["name"])
        if args["root"] and not caller.admin:
            self.audit(caller, "exec", env.name, "refused", "--root")
            raise Refused(
                "exec --root through the host daemon is an admin's",
                hint="run as the environment's user (leave --root out)",
            )
        if env.state != "running":
            raise InputError(
                f"environment {env.name!r} is {env.state}, not running",
                hint=f"see 'torchrig logs {env.name}'",
            )
        self.audit(caller, "exec", env.name, "allowed", " ".join(argv)[:200])
        user = "root" if args["root"] else (env.container_user or "")
        exec_id, stream = engine.exec(env.id, argv, user, args["workdir"])
        for o, e in stream:
            if o:
                send("out", o)
            if e:
                send("err", e)
        return {"name": env.name, "argv": argv, "exit_code": engine.exec_exit_code(exec_id)}

    def up(self, caller: Caller, args: dict[str, Any], send: Send) -> dict[str, Any]:
        from torchrig.runtime.up import DaemonContext, run_up

        owner = self._owner_of_up(caller, args["user"])
        engine = self.engine()
        req = self._request(caller, owner, args, engine)
        self._runs_as_owner(caller, owner, engine, req.image)
        key = _ssh_key(args["ssh_key"]) if args["ssh"] else None
        ledger = self.ledger_for(engine, caller)
        try:
            # the owner's environments keep their SSH host keys (private keys) and host ports across down/up,
            # in root's state
            owner_state = ensure_private_dir(self.state_dir / "users") / str(owner.uid)
            ctx = DaemonContext(ledger, owner.uid, owner.gid, key, owner_state)
            result = run_up(
                req,
                inventory_path=self.inventory_path,
                ssh_key_path=None,
                dry_run=args["dry_run"],
                create_only=args["create_only"],
                wait_s=float(args["wait_s"]) or None,
                daemon=ctx,
            )
        finally:
            ledger.close()
        gpus = ",".join(u.label for u in result.plan.gpus) or "none"
        who = "" if owner.uid == caller.uid else f" for {owner.describe()}"
        self.audit(caller, "up", req.name, "allowed", f"{result.state}{who}; GPUs {gpus}")
        return {"result": jsonable(result)}

    def _runs_as_owner(self, caller: Caller, owner: Caller, engine: Any, ref: str) -> None:
        """The environment's processes run as its owner: the image's user (remapped to the owner's UID by
        ``up``) must be known. An image with no user would run as root, and root in a container can read
        what its owner cannot in a mounted folder."""
        from torchrig.contract import image_user

        image = engine.image(ref)
        who = image_user(image.labels, image.user)
        if owner.uid == 0 or (who.name is not None and who.uid is not None) or who.uid == owner.uid:
            return
        self.audit(caller, "up", ref, "refused", "the image has no non-root user")
        raise Refused(
            f"image {ref!r} names no user of its own (label org.torchrig.user or USER NAME): through the host "
            "daemon an environment runs as you, never as root",
            hint="build it with 'torchrig image build' (it adds the user), or ask an admin",
        )

    def _owner_of_up(self, caller: Caller, user: str | None) -> Caller:
        if user is None:
            return caller
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise UsageError(
                f"--user {user}: no such account on this host", hint="see 'getent passwd'"
            ) from None
        if pw.pw_uid == caller.uid:
            return caller
        if not caller.admin:
            self.audit(caller, "up", f"--user {user}", "refused", "not an admin")
            raise Refused(
                f"--user {user}: only an admin may start an environment for another user",
                hint="leave --user out",
            )
        return caller_of(0, pw.pw_uid, pw.pw_gid, self.admin_gid)

    def _request(self, caller: Caller, owner: Caller, args: dict[str, Any], engine: Any) -> Any:
        from torchrig.labels import parse_labels
        from torchrig.runtime.options import check_name, parse_cpus, parse_ulimit
        from torchrig.runtime.placement import parse_gpus
        from torchrig.runtime.plan import UpRequest
        from torchrig.runtime.up import default_name
        from torchrig.sizes import parse_size

        labels: list[tuple[str, str]] = []
        for k, v in args["labels"]:
            if (
                k in DAEMON_KEYS
                or (k.endswith("_port") and k.startswith(ENV_LABEL_PREFIX))
                or "," in k
                or "," in v
            ):
                raise UsageError(
                    f"label {k[:60]!r}: not allowed through the host daemon",
                    hint="use your own keys, e.g. team=vision",
                )
            labels.extend(parse_labels(f"{k}={v}"))
        volumes = tuple(self._volume(caller, owner, text, engine, tuple(labels)) for text in args["volumes"])
        return UpRequest(
            image=args["image"],
            name=check_name(args["name"]) if args["name"] else default_name(owner.name),
            user=owner.name,
            gpus=parse_gpus(args["gpus"]),
            volumes=volumes,
            memory_bytes=parse_size(args["memory"], "--memory") if args["memory"] else None,
            nano_cpus=parse_cpus(args["cpus"], os.cpu_count() or 1) if args["cpus"] else None,
            shm_size_bytes=parse_size(args["shm_size"], "--shm-size") if args["shm_size"] else None,
            jupyter=args["jupyter"],
            ssh=args["ssh"],
            public=args["public"],
            share=args["share"],
            ulimits=tuple(parse_ulimit(u) for u in args["ulimits"]),
            pids_limit=_pids(args["pids_limit"]),
            owner_uid=owner.uid,
            extra_labels=tuple(labels),
        )

    def _volume(
        self, caller: Caller, owner: Caller, text: str, engine: Any, labels: tuple[tuple[str, str], ...]
    ) -> Any:
        """One ``--volume``: a host path resolved and checked as its owner, or a named volume that is theirs
        (made, labelled with their UID, when missing)."""
        from torchrig.runtime.options import parse_volume

        source, sep, rest = text.partition(":")
        if not sep:
            raise UsageError(
                f"malformed --volume {text!r}", hint="expected HOST:CONTAINER or HOST:CONTAINER:ro"
            )
        if "/" in source or source.startswith((".", "~")):
            if not source.startswith("/"):
                raise UsageError(f"--volume {text!r}: the host path must be absolute through the host daemon")
            read_only = rest.endswith(":ro")
            try:
                real = resolve_as(owner, source, write=not read_only)
            except Refused as err:
                self.audit(caller, "up", f"--volume {source}", "refused", err.message)
                raise
            return parse_volume(f"{real}:{rest}", Path("/"))
        vol = parse_volume(text, Path("/"))
        try:
            existing = engine.client.volumes.get(vol.host_path)
        except engine.errors.NotFound:
            engine.client.volumes.create(
                name=vol.host_path, labels={**dict(labels), VOLUME_LABEL: "1", OWNER_LABEL: str(owner.uid)}
            )
            return vol
        found = (existing.attrs.get("Labels") or {}).get(OWNER_LABEL, "")
        if found != str(owner.uid):
            self.audit(caller, "up", f"volume {vol.host_path}", "refused", f"owner UID {found or 'none'}")
            raise refusal(
                caller,
                f"volume {vol.host_path!r}",
                _owner(int(found)) if found.isdigit() else "nobody known (not made through torchrig)",
                admin_hint=False,
            )
        return vol


def _name(uid: int | None) -> str:
    return "?" if uid is None else account_name(uid) or str(uid)


def _owner(uid: int | None) -> str:
    return "no known owner" if uid is None else f"{_name(uid)} (UID {uid})"


def _pids(n: int | None) -> int | None:
    if n is not None and not 64 <= n <= 2**22:
        raise UsageError(f"--pids-limit {n} is out of range", hint="give 64..4194304 (default 16384)")
    return n


def _ssh_key(text: str | None) -> str:
    if not text:
        raise UsageError("no SSH public key sent", hint="pass --ssh-key FILE, or use --no-ssh")
    line = text.strip()
    if len(line) > MAX_SSH_KEY_BYTES or "\n" in line or not line.startswith(("ssh-", "ecdsa-", "sk-")):
        raise UsageError(
            "the SSH public key is not one key line",
            hint="pass the .pub file, e.g. --ssh-key ~/.ssh/id_ed25519.pub",
        )
    return line + "\n"
