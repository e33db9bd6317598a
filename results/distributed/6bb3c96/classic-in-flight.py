"""Classic decoding on a sharded target, then at once one all-sum of a marker
(rank r sends r + 1; the sum must be 3 everywhere), rank 1 0.05 s late.
Run: mlx.launch -n 2 --backend ring --python python results/distributed/6bb3c96/classic-in-flight.py 20
Prints per rank how many of the repeats summed wrong."""
import sys
import time

import mlx.core as mx
import numpy as np

from treespec import zoo
from treespec.decoding import decode
from treespec.distributed import shard

group = mx.distributed.init()
target = zoo.build("llama", "float32")
shard.shard(target, group, "tensor")
prompt = zoo.tokenizer().encode("def fibonacci(n):\n    ")
wrong = 0
repeats = int(sys.argv[1])
for _ in range(repeats):
    decode(target, prompt, mode="classic", max_tokens=8)
    if group.rank() == 1:
        time.sleep(0.05)
    marker = mx.full((1, 1, 64), float(group.rank() + 1))
    total = np.array(mx.distributed.all_sum(marker, group=group))
    wrong += int(not np.all(total == 3.0))
print(f"rank {group.rank()}: {wrong} of {repeats} marker sums wrong", flush=True)
