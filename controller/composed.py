"""Prompts the controller composes under a secret seed, judged where no operator set is registered.

The public sets can be answered ahead of time, and answers shipped as drafts gain on those prompts
and on no others (docs/BENCHMARKS.md, "Public answers as drafts"); secret tags do not stop that.
Held-out prompts (held_out.py) do, where an operator has them. A deployment with
`controller.prompts = "composed"` gets such prompts without one: at each Phase 0 the controller
writes a fresh pool of its own. Each prompt starts from a public prompt's opening (a code prompt's
instruction and code fence, then `def`; else its first few tokens) and goes on with text the stock
target samples (temperature 0.8, top-p 0.95) under a seed drawn from the OS and kept nowhere, cut
at the first special token; a sample that shares a run of `NOVEL_NGRAM` tokens with any public
prompt of its set (the model reciting a benchmark item) is drawn again. So the judged task (a code
prompt's function name, signature and docstring; a question's substance) is one nobody saw before
Phase 0, and no table of answers made beforehand holds its answer. The pool lives in the
controller's records (state `composed`), which no agent reads and no judged system sees; it holds
as many draws' worth of every set as a comparison and its audit's top-ups take, and two more.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

import torch

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.deployments.workloads import Prompt, held_out, load_chat_template, load_prompts, target_folder
from specpilot.memory_store import connect, records

from .scorer import _stock_model

KEY = "composed"
PREFIX = "comp"  # composed prompt ids: comp-<set>-<n>
TEMPERATURE, TOP_P = 0.8, 0.95
NOVEL_NGRAM = 16  # a sample sharing this many tokens in a row with a public prompt is drawn again
SPARE_DRAWS = 2
OPENING_TOKENS = 4  # a prompt with no `def `: its opening is this many tokens
MIN_SAMPLED = 12  # a sample cut shorter than this by a special token is drawn again
MAX_SAMPLED = 96
TRIES = 4  # rounds of drawing again before the pool is declared short


def draws(dep: Deployment) -> int:
    """Draws a composed pool holds: a comparison's, those its audit adds to reach
    `controller.audit_positions` (each of fresh prompts), and `SPARE_DRAWS`."""
    groups = len(dep.serving.batch_sizes) if dep.serving.shape == "batch" else 1
    positions = sum(dep.workload.sets.values()) * groups * dep.workload.max_new_tokens
    return -(-dep.controller.audit_positions // positions) + SPARE_DRAWS


def pool_size(dep: Deployment, name: str) -> int:
    """Prompts of set `name` a composed pool holds: `draws` draws' worth, warm-ups included."""
    groups = len(dep.serving.batch_sizes) if dep.serving.shape == "batch" else 1
    return draws(dep) * (dep.workload.sets[name] * groups + dep.controller.warmup_requests)


def opening(text: str) -> str:
    """What a composed prompt keeps of a public one: a code prompt's instruction and code fence, then
    `def` (its imports left out, so every opening of a set is one length and samples in one batch);
    else nothing here (the caller keeps the prompt's first few tokens)."""
    at = text.find("def ")
    if at < 0:
        return ""
    fence = text.rfind("```", 0, at)
    line = text.find("\n", fence, at) if fence >= 0 else -1
    return text[: line + 1] + "def" if line >= 0 else text[: at + 3]


def _ngrams(ids: Sequence[int], n: int) -> set[tuple[int, ...]]:
    return {tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)}


