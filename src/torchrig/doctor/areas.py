"""What ``torchrig doctor --only`` selects; each check belongs to one (``checks.CHECKS``). Its own module, so
that the command validates its arguments and starts the torch probe before the checks' modules load."""

AREAS = ("driver", "container", "env", "torch", "gpu")
