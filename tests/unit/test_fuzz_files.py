"""Fuzz the contents of every file a command reads: recorded files with values replaced or removed, damaged
bytes, or random bytes. Each call: exit 0, 1 or 2, never an internal error or a traceback, bounded in time
and memory (see tests/fuzzkit.py). The environment variables commands read are fuzzed here too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuzzkit  # noqa: E402
from torchrig.errors import InputError  # noqa: E402

fuzzkit.register_profiles()
fuzzkit.preload()

FIX = fuzzkit.FIXTURES
SPEC = (FIX / "image" / "cpu-only.toml").read_bytes()
# the spec the recorded lock was built from (torch 2.13.0, CPU): --locked accepts the lock for it
LOCKED_SPEC = SPEC.replace(b'version = "2.8.0"', b'version = "2.13.0"')
LOCK = (FIX / "image" / "lock-2.13.0-cpu-jupyter-ssh.json").read_bytes()
IMAGE_CONFIG = json.dumps(
    {"services": ["jupyter", "ssh"], "workdir": "/workspace", "jupyter_port": 8888, "ssh_port": 22}
).encode()

# (what, argv, the file's path in the scratch folder, its seed, json|toml|bytes, environment)
TARGETS = [
    (
        "doctor-facts",
        ["doctor", "--facts", "f.json"],
        "f.json",
        (FIX / "doctor" / "h200x1-driver580-cu130.json"),
        "json",
        {},
    ),
    (
        "doctor-facts-2gpu",
        ["doctor", "--json", "--facts", "f.json"],
        "f.json",
        (FIX / "doctor" / "h200x2-driver580-cu130-shm-64m.json"),
        "json",
        {},
    ),
    (
        "gpus-inventory",
        ["gpus", "--inventory", "f.json"],
        "f.json",
        (FIX / "runtime" / "inventory-8xh200.json"),
        "json",
        {},
    ),
    (
        "gpus-inventory-mig",
        ["gpus", "--json"],
        "f.json",
        (FIX / "runtime" / "mig-1xh100-3-instances.json"),
        "json",
        {"TORCHRIG_GPU_INVENTORY": "f.json"},
    ),
    (
        "bench-report",
        ["bench", "--from-json", "f.json", "--no-plots"],
        "f.json",
        (FIX / "bench" / "cpu-gloo-2proc-torch2.13.json"),
        "json",
        {},
    ),
    ("image-spec", ["image", "render", "s/torchrig.toml"], "s/torchrig.toml", SPEC, "toml", {}),
    (
        "image-spec-cu128",
        ["image", "render", "--json", "s/torchrig.toml"],
        "s/torchrig.toml",
        (FIX / "image" / "runtime-jupyter-ssh-cu128.toml"),
        "toml",
        {},
    ),
    (
        "cluster-spec",
        ["cluster", "slurm", "--spec", "s/torchrig.toml", "--", "train.py"],
        "s/torchrig.toml",
        SPEC,
        "toml",
        {},
    ),
    (
        "image-lock",
        ["image", "build", "--locked", "l/torchrig.toml"],
        "l/torchrig.lock.json",
        LOCK,
        "json",
        {},
    ),
    ("up-lock", ["up", "--dry-run", "--spec", "l/torchrig.toml"], "l/torchrig.lock.json", LOCK, "json", {}),
    (
        "serve-image-config",
        ["serve", "--dry-run"],
        "cfg.json",
        IMAGE_CONFIG,
        "json",
        {"TORCHRIG_IMAGE_CONFIG": "cfg.json", "SSH_AUTHORIZED_KEYS_FILE": "c/authorized_keys"},
    ),
    (
        "serve-keys",
        ["serve", "--dry-run", "--services", "ssh"],
        "keys",
        fuzzkit.CORPUS_TEXT["authorized_keys"],
        "bytes",
        {"SSH_AUTHORIZED_KEYS_FILE": "keys"},
    ),
    (
        "serve-token",
        ["serve", "--dry-run", "--services", "jupyter"],
        "token",
        b"0123456789abcdef\n",
        "bytes",
        {"JUPYTER_TOKEN_FILE": "token"},
    ),
    (
        "up-ssh-key",
        ["up", "--dry-run", "--image", "x", "--ssh-key", "k.pub"],
        "k.pub",
        fuzzkit.CORPUS_TEXT["authorized_keys"],
        "bytes",
        {},
    ),
    (
        "ledger",
        ["gpus", "--inventory", "c/inventory.json"],
        "state/leases.sqlite3",
        b"SQLite format 3\x00" + bytes(200),
        "bytes",
        {},
    ),
]


def _content(seed, kind):
    data = seed.read_bytes() if isinstance(seed, Path) else seed
    if kind == "json":
        return fuzzkit.json_content(data)
    if kind == "toml":
        return fuzzkit.toml_content(data)
    return st.one_of(fuzzkit.damaged(data), st.binary(max_size=512))


@pytest.mark.parametrize("what,argv,rel,seed,kind,env", TARGETS, ids=[t[0] for t in TARGETS])
@given(data=st.data())
def test_file_content_fuzz(what, argv, rel, seed, kind, env, data):
    content = data.draw(_content(seed, kind), label="content")
    files = {rel: content}
    if rel.startswith("s/"):
        files["s/torchrig.lock.json"] = LOCK
    if rel.startswith("l/"):
        files["l/torchrig.toml"] = LOCKED_SPEC
    fuzzkit.check(fuzzkit.call(argv, env=env, files=files))


def test_every_seed_is_accepted_as_recorded():
    """The unmutated seeds pass (exit 0/1, or the 'reached' marker): the fuzz starts from valid files."""
    for what, argv, rel, seed, _kind, env in TARGETS:
        if what in ("ledger", "up-lock", "up-ssh-key"):  # these need the engine after the file
            continue
        files = {rel: seed.read_bytes() if isinstance(seed, Path) else seed}
        if rel.startswith("s/"):
            files["s/torchrig.lock.json"] = LOCK
        if rel.startswith("l/"):
            files["l/torchrig.toml"] = LOCKED_SPEC
        out = fuzzkit.call(argv, env=env, files=files)
        assert out.code in (0, 1, fuzzkit.REACHED_EXIT), f"{what}: " + out.describe()


ENV_VARS = {
    "serve": [
        "TORCHRIG_JUPYTER_PORT",
        "TORCHRIG_SSH_PORT",
        "TORCHRIG_SERVICES",
        "JUPYTER_TOKEN",
        "SSH_AUTHORIZED_KEYS",
        "JUPYTER_TOKEN_FILE",
        "SSH_AUTHORIZED_KEYS_FILE",
        "TORCHRIG_IMAGE_CONFIG",
    ],
    "launch": ["CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "TORCH_FR_BUFFER_SIZE", "TORCHRIG_COLLECTIVE_TIMEOUT_S"],
    "gpus": ["TORCHRIG_GPU_INVENTORY", "TORCHRIG_STATE_DIR"],
    "check": ["TORCHRIG_CACHE_DIR"],
    "train": ["WORLD_SIZE", "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES"],
}
ENV_ARGV = {
    "serve": ["serve", "--dry-run"],
    "launch": ["launch", "--dry-run", "--gpus", "all", "train.py"],
    "gpus": ["gpus"],
    "check": ["check", "--gpu", "A100", "--torch", "2.8.0"],
    "train": ["train", "--steps", "5"],
}


@pytest.mark.parametrize("name", list(ENV_VARS))
@given(data=st.data())
def test_environment_fuzz(name, data):
    values = st.one_of(
        st.sampled_from(fuzzkit.NUMBERS + fuzzkit.WORDS + fuzzkit.corpus_paths()),
        st.text(st.characters(blacklist_characters="\x00"), max_size=12),
    )
    env = data.draw(st.dictionaries(st.sampled_from(ENV_VARS[name]), values, max_size=3), label="env")
    fuzzkit.check(fuzzkit.call(ENV_ARGV[name], env=env))


@given(
    content=st.one_of(st.binary(max_size=64), fuzzkit.damaged(bytes(range(64)))),
    suffix=st.sampled_from([".bin", ".npy"]),
)
def test_token_file_fuzz(tmp_path_factory, content, suffix):
    """The trainer's token-file reader: any bytes are tokens or a one-line InputError, nothing else."""
    from torchrig.train.data import TokenFile

    path = tmp_path_factory.mktemp("tokens") / f"t{suffix}"
    path.write_bytes(content)
    try:
        TokenFile(path, seq_len=4, vocab=50304)
    except InputError as err:
        assert "\n" not in err.one_line()
