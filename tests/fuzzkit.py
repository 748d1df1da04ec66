"""The fuzz harness: run ``torchrig.cli.main(argv)`` in a forked child with a time and memory bound.

Each call forks this (already warm) test process, so a call costs milliseconds, yet a hang or a runaway
allocation only kills the child: the child gets an address-space limit (RLIMIT_AS) and an alarm. The child
works in a scratch folder, with the Docker engine, the GPU ledger and the knowledge-base cache pointed at
places that cannot harm this host, and the few steps that would start something for real (a training, a
torchrun job, an image build, a service, an sbatch) replaced by a marker that ends the call: the fuzzer
checks what a command does with its input up to the point where it would act.

The hardware boundary is faked from recorded output: the launcher's GPU probe answers two H200s (as
tests/fixtures/doctor/h200x2-*.json recorded), doctor's probes replay a recorded snapshot.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import re
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
DOCTOR_SNAPSHOT = FIXTURES / "doctor" / "h200x1-driver580-cu130.json"

# Bounds of one call. Memory: above what the warm parent already maps (torch included).
TIME_LIMIT_S = int(os.environ.get("TORCHRIG_FUZZ_TIME_S", "30"))
MEMORY_LIMIT_MIB = int(os.environ.get("TORCHRIG_FUZZ_MEMORY_MIB", "1536"))

REACHED_EXIT = 70  # the child got as far as a step that would start something: its input was accepted


class Reached(BaseException):
    """Raised where a command would start a training, a job, a build or a service."""


@dataclass
class Outcome:
    argv: list[str]
    code: int | None  # None: killed by a signal
    signal: int | None
    out: str
    err: str
    elapsed_s: float
    # what the child cost beyond the parent it was forked from: resident memory at its peak (ru_maxrss of
    # the child less the parent's resident size at the fork: the pages it inherited count in both) and the
    # bytes it read (/proc/self/io rchar at its exit less at its start); None where not measured
    grew_kib: int | None = None
    read_bytes: int | None = None

    @property
    def reached(self) -> bool:
        return self.code == REACHED_EXIT

    def problems(self) -> list[str]:
        """What the fuzz contract forbids in this outcome (an empty list: fine)."""
        found = []
        if self.signal is not None:
            why = "time limit" if self.signal in (signal.SIGALRM, signal.SIGKILL) else "a signal"
            found.append(f"killed by signal {self.signal} ({why})")
        elif self.code not in (0, 1, 2, REACHED_EXIT):
            found.append(f"exit status {self.code}")
        text = self.out + self.err
        if "internal error" in text:
            found.append("'internal error' in the output")
        if "Traceback (most recent call last)" in text:
            found.append("a traceback in the output")
        if self.code == 2 and self.err.strip().count("\n") > 0 and "--json" not in self.argv:
            found.append("a usage error longer than one line")
        return found

    def describe(self) -> str:
        return (
            f"argv={self.argv!r}\ncode={self.code} signal={self.signal} elapsed={self.elapsed_s:.1f}s\n"
            f"--- stdout (tail)\n{self.out[-2000:]}\n--- stderr (tail)\n{self.err[-3000:]}"
        )


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _rchar() -> int:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def _vm_size_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _reach(what: str):
    def stop(*_a, **_k):
        raise Reached(what)

    return stop


def _fake_gpu_probe(*_a, **_k):
    from torchrig.launch.probe import GpuProbe

    # two H200s, every pair peer-capable: what the probe answered on the 2x H200 machine
    return GpuProbe(2, ("NVIDIA H200", "NVIDIA H200"), (), torch_version="2.13.0")


def _recorded_doctor_facts(*_a, **_k):
    from torchrig.doctor.facts import load_facts

    return load_facts(str(DOCTOR_SNAPSHOT))


def install_boundaries(real: tuple[str, ...] = ()) -> None:
    """In the child: stop at every step that would start something, fake the hardware from recordings.
    ``real``: steps (``module.name``) left to run for real, e.g. ``torchrig.train.loop.train`` to fuzz
    what a resumed training reads."""
    import importlib

    stops = {
        "torchrig.train.loop": ["train"],
        "torchrig.launch.supervise": ["execute"],
        "torchrig.launch.preflight": ["check_process_group"],
        "torchrig.bench.launch": ["run_workers"],
        "torchrig.image.pipeline": ["build"],
        "torchrig.serve.supervisor": ["Supervisor"],
        "torchrig.cluster.slurm": ["submit"],
        "torchrig.cluster.k8s": ["apply"],
        "torchrig.cli.cmd_dashboard": ["_serve"],  # serves until stopped
        "torchrig.hostd.server": ["serve"],  # the host daemon serves until stopped
        "torchrig.hostd.unit": ["install"],  # writes /etc/systemd/system and runs systemctl
        # export: the checkpoint is read, checked, loaded and run eagerly; writing .pt2/.onnx is the act
        "torchrig.export.core": ["_pt2", "_onnx"],
        "torchrig.install.host": ["run_installer"],  # pip install into this interpreter
    }
    for mod_name, names in stops.items():
        try:
            mod = importlib.import_module(mod_name)
        except Exception:  # an optional extra missing: the command says so itself
            continue
        for name in names:
            if f"{mod_name}.{name}" not in real:
                setattr(mod, name, _reach(f"{mod_name}.{name}"))
    import torchrig.launch.probe as probe

    probe.probe_gpus = _fake_gpu_probe
    import torchrig.doctor.probes as probes

    probes.collect = _recorded_doctor_facts
    import torchrig.install.host as install_host

    # The package index is the network: the fuzzed install plans as with an installer that cannot list what
    # an index serves (uv), trusting resolve's pick. The query itself is proven against a real index on
    # loopback (test_install.py::test_the_versions_a_real_index_serves_come_from_pips_own_query).
    install_host.served_versions = lambda *_a, **_k: None
    install_host.index_unreachable = lambda *_a, **_k: None
    import torchrig.cli.cmd_bench as cmd_bench

    cmd_bench._device = lambda args: ("cpu", 0)  # torch.cuda.device_count() on this CPU-only host


_PRELOADED = False


def preload() -> None:
    """Import what the commands import, once, in the parent: every forked call starts warm."""
    global _PRELOADED
    if _PRELOADED:
        return
    _PRELOADED = True
    import torchrig.cli as cli

    for name in cli.COMMANDS:
        cli.build_parser(name)
    from torchrig.compat import load_kb

    load_kb()
    for mod in (
        "torchrig.train.loop",
        "torchrig.launch.supervise",
        "torchrig.launch.preflight",
        "torchrig.bench.launch",
        "torchrig.bench.run",
        "torchrig.image.pipeline",
        "torchrig.serve.supervisor",
        "torchrig.cluster.slurm",
        "torchrig.cluster.k8s",
        "torchrig.cluster.validate",
        "torchrig.doctor",
        "torchrig.doctor.probes",
        "torchrig.export",
        "torchrig.runtime.up",
        "torchrig.hostd.server",
        "torchrig.hostd.unit",
        "docker",
        "numpy",
        "torch",  # imported for the first time under the child's address-space limit, it stalls
    ):
        with contextlib.suppress(Exception):  # an optional extra missing: its command says so itself
            __import__(mod)


def scratch_env(work: Path) -> dict[str, str]:
    """Environment of every fuzzed call: nothing reaches this host's engine, ledger or caches."""
    return {
        "DOCKER_HOST": f"unix://{work}/no-docker.sock",
        "TORCHRIG_STATE_DIR": str(work / "state"),
        "TORCHRIG_HOST_SOCKET": "",  # no host daemon: the commands talk to the (absent) engine themselves
        "TORCHRIG_CACHE_DIR": str(work / "cache"),
        "HOME": str(work / "home"),
        "XDG_STATE_HOME": str(work / "home" / ".local" / "state"),
        "TORCHRIG_IMAGE_CONFIG": str(work / "no-image-config.json"),
        "JUPYTER_TOKEN_FILE": str(work / "no-token"),
        "SSH_AUTHORIZED_KEYS_FILE": str(work / "no-keys"),
        "PATH": "/usr/bin:/bin",  # no sbatch or kubectl: --submit/--apply fail early
        "NO_COLOR": "1",
        "MPLCONFIGDIR": str(Path(tempfile.gettempdir()) / "torchrig-fuzz-matplotlib"),  # its font cache, once
    }


