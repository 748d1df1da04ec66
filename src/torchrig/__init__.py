"""torchrig: from a bare NVIDIA machine to verified multi-GPU PyTorch training.

The package root imports nothing heavy: torch, docker and pynvml are imported only by the commands
that need them (see ``torchrig.cli``).
"""

__version__ = "0.1.0"
