"""Is a tree exact here: the gate a decode consults (measured per configuration,
remembered on disk), and the envelope, verdict words, pass rule and negative
controls the suites and ``treespec audit`` judge numerics with."""