def run_main(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    time_limit_s: int = TIME_LIMIT_S,
    memory_limit_mib: int = MEMORY_LIMIT_MIB,
    real: tuple[str, ...] = (),
) -> Outcome:
    """``torchrig.cli.main(argv)`` in a forked child bounded in time and memory; its exit, stdout, stderr."""

    def command() -> int:
        install_boundaries(real)
        from torchrig.cli import main

        try:
            return main(list(argv))
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 2
        except Reached as exc:
            print(f"[fuzz] reached {exc}", file=sys.stderr)
            return REACHED_EXIT

    return run_bounded(
        command, argv, cwd=cwd, env=env, time_limit_s=time_limit_s, memory_limit_mib=memory_limit_mib
    )


def run_bounded(
    fn: Callable[[], int],
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    time_limit_s: int = TIME_LIMIT_S,
    memory_limit_mib: int = MEMORY_LIMIT_MIB,
) -> Outcome:
    """``fn()`` (returning an exit status) in a forked child bounded in time and memory, in the scratch
    environment of ``cwd``; its exit, stdout and stderr. ``argv`` only labels the outcome."""
    with (
        tempfile.TemporaryFile() as out_f,
        tempfile.TemporaryFile() as err_f,
        tempfile.TemporaryFile() as io_f,
    ):
        sys.stdout.flush()
        sys.stderr.flush()
        t0 = time.monotonic()
        rss_at_fork_kib = _status_kib("VmRSS")
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 99
            rchar0 = _rchar()
            try:
                os.dup2(out_f.fileno(), 1)
                os.dup2(err_f.fileno(), 2)
                sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
                sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
                os.chdir(cwd)
                os.environ.update(scratch_env(cwd))
                os.environ.pop("TORCHRIG_DEBUG", None)
                os.environ.update(env or {})
                limit = _vm_size_bytes() + memory_limit_mib * 2**20
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                signal.alarm(time_limit_s)
                if "torch" in sys.modules:
                    # GNU OpenMP is not fork-safe: once the parent has run a parallel region (any earlier test
                    # that used torch), the child's first one waits forever for pool threads it does not have.
                    # One thread runs ATen's parallel_for inline, with no OpenMP at all.
                    sys.modules["torch"].set_num_threads(1)
                os.environ["OMP_NUM_THREADS"] = "1"
                code = fn()
            except BaseException:
                with contextlib.suppress(BaseException):
                    print("[fuzz] escaped main():\n" + traceback.format_exc(), file=sys.stderr)
                code = 98
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os.write(io_f.fileno(), str(_rchar() - rchar0 if rchar0 >= 0 else -1).encode())
                except BaseException:
                    pass
                os._exit(code)
        deadline = t0 + time_limit_s + 10
        status, usage = None, None
        while status is None:
            done, st, ru = os.wait4(pid, os.WNOHANG)
            if done:
                status, usage = st, ru
            elif time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                _, status, usage = os.wait4(pid, 0)
            else:
                time.sleep(0.005)
        elapsed = time.monotonic() - t0
        out_f.seek(0)
        err_f.seek(0)
        out = out_f.read().decode("utf-8", "replace")
        err = err_f.read().decode("utf-8", "replace")
        io_f.seek(0)
        read_text = io_f.read().decode() or "-1"
    grew = max(0, usage.ru_maxrss - rss_at_fork_kib) if usage is not None else None
    read = int(read_text) if read_text.lstrip("-").isdigit() and int(read_text) >= 0 else None
    if os.WIFSIGNALED(status):
        return Outcome(list(argv), None, os.WTERMSIG(status), out, err, elapsed, grew, read)
    return Outcome(list(argv), os.WEXITSTATUS(status), None, out, err, elapsed, grew, read)


