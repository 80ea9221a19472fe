"""One module per op: its inputs, reference, candidates and gradient names, declared as data."""
