"""torchrig bench: measure a machine's GPUs and links the way the reference tools do, and grade each figure.

Layout (pure core, thin adapters):

- measuring, inside torchrun workers (``torch`` passed in): ``device`` (GEMM, device memory, host<->device),
  ``comm`` (P2P matrix, collectives), ``scaling`` (torchrig train on 1..N GPUs), ``timing``; the entry is ``worker``;
- launching: ``config`` (what to measure), ``launch`` (the torchrun plan and its execution);
- pure: ``busbw`` (nccl-tests arithmetic), ``records`` (typed results), ``grading`` (against the knowledge
  base's datasheet peaks and ``thresholds.toml``), ``render`` (text, Markdown), ``plots`` (PNG), ``run``.

Nothing here imports torch at module level.
"""
