"""torchrig's built-in trainer: GPT or ResNet, DDP or FSDP2, AMP, torch.compile, accumulation, DCP checkpoints.

Modules: ``config`` (options, sizes), ``models``, ``data`` (datasets, resumable sampler), ``setup`` (process
group, wrapping), ``loop`` (the steps), ``checkpoint`` (atomic, verified, resharding DCP), ``rundir`` (a run folder's owner,
checksums, pruning; no torch), ``metrics`` (JSONL,
TensorBoard, MFU). Nothing here is imported by ``torchrig --help``.
"""