# ---- the corpus: files every fuzzed call finds in its scratch folder under c/ ------------------------------


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _npy(descr: str, count: int, itemsize: int) -> bytes:
    """A .npy file (format 1.0) of ``count`` zeros of ``descr``, written by hand: no numpy needed."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({count},), }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return (
        b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(count * itemsize)
    )


CORPUS_TEXT: dict[str, bytes] = {
    "empty": b"",
    "binary.bin": bytes(range(256)) * 8,
    "nul.json": b'{"a": "\x00"}\x00\x00',
    "latin1.txt": "caf\xe9 na\xefve\n".encode("latin-1"),
    "utf16.json": '{"schema_version": 1}'.encode("utf-16"),
    "bom.json": b'\xef\xbb\xbf{"schema_version": 1}',
    "deep.json": _deep(200_000).encode(),
    "deepobj.json": ('{"a":' * 100_000 + "1" + "}" * 100_000).encode(),
    "null.json": b"null",
    "list.json": b"[1, 2, 3]",
    "string.json": b'"text"',
    "number.json": b"1e999999",
    "bignum.json": b'{"schema_version": 100000000000000000000000000000000000000000000}',
    "nan.json": b'{"schema_version": NaN}',
    "truncated.json": b'{"schema_version": 1, "gpus": [',
    "deep.toml": ("a = " + "[" * 50_000 + "]" * 50_000 + "\n").encode(),
    "bad.toml": b"[torch\nversion = = 1\n",
    "null-sections.toml": b"schema_version = 1\n[torch]\n[python]\n[image]\n",
    "odd.bin": b"\x01\x02\x03",
    "floats.npy": _npy("<f8", 8, 8),
    "badhdr.npy": b"\x93NUMPY\x01\x00\x10\x00{'descr': 'zz'}\n",
    # a well-formed OpenSSH ed25519 public key (key bytes 0..31: nobody's key)
    "authorized_keys": b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f fuzz@host\n",
    "token": b"\xff\xfe\x00\x01",
}
# recorded fixtures, whole, as seeds for the mutations and as valid inputs
CORPUS_FIXTURES: dict[str, Path] = {
    "facts.json": FIXTURES / "doctor" / "h200x1-driver580-cu130.json",
    "inventory.json": FIXTURES / "runtime" / "inventory-8xh200.json",
    "mig.json": FIXTURES / "runtime" / "mig-1xh100-3-instances.json",
    "bench.json": FIXTURES / "bench" / "cpu-gloo-2proc-torch2.13.json",
    "spec.toml": FIXTURES / "image" / "cpu-only.toml",
    "spec-cu128.toml": FIXTURES / "image" / "runtime-jupyter-ssh-cu128.toml",
    "torchrig.lock.json": FIXTURES / "image" / "lock-2.13.0-cpu-jupyter-ssh.json",
}
SPECIAL_PATHS = ["/dev/null", "/dev/full", "/dev/zero", "/proc/self/status", "/proc/1", ".", "c", "c/dir", ""]


def make_corpus(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in CORPUS_TEXT.items():
        (root / name).write_bytes(data)
    for name, src in CORPUS_FIXTURES.items():
        (root / name).write_bytes(src.read_bytes())
    (root / "dir").mkdir(exist_ok=True)
    (root / "dir" / "x.bin").write_bytes(b"\x00\x01")
    return root


def corpus_paths() -> list[str]:
    names = [*CORPUS_TEXT, *CORPUS_FIXTURES]
    return [f"c/{n}" for n in names] + SPECIAL_PATHS + ["missing", "missing/deeper/file.json", "c/empty/x"]


# ---- argv, from the commands' own parsers and the examples in their --help -------------------------------

NUMBERS = [
    "-1",
    "0",
    "1",
    "2",
    "3",
    "8",
    "-0",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e309",
    "1e-320",
    "1.5",
    "0x10",
    "99999999999999999999999",
    "-99999999999999999999999",
    "9" * 400,  # float() of it overflows: a message that formats it as a float crashes
    str(2**63),
    str(2**31),
    "65536",
    "1_000",
    " 3",
]
WORDS = [
    "all",
    "0,1",
    "-1,0",
    "0,0",
    "1,,2",
    "device=1",
    "auto",
    "cpu",
    "cuda",
    "gpt",
    "resnet",
    "tiny",
    "none",
    "bf16",
    "fp16",
    "2.8.0",
    "2.8.0+cu126",
    "2.13.0+cpu",
    ">=2.6",
    "==2.7.*",
    "535.104.05",
    "570.86",
    "3.11",
    "A100",
    "H200",
    "RTX 5090",
    "localhost:29500",
    "host:99999",
    "host:-1",
    "[::1]:29500",
    "a:b",
    ":",
    "64g",
    "1KiB",
    "4GiB",
    "-5g",
    "0b",
    "1e400g",
    "16Gi",
    "memlock=-1",
    "nofile=1:2",
    "x=y=z",
    "K=V",
    "=v",
    "KEY",
    "src:dst",
    "claim:/data",
    "/abs:rel",
    "UPPER_case",
    "a" * 300,
    "\udcff\udcfe",
    "é🙂",
    "-",
    "--",
    "-m",
    "torchrig.train",
    "train.py",
    "MIG-4f5c1d2e",
    "GPU-00000000-0000-0000-0000-000000000000",
    "01:00:00",
    "1-00:00:00",
    "99:99:99",
    "pytorchjob",
    "jobset",
    "job",
    "k8s",
    "slurm",
    "docker.io/x:y",
    "torchrig/pytorch:2.8.0-cu128-py3.11-runtime",
    "$(reboot)",
    "a b",
    "a\nb",
    "'",
    '"',
]


def _example_lines(doc: str, name: str) -> list[list[str]]:
    import shlex

    out = []
    for line in doc.splitlines():
        line = line.strip()
        m = re.match(rf"(?:[A-Z_]+=\S+\s+)*torchrig {re.escape(name)}\b(.*)", line)
        if not m:
            continue
        rest = re.split(r"\s(?:\||&&|>|;)\s", m.group(1))[0].rstrip("\\").strip()
        try:
            words = shlex.split(rest, comments=True)
        except ValueError:
            continue
        out.append([w.replace("~", "c") for w in words])
    return out


@dataclass(frozen=True)
class Shape:
    """A parser's options and positionals, as the fuzzer draws them."""

    options: tuple  # argparse actions with option strings (help excluded)
    positionals: tuple
    subparsers: dict  # name -> Shape
    examples: tuple  # argv lists (after the command and sub-command)
    by_flag: dict  # option string -> action
    values: dict  # option string -> values seen in the examples


