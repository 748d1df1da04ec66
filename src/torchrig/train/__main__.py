"""Per-rank entry point: ``python -m torchrig.train OPTIONS`` (what ``torchrig train`` starts under torchrun)."""

from __future__ import annotations

import sys

from torchrig.errors import TorchrigError


def main(argv: list[str] | None = None) -> int:
    from torchrig.argtypes import TorchrigParser
    from torchrig.train.options import add_train_options, config_from_args

    parser = TorchrigParser(prog="python -m torchrig.train")
    add_train_options(parser)
    try:
        cfg = config_from_args(parser.parse_args(sys.argv[1:] if argv is None else argv))
        from torchrig.train.loop import train

        train(cfg)
    except TorchrigError as err:
        print(f"torchrig: error: {err.one_line()}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
