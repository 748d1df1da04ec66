"""The ``torchrig`` command line: a registry of commands, each in its own module, imported only when chosen.

``torchrig --help`` and the light commands import neither torch, docker nor pynvml; a test proves it.
Every command module ``torchrig.cli.cmd_<name>`` provides ``configure(parser)`` and ``run(args) -> Report``;
its module docstring is its ``--help`` text. Errors are mapped to exit codes here and only here
(see ``torchrig.errors``): 0 ok, 1 problems found, 2 bad usage or input, 3 internal error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from torchrig import __version__
from torchrig.argtypes import TorchrigParser  # every command's parser (python -m torchrig.train uses it too)
from torchrig.errors import EXIT_INTERNAL, EXIT_USAGE, TorchrigError, UsageError

# name -> (module, one-line summary, group). Order is the order of --help.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "doctor": ("cmd_doctor", "inspect this machine or container: what is wrong, why, and the fix", "Doctor"),
    "check": (
        "cmd_check",
        "will this GPU + driver run this PyTorch build? works / caveats / fails",
        "Knowledge",
    ),
    "resolve": (
        "cmd_resolve",
        "the best PyTorch build for these GPUs and driver, with the pip command",
        "Knowledge",
    ),
    "install": (
        "cmd_install",
        "install the right PyTorch build here, verify it with a real kernel, then doctor",
        "Knowledge",
    ),
    "matrix": ("cmd_matrix", "support table: GPU families x PyTorch builds", "Knowledge"),
    "init": ("cmd_init", "write a commented torchrig.toml image spec", "Images"),
    "image": ("cmd_image", "render the Dockerfile for a spec, or build the image", "Images"),
    "serve": ("cmd_serve", "the image's entrypoint: JupyterLab and SSH as the non-root user", "Images"),
    "up": (
        "cmd_up",
        "start an environment on this GPU server (GPU lease, ports, volumes, limits)",
        "Environments",
    ),
    "ps": ("cmd_ps", "list running torchrig environments", "Environments"),
    "logs": ("cmd_logs", "show an environment's logs", "Environments"),
    "exec": ("cmd_exec", "run a command inside an environment", "Environments"),
    "down": ("cmd_down", "stop and remove an environment, freeing its GPUs", "Environments"),
    "gpus": ("cmd_gpus", "the GPU board: each GPU, who holds it, memory and utilisation", "Environments"),
    "dashboard": (
        "cmd_dashboard",
        "a read-only web page of this GPU server: GPUs, leases, environments, bench, doctor",
        "Environments",
    ),
    "host": (
        "cmd_host",
        "the host daemon of a shared server: owns Docker and the leases, checks who asks",
        "Environments",
    ),
    "bench": ("cmd_bench", "measure GPUs and links and grade them against the datasheet", "Proof"),
    "launch": (
        "cmd_launch",
        "run a script on 1..N GPUs / nodes through torchrun, with pre-flight",
        "Training",
    ),
    "train": (
        "cmd_train",
        "built-in DDP/FSDP trainer (GPT or ResNet) with checkpoints and metrics",
        "Training",
    ),
    "export": ("cmd_export", "export a checkpoint to torch.export (.pt2) and ONNX, verified", "Training"),
    "cluster": (
        "cmd_cluster",
        "render Slurm sbatch scripts or Kubernetes manifests for a training job",
        "Training",
    ),
}

EPILOG = """examples:
  torchrig doctor                                  # what is wrong with this machine, and the fix
  torchrig check --gpu "RTX 5090" --driver 570.86 --torch 2.7.0+cu126
  torchrig resolve --gpu "Tesla V100-SXM2-32GB" --driver 535.104 --python 3.11
  torchrig matrix --torch 2.8.0 --format markdown

