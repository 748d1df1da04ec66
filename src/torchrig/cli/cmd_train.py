"""Train a GPT language model or a ResNet classifier the right way, on 1..N GPUs (or CPU ranks).

DDP or FSDP2 (fully_shard); bf16 or fp16 autocast (GradScaler for fp16); torch.compile; gradient
accumulation that synchronises gradients only on the last micro-step; DistributedSampler with DataLoader
workers and pinned memory; warm-up + cosine learning rate; gradient clipping; atomic DCP checkpoints that
resume on any number of GPUs with no lost or repeated steps; metrics as JSONL and TensorBoard with
tokens/s (images/s) and MFU. --gpus is launch's (all, N, 0,2, device=1, GPU-UUID; a GPU that someone else
leased is refused unless --force); with more than one GPU, one GPU other than CUDA's first,
or --nproc-per-node N, the ranks are started through 'torchrig launch' (torchrun underneath); under torchrun
it trains in place.

examples:
  torchrig train --model gpt --size tiny --steps 200                 # CPU or one GPU, learnable data
  torchrig train --gpus 2 --model gpt --size small --data synthetic --micro-batch 16 --compile
  torchrig train --gpus all --parallel fsdp --size medium --precision bf16 --ckpt-every 500
  torchrig train --gpus 2 --out run1 --resume                        # continue from run1/checkpoints/latest
  torchrig train --out run1 --overwrite                              # a new run in place of run1's
  torchrig train --model resnet --size resnet18 --data ./images --micro-batch 128
  torchrig train --model gpt --data tokens.bin --size mini           # a uint16 token file (nanoGPT's .bin)
  torchrig train --gpus 2 --size small --compile --steps 60 --profile-steps 5   # where the step time goes
  torchrig train --size small --compile --precision fp8 --fp8-recipe tensorwise  # torchao float8 (sm_89+)
  nsys profile --capture-range=cudaProfilerApi torchrig train --compile --profile-steps 3 --profiler cuda

outputs under --out: run.json (the run's id), metrics.jsonl, tensorboard/, checkpoints/step-N/ (+ latest),
summary.json, profile/rankR.trace.json.gz (with --profile-steps; open in Perfetto or chrome://tracing).
An --out belongs to one run: a new run there is refused unless --resume, --resume-if-possible or
--overwrite says what to do with the one it holds. Checkpoints carry SHA-256 checksums; a damaged newest
one is skipped for the newest intact one (docs/checkpoints.md).
"""

from __future__ import annotations

import argparse
from typing import Any

from torchrig.argtypes import MAX_PROCS, int_in
from torchrig.cli.cmd_launch import add_failure_options, add_gpu_options
from torchrig.launch.options import FAILURE_OPTIONS, from_args
from torchrig.train.options import add_train_options, config_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    add_train_options(parser)
    g = parser.add_argument_group("ranks (started through torchrig launch)")
    add_gpu_options(g, "(more than one starts one rank per GPU)")
    g.add_argument(
        "--nproc-per-node", type=int_in(1, MAX_PROCS), help="CPU ranks (gloo) to start, with --device cpu"
    )
    add_failure_options(g)
    g.add_argument("--log-dir", default=None, help="per-rank logs (default OUT/logs)")
    g.add_argument("--no-preflight", action="store_true", help="skip the launcher's pre-flight checks")


def request_from_args(args: argparse.Namespace) -> Any:
    """The train request these options ask for (``torchrig.train.plan.TrainRequest``)."""
    from torchrig.train.plan import TrainRequest

    return TrainRequest(
        config_from_args(args),
        gpus=args.gpus,
        force=args.force,
        nproc_per_node=args.nproc_per_node,
        log_dir=args.log_dir,
        preflight=not args.no_preflight,
        launch_options=tuple(from_args(args, FAILURE_OPTIONS).items()),
    )


def run(args: argparse.Namespace) -> Any:
    from torchrig.train import train

    return train(request_from_args(args))
