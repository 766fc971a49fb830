"""Request files (CONTRACTS §6): a deployment's workload, sampled, chat-templated and tokenized.

Per set in `workload.sets` (in the spec's order), `samples` prompts are drawn without replacement
by `random.Random("<seed>:<set>")` (string seeds hash with SHA-512, so the draw is the same on
every machine and Python run) and kept in source order. Each prompt's first user turn (MT-Bench:
the first of its two turns) is rendered with the target's chat template — system prompt if set,
`enable_thinking` = workload.thinking, generation prompt on — and tokenized. The file is named by
a hash of everything that decides its bytes (the chosen prompts, the workload, the tokenizer and
template), built once, and written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import SpecPilotError
from ..home import Home
from ..spec import Deployment, Workload
from .chat import load_chat_template, target_folder
from .sources import Prompt, load_prompts

FORMAT = 1  # bump when the rendering rules above change, so old cached files are not reused

# A judged request's prompt: its pool prompt's first turn under a secret tag drawn for it alone
# (controller/context.py), so no candidate can carry answers to the public prompt sets.
VARIANT = "(ref {tag})\n{turn}"


@dataclass
class Request:
    id: str
    set: str
    input_ids: list[int]
    max_new_tokens: int


def sample_prompts(workload: Workload, home: Home) -> list[Prompt]:
    """The workload's prompts: a seeded sample of each set, sets in spec order, items in source order."""
    chosen: list[Prompt] = []
    for name, k in workload.sets.items():
        prompts = load_prompts(name, home)
        if k > len(prompts):
            raise SpecPilotError(
                f"workload asks for {k} samples of {name!r}, which has only {len(prompts)}; "
                f"lower workload.sets.{name}"
            )
        picked = sorted(random.Random(f"{workload.seed}:{name}").sample(range(len(prompts)), k))
        chosen.extend(prompts[i] for i in picked)
    return chosen


def request_file(dep: Deployment, home: Home) -> Path:
    """The deployment's request file under `<cache>/requests/`, built on first use."""
    template = load_chat_template(target_folder(dep, home))  # first: a missing template is the error to name
    return _build(dep, dep.workload, home, sample_prompts(dep.workload, home), template)


def pool_file(dep: Deployment, home: Home) -> Path:
    """Every prompt of the deployment's sets, rendered like its requests: what the controller draws
    judged requests from (a pool far larger than a period uses)."""
    w = dep.workload
    template = load_chat_template(target_folder(dep, home))
    everything = [p for name in w.sets for p in load_prompts(name, home)]
    pool = w.model_copy(update={"sets": {name: len(load_prompts(name, home)) for name in w.sets}})
    return _build(dep, pool, home, everything, template, kind="pool")


def judged_pool(dep: Deployment, home: Home, held: list[Prompt] | None = None) -> list[Request]:
    """What the controller draws judged requests from: the deployment's held-out prompts where it
    has them (`held`, held_out.py), else every prompt of its sets (`pool_file`)."""
    if held is None:
        return load_requests(pool_file(dep, home))
    w = dep.workload
    template = load_chat_template(target_folder(dep, home))
    return [Request(p.id, p.set, template.encode(p.turns[0], w.system_prompt, w.thinking), w.max_new_tokens)
            for p in held]  # fmt: skip


def judged_prompts(
    dep: Deployment,
    home: Home,
    picks: list[tuple[str, str]],
    variant: str = VARIANT,
    held: list[Prompt] | None = None,
) -> list[list[int]]:
    """Token ids of pool prompts as the controller judges them: `(pool id, tag)` each rendered
    like a request from its first turn under the tag (`variant`: the controller's `VARIANT`; a
    benchmark may try another form); the picks are of `held` where given (the deployment's
    held-out prompts), else of its public sets."""
    w = dep.workload
    template = load_chat_template(target_folder(dep, home))
    by_id = (
        {p.id: p for p in held}
        if held is not None
        else {p.id: p for n in w.sets for p in load_prompts(n, home)}
    )
    return [
        template.encode(variant.format(tag=tag, turn=by_id[pid].turns[0]), w.system_prompt, w.thinking)
        for pid, tag in picks
    ]


def _build(dep: Deployment, w: Workload, home: Home, prompts: list[Prompt], template, kind: str = "") -> Path:
    key = hashlib.sha256(
        json.dumps(
            {
                "format": FORMAT,
                "workload": w.model_dump(mode="json"),
                "template": template.fingerprint,
                "prompts": [[p.id, p.turns[0]] for p in prompts],
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()[:20]
    path = home.cache / "requests" / f"{dep.name}-{kind + '-' if kind else ''}{key}.jsonl"
    if path.is_file():
        return path
    lines = []
    for p in prompts:
        ids = template.encode(p.turns[0], w.system_prompt, w.thinking)
        lines.append(json.dumps(asdict(Request(p.id, p.set, ids, w.max_new_tokens))) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    tmp.write_text("".join(lines))
    os.replace(tmp, path)  # readers see the whole file or none
    return path


def load_requests(path: Path) -> list[Request]:
    """The requests of a request file; a malformed line is one error naming the file and line."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SpecPilotError(f"{path}: cannot read the request file ({e})") from None
    requests = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            req = Request(str(row["id"]), str(row["set"]), list(row["input_ids"]), int(row["max_new_tokens"]))
            if not req.input_ids or not all(type(t) is int and t >= 0 for t in req.input_ids):
                raise ValueError("input_ids must be a non-empty list of token ids")
            if req.max_new_tokens <= 0:
                raise ValueError("max_new_tokens must be positive")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise SpecPilotError(
                f"{path}: line {n} is not a request ({e}); each line needs id, set, input_ids, max_new_tokens"
            ) from None
        requests.append(req)
    return requests


def summarize(requests: list[Request]) -> dict[str, dict]:
    """Per set: request count and prompt lengths in tokens (min, mean, max)."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r.set for r in requests):
        lengths = [len(r.input_ids) for r in requests if r.set == name]
        out[name] = {
            "requests": len(lengths),
            "min_tokens": min(lengths),
            "mean_tokens": round(sum(lengths) / len(lengths), 1),
            "max_tokens": max(lengths),
            "max_new_tokens": next(r.max_new_tokens for r in requests if r.set == name),
        }
    return out
