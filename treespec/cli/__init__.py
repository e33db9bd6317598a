"""The command line: ``treespec generate | bench | audit``. ``main`` parses every
command's flags without importing mlx-lm, then imports the command's module."""
