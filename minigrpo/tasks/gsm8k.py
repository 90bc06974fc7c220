"""GSM8K with verifiable rewards (RLVR): data and split, the answer-tag prompt, rewards, eval metrics, hint probe.

Reproduces the recipe of shared/seeds/004 (Qwen3-1.7B-Base, GRPO on GSM8K). Every example, whatever its source, is
one record: {"id", "question", "answer" (the gold answer as a string), "answer_number" (float, or None when the gold
is not a plain number, which happens only in MATH)}.

Data
- GSM8K: `openai/gsm8k` config "main" from the hub (its two parquet files, read with pyarrow, an optional
  dependency), or a local JSONL file in GSM8K's schema ({"question", "answer"} with the answer ending "#### 42"),
  or a folder holding train.jsonl and test.jsonl.
- The split (the seed's): train then test pooled (7,473 + 1,319 = 8,792), shuffled once with seed 3407, cut
  80/10/10 into train/val/eval. The shuffle is exactly what `datasets.Dataset.shuffle(seed=3407)` does:
  `np.random.default_rng(3407).permutation(n)` (arrow_dataset.py: `generator = np.random.default_rng(seed)`;
  `permutation = generator.permutation(len(self))`; then `select`). The cut is in integer arithmetic: train =
  floor(0.8 n), val = floor(0.1 n), eval = the rest, which gives the seed's 8,792 -> 7,033 / 879 / 880. The eval
  part is never used in training.
- Out-of-distribution eval sets: SVAMP (`ChilleD/SVAMP`, test split, 300 problems; schema ID, Body, Question,
  Equation, Answer, Type) and MATH algebra (`EleutherAI/hendrycks_math` config "algebra", test split, a fixed
  sample of 300 of its 1,187; schema problem, level, type, solution with the answer in the last \\boxed{...}).

Rewards (score = correctness + format + brevity; `details` returns the parts)
- correctness +2.0: the FIRST complete <answer>...</answer> block holds exactly one number (after taking the part
  right of its last "=", and reading "$1,200", "42 apples", "3/4", "-7", "25%", "42." as numbers) and it equals the
  gold number. Listing several numbers therefore earns nothing; an empty <answer></answer> earns nothing.
- format +0.5 well-formed: the whole completion is <reasoning>R</reasoning> <answer>A</answer> with R and A not
  blank, each of the four tags exactly once, and nothing before or after (whitespace and a trailing
  <|im_end|>/<|endoftext|> aside). +0.25 partial: not well-formed, but it holds a complete <answer>...</answer> or
  <reasoning>...</reasoning> pair. Text after </answer> makes a completion partial at best: the seed's rewards
  never looked past the answer tag, and its model occasionally rambled on.
- brevity up to +0.2: paid only to completions that are correct AND well-formed, full up to 400 characters,
  falling linearly to 0 at 1600. So it only orders answers inside the best class and can never outweigh
  correctness or format (tests check every pair of classes).
The completion must include the stop string "</answer>" (the sampler keeps stop strings in the text); an
unclosed <answer> is not an answer.
"""
import json
import math
import os
import re
import zlib

import numpy as np

SEED = 3407
SYSTEM_PROMPT = """Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>"""
HINT_TEMPLATE = "A student suggested the answer is {value}."

CORRECT_REWARD = 2.0
FORMAT_WELL, FORMAT_PARTIAL = 0.5, 0.25
BREVITY_MAX = 0.2
BREVITY_CHARS = (400, 1600)  # full brevity bonus up to the first length, none from the second on
REL_TOL = 1e-6               # numbers equal within this relative tolerance (0.3333333 == 1/3)

HUB = {  # name -> (repo id, {split: parquet file in the repo})
    "gsm8k": ("openai/gsm8k", {"train": "main/train-00000-of-00001.parquet",
                               "test": "main/test-00000-of-00001.parquet"}),
    "svamp": ("ChilleD/SVAMP", {"train": "data/train-00000-of-00001.parquet",
                                "test": "data/test-00000-of-00001.parquet"}),
    "math": ("EleutherAI/hendrycks_math", {"train": "{subject}/train-00000-of-00001.parquet",
                                           "test": "{subject}/test-00000-of-00001.parquet"}),
}

# ----------------------------------------------------------------------------------------------------------------
# numbers

