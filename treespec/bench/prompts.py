"""treespec bench's inputs that its flags name: the prompts, the default
chain blocks and fixed trees. Data only, so the command line's parser
(treespec.cli.main) reads them without importing the bench."""

# Python-code prompts for the trained pair (trained on CPython's stdlib). Each
# ends in a newline, not indentation spaces (treespec/pair/README.md says why).
PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def read_lines(path):\n    with open(path) as f:\n",
    "    def __repr__(self):\n",
    '"""Utilities for parsing command line arguments."""\n\nimport re\n',
    "for i in range(len(items)):\n",
    "try:\n    import threading\nexcept ImportError:\n",
    "    if not isinstance(value, str):\n",
]
FIXED_TREES = ((2, 1, 1), (2, 2, 1), (3, 1, 1, 1))
DEFAULT_BLOCKS = "2..8"