def shape_of(parser, examples: list[list[str]]) -> Shape:
    import argparse

    options, positionals, subs = [], [], {}
    for act in parser._actions:
        if isinstance(act, argparse._HelpAction) or "--debug" in act.option_strings:
            continue  # --debug shows tracebacks on purpose
        if isinstance(act, argparse._SubParsersAction):
            for sub_name, sub in act.choices.items():
                sub_examples = [e[1:] for e in examples if e and e[0] == sub_name]
                subs[sub_name] = shape_of(sub, sub_examples)
            continue
        (options if act.option_strings else positionals).append(act)
    by_flag = {s: a for a in options for s in a.option_strings}
    values: dict[str, set] = {}
    for ex in examples:
        for i, tok in enumerate(ex[:-1]):
            act = by_flag.get(tok)
            if act is not None and act.nargs != 0:
                values.setdefault(tok, set()).add(ex[i + 1])
    return Shape(
        tuple(options),
        tuple(positionals),
        subs,
        tuple(tuple(e) for e in examples),
        by_flag,
        {k: sorted(v) for k, v in values.items()},
    )


def command_shapes() -> dict[str, Shape]:
    import importlib

    import torchrig.cli as cli

    shapes = {}
    for name in cli.COMMANDS:
        parser, _module = cli.build_parser(name)
        doc = importlib.import_module(f"torchrig.cli.{cli.COMMANDS[name][0]}").__doc__ or ""
        shapes[name] = shape_of(parser, _example_lines(doc, name))
    return shapes


