"""GSM8K with verifiable rewards (RLVR): data and split, the answer-tag prompt, rewards (its eval metrics and the
hint probe: minigrpo/evals/gsm8k.py).

Reproduces the gsm8k reference run's recipe (Qwen3-1.7B-Base, GRPO on GSM8K). Every example, whatever its source, is
one record: {"id", "question", "answer" (the gold answer as a string), "answer_number" (float, or None when the gold
is not a plain number, which happens only in MATH)}.

Data
- GSM8K: `openai/gsm8k` config "main" from the hub (its two parquet files, read with pyarrow, an optional
  dependency), or a local JSONL file in GSM8K's schema ({"question", "answer"} with the answer ending "#### 42"),
  or a folder holding train.jsonl and test.jsonl.
- The split (the gsm8k run's): train then test pooled (7,473 + 1,319 = 8,792), shuffled once with seed 3407, cut
  80/10/10 into train/val/eval. The shuffle is exactly what `datasets.Dataset.shuffle(seed=3407)` does:
  `np.random.default_rng(3407).permutation(n)` (arrow_dataset.py: `generator = np.random.default_rng(seed)`;
  `permutation = generator.permutation(len(self))`; then `select`). The cut is in integer arithmetic: train =
  floor(0.8 n), val = floor(0.1 n), eval = the rest, which gives the gsm8k run's 8,792 -> 7,033 / 879 / 880. The eval
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
  <reasoning>...</reasoning> pair. Text after </answer> makes a completion partial at best: the gsm8k run's rewards
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

import numpy as np

from minigrpo.errors import first_line
from minigrpo.tasks.base import SingleTurnTask

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
    """True when anything but whitespace / EOS text follows the first </answer> (the gsm8k run's rambling check)."""
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


def _read_records(path: str) -> list[tuple[str, dict]]:
    """(where, row) for each row of a .jsonl, .json (a list) or .parquet file; `where` names the file and the line
    or row, for the one line a bad row gets."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such data file; pass a JSONL file or a folder with train/test.jsonl")
    if path.endswith(".parquet"):
        return [(f"{path} row {i + 1}", r) for i, r in enumerate(_read_parquet(path))]
    try:
        with open(path, encoding="utf-8") as f:
            if path.endswith(".json"):
                rows = json.load(f)
                if not isinstance(rows, list):
                    raise ValueError(f"{path}: expected a JSON list of records, got a {type(rows).__name__}")
                return [(f"{path} record {i + 1}", r) for i, r in enumerate(rows)]
            out = []
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        out.append((f"{path} line {n}", json.loads(line)))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path} line {n}: not valid JSON ({e.msg}); a JSONL file holds one JSON "
                                         "object per line") from None
            return out
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text; pass a JSONL, JSON or parquet file") from None


def _read_parquet(path: str) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"{path}: reading parquet needs pyarrow (pip install pyarrow), "
                          "or pass a local JSONL file instead (--data file.jsonl)") from None
    return pq.read_table(path).to_pylist()


HUB_INSTEAD = {"gsm8k": "--data FILE.jsonl or a folder holding train.jsonl and test.jsonl",
               "svamp": "--svamp FILE.jsonl", "math": "--math FILE.jsonl"}


def _hub_records(name: str, split: str, subject: str = "algebra") -> list[tuple[str, dict]]:
    """(where, row) of one split's parquet file of a known hub dataset (downloaded and cached by huggingface_hub)."""
    from huggingface_hub import hf_hub_download
    from minigrpo import hub
    repo, files = HUB[name]
    file = files[split].format(subject=subject)
    try:
        path = hub.fetch(hf_hub_download, repo_id=repo, filename=file, repo_type="dataset")
    except Exception as e:   # offline, a proxy, no such file: one line saying what to pass instead
        raise OSError(f"{repo}: the hub download of {file} failed ({type(e).__name__}: {first_line(e)}); offline, "
                      f"pass {HUB_INSTEAD[name]}") from None
    return [(f"{repo} {file} row {i + 1}", r) for i, r in enumerate(_read_parquet(path))]


def _need(row, where: str, schema: str, **fields):
    """Check that `row` holds each field with a value of its type; a bad row is one line naming file and line."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object {schema}, got a {type(row).__name__}")
    for key, kind in fields.items():
        if key not in row:
            raise ValueError(f"{where}: no {key!r} field; expected {schema}")
        if not isinstance(row[key], kind) or isinstance(row[key], bool):
            raise ValueError(f"{where}: {key!r} is {json.dumps(row[key])[:40]}, not a "
                             f"{' or '.join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))}")


def gsm8k_record(row: dict, id: str, where: str | None = None) -> dict:
    """GSM8K row {"question", "answer": "...rationale...\\n#### 1,200"} -> common record."""
    where = where or f"gsm8k example {id}"
    _need(row, where, '{"question": "...", "answer": "... #### 42"} (GSM8K\'s schema)', question=str, answer=str)
    if "####" not in row["answer"]:
        raise ValueError(f"{where}: answer has no '#### <number>' line; is this GSM8K's schema?")
    gold = row["answer"].rsplit("####", 1)[1].strip()
    return {"id": str(row.get("id", id)), "question": row["question"].strip(), "answer": gold,
            "answer_number": parse_gold_number(gold)}


def svamp_record(row: dict, id: str, where: str | None = None) -> dict:
    """SVAMP row {ID, Body, Question, Answer, ...} -> common record (question = body + question)."""
    where, schema = where or f"svamp example {id}", "SVAMP's {\"Body\", \"Question\", \"Answer\"}"
    _need(row, where, schema, Answer=(int, float))
    if not row.get("question_concat"):
        _need(row, where, schema, Body=str, Question=str)
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


def math_record(row: dict, id: str, where: str | None = None) -> dict:
    """MATH row {problem, level, type, solution} -> common record; the gold is the last \\boxed{} content."""
    where = where or f"math example {id}"
    _need(row, where, "MATH's {\"problem\", \"solution\"}", problem=str, solution=str)
    gold = last_boxed(row["solution"])
    if gold is None:
        raise ValueError(f"{where}: solution has no \\boxed{{...}} answer")
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
    pool = [gsm8k_record(row, f"gsm8k-{s}-{i:05d}" if s else f"gsm8k-{i:05d}", where)
            for s, rows in parts for i, (where, row) in enumerate(rows)]
    if not pool:
        raise ValueError(f"{data}: no examples in it (an empty file); pass GSM8K's JSONL, one problem per line")
    if len({ex["id"] for ex in pool}) != len(pool):
        raise ValueError(f"{data}: example ids are not unique")
    return pool


def _sample(records: list[dict], limit: int | None, seed: int) -> list[dict]:
    """A fixed sample of `limit` records (file order kept), or all of them."""
    if limit is None or len(records) <= limit:
        return records
    chosen = np.sort(np.random.default_rng(seed).permutation(len(records))[:limit])
    return [records[i] for i in chosen]


def load_svamp(data: str | None = None, split: str = "test", limit: int | None = 300, seed: int = SEED):
    rows = _hub_records("svamp", split) if data in (None, "hub") else _read_records(data)
    return _sample([svamp_record(r, f"{split}-{i:05d}", w) for i, (w, r) in enumerate(rows)], limit, seed)


def load_math(data: str | None = None, subject: str = "algebra", split: str = "test", limit: int | None = 300,
              seed: int = SEED):
    rows = _hub_records("math", split, subject) if data in (None, "hub") else _read_records(data)
    return _sample([math_record(r, f"math-{subject}-{split}-{i:05d}", w) for i, (w, r) in enumerate(rows)], limit,
                   seed)


def split_indices(n: int, seed: int = SEED) -> dict[str, np.ndarray]:
    """The gsm8k run's split of a pool of n: one datasets-style shuffle, then train 80% | val 10% | eval the rest."""
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


class GSM8KTask(SingleTurnTask):
    """The task protocol of minigrpo/tasks/__init__.py. Data is read on first use.

    data: GSM8K source (None/"hub", JSONL file, folder); svamp, math_algebra: OOD sources for eval_sets()
    (None = skip, "hub", or a file in their schema); ood_limit: problems per OOD set (a fixed sample when larger)."""
    name = "gsm8k"
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
