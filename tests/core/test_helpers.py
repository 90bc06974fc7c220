"""The small helpers every part of minigrpo shares: machine.py, seeds.py, files.py, metrics.py and
packing.left_pad (signals.py's Ctrl-C and process groups are tests/run/test_signals.py)."""
import os

import pytest
import torch

from minigrpo.files import atomic_write, read_json
from minigrpo.machine import pick_dtype
from minigrpo.metrics import mean
from minigrpo.packing import left_pad
from minigrpo.seeds import derive_seed, splitmix64


def test_left_pad_puts_every_row_last_token_in_the_last_column():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert ids.dtype == mask.dtype == torch.long


def test_atomic_write_replaces_whole_files(tmp_path):
    path = str(tmp_path / "f.json")
    atomic_write(path, "one")
    atomic_write(path, b"two")

    def write(tmp):
        with open(tmp, "w") as f:
            f.write("three")
    atomic_write(path, write)
    assert open(path).read() == "three" and os.listdir(tmp_path) == ["f.json"]


def test_read_json_says_which_file_and_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json: pass --data"):
        read_json(str(tmp_path / "missing.json"), "pass --data")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match=r"bad.json: not valid JSON \(.*\); fix it"):
        read_json(str(tmp_path / "bad.json"), "", fix="; fix it")


def test_mean_skips_none():
    assert mean([1.0, None, 2.0]) == 1.5 and mean([None]) is None and mean([]) is None


def test_pick_dtype():
    assert pick_dtype(None, torch.device("cpu")) == torch.float32
    assert pick_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


def test_derive_seed_is_splitmix64_folded_over_the_parts():
    seeds = [derive_seed(*p) for p in [(0,), (0, 1), (1, 0), (0, "a"), (0, "b"), (0, 1, 2), (0, 2, 1)]]
    assert len(set(seeds)) == len(seeds)                                   # order and strings matter
    assert all(0 <= s < 2**63 for s in seeds) and derive_seed(0, "a") == derive_seed(0, "a")
    one = int(splitmix64(torch.tensor(7))) % 2**64 >> 1
    assert derive_seed(7) == one                                           # one part: splitmix64 of it, 63 bits