every command takes --json (machine-readable, with schema_version) and --debug (tracebacks).
exit status: 0 ok, 1 problems found, 2 bad usage or input.
"""


def top_help() -> str:
    lines = [
        "usage: torchrig [--json] [--debug] [--version] COMMAND [options]",
        "",
        "From a bare NVIDIA machine to verified multi-GPU PyTorch training.",
        "",
    ]
    group = None
    for name, (_mod, summary, grp) in COMMANDS.items():
        if grp != group:
            lines.append(f"{grp}:")
            group = grp
        lines.append(f"  {name:<9} {summary}")
    lines += ["", EPILOG.rstrip(), "", "Run 'torchrig COMMAND --help' for a command's options and examples."]
    return "\n".join(lines)


def build_parser(name: str) -> tuple[TorchrigParser, object]:
    """Import the command's module and build its parser (used by main and by docs/tests)."""
    module = importlib.import_module(f"torchrig.cli.{COMMANDS[name][0]}")
    parser = TorchrigParser(
        prog=f"torchrig {name}",
        description=(module.__doc__ or COMMANDS[name][1]).strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = parser.add_argument_group("common options")
    common.add_argument("--json", action="store_true", help="print the result as JSON (with schema_version)")
    common.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    module.configure(parser)
    from torchrig.argtypes import bound_numbers

    bound_numbers(parser)  # every number finite and within 64 bits, whatever the command declared
    return parser, module


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Options may come between positionals (``image render --json SPEC``): argparse's plain parse gives an
    optional positional its default at the first one and then refuses SPEC. Commands whose last positional
    takes the rest of the line (``launch SCRIPT ARGS``) or that have sub-commands parse as before."""
    if any(a.nargs in (argparse.REMAINDER, argparse.PARSER) for a in parser._actions):
        return parser.parse_args(argv)
    return parser.parse_intermixed_args(argv)


def _split_globals(argv: list[str]) -> tuple[dict[str, bool], list[str]]:
    flags = {"json": False, "debug": False}
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        tok = rest.pop(0)
        if tok in ("-h", "--help"):
            flags["help"] = True
        elif tok == "--version":
            flags["version"] = True
        elif tok in ("--json", "--debug"):
            flags[tok[2:]] = True
        else:
            raise UsageError(f"unknown option {tok!r}", hint="see 'torchrig --help'")
    return flags, rest


def _fail(err: TorchrigError, command: str, as_json: bool) -> int:
    print(f"torchrig: error: {err.one_line()}", file=sys.stderr)
    if as_json:
        import json

        print(
            json.dumps(
                {
                    "schema_version": 1,
                    "command": command,
                    "error": {
                        "type": type(err).__name__,
                        "message": err.one_line(),
                        "exit_code": err.exit_code,
                    },
                },
                indent=2,
            )
        )
    return err.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command, as_json, debug = (
        "torchrig",
        "--json" in argv,
        "--debug" in argv or bool(os.environ.get("TORCHRIG_DEBUG")),
    )
    try:
        flags, rest = _split_globals(argv)
        if flags.get("version"):
            print(f"torchrig {__version__}")
            return 0
        if flags.get("help") or not rest:
            print(top_help())
            return 0 if flags.get("help") else EXIT_USAGE
        command = rest.pop(0)
        if command not in COMMANDS:
            from torchrig.fuzzy import did_you_mean

            raise UsageError(
                f"unknown command {command!r}",
                hint=did_you_mean(command, COMMANDS) or "see 'torchrig --help'",
            )
        parser, module = build_parser(command)
        args = _parse(parser, rest)
        args.json = bool(args.json or flags["json"])
        args.debug = bool(args.debug or flags["debug"])
        as_json, debug = args.json, args.debug
        report = module.run(args)  # type: ignore[attr-defined]
        from torchrig.report import dump_json

        if as_json:
            print(dump_json(command, report))
        else:
            text = report.render_text()
            if text:
                print(text)
        sys.stdout.flush()
        return int(report.exit_code)
    except TorchrigError as err:
        if debug:
            import traceback

            traceback.print_exc()
        return _fail(err, command, as_json)
    except KeyboardInterrupt:
        print("torchrig: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as err:  # a path the user gave: a full disk, a device, a folder, no permission
        if debug or err.filename is None:
            if debug:
                raise
            return _internal(err)
        where = err.filename if err.filename2 is None else f"{err.filename} -> {err.filename2}"
        return _fail(
            UsageError(
                f"cannot use {where}: {err.strerror or err}",
                hint="check the path, its permissions and free space",
            ),
            command,
            as_json,
        )
    except Exception as err:  # a bug, not a user mistake
        if debug:
            raise
        return _internal(err)


def _internal(err: BaseException) -> int:
    message = " ".join(str(err).split())[:300]
    print(
        f"torchrig: internal error: {type(err).__name__}: {message} (rerun with --debug and report it)",
        file=sys.stderr,
    )
    return EXIT_INTERNAL
