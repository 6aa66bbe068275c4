"""The GPU test double's hang diagnostic (tests/fixtures/cuda_on_cpu): under a real torchrun, the
rank torchrun ends because its peer failed prints its stack before it goes, and
``megatron_real.failure_report`` puts that stack ahead of the output's tail, where a gloo
timeout names only the rank that waited."""

import os
import subprocess
import sys

from megatron_real import CUDA_ON_CPU, failure_report

# Rank 1 fails at once; rank 0 waits in a function of its own until torchrun ends it (SIGTERM).
# The DataLoader-like child rank 0 forks first is ended too, and prints nothing.
PROGRAM = """
import os, sys, time
def waiting_for_the_peer():
    time.sleep(120)
if os.environ["RANK"] == "1":
    time.sleep(2)
    sys.exit(3)
child = os.fork()
if child == 0:
    time.sleep(120)
    os._exit(0)
print("rank 0 waits", flush=True)
waiting_for_the_peer()
"""


def test_a_rank_ended_by_torchrun_prints_where_it_waited(tmp_path):
    (tmp_path / "ranks.py").write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(CUDA_ON_CPU), CUDA_ON_CPU="1", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "ranks.py"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert output.count("(most recent call first):") == 1, output[-3000:]  # rank 0, not its child
    report = failure_report("x" * 4000 + output, tail=200)
    stacks, tail = report.split("\n...\n")
    assert stacks.startswith("stacks of the ended ranks:\n")
    assert 'ranks.py", line 4 in waiting_for_the_peer' in stacks and tail == output[-200:]
    assert failure_report("plain output") == "plain output"
