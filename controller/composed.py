"""Prompts the controller composes under a secret seed, judged where no operator set is registered.

The public sets can be answered ahead of time, and answers shipped as drafts gain on those prompts
and on no others (docs/BENCHMARKS.md, "Public answers as drafts"); secret tags do not stop that.
Held-out prompts (held_out.py) do, where an operator has them. A deployment with
`controller.prompts = "composed"` gets such prompts without one: at each Phase 0 the controller
writes a fresh pool of its own, sampling the stock target (temperature 0.8, top-p 0.95) under a
seed drawn from the OS and kept nowhere. A code prompt keeps a public one's instruction and code
fence and is a stub, as HumanEval's are: a sampled signature (`def name(...):`), then a docstring
sampled for it; a question keeps a public one's first 4 tokens and goes on with sampled text; each
cut at the first special token. A sample that repeats one of the pool, or shares a run of
`NOVEL_NGRAM` tokens with any public prompt of its set (the model reciting a benchmark item), is
drawn again. So the judged task is one nobody saw before Phase 0, and no table of answers made
beforehand holds its answer. The pool lives in the controller's records (state `composed`), which
no agent reads and no judged system sees; it holds as many draws' worth of every set as a
comparison and its audit's top-ups take, and two more.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence

import torch

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.deployments.workloads import Prompt, held_out, load_chat_template, load_prompts, target_folder
from specpilot.memory_store import connect, records

from .held_out import MEASURED_ON_THE_POOL
from .scorer import _stock_model

KEY = "composed"
PREFIX = "comp"  # composed prompt ids: comp-<set>-<n>
TEMPERATURE, TOP_P = 0.8, 0.95
NOVEL_NGRAM = 16  # a sample sharing this many tokens in a row with a public prompt is drawn again
SPARE_DRAWS = 2
OPENING_TOKENS = 4  # a prompt with no `def `: its opening is this many tokens
MIN_SAMPLED = 12  # a sample cut shorter than this by a special token is drawn again
MAX_SAMPLED = 96
SIGNATURE_TOKENS, DOC_TOKENS = 24, 64  # a stub's signature line and docstring: at most so many tokens
TRIES = 4  # rounds of drawing again before the pool is declared short


def draws(dep: Deployment) -> int:
    """Draws a composed pool holds: a comparison's, those its audit adds to reach
    `controller.audit_positions` (each of fresh prompts), and `SPARE_DRAWS`."""
    positions = sum(dep.draw_sizes.values()) * dep.workload.max_new_tokens
    return -(-dep.controller.audit_positions // positions) + SPARE_DRAWS


def pool_size(dep: Deployment, name: str) -> int:
    """Prompts of set `name` a composed pool holds: `draws` draws' worth, warm-ups included."""
    return draws(dep) * (dep.draw_sizes[name] + dep.controller.warmup_requests)


def opening(text: str) -> str:
    """What a composed prompt keeps of a public one: a code prompt's instruction and code fence, then
    `def` (its imports left out); else nothing here (the caller keeps the prompt's first few tokens)."""
    at = text.find("def ")
    if at < 0:
        return ""
    fence = text.rfind("```", 0, at)
    line = text.find("\n", fence, at) if fence >= 0 else -1
    return text[: line + 1] + "def" if line >= 0 else text[: at + 3]


def signature(sampled: str) -> str | None:
    """The first line of text sampled after `def`, where it is a signature (`name(...):`)."""
    first = sampled.partition("\n")[0].rstrip()
    return first if first.endswith(":") and "(" in first else None


def docstring(sampled: str) -> str:
    """Docstring text sampled after an opening `\"\"\"`: up to its closing quotes, or (cut short)
    its whole lines, closed."""
    body = sampled.split('"""')[0] if '"""' in sampled else sampled.rpartition("\n")[0]
    return body.rstrip() + '\n    """'


def _ngrams(ids: Sequence[int], n: int) -> set[tuple[int, ...]]:
    return {tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)}


def _prefill(model, openings: list[list[int]], steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Openings of any lengths in one batch, padded on the left to the longest (s tokens), with room
    for `steps` more: their last rows' logits [n, 1, V], and `real` [n, s + steps], True where a
    row's cache slot holds one of its own tokens. A pad attends only to itself (finite K/V that no
    real row attends to); RoPE is relative, so each row's logits are those of its opening alone."""
    n, s = len(openings), max(map(len, openings))
    pads = torch.tensor([s - len(o) for o in openings])
    real = torch.arange(s + steps)[None, :] >= pads[:, None]
    tokens = torch.tensor([[0] * (s - len(o)) + o for o in openings])
    model.setup_cache(n, s + steps)
    mask = (torch.ones(s, s, dtype=torch.bool).tril() & real[:, None, :s]) | torch.eye(s, dtype=torch.bool)
    return model.forward(tokens, torch.arange(s), 0, mask, s, logits_rows=slice(s - 1, s)), real


def _decode(model, nxt: torch.Tensor, at: int, real: torch.Tensor) -> torch.Tensor:
    """Logits [n, 1, V] after the tokens `nxt` [n, 1], written at cache slot `at` of every row."""
    return model.forward(nxt, torch.tensor([at]), at, real[:, None, : at + 1], at + 1)


