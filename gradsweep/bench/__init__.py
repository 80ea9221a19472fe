"""``gradsweep bench``: the performance suite of a manifest, as signed evidence.

Each op has cases declared as data (``catalog``): the shapes a trainer runs, the phase timed, the stock path
and the baselines it is compared with. A run times every case end to end (the kernels' public functions
called as a trainer calls them, fold planning included) and kernels only, next to the stock path, the
optional third-party anchors and the run's own ceilings; checks the timed kernels' results (bitwise claims on
the timed data, accuracy and invariance through the contract's judge); reads the targets of
``manifests/bench_targets.yaml``; and writes signed bench evidence and a PNG chart. See docs/bench.md.
"""
