"""``torchrig dashboard``: a read-only page for a shared GPU server (who holds which GPU, what runs, how to
get in), served by the standard library's HTTP server from the same ledger, engine and NVML adapters as
``torchrig gpus`` and ``torchrig ps``. ``state`` collects, ``page`` renders (pure), ``server`` serves."""