def value_strategy(act, seen: list[str], paths: list[str]):
    from hypothesis import strategies as st

    pools = [st.sampled_from(NUMBERS), st.sampled_from(WORDS), st.sampled_from(paths)]
    if act is not None and act.choices:
        pools.insert(0, st.sampled_from(sorted(map(str, act.choices))))
    if seen:
        pools.insert(0, st.sampled_from(seen))
    typ = getattr(act, "type", None)
    if typ is int:
        pools.insert(0, st.integers(-(2**70), 2**70).map(str))
    elif typ is float:
        pools.insert(0, st.floats(allow_nan=True, allow_infinity=True).map(repr))
    # argv comes from a shell: no NUL byte can be in it
    pools.append(st.text(st.characters(blacklist_characters="\x00"), max_size=12))
    return st.one_of(*pools)


def argv_strategy(name: str, shape: Shape, paths: list[str]):
    from hypothesis import strategies as st

    @st.composite
    def build(draw):
        argv = [name]
        sh = shape
        examples = list(shape.examples)
        if shape.subparsers:
            sub = draw(st.sampled_from(sorted(shape.subparsers)))
            argv.append(sub)
            sh = shape.subparsers[sub]
            examples = list(sh.examples)
        base = list(draw(st.sampled_from(examples))) if examples and draw(st.booleans()) else None
        extras: list[str] = []
        for act in draw(st.lists(st.sampled_from(sh.options), max_size=4)) if sh.options else []:
            flag = draw(st.sampled_from(act.option_strings))
            extras.append(flag)
            if act.nargs != 0:
                extras.append(draw(value_strategy(act, sh.values.get(flag, []), paths)))
        if base is not None:
            for i in range(len(base) - 1):
                act = sh.by_flag.get(base[i])
                if act is not None and act.nargs != 0 and draw(st.integers(0, 3)) == 0:
                    base[i + 1] = draw(value_strategy(act, [], paths))
            return argv + extras + base
        tail: list[str] = []
        for act in sh.positionals:
            if act.nargs == "...":  # REMAINDER: the script or command and its arguments
                words = draw(st.lists(value_strategy(None, [], paths), max_size=3))
                tail += (["--"] if draw(st.booleans()) else []) + words
            elif act.nargs in ("?", "*") and draw(st.booleans()):
                continue
            else:
                tail.append(draw(value_strategy(act, [], paths)))
        return argv + extras + tail

    return build()