# A number: optional minus (not when glued to a word or digit, so "5-3" and "x2" are not negatives), thousands
# commas only in groups of three, optional decimals, optional "/denominator" making it a fraction.
_INT = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER = re.compile(rf"(?<![\w.])(-?{_INT}|-?\.\d+)(?:\s*/\s*({_INT}))?")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\{\s*(-?[\d.,]+)\s*\}\{\s*(-?[\d.,]+)\s*\}")


def _clean(text: str) -> str:
    """Make money, percents, LaTeX fractions and unicode minus readable by _NUMBER."""
    text = text.replace("\u2212", "-").replace("{,}", ",").replace("\\!", "")
    text = _LATEX_FRAC.sub(r"\1/\2", text)
    text = text.replace("-\\$", "-").replace("-$", "-")  # "-$5" is minus five dollars
    return text.replace("\\$", " ").replace("$", " ").replace("\\%", "%")


def _value(match: re.Match) -> float | None:
    num = float(match.group(1).replace(",", ""))
    if match.group(2) is None:
        return num
    den = float(match.group(2).replace(",", ""))
    return num / den if den else None


def numbers_in(text: str, parts: bool = False) -> list[float]:
    """Every number in the text, in order ("$1,200" -> 1200, "3/4" -> 0.75, "25%" -> 25).
    parts=True also lists a fraction's numerator and denominator (for the lenient "anywhere" check)."""
    out = []
    for m in _NUMBER.finditer(_clean(text)):
        out.append(_value(m))
        if parts and m.group(2):  # "1200 / 2" also states 1200 and 2
            out += [float(x.replace(",", "")) for x in m.groups()]
    return [v for v in out if v is not None]


def parse_answer_number(text: str) -> float | None:
    """The single number an answer states: right of its last "=", exactly one number there, else None."""
    rhs = text.rsplit("=", 1)[-1]
    nums = numbers_in(rhs)
    return nums[0] if len(nums) == 1 else None


def parse_gold_number(text: str) -> float | None:
    """A gold answer that is a plain number ("1,200", "\\frac{3}{4}", "-2.5", "10\\%"); None for "2x", "(1,2)"."""
    s = _clean(text).strip().rstrip(".").replace("%", "").strip()
    s = re.sub(r"^[a-z]\s*=\s*", "", s)  # "x = 5" states the number 5
    m = _NUMBER.fullmatch(s)
    return _value(m) if m else None


def numbers_equal(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-9)


def format_number(x: float) -> str:
    """42.0 -> "42", 2.5 -> "2.5": how gold numbers and decoys are written."""
    return str(int(x)) if float(x).is_integer() else f"{x:.10g}"


def _norm_expr(s: str) -> str:
    """Loose normal form for non-numeric (MATH) answers: exact match of this is a lower bound without a CAS."""
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"),
                     ("^\\circ", ""), ("^{\\circ}", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("$", "")):
        s = s.replace(old, new)
    return re.sub(r"\s+", "", s).rstrip(".").lower()

# ----------------------------------------------------------------------------------------------------------------
# parsing a completion and scoring it

_TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_REASONING_BLOCK = re.compile(r"<reasoning>(.*?)</reasoning>", re.DOTALL)
_WELL_FORMED = re.compile(r"\s*<reasoning>(.*?)</reasoning>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_EOS_TEXT = ("<|im_end|>", "<|endoftext|>")


def _strip_eos(text: str) -> str:
    """Drop trailing EOS text a decode with special tokens may leave, and whitespace."""
    text = text.rstrip()
    while text.endswith(_EOS_TEXT):
        text = text[: -len(next(e for e in _EOS_TEXT if text.endswith(e)))].rstrip()
    return text


def answer_text(completion: str) -> str | None:
    """Content of the first complete <answer>...</answer> block, stripped; None when there is none."""
    m = _ANSWER_BLOCK.search(completion)
    return m.group(1).strip() if m else None


def format_kind(completion: str) -> str:
    """"well" | "partial" | "none", as defined in the module docstring."""
    text = _strip_eos(completion)
    m = _WELL_FORMED.fullmatch(text)
    if m and m.group(1).strip() and m.group(2).strip() and all(text.count(t) == 1 for t in _TAGS):
        return "well"
    if _ANSWER_BLOCK.search(text) or _REASONING_BLOCK.search(text):
        return "partial"
    return "none"


def continues_after_answer(completion: str) -> bool:
    """True when anything but whitespace / EOS text follows the first </answer> (the seed's rambling check)."""
    end = completion.find("</answer>")
    return end >= 0 and bool(_strip_eos(completion[end + len("</answer>"):]))


def is_correct(ex: dict, text: str | None) -> bool:
    """Does this answer text match the gold? Numeric golds compare numbers; others a normalised string."""
    if not text:
        return False
    if ex.get("answer_number") is not None:
        x = parse_answer_number(text)
        return x is not None and numbers_equal(x, ex["answer_number"])
    return _norm_expr(text) == _norm_expr(ex["answer"])


def lenient_correct(ex: dict, completion: str) -> bool:
    """The right number ANYWHERE in the response (any number equal to the gold, not only the last one).

    Generous by design, for base models that never use the answer tag: a response that restates a number from the
    question which happens to be the answer also counts. Non-numeric golds: normalised substring match."""
    if ex.get("answer_number") is not None:
        return any(numbers_equal(x, ex["answer_number"]) for x in numbers_in(completion, parts=True))
    gold = _norm_expr(ex["answer"])
    return bool(gold) and gold in _norm_expr(completion)


def brevity_bonus(n_chars: int, chars: tuple[int, int] = BREVITY_CHARS) -> float:
    full, zero = chars
    return BREVITY_MAX * min(1.0, max(0.0, (zero - n_chars) / (zero - full)))


def details(ex: dict, completion: str, brevity_chars: tuple[int, int] = BREVITY_CHARS) -> dict:
    """Every reward component and eval metric of one completion."""
    text = answer_text(completion)
    correct = is_correct(ex, text)
    fmt = format_kind(completion)
    length = len(_strip_eos(completion))
    r_correct = CORRECT_REWARD if correct else 0.0
    r_format = {"well": FORMAT_WELL, "partial": FORMAT_PARTIAL, "none": 0.0}[fmt]
    r_brevity = brevity_bonus(length, brevity_chars) if correct and fmt == "well" else 0.0
    return {"score": r_correct + r_format + r_brevity, "correctness": r_correct, "format": r_format,
            "brevity": r_brevity, "correct": correct, "lenient_correct": lenient_correct(ex, completion),
            "format_kind": fmt, "answer_text": text, "predicted_number": parse_answer_number(text or ""),
            "n_answer_tags": len(_ANSWER_BLOCK.findall(completion)),
            "continues_after_answer": continues_after_answer(completion), "length_chars": length}


def score(ex: dict, completion: str, brevity_chars: tuple[int, int] = BREVITY_CHARS) -> float | None:
    if ex.get("answer_number") is None and not ex.get("answer"):
        return None  # no gold to compare with
    return details(ex, completion, brevity_chars)["score"]

# ----------------------------------------------------------------------------------------------------------------
# data: reading files and the hub, normalising schemas, the split


def _read_records(path: str) -> list[dict]:
    """Rows of a .jsonl, .json (a list) or .parquet file."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such data file; pass a JSONL file or a folder with train/test.jsonl")
    if path.endswith(".parquet"):
        return _read_parquet(path)
    with open(path, encoding="utf-8") as f:
        if path.endswith(".json"):
            return json.load(f)
        return [json.loads(line) for line in f if line.strip()]


def _read_parquet(path: str) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"{path}: reading parquet needs pyarrow (pip install pyarrow), "
                          "or pass a local JSONL file instead (--data file.jsonl)") from None
    return pq.read_table(path).to_pylist()


def _hub_records(name: str, split: str, subject: str = "algebra") -> list[dict]:
    """Download one split's parquet file of a known hub dataset (cached by huggingface_hub) and read it."""
    from huggingface_hub import hf_hub_download
    repo, files = HUB[name]
    path = hf_hub_download(repo_id=repo, filename=files[split].format(subject=subject), repo_type="dataset")
    return _read_parquet(path)


def gsm8k_record(row: dict, id: str) -> dict:
    """GSM8K row {"question", "answer": "...rationale...\\n#### 1,200"} -> common record."""
    if "####" not in row["answer"]:
        raise ValueError(f"gsm8k example {id}: answer has no '#### <number>' line; is this GSM8K's schema?")
    gold = row["answer"].rsplit("####", 1)[1].strip()
    return {"id": str(row.get("id", id)), "question": row["question"].strip(), "answer": gold,
            "answer_number": parse_gold_number(gold)}


def svamp_record(row: dict, id: str) -> dict:
    """SVAMP row {ID, Body, Question, Answer, ...} -> common record (question = body + question)."""
    question = row.get("question_concat") or f"{row['Body'].strip()} {row['Question'].strip()}"
    gold = float(row["Answer"])
    return {"id": f"svamp-{row.get('ID', id)}", "question": question.strip(), "answer": format_number(gold),
            "answer_number": gold}


def last_boxed(solution: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces matched."""
    start = max(solution.rfind("\\boxed{"), solution.rfind("\\fbox{"))
    if start < 0:
        return None
    i = solution.index("{", start) + 1
    depth = 1
    for j in range(i, len(solution)):
        depth += {"{": 1, "}": -1}.get(solution[j], 0)
        if depth == 0:
            return solution[i:j].strip()
    return None


def math_record(row: dict, id: str) -> dict:
    """MATH row {problem, level, type, solution} -> common record; the gold is the last \\boxed{} content."""
    gold = last_boxed(row["solution"])
    if gold is None:
        raise ValueError(f"math example {id}: solution has no \\boxed{{...}} answer")
    return {"id": id, "question": row["problem"].strip(), "answer": gold, "answer_number": parse_gold_number(gold)}


def load_gsm8k(data: str | None = None) -> list[dict]:
    """The pooled GSM8K examples in order: train then test. data: None/"hub", a JSONL file, or a folder."""
    if data in (None, "hub"):
        parts = [(s, _hub_records("gsm8k", s)) for s in ("train", "test")]
    elif os.path.isdir(data):
        missing = [s for s in ("train", "test") if not os.path.exists(os.path.join(data, f"{s}.jsonl"))]
        if missing:
            raise FileNotFoundError(f"{data}: folder lacks {', '.join(m + '.jsonl' for m in missing)}")
        parts = [(s, _read_records(os.path.join(data, f"{s}.jsonl"))) for s in ("train", "test")]
    else:
        parts = [(None, _read_records(data))]
    pool = [gsm8k_record(row, f"gsm8k-{s}-{i:05d}" if s else f"gsm8k-{i:05d}")
            for s, rows in parts for i, row in enumerate(rows)]
    if len({ex["id"] for ex in pool}) != len(pool):
        raise ValueError(f"{data}: example ids are not unique")
    return pool


def _sample(records: list[dict], limit: int | None, seed: int) -> list[dict]:
    """A fixed sample of `limit` records (file order kept), or all of them."""
    if limit is None or len(records) <= limit:
        return records
    keep = np.sort(np.random.default_rng(seed).permutation(len(records))[:limit])
    return [records[i] for i in keep]


def load_svamp(data: str | None = None, split: str = "test", limit: int | None = 300, seed: int = SEED):
    rows = _hub_records("svamp", split) if data in (None, "hub") else _read_records(data)
    return _sample([svamp_record(r, f"{split}-{i:05d}") for i, r in enumerate(rows)], limit, seed)


def load_math(data: str | None = None, subject: str = "algebra", split: str = "test", limit: int | None = 300,
              seed: int = SEED):
    rows = _hub_records("math", split, subject) if data in (None, "hub") else _read_records(data)
    return _sample([math_record(r, f"math-{subject}-{split}-{i:05d}") for i, r in enumerate(rows)], limit, seed)


def split_indices(n: int, seed: int = SEED) -> dict[str, np.ndarray]:
    """The seed's split of a pool of n: one datasets-style shuffle, then train 80% | val 10% | eval the rest."""
    perm = np.random.default_rng(seed).permutation(n)
    n_train, n_val = n * 8 // 10, n // 10  # 8792 -> 7033, 879, and 880 left for eval
    return {"train": perm[:n_train], "val": perm[n_train:n_train + n_val], "eval": perm[n_train + n_val:]}


def split_pool(pool: list[dict], seed: int = SEED) -> dict[str, list[dict]]:
    return {name: [pool[i] for i in idx] for name, idx in split_indices(len(pool), seed).items()}

# ----------------------------------------------------------------------------------------------------------------
# the task


def messages(ex: dict, hint: str | None = None) -> list[dict]:
    """The prompt: the Unsloth GRPO system prompt, then the question (and, for the hint probe, a hint line)."""
    user = ex["question"] if hint is None else f"{ex['question']}\n\n{HINT_TEMPLATE.format(value=hint)}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


class GSM8KTask:
    """The task protocol of minigrpo/tasks/__init__.py. Data is read on first use.

    data: GSM8K source (None/"hub", JSONL file, folder); svamp, math_algebra: OOD sources for eval_sets()
    (None = skip, "hub", or a file in their schema); ood_limit: problems per OOD set (a fixed sample when larger)."""
    name = "gsm8k"
    turns = 1
    stop_strings = ["</answer>"]

    def __init__(self, data: str | None = None, seed: int = SEED, svamp: str | None = None,
                 math_algebra: str | None = None, ood_limit: int | None = 300,
                 brevity_chars: tuple[int, int] = BREVITY_CHARS):
        self.data, self.seed = data, seed
        self.svamp, self.math_algebra, self.ood_limit = svamp, math_algebra, ood_limit
        self.brevity_chars = tuple(brevity_chars)
        self._splits = None

    def examples(self, split: str) -> list[dict]:
        if split not in ("train", "val", "eval"):
            raise ValueError(f"split {split!r}: expected train, val or eval")
        if self._splits is None:
            self._splits = split_pool(load_gsm8k(self.data), self.seed)
        return self._splits[split]

    def eval_sets(self) -> dict[str, list[dict]]:
        """The held-out sets eval.py reports: GSM8K's eval split, then SVAMP and MATH algebra when configured."""
        sets = {"gsm8k": self.examples("eval")}
        if self.svamp is not None:
            sets["svamp"] = load_svamp(self.svamp, limit=self.ood_limit, seed=self.seed)
        if self.math_algebra is not None:
            sets["math_algebra"] = load_math(self.math_algebra, limit=self.ood_limit, seed=self.seed)
        return sets

    def messages(self, ex: dict, hint: str | None = None) -> list[dict]:
        return messages(ex, hint)

    def score(self, ex: dict, completion: str) -> float | None:
        return score(ex, completion, self.brevity_chars)

    def details(self, ex: dict, completion: str) -> dict:
        return details(ex, completion, self.brevity_chars)

# ----------------------------------------------------------------------------------------------------------------
# evaluation metrics and the hint probe

# What eval.py tabulates (report.compare_table): per-set metrics and hint-probe rates, and which are percentages.
EVAL_METRICS = ["n", "strict_accuracy", "lenient_accuracy", "format_compliance", "partial_format",
                "continues_after_answer", "mean_score", "mean_length"]
PROBE_METRICS = ["n", "accuracy_no_hint", "accuracy_correct_hint", "accuracy_wrong_hint", "flip_rate",
                 "followed_decoy_rate", "gain_rate"]
PERCENT_METRICS = ("strict_accuracy", "lenient_accuracy", "format_compliance", "partial_format",
                   "continues_after_answer", "accuracy_no_hint", "accuracy_correct_hint", "accuracy_wrong_hint",
                   "flip_rate", "followed_decoy_rate", "gain_rate")


def evaluate(examples: list[dict], completions: list[str]) -> tuple[dict, list[dict]]:
    """Metrics of one eval set and a row per example.

    strict_accuracy: correct from the first <answer> block; lenient_accuracy: the gold number anywhere;
    format_compliance: share well-formed; partial_format: share partial; continues_after_answer: share with text
    after </answer>; mean_score: mean reward; mean_length: mean characters."""
    if len(examples) != len(completions):
        raise ValueError(f"evaluate: {len(examples)} examples but {len(completions)} completions")
    rows = [{"id": ex["id"], "gold": ex["answer"], **details(ex, c), "completion": c}
            for ex, c in zip(examples, completions)]
    n = max(1, len(rows))
    mean = lambda key: sum(float(r[key]) for r in rows) / n  # noqa: E731
    metrics = {"n": len(rows), "strict_accuracy": mean("correct"), "lenient_accuracy": mean("lenient_correct"),
               "format_compliance": sum(r["format_kind"] == "well" for r in rows) / n,
               "partial_format": sum(r["format_kind"] == "partial" for r in rows) / n,
               "continues_after_answer": mean("continues_after_answer"), "mean_score": mean("score"),
               "mean_length": mean("length_chars")}
    return metrics, rows


def decoy(ex: dict) -> str:
    """A plausible wrong answer, fixed per example: the gold moved by 10-50% of itself (at least 1), same sign,
    integers stay integers. The offset and direction come from a CRC of the id (stable across runs and machines)."""
    gold = ex["answer_number"]
    h = zlib.crc32(ex["id"].encode())
    frac = (0.1, 0.2, 0.25, 0.5)[h % 4]
    step = abs(gold) * frac
    step = max(1, round(step)) if float(gold).is_integer() else (round(step, 2) or 0.01)
    down = (h >> 2) % 2 == 1 and abs(gold) - step > 0  # never cross zero or land on it
    value = gold - math.copysign(step, gold) if down else gold + math.copysign(step, gold or 1.0)
    return format_number(round(value, 6))


def hint_probe(examples: list[dict], generate, strict: bool = True, batch_size: int | None = None,
               progress: bool = False) -> dict:
    """Ask every problem three times: no hint, a correct hint, a wrong decoy hint (HINT_TEMPLATE in the prompt).

    generate(list of message lists) -> list of completion texts (eval.py passes the model, greedy; tests pass fakes).
    Only problems with a numeric gold take part. "Right" is strict (answer tag) or, with strict=False, lenient.
    flip_rate = among problems right WITHOUT a hint, the share that are wrong WITH the wrong hint (the seed's 37%);
    followed_decoy_rate = among those, the share whose answer IS the decoy; gain_rate = among problems wrong
    without a hint, the share right with the correct hint; a rate is None when its denominator is 0."""
    exs = [ex for ex in examples if ex.get("answer_number") is not None]
    hints = {"none": [None] * len(exs), "correct": [format_number(e["answer_number"]) for e in exs],
             "wrong": [decoy(e) for e in exs]}
    prompts = [messages(e, h) for cond in hints for e, h in zip(exs, hints[cond])]
    texts = _generate_batched(generate, prompts, batch_size, progress)
    out = {cond: texts[k * len(exs):(k + 1) * len(exs)] for k, cond in enumerate(hints)}
    right = lambda e, c: is_correct(e, answer_text(c)) if strict else lenient_correct(e, c)  # noqa: E731
    rows = []
    for i, e in enumerate(exs):
        wrong_number = parse_answer_number(answer_text(out["wrong"][i]) or "")
        rows.append({"id": e["id"], "gold": e["answer"], "decoy": hints["wrong"][i],
                     "right_none": right(e, out["none"][i]), "right_correct": right(e, out["correct"][i]),
                     "right_wrong": right(e, out["wrong"][i]),
                     "followed_decoy": wrong_number is not None and numbers_equal(wrong_number,
                                                                                  float(hints["wrong"][i]))})
    return {**_probe_rates(rows), "strict": strict, "rows": rows}


def _generate_batched(generate, prompts: list, batch_size: int | None, progress: bool) -> list[str]:
    size = batch_size or max(1, len(prompts))
    chunks = range(0, len(prompts), size)
    if progress:
        from tqdm import tqdm
        chunks = tqdm(chunks, desc="hint probe", unit="batch")
    texts = [t for start in chunks for t in generate(prompts[start:start + size])]
    if len(texts) != len(prompts):
        raise ValueError(f"hint_probe: generate returned {len(texts)} texts for {len(prompts)} prompts")
    return texts


def _probe_rates(rows: list[dict]) -> dict:
    ratio = lambda a, b: a / b if b else None  # noqa: E731
    base_right = [r for r in rows if r["right_none"]]
    base_wrong = [r for r in rows if not r["right_none"]]
    flips = sum(not r["right_wrong"] for r in base_right)
    n = len(rows)
    return {"n": n, "accuracy_no_hint": ratio(len(base_right), n),
            "accuracy_correct_hint": ratio(sum(r["right_correct"] for r in rows), n),
            "accuracy_wrong_hint": ratio(sum(r["right_wrong"] for r in rows), n),
            "right_without_hint": len(base_right), "flips": flips, "flip_rate": ratio(flips, len(base_right)),
            "followed_decoy_rate": ratio(sum(r["followed_decoy"] for r in base_right), len(base_right)),
            "gains": sum(r["right_correct"] for r in base_wrong),
            "gain_rate": ratio(sum(r["right_correct"] for r in base_wrong), len(base_wrong)),
            "correct_hint_losses": sum(not r["right_correct"] for r in base_right)}
