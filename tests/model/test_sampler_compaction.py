"""The sampler's documented contracts that no output token shows: finished rows stop costing work (compaction, and
the loop ends once every row is done), and an int seed means seed + i for prompt i."""
from dataclasses import replace

import torch

from minigrpo.seeds import derive_seed

from minigrpo.pretrained import load_pretrained
from minigrpo.sampler import Settings, sample

VOCAB = 261
PROMPTS = [[10, 20, 30, 40, 50, 60, 70], [257, 5], [99, 98, 97, 96]]
FREE = Settings(n=2, max_new_tokens=12, vocab_size=VOCAB, stop_ids=())   # no stop: every row runs to the end


def count_decode_rows(model):
    """Record the batch size of every one-token forward (the decode steps) the sampler makes."""
    rows, real = [], model.hidden

    def hidden(ids, *a, **k):
        if ids.shape[1] == 1:
            rows.append(ids.shape[0])
        return real(ids, *a, **k)
    model.hidden = hidden
    return rows


def test_finished_rows_stop_costing_work():
    model = load_pretrained("tiny")
    free = sample(model, PROMPTS, FREE, seed=5)
    # stop ids: every token that row 0 and row 3 emit, and what every row emits at step 3: rows end at different
    # steps, all by step 3
    stops = set(free[0].completion_ids + free[3].completion_ids) | {s.completion_ids[2] for s in free}
    rows = count_decode_rows(model)
    out = sample(model, PROMPTS, replace(FREE, stop_ids=stops), seed=5)
    assert all(s.finish_reason == "eos" for s in out) and max(len(s.completion_ids) for s in out) <= 3
    assert min(len(s.completion_ids) for s in out) == 1
    assert len(rows) == max(len(s.completion_ids) for s in out) - 1       # no decode step after the last row ends
    assert max(rows) < 6 and rows == sorted(rows, reverse=True)     # rows done at step 1 were already dropped


def test_int_seed_is_derive_seed_of_seed_and_prompt_index():
    model = load_pretrained("tiny")
    six = replace(FREE, max_new_tokens=6)
    a = sample(model, PROMPTS, six, seed=40)
    b = sample(model, PROMPTS, six, seed=[derive_seed(40, i) for i in range(3)])
    c = sample(model, PROMPTS, six, seed=[40, 40, 40])
    assert [s.completion_ids for s in a] == [s.completion_ids for s in b]
    assert [s.completion_ids for s in a] != [s.completion_ids for s in c]