@torch.inference_mode()
def _sample(
    model, openings: list[list[int]], steps: int, stop: set[int], gen: torch.Generator
) -> list[list[int]]:
    """Continue each opening (all of one length) by up to `steps` sampled tokens, in one batch;
    each continuation cut before its first `stop` token."""
    n, s = len(openings), len(openings[0])
    model.setup_cache(n, s + steps)
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    logits = model.forward(torch.tensor(openings), torch.arange(s), 0, mask, s, logits_rows=slice(s - 1, s))
    out = []
    for i in range(steps):
        p = torch.softmax(logits[:, -1] / TEMPERATURE, dim=-1)
        sp, si = p.sort(dim=-1, descending=True)
        sp = sp * (sp.cumsum(-1) - sp < TOP_P)  # the nucleus: the top tokens up to TOP_P of the mass
        nxt = si.gather(1, torch.multinomial(sp, 1, generator=gen))
        out.append(nxt)
        logits = model.forward(nxt, torch.tensor([s + i]), s + i, None, s + i + 1)
    rows = torch.cat(out, 1).tolist()
    return [row[: next((j for j, t in enumerate(row) if t in stop), len(row))] for row in rows]


def compose(dep: Deployment, home: Home, seed: int) -> list[Prompt]:
    """A fresh pool: `pool_size` composed prompts of every set of the workload (see the module)."""
    if dep.engine != "refspec":
        raise SpecPilotError(
            f"deployment {dep.name!r}: composed prompts are sampled by refspec's stock model; engine "
            f'{dep.engine!r} has none here: set controller.prompts = "public" or register held-out prompts'
        )
    tok = load_chat_template(target_folder(dep, home)).tokenizer
    stop = {
        i for t, i in tok.get_vocab(with_added_tokens=True).items() if t.startswith("<|")
    }  # chat markers, EOS
    model = _stock_model(dep.target.model, str(home.cache), "cpu")
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    rows: list[dict] = []
    for name in dep.workload.sets:
        public = load_prompts(name, home)
        public_ids = [tok.encode(p.turns[0], add_special_tokens=False).ids for p in public]
        seen = set().union(*(_ngrams(ids, NOVEL_NGRAM) for ids in public_ids))
        steps = min(MAX_SAMPLED, max(MIN_SAMPLED * 2, int(statistics.median(len(i) for i in public_ids))))
        want, made = pool_size(dep, name), []
        for _ in range(TRIES):
            picks = [rng.randrange(len(public)) for _ in range(want - len(made))]
            by_len: dict[int, list[tuple[str, list[int]]]] = {}
            for k in picks:
                head = opening(public[k].turns[0])
                ids = (
                    tok.encode(head, add_special_tokens=False).ids if head else public_ids[k][:OPENING_TOKENS]
                )
                by_len.setdefault(len(ids), []).append((head or tok.decode(ids), ids))
            for group in by_len.values():
                heads, conts = [h for h, _ in group], _sample(model, [i for _, i in group], steps, stop, gen)
                for head, cont in zip(heads, conts, strict=True):
                    if len(cont) >= MIN_SAMPLED and not _ngrams(cont, NOVEL_NGRAM) & seen:
                        text = head + tok.decode(cont)
                        made.append(text + "\n```" if text.count("```") % 2 else text)  # close its fence
            if len(made) >= want:
                break
        if len(made) < want:
            raise SpecPilotError(
                f"deployment {dep.name!r}: composed {len(made)} of {want} prompts of set {name!r} in "
                f"{TRIES} tries (samples recited public prompts or stopped early); run Phase 0 again"
            )
        rows += [{"set": name, "id": str(i), "turns": [t]} for i, t in enumerate(made[:want])]
    return held_out.from_rows(dep, rows, "the composed prompts", prefix=PREFIX)


def make(dep: Deployment, home: Home) -> dict[str, int]:
    """Compose a fresh pool under a seed from the OS and store it (replacing the last); per set."""
    prompts = compose(dep, home, random.SystemRandom().getrandbits(63))
    records.set_state(connect(home), dep.name, KEY, {"prompts": held_out.to_rows(prompts, prefix=PREFIX)})
    return held_out.counts(prompts)


def load(dep: Deployment, home: Home) -> list[Prompt] | None:
    """The deployment's composed pool, or None (public prompts, or no Phase 0 composed one yet)."""
    got = records.get_state(connect(home), dep.name, KEY)
    return None if got is None else held_out.from_rows(dep, got["prompts"], prefix=PREFIX)
