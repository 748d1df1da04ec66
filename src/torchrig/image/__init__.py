"""Images: a short spec (``torchrig.toml``) -> a pinned, non-root PyTorch + CUDA image with JupyterLab and SSH.

``spec`` parses and validates the spec; ``stack`` resolves it (the compatibility engine picks the torch build,
``data/bases.toml`` the base); ``render`` turns the plan into the Dockerfile (pure, golden-tested);
``context`` assembles the build context; ``build`` is the Docker Engine adapter; ``pipeline`` strings them
together for ``torchrig image render|build``. See docs/images.md.
"""
