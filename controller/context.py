"""What every judgement of a deployment starts from: its workspace, its slots, its requests, the
controller's own digest.

Judged requests are drawn afresh for each run from the pool of every prompt of the deployment's
sets (as many per set as the workload samples), with a secret seed, and carry neutral ids
(`r00`, `r01`, ...): a system cannot know which requests a period will bring, nor tell a judged
run from any other. The prompt sets are public, so each judged prompt also carries a secret tag
of its own (32 random bits, `workloads.VARIANT`): the greedy answer to a tagged prompt is mostly
not the answer to the public one (SmolLM2, 64 tokens: 17 of 24 answers differ, from the 19th token
at the median; bench/tagged_answers.py), so a candidate that ships answers to the sets and paces
them out emits wrong tokens, which the audit finds. (An answer a tag does not move could still be
shipped, and shipped answers used as drafts gain on the tokens a tag left as they were: see
docs/BENCHMARKS.md, "Public answers as drafts".) Where the operator has registered held-out
prompts (held_out.py), the pool is those alone and nothing public answers them; else, with
`controller.prompts = "composed"`, the pool is the one Phase 0 composed (composed.py). A request's
source is `<pool id>#<tag>`; the draw (`held_out`, `composed`) and the sources are recorded in the
run's evidence.

A batch deployment (`serving.shape = "batch"`) is measured on groups: one group per batch size B
(id `b{B}`, served B at a time), each of its own drawn requests (as many per set as the workload
samples; no request twice in a period, so no system can replay an answer it already gave), so a
group's speed is the output throughput at B and a block's mean log ratio is the geometric mean
over batch sizes (paper §5.1).
What reads outputs request by request (the audit, Phase 0's scoring) takes the groups apart with
`flatten`.
"""

from __future__ import annotations

import random
from pathlib import Path

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.deployments.workloads import judged_pool, judged_prompts, load_requests, request_file
from specpilot.memory_store import Workspace, records

from . import composed, held_out
from .engine import Group, Request
from .integrity import check_digest, controller_digest
from .placement import available_cores, require_pairing
from .slots import Slot
from .systems import ENGINE_PROTECTED


def workspace(home: Home, dep: Deployment) -> Workspace:
    """The deployment's workspace: its repository, and the cache the judged systems are exported to."""
    return Workspace.open(home, dep.name)


def slots_of(dep: Deployment) -> tuple[Slot, ...]:
    """The deployment's device slots for a paired run: all (sliced design), two (swapped) or one
    (interleaved)."""
    keep = {"sliced": None, "swapped": 2, "interleaved": 1}[dep.design]
    slots = tuple(Slot.parse(s) for s in dep.devices.slots[:keep])
    for s in slots:
        s.check_exists()
    if dep.design == "interleaved" and any(s.kind != "cpu" for s in slots):
        require_pairing(available_cores())  # before anything runs or is stored
    return slots


def tuning_requests(dep: Deployment, home: Home, limit: int | None = None) -> list[Request]:
    """The deployment's own request file (what agents see and tune on): never used for a verdict."""
    reqs = [Request(r.id, r.input_ids, r.max_new_tokens) for r in load_requests(request_file(dep, home))]
    return reqs[:limit] if limit else reqs


ANCHORS = 4  # measured requests a draw takes from the baseline's speed record, where it has them