# ---- one fuzzed call, and the profiles -----------------------------------------------------------------

_CORPUS: Path | None = None


def corpus() -> Path:
    global _CORPUS
    if _CORPUS is None:
        _CORPUS = make_corpus(Path(tempfile.mkdtemp(prefix="torchrig-fuzz-corpus-")))
    return _CORPUS


def call(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    files: dict[str, bytes] | None = None,
    trees: dict[str, Path] | None = None,
    real: tuple[str, ...] = (),
    prepare: Callable[[Path], None] | None = None,
) -> Outcome:
    """One call in a fresh scratch folder holding the corpus under c/, copies of the folders ``trees``
    (relative path -> source folder) and ``files`` (relative to it, written last); ``prepare(folder)`` then
    makes what bytes cannot say (a FIFO, a link to a device, a sparse giant)."""
    import shutil

    preload()  # the boundaries are patched in modules the parent imported: the child imports nothing heavy
    work = Path(tempfile.mkdtemp(prefix="torchrig-fuzz-"))
    try:
        shutil.copytree(corpus(), work / "c", symlinks=True)
        key = work / "home" / ".ssh" / "id_ed25519.pub"  # so `up` gets past its key lookup
        key.parent.mkdir(parents=True)
        key.write_bytes(CORPUS_TEXT["authorized_keys"])
        for rel, src in (trees or {}).items():
            shutil.copytree(src, work / rel, symlinks=True)
        for rel, data in (files or {}).items():
            target = work / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if prepare is not None:
            prepare(work)
        return run_main(argv, cwd=work, env=env, real=real)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check(outcome: Outcome) -> None:
    problems = outcome.problems()
    if problems:  # a short message: hypothesis prints the (shrunk) input itself
        raise AssertionError("; ".join(problems) + "\n" + outcome.describe())


