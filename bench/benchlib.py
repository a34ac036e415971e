"""What the bench scripts share: the repository root, bytes in MiB, and a torchrun launch that stops the bench
with both output streams when a run fails."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torchrun(n, port, argv):
    cmd = ["torchrun", "--no-python", "--standalone", f"--nproc-per-node={n}",
           f"--master-port={port}"] + argv
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res.stdout


def mib(b):
    return b / 2**20
