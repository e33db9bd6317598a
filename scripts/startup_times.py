"""Start-up and end-to-end wall time of the command line, as a user sees it.

    python scripts/startup_times.py [--repeats 5] [--generate-args "--max-tokens 64"]
        [--cold-memo] [--out results/startup/NAME.json]

Times, each as a fresh process, ``--repeats`` times interleaved: ``treespec
--help``, ``python -c "import treespec.cli"`` and ``treespec generate`` on
the default pair (its default prompt and length). Before the timed runs one
untimed ``treespec generate`` warms the OS file cache and (where the probe's
verdict is memoized on disk) the memo, so every timed generate is a second
invocation; ``--cold-memo`` points TREESPEC_CACHE_DIR at a fresh empty
folder for every generate instead. Prints the medians of wall and CPU time (user + system
of the child), every wall sample and the
load average before and after (the machine is shared: read ratios, not
absolute times).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {
    "help": ["-m", "treespec", "--help"],
    "import": ["-c", "import treespec.cli"],
    "generate": ["-m", "treespec", "generate"],
}


def timed(args, env):
    """(wall s, CPU s of the child: user + system, which load inflates less)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cold-memo", action="store_true",
                    help="a fresh, empty TREESPEC_CACHE_DIR for every generate")
    ap.add_argument("--generate-args", default="",
                    help="extra flags for treespec generate, e.g. '--max-tokens 64'")
    ap.add_argument("--out", help="also write the samples as JSON here")
    args = ap.parse_args()
    env = dict(os.environ)
    COMMANDS["generate"] = COMMANDS["generate"] + args.generate_args.split()
    load_before = os.getloadavg()
    timed(COMMANDS["generate"], env)  # warm-up: file cache, and the memo if there is one
    samples = {k: [] for k in COMMANDS}
    cpu = {k: [] for k in COMMANDS}
    for _ in range(args.repeats):
        for name, cmd in COMMANDS.items():
            run_env = env
            if name == "generate" and args.cold_memo:
                run_env = {**env, "TREESPEC_CACHE_DIR": tempfile.mkdtemp(prefix="treespec-memo-")}
            wall, cpu_s = timed(cmd, run_env)
            samples[name].append(wall)
            cpu[name].append(cpu_s)
    load_after = os.getloadavg()
    medians = {k: statistics.median(v) for k, v in samples.items()}
    cpu_medians = {k: statistics.median(v) for k, v in cpu.items()}
    for k, v in samples.items():
        print(f"{k:<9} wall median {medians[k]:6.2f} s, CPU median {cpu_medians[k]:6.2f} s; "
              "wall samples " + " ".join(f"{x:.2f}" for x in v))
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
          f"{os.cpu_count()} CPUs; cold memo: {args.cold_memo}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "medians_s": medians, "samples_s": samples, "cpu_medians_s": cpu_medians,
            "cpu_samples_s": cpu, "repeats": args.repeats,
            "cold_memo": args.cold_memo, "generate_args": args.generate_args, "loadavg_before": load_before,
            "loadavg_after": load_after, "cpus": os.cpu_count()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