def register_profiles() -> None:
    from hypothesis import HealthCheck, settings

    common = dict(
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        print_blob=True,
    )
    # CI: the same examples every run (derandomize), sized so the whole suite stays within a few minutes
    settings.register_profile(
        "ci", max_examples=int(os.environ.get("TORCHRIG_FUZZ_EXAMPLES", "8")), derandomize=True, **common
    )
    # local hunting: torchrig's own fuzz budget, random seeds, hypothesis' database keeps what failed
    settings.register_profile(
        "long", max_examples=int(os.environ.get("TORCHRIG_FUZZ_EXAMPLES", "1000")), **common
    )
    settings.load_profile(os.environ.get("TORCHRIG_FUZZ_PROFILE", "ci"))


# ---- file contents: mutations of recorded files ------------------------------------------------------------

JSON_REPLACEMENTS = [
    None,
    -1,
    0,
    1,
    2**64,
    -(2**63),
    10**400,
    1e308,
    -1e308,
    0.5,
    "",
    "x" * 2000,
    "\u0000",
    "é🙂",
    [],
    {},
    True,
    False,
    [[[[]]]],
    {"a": None},
    [None],
    {"": {}},
    "NaN",
    "-1",
    "1e999",
]
TOML_VALUES = [
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "99999999999999999999",
    '""',
    '"x"',
    "[]",
    "{}",
    "true",
    '"\\u0000"',
    "[[1]]",
    "1979-05-27",
    '["a", 1]',
    "{ a = 1 }",
    '"' + "a" * 500 + '"',
    "0x7fffffffffffffff",
]


def _json_slots(value):
    """Every (container, key) in a parsed JSON value, breadth first."""
    slots, todo = [], [value]
    while todo:
        item = todo.pop(0)
        keys = list(item) if isinstance(item, dict) else range(len(item)) if isinstance(item, list) else []
        for k in keys:
            slots.append((item, k))
            todo.append(item[k])
    return slots


def json_content(seed: bytes):
    """Valid JSON from ``seed`` with a few values replaced or removed, or the seed's bytes damaged."""
    import json

    from hypothesis import strategies as st

    @st.composite
    def mutated(draw):
        doc = json.loads(seed)
        for _ in range(draw(st.integers(1, 4))):
            slots = _json_slots(doc)
            if not slots:
                break
            container, key = draw(st.sampled_from(slots))
            if isinstance(container, dict) and draw(st.integers(0, 4)) == 0:
                del container[key]
            else:
                container[key] = copy.deepcopy(draw(st.sampled_from(JSON_REPLACEMENTS)))  # never shared
        return json.dumps(doc).encode()

    return st.one_of(mutated(), damaged(seed), st.binary(max_size=512))


def toml_content(seed: bytes):
    from hypothesis import strategies as st

    lines = seed.decode().splitlines()
    assignments = [i for i, line in enumerate(lines) if re.match(r"\s*[\w.\"-]+\s*=", line)]

    @st.composite
    def mutated(draw):
        out = list(lines)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.sampled_from(assignments))
            key = out[i].split("=", 1)[0]
            choice = draw(st.integers(0, 5))
            if choice == 0:
                out[i] = ""  # the key removed
            elif choice == 1:
                out.insert(
                    i, draw(st.sampled_from(["[torch]", "[python]", "[[image]]", "[services]", "[x.y]"]))
                )
            else:
                out[i] = f"{key}= {draw(st.sampled_from(TOML_VALUES))}"
        return "\n".join(out).encode()

    return st.one_of(mutated(), damaged(seed), st.binary(max_size=512))


def damaged(seed: bytes):
    """The seed truncated, with bytes overwritten, or with bytes spliced in."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw):
        data = bytearray(seed)
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, max(len(data) - 1, 0)))
            op = draw(st.integers(0, 2))
            if op == 0:
                del data[at:]
            elif op == 1 and data:
                data[at] = draw(st.integers(0, 255))
            else:
                data[at:at] = draw(st.binary(min_size=1, max_size=16))
        return bytes(data)

    return build()
