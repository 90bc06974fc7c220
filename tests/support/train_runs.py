"""What the tests that run train.py share: a small synthetic run's flags, train.main in this process with its exit
code and lines, the child process's environment, the logged metrics without their timings (which differ from run to
run), the last checkpoint's weights, and the wait for a checkpoint before a signal is sent to the run."""
import json
import os
import time

from safetensors.torch import load_file

from minigrpo.run.steplog import is_timing

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}   # one thread: the same kernels as recorded


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(ln).items() if not is_timing(k)} for ln in f]


def final_weights(run_dir):
    """(the weights, the checkpoint's name) of the run's last checkpoint."""
    ckpts = sorted(os.listdir(os.path.join(run_dir, "checkpoints")), key=lambda d: int(d.split("-")[1]))
    return load_file(os.path.join(run_dir, "checkpoints", ckpts[-1], "model.safetensors")), ckpts[-1]


def wait_for_checkpoint(proc, path, what, timeout=300):
    """Poll (every 20 ms) until the checkpoint folder `path` exists, then assert that the run is still going, so
    that what the test does to it next (`what`: "interrupted", "killed") lands mid-run."""
    deadline = time.time() + timeout
    while not path.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before it could be {what}"


SMALL = ["--task", "synthetic", "--model", "tiny", "--tasks-per-step", "4", "--group-size", "4",
         "--micro-batch", "8", "--quiet", "--seed", "1"]

def main_lines(argv, capsys, out=None):
    """train.main(argv) in this process: (exit code or None, the stderr lines); `out`, a list, gets the stdout lines
    (the final table and the closing reward line)."""
    import train
    code = None
    try:
        train.main(argv)
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    if out is not None:
        out += captured.out.strip().splitlines()
    return code, captured.err.strip().splitlines()
