"""Adapters to the hardware's own management libraries, shared by every area that reads them.

Each adapter is the only code that imports its library (lazily, inside the call that needs it) and returns
plain frozen records; the areas (doctor, runtime) keep their decisions as pure functions of those records.
``record`` holds the one record of a GPU's facts and the one recording format; ``gpus`` probes them.
"""