@torch.inference_mode()
def _sample(
    model,
    openings: list[list[int]],
    steps: int,
    stop: set[int],
    gen: torch.Generator,
    done: Callable[[list[int]], bool] | None = None,
) -> list[list[int]]:
    """Continue each opening by up to `steps` sampled tokens, all in one batch; each continuation cut
    before its first `stop` token. A row is finished at a stop token, or once `done` holds for its
    tokens so far; finished rows leave the batch, cache rows and all (once a quarter of it has
    finished), so the rows still sampling do not pay for them: decoding on the CPU costs in
    proportion to the rows."""
    logits, real = _prefill(model, openings, steps)
    s = real.shape[1] - steps
    rows: list[list[int]] = [[] for _ in openings]
    alive = list(range(len(openings)))  # the opening of each batch row
    finished: set[int] = set()  # openings
    for i in range(steps):
        p = torch.softmax(logits[:, -1] / TEMPERATURE, dim=-1)
        sp, si = p.sort(dim=-1, descending=True)
        sp = sp * (sp.cumsum(-1) - sp < TOP_P)  # the nucleus: the top tokens up to TOP_P of the mass
        nxt = si.gather(1, torch.multinomial(sp, 1, generator=gen))
        for row, t in zip(alive, nxt[:, 0].tolist(), strict=True):
            if row not in finished:
                rows[row].append(t)
                if t in stop or (done is not None and done(rows[row])):
                    finished.add(row)
        if i + 1 == steps or len(finished) == len(openings):
            break
        gone = [b for b, row in enumerate(alive) if row in finished]
        if 4 * len(gone) >= len(alive):
            keep = torch.tensor([b for b, row in enumerate(alive) if row not in finished])
            model.kv, model.batch = model.kv.index_select(2, keep), len(keep)
            real, nxt, alive = real[keep], nxt[keep], [alive[b] for b in keep.tolist()]
        logits = _decode(model, nxt, s + i, real)
    return [row[: next((j for j, t in enumerate(row) if t in stop), len(row))] for row in rows]


def _continue(
    model,
    tok,
    texts: list[str],
    steps: int,
    stop: set[int],
    gen: torch.Generator,
    until: str | None = None,
) -> list[str]:
    """Each text continued by up to `steps` sampled tokens (cut at a `stop` token, or finished once
    the continuation holds `until`), decoded."""
    if not texts:
        return []
    ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    done = None if until is None else (lambda row: until in tok.decode(row))
    return [tok.decode(cont) for cont in _sample(model, ids, steps, stop, gen, done)]


def compose(dep: Deployment, home: Home, seed: int, avoid: frozenset[str] = frozenset()) -> list[Prompt]:
    """A fresh pool: `pool_size` composed prompts of every set of the workload (see the module), none
    of them a text in `avoid` (the last pool's: a confident sample can repeat one)."""
    if dep.engine != "refspec":
        raise SpecPilotError(
            f"deployment {dep.name!r}: composed prompts are sampled by refspec's stock model; engine "
            f'{dep.engine!r} has none here: set controller.prompts = "public" or register held-out prompts'
        )
    tok = load_chat_template(target_folder(dep, home)).tokenizer
    stop = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}  # EOS, chat markers, ...
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
            picks = [public[rng.randrange(len(public))].turns[0] for _ in range(want - len(made))]
            heads = [opening(t) or tok.decode(tok.encode(t, add_special_tokens=False).ids[:OPENING_TOKENS])
                     for t in picks]  # fmt: skip
            code = [i for i, h in enumerate(heads) if h.endswith("def")]
            other = [i for i in range(len(heads)) if i not in code]
            texts = [""] * len(heads)  # what each prompt adds to its opening ("": drawn again)
            for i, t in zip(
                other, _continue(model, tok, [heads[i] for i in other], steps, stop, gen), strict=True
            ):
                texts[i] = t
            # A code prompt is a stub, as HumanEval's are: a sampled signature, then a docstring sampled for it.
            sigs = _continue(model, tok, [heads[i] for i in code], SIGNATURE_TOKENS, stop, gen, until="\n")
            ok = [(i, sig) for i, t in zip(code, sigs, strict=True) if (sig := signature(t)) is not None]
            opened = [sig + '\n    """' for _, sig in ok]
            docs = _continue(
                model,
                tok,
                [heads[i] + o for (i, _), o in zip(ok, opened, strict=True)],
                DOC_TOKENS,
                stop,
                gen,
                until='"""',
            )
            for (i, _), o, d in zip(ok, opened, docs, strict=True):
                texts[i] = o + docstring(d)
            for head, body in zip(heads, texts, strict=True):
                new = tok.encode(body, add_special_tokens=False).ids
                text = head + body
                text += "\n```" if text.count("```") % 2 else ""  # close its fence
                fresh = text not in made and text not in avoid
                if len(new) >= MIN_SAMPLED and not _ngrams(new, NOVEL_NGRAM) & seen and fresh:
                    made.append(text)
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
    """Compose a fresh pool under a seed from the OS and store it (replacing the last, with which it
    shares no prompt); per set."""
    last = frozenset(p.turns[0] for p in load(dep, home) or [])
    prompts = compose(dep, home, random.SystemRandom().getrandbits(63), last)
    db = connect(home)
    for key in MEASURED_ON_THE_POOL:  # measured on the last pool (its ids name other prompts now)
        records.set_state(db, dep.name, key, None)
    records.set_state(db, dep.name, KEY, {"prompts": held_out.to_rows(prompts, prefix=PREFIX)})
    return held_out.counts(prompts)


def load(dep: Deployment, home: Home) -> list[Prompt] | None:
    """The deployment's composed pool, or None (public prompts, or no Phase 0 composed one yet)."""
    got = records.get_state(connect(home), dep.name, KEY)
    return None if got is None else held_out.from_rows(dep, got["prompts"], prefix=PREFIX)
