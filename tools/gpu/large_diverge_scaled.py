"""`torchrig train ...` with GPT-2's residual scaling at init (tools/gpu/large_diverge.sh's `scaled`).

GPT-2 scales the residual projections' initial weights by 1/sqrt(N), N = 2 x layers (the attention output and
the MLP output of each block): Hugging Face's modeling_gpt2.py ``_init_weights`` (``c_proj.weight``, std
``initializer_range / sqrt(2 * n_layer)``), nanoGPT's model.py. One process only (a single GPU trains in place).
"""

import math
import sys

import torch

from torchrig.train import models

_plain_init = models.GPT.__init__


def _scaled_init(self, c):  # type: ignore[no-untyped-def]
    _plain_init(self, c)
    for blk in self.blocks:
        for layer in (blk.proj, blk.out):
            torch.nn.init.normal_(layer.weight, std=0.02 / math.sqrt(2 * c.layers))


models.GPT.__init__ = _scaled_init  # type: ignore[method-assign]

if __name__ == "__main__":
    from torchrig.cli import main

    sys.exit(main(sys.argv[1:]))