def draw_requests(dep: Deployment, home: Home, seed: int | None = None,
                  anchors: frozenset[str] = frozenset(), exclude: frozenset[str] = frozenset(),
                  ) -> tuple[list[Request], dict]:  # fmt: skip
    """Warm-up + measured requests drawn from the pool, with neutral ids; and the draw's record.

    `anchors`: the sources (`<pool id>#<tag>`) the baseline's speed record holds; up to `ANCHORS`
    of the measured requests are drawn among them, tag and all (each in place of one of its own
    set), so the check of the baseline against its record (checks.baseline_slowed) has requests to
    compare by design, not by luck: a prompt's speed depends on its tag (one HumanEval prompt ran
    at 118 tokens/s untagged, 33 tagged). Which ones is as secret as the rest of the draw; they are
    the only tagged prompts judged twice, and only the controller's state holds their tags. (Not
    for batch groups: a group's record is of its exact members.) `exclude`: pool ids not to draw
    (an audit's further draws)."""
    seed = random.SystemRandom().getrandbits(64) if seed is None else seed
    rng = random.Random(seed)
    held, composed_pool = held_out.load(dep, home), None
    if held is None and dep.controller.prompts == "composed":
        held = composed_pool = composed.load(dep, home)
        if held is None:
            raise SpecPilotError(
                f"deployment {dep.name!r} judges on composed prompts and none are composed yet: run "
                f"`specpilot phase0 -d {dep.name}` (Phase 0 composes them)"
            )
    pool = [r for r in judged_pool(dep, home, held) if r.id not in exclude]
    by_set: dict[str, list] = {}
    for r in pool:
        by_set.setdefault(r.set, []).append(r)
    n_groups = dep.groups
    chosen = []
    for name, need in dep.draw_sizes.items():
        have = by_set.get(name, [])
        if len(have) < need:
            per = f" ({dep.workload.sets[name]} for each of {n_groups} batch sizes)" if n_groups > 1 else ""
            where, fix = (
                ("its composed pool holds", "")
                if composed_pool is not None
                else ("its held-out prompts hold", "add more with `specpilot workloads held-out add` or ")
                if held is not None
                else ("its pool holds", "")
            )
            raise SpecPilotError(
                f"deployment {dep.name!r}: a draw needs {need} prompts of set {name!r}{per}, "
                f"{where} {len(have)}; {fix}lower workload.sets.{name}"
            )
        chosen += rng.sample(have, need)
    tags = {r.id: f"{rng.getrandbits(32):08x}" for r in chosen}
    if anchors and n_groups == 1:
        recorded = dict(a.split("#", 1) for a in sorted(anchors) if "#" in a)  # pool id -> its tag
        known = [r for r in pool if r.id in recorded and r not in chosen and r.set in dep.workload.sets]
        for a in rng.sample(known, min(ANCHORS, len(known), len(chosen))):
            same = [i for i, r in enumerate(chosen) if r.set == a.set and r.id not in recorded]
            if same:
                chosen[rng.choice(same)] = a
                tags[a.id] = recorded[a.id]
    rng.shuffle(chosen)
    warm = rng.sample(
        [r for r in pool if r not in chosen], min(dep.controller.warmup_requests, len(pool) - len(chosen))
    )
    tags |= {r.id: f"{rng.getrandbits(32):08x}" for r in warm}
    picked = warm + chosen
    prompts = judged_prompts(dep, home, [(r.id, tags[r.id]) for r in picked], held=held)
    reqs = [Request(f"r{i:02d}", ids, r.max_new_tokens)
            for i, (ids, r) in enumerate(zip(prompts, picked, strict=True))]  # fmt: skip
    sources = {q.id: f"{r.id}#{tags[r.id]}" for q, r in zip(reqs, picked, strict=True)}
    if dep.serving.shape == "batch":
        warm_reqs, measured = reqs[: len(warm)], reqs[len(warm) :]
        per = len(measured) // n_groups
        groups = [Group(f"b{b}", b, tuple(measured[i * per : (i + 1) * per]))
                  for i, b in enumerate(dep.serving.batch_sizes)]  # fmt: skip
        # A group's source names its members, so a speed record never pairs two different groups.
        sources |= {g.id: f"{g.batch}x[" + ",".join(sources[r.id] for r in g.requests) + "]" for g in groups}
        reqs = warm_reqs + groups
    return reqs, {"seed": seed, "pool": len(pool), "held_out": held is not None and composed_pool is None,
                  "composed": composed_pool is not None, "sources": sources}  # fmt: skip


def flatten(
    reqs: list[Request | Group], outputs: dict[str, list[int]] | None = None
) -> tuple[list[Request], dict[str, list[int]]]:
    """Each group's requests as requests of their own (ids `b4/r03`), with their outputs cut from
    the group's (its requests' outputs in order); single requests as they are."""
    flat: list[Request] = []
    out: dict[str, list[int]] = {}
    for r in reqs:
        if not isinstance(r, Group):
            flat.append(r)
            if outputs is not None and r.id in outputs:
                out[r.id] = outputs[r.id]
            continue
        at = 0
        for q in r.requests:
            rid = f"{r.id}/{q.id}"
            flat.append(Request(rid, q.input_ids, q.max_new_tokens))
            if outputs is not None and r.id in outputs:
                out[rid] = outputs[r.id][at : at + q.max_new_tokens]
            at += q.max_new_tokens
    return flat, out


def pool_id(source: str) -> str:
    """The pool prompt of a request's source (`<pool id>#<tag>`)."""
    return source.split("#", 1)[0]


def more_requests(dep: Deployment, home: Home, used: set[str]) -> tuple[list[Request], dict] | None:
    """One more draw, shaped exactly as a timed run's (as many warm-up and measured requests of
    each set, a batch deployment's groups, ids from r00), of pool prompts outside `used` (sources),
    with a fresh secret seed: what an audit adds when a run's outputs are too few to score. None
    when the pool has too few left."""
    try:
        return draw_requests(dep, home, exclude=frozenset(pool_id(s) for s in used))
    except SpecPilotError:
        return None


def protected_paths(dep: Deployment) -> list[str]:
    return ENGINE_PROTECTED.get(dep.engine, []) + list(dep.controller.protected)


def judge_digest(dep: Deployment, home: Home) -> str:
    """The digest of everything that decides or records this deployment's verdicts (integrity.py)."""
    weights = None
    if dep.engine == "refspec":
        from .refspec_system import weights_folder

        weights = weights_folder(dep, home)
    elif Path(dep.target.model).is_dir():
        weights = Path(dep.target.model)
    return controller_digest(weights, home.cache / "digests")


def digest(db, dep: Deployment, home: Home) -> str:
    return check_digest(
        records.get_state(db, dep.name, "controller_digest"), dep.name, judge_digest(dep, home)
    )
