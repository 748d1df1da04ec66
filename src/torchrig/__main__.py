"""``python -m torchrig`` is the same as the ``torchrig`` console script."""

import sys

from torchrig.cli import main

sys.exit(main())
