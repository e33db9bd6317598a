"""What runs on a lent accelerator machine, from the repository root: shell
scripts named for what they run (``--help`` prints each one's header) and
the pytest plugin one of them loads (``-p benchmarks.device.timing_plugin``)."""
