"""What a system did besides answering, read from the controller's own accounting of a paired run.

Each finding is an integrity violation: the comparison gets no approval, and the reason is named.
- It left its core: its CPU time exceeds what one core gives (where no cpuset confines it, also a
  changed affinity).
- It worked before the timed window: it took far longer than the baseline to report ready (the
  controller sends requests only after ready, over the protocol, so work done then can only be
  work on something else than the requests — or precomputed answers).
- It worked while it was not timed: its CPU seconds before it reported ready, or after it was ready
  outside its turns (waiting for the other system, between turns, and in its exit window after its
  last request, read from its cgroup, which counts exited processes too), far beyond the
  baseline's in the same windows. What a system computes untimed could only serve a timed copy of
  it elsewhere (through a channel jail.py closes) or precompute; either way it is no speed.
- It worked in its warm-up: the warm-up requests are served and never timed, so a system that
  spends far longer on them than the baseline (1.5× + 5 s, the allowance for work before ready)
  computes untimed.
- It produced tokens without computing them: on a CPU slot where the baseline computes (at least
  half a CPU-second per second of serving), its CPU time per second of serving is far below the
  baseline's on the same requests while it serves them faster (a system that paces out answers it
  already has sleeps; one that sleeps and is slower is judged slower, not a cheat). On a
  GPU the CPU time says little of the work; GPU time per token is not accounted yet.
- The baseline ran slower than its own record on the same requests (beside the candidate: the
  candidate slowed it, by design or by using a shared resource such as memory bandwidth, and the
  paired gain is inflated). Requests differ in speed (a prompt the drafter matches well runs twice
  as fast), so the record is per pool request and only requests both runs measured are compared.
- Its work ran on into the baseline's turns (the interleaved design, `carryover`): freezing a
  process leaves the kernels it queued on its GPU running, so a candidate can launch work as it
  answers and slow the baseline's next turn. In ABBA order a pair's first turn follows its own
  system's turn and its second the other's; the requests keep their places from block to block and
  who goes first swaps from block to block, so each system's slowdown right after the other's turn is
  estimated apart from the request and the block (least squares). A slowdown both ways (caches
  both systems warm for themselves) cancels in the pair; the baseline's slowdown in excess of the
  candidate's, beyond `CARRYOVER_FLOOR` and significant at `CARRYOVER_ALPHA`, is a finding.
- The GPU ran slower in the baseline's turns than in its own (`clock_split`): a system that can
  set the device's clocks (application or locked clocks, as root) could lower them as its turn
  ends and raise them as its next begins, which no throttle reason shows. Under load the SM clock
  sits at its boost unless a throttle (power, heat) pulls it down, and those are reported per turn
  (gpu_load.py); so the baseline's median turn clock below the candidate's by `CLOCK_SPLIT` is a
  finding. Every turn starts out of throttle (gpu_load's `settle`), so a system's own power cap
  lowers its turn's later samples, not the turn's highest; the candidate slower is its own cost.
- The GPU's power limit moved (`power_limit_moved`): each system's power cap in its own turns is
  its own cost, which holds only while both run under one limit; a system that can set the limit
  (as root) and lowers it for the other's turns would make its cap the other's cost. The enforced
  limit is read in every turn, and more than one value over a run is a finding.
- Its kernels ran on after its answers (`queued_past_answer`): when the GPU passes to the other
  system the controller waits until it is idle (gpu_load.GpuWatch.drain), so queued work slows no
  one's turn, but it is device time outside the candidate's timing. The candidate seen busy after
  its last answer in more of its turns than the baseline (`UNTIMED_FACTOR` × + `QUEUED_SLACK`) is a
  finding, as its CPU work outside its turns is. So is a single turn after which its kernels
  outlasted the drain (`DRAIN_S`) with nothing else on the GPU: that makes a disturbance, which
  sets the block aside, and a candidate that could set blocks aside would choose which count.
- It gained once the requests repeated (`repeat_gain`, comparisons only): every block serves the
  one draw of its comparison, so a request's first serve is in the first round and every later one
  is a repeat. Fresh processes and the jail leave a system nothing of an earlier block's, except
  through the machine's shared state (the page-cache residency of a read-only file: evicted by one
  process, probed by the next); a system that carried its answers so would draft them on repeats
  and run faster there only. Its gain in the later rounds above the first round's by
  `REPEAT_FLOOR`, significant at `REPEAT_ALPHA` (the spread pooled with Phase 0's A/A blocks'), is
  a finding. It does not see a carry under the floor, one on a changing subset of the requests
  (hidden in the blocks' spread), or one from a comparison to a later one on the prompts both drew
  (docs/ARCHITECTURE.md: the fix is a fresh draw per block).
"""

from __future__ import annotations

import math
import statistics

import numpy as np
from scipy import stats

from .gpu_load import DRAIN_S
from .paired import PairedRun
from .stats import block_logs

CPU_SHARE_LIMIT = 1.05  # CPU seconds per wall second a one-core system may use (accounting slack)
READY_FACTOR, READY_SLACK_S = 1.5, 5.0  # B may take this much longer than A to be ready (s, CPU-s)
UNTIMED_FACTOR, UNTIMED_SLACK_S = 1.5, 1.0  # ... and use this much more CPU outside its turns after it
WORK_FLOOR = 0.5  # B's CPU per serving second must be at least this share of A's ...
COMPUTE_BOUND = 0.5  # ... where A computes on its CPU core (a GPU engine or a fake that sleeps does not)
BASELINE_FLOOR = 0.85  # the baseline's median speed ratio to its record must be at least this
MIN_OVERLAP = 3  # requests measured both now and in the record before the ratio means anything
# The baseline may run this much slower (log time) right after the candidate's turns, beyond the
# candidate's own slowdown after the baseline's, before it is a finding (half of it reaches the gain)
CARRYOVER_FLOOR = 0.01
CARRYOVER_ALPHA = 0.01  # ... and only where the excess is this unlikely without one
CLOCK_SPLIT = 0.03  # the baseline's median SM clock in its turns may be this much below the candidate's
QUEUED_SLACK = 2  # turns B's kernels may run past its answer beyond UNTIMED_FACTOR × A's
REPEAT_FLOOR = 0.03  # B's log gain on repeated requests may exceed its first serves' by this ...
REPEAT_ALPHA = 0.001  # ... and only where the excess is this unlikely without a carry


def violations(run: PairedRun) -> list[str]:
    out: list[str] = []
    for period in run.periods:
        for label, u in period.usage.items():
            slot = period.slots[label]
            if slot.kind != "cpu":
                continue
            if not u.get("cpuset") and u.get("cores") not in (None, str(slot.index)):
                out.append(f"system {label} changed its CPU affinity on {slot} to {u['cores']}")
            if u["wall_s"] > 5 and u["cpu_s"] > CPU_SHARE_LIMIT * u["wall_s"]:
                out.append(f"system {label} used {u['cpu_s']:.1f} CPU-s in {u['wall_s']:.1f} s on one core")
        ready = {lb: u.get("ready_s") for lb, u in period.usage.items()}
        if ready.get("A") and ready.get("B") and ready["B"] > READY_FACTOR * ready["A"] + READY_SLACK_S:
            out.append(f"system B took {ready['B']:.1f} s to report ready against the baseline's {ready['A']:.1f} s: "
                       "work before the timed window")  # fmt: skip
        out += _untimed(period)
        out += _warm_up(period, run.warmup_ids)
        busy = {lb: 0.0 for lb in ("A", "B")}
        wall = {lb: 0.0 for lb in ("A", "B")}
        for turn in period.turns:
            for lb in turn.labels:
                busy[lb] += turn.cpu_s[lb]
                wall[lb] += turn.served_s[lb]
        on_cpu = all(s.kind == "cpu" for s in period.slots.values())
        if on_cpu and wall["A"] > 1 and wall["B"] > 1:
            ua, ub = busy["A"] / wall["A"], busy["B"] / wall["B"]
            if ua >= COMPUTE_BOUND and ub < WORK_FLOOR * ua and wall["B"] < wall["A"]:
                out.append(f"system B used {ub:.2f} CPU-s per second of serving against the baseline's {ua:.2f}: "
                           "tokens without compute")  # fmt: skip
    out += carryover(run) + clock_split(run) + queued_past_answer(run) + power_limit_moved(run)
    return sorted(set(out), key=out.index)


def clock_split(run: PairedRun) -> list[str]:
    """The SM clock of each system's GPU turns (each turn's highest sample, their median over the
    run), the baseline's against the candidate's; nothing where no GPU was watched."""
    clocks: dict[str, list[int]] = {"A": [], "B": []}
    for period in run.periods:
        for turn in period.turns:
            for lb, gpu in turn.gpu.items():
                if lb in clocks and gpu.get("sm_mhz_max"):
                    clocks[lb].append(gpu["sm_mhz_max"])
    if not (clocks["A"] and clocks["B"]):
        return []
    a, b = statistics.median(clocks["A"]), statistics.median(clocks["B"])
    if a < (1 - CLOCK_SPLIT) * b:
        return [f"the GPU ran at {a:.0f} MHz in the baseline's turns against {b:.0f} MHz in the candidate's (medians "
                "of each turn's highest SM clock): the device was slowed for the baseline"]  # fmt: skip
    return []


def power_limit_moved(run: PairedRun) -> list[str]:
    """The GPU's enforced power limit, read in every turn, was not one value over the run (each
    system's power cap is its own cost only while both run under the same limit)."""
    limits: dict[str, set[int]] = {"A": set(), "B": set()}
    for period in run.periods:
        for turn in period.turns:
            for lb, gpu in turn.gpu.items():
                limits.setdefault(lb, set()).update(gpu.get("power_limit_w", ()))
    if len(set().union(*limits.values())) > 1:
        seen = "; ".join(f"{sorted(w)} W in {lb}'s turns" for lb, w in sorted(limits.items()) if w)
        return [f"the GPU's power limit moved during the run ({seen}): something set it between turns"]
    return []


def queued_past_answer(run: PairedRun) -> list[str]:
    """Turns after which the GPU passed to the other system with the turn's kernels still running
    past its last answer, the candidate's against the baseline's (nothing where none was drained)."""
    drained = {"A": 0, "B": 0}
    busy = {"A": 0, "B": 0}
    stuck = 0  # B's turns whose kernels outlasted the drain's limit, nothing else on the GPU
    for period in run.periods:
        for turn in period.turns:
            for lb, gpu in turn.gpu.items():
                if lb in drained and "busy_after_answer_s" in gpu:
                    drained[lb] += 1
                    after = gpu["busy_after_answer_s"]
                    busy[lb] += after is None or after > 0
                    stuck += lb == "B" and after is None and not gpu.get("other_pids")
    out = []
    if busy["B"] > UNTIMED_FACTOR * busy["A"] + QUEUED_SLACK:
        out.append(f"system B's kernels ran on after its last answer in {busy['B']} of the {drained['B']} turns it "
                   f"handed the GPU on, against the baseline's {busy['A']} of {drained['A']}: GPU work outside its "
                   "timed turns")  # fmt: skip
    if stuck:  # a disturbance sets its block aside: the candidate would choose which blocks count
        out.append(f"system B's kernels were still running {DRAIN_S:.0f} s after its last answer in {stuck} turn"
                   f"{'s' * (stuck > 1)}: a block it can have set aside at will")  # fmt: skip
    return out


def carryover(run: PairedRun) -> list[str]:
    """The baseline's slowdown right after the candidate's turns, beyond the candidate's after the
    baseline's (interleaved runs only; too few blocks of either order to tell: no finding)."""
    if run.design != "interleaved":
        return []
    fits = [after_other(run, lb) for lb in ("A", "B")]
    if None in fits:
        return []
    (ca, sa, dfa), (cb, sb, dfb) = fits
    excess, se = ca - cb, math.hypot(sa, sb)
    if excess > CARRYOVER_FLOOR and excess > float(stats.t.ppf(1 - CARRYOVER_ALPHA, min(dfa, dfb))) * se:
        return [f"the baseline ran {math.expm1(ca):.1%} slower right after the candidate's turns than after its own, "
                f"the candidate {math.expm1(cb):+.1%} after the baseline's (excess {excess:.1%} ± {se:.1%}): the "
                "candidate's work runs on into the baseline's turns"]  # fmt: skip
    return []


def repeat_gain(run: PairedRun, aa: tuple[float, int] = (0.0, 0)) -> list[str]:
    """B's gain over A in the later rounds (repeats of the draw) against the first round's (each
    request's first serve), quiet blocks only (the first round's all, where none of them is quiet: a
    system that could set them aside would otherwise hide its first serves). The spread is pooled
    within the two groups and with `aa` (the A/A blocks' pooled sd of log gains and its degrees of
    freedom: Phase 0's noise), so a run of three blocks, one of them first, can tell; no spread to
    pool at all, or no repeat block: no finding."""
    rounds = list(zip(run.block_rounds, run.blocks, run.block_disturbances, strict=True))
    first = [b for r, b, d in rounds if r == 0 and not d] or [b for r, b, _ in rounds if r == 0]
    later = [b for r, b, d in rounds if r > 0 and not d]
    if not first or not later:
        return []
    first, later = block_logs(first), block_logs(later)
    dof = sum(len(g) - 1 for g in (first, later)) + aa[1]
    if dof < 1:
        return []
    ss = sum(float(((g - g.mean()) ** 2).sum()) for g in (first, later)) + aa[0] ** 2 * aa[1]
    sd = math.sqrt(ss / dof)
    excess, se = float(later.mean() - first.mean()), sd * math.sqrt(1 / len(first) + 1 / len(later))
    if excess > REPEAT_FLOOR and excess > float(stats.t.ppf(1 - REPEAT_ALPHA, dof)) * se:
        return [f"the candidate gained {math.expm1(float(later.mean())):+.1%} on the requests it had served before "
                f"against {math.expm1(float(first.mean())):+.1%} on their first serve (excess {excess:.1%} ± {se:.1%}, "
                f"{len(first)} and {len(later)} blocks): a system that runs faster on repeats carries something "
                "from one process to the next"]  # fmt: skip
    return []


def after_other(run: PairedRun, label: str) -> tuple[float, float, int] | None:
    """(c, its standard error, degrees of freedom): the log time by which `label` serves a request
    more slowly right after the other system's turn than after its own, fitted with an effect per
    block and per request; None where the run cannot tell them apart."""
    rows = []
    for k, period in enumerate(run.periods):
        served = sorted(
            (r.t_send, lb, rid, r) for lb, res in period.results.items() for rid, r in res.items()
        )
        for (_, prev, _, _), (_, lb, rid, r) in zip(served, served[1:], strict=False):
            if lb == label and rid not in run.warmup_ids and r.tokens and r.seconds > 0:
                rows.append((k, rid, prev != lb, math.log(r.seconds / len(r.tokens))))
    blocks, reqs = sorted({r[0] for r in rows}), sorted({r[1] for r in rows})
    x = np.zeros((len(rows), len(blocks) + len(reqs)))
    for i, (k, rid, other, _) in enumerate(rows):
        x[i, blocks.index(k)] = 1.0
        if (j := reqs.index(rid)) > 0:  # the first request is the reference
            x[i, len(blocks) + j - 1] = 1.0
        x[i, -1] = float(other)
    dof = len(rows) - x.shape[1]
    if dof < 1 or np.linalg.matrix_rank(x) < x.shape[1]:
        return None
    y = np.array([r[3] for r in rows])
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    cov = float(resid @ resid) / dof * np.linalg.inv(x.T @ x)
    return float(beta[-1]), math.sqrt(max(float(cov[-1, -1]), 0.0)), dof


def _untimed(period) -> list[str]:
    """B's CPU seconds before ready and after ready outside its turns, against A's."""
    u = period.usage
    if not ("A" in u and "B" in u):
        return []
    out = []
    ready = {lb: u[lb].get("ready_cpu_s") for lb in ("A", "B")}
    if None not in ready.values() and ready["B"] > READY_FACTOR * ready["A"] + READY_SLACK_S:
        out.append(f"system B used {ready['B']:.1f} CPU-s before it reported ready against the baseline's "
                   f"{ready['A']:.1f}: work before the timed window")  # fmt: skip
    after = {}
    for lb in ("A", "B"):
        total = u[lb].get("cpu_total_s") if u[lb].get("exit_cpu_s") is not None else None
        if total is None or ready[lb] is None:
            return out  # not measured here (no cgroup): the ready-time check stands alone
        after[lb] = max(0.0, total - ready[lb] - sum(t.cpu_s.get(lb, 0.0) for t in period.turns))
    if after["B"] > UNTIMED_FACTOR * after["A"] + UNTIMED_SLACK_S:
        out.append(f"system B used {after['B']:.1f} CPU-s outside its turns after it was ready (waiting, between "
                   f"turns, exiting) against the baseline's {after['A']:.1f}: work while not timed")  # fmt: skip
    return out


def _warm_up(period, warm: set[str]) -> list[str]:
    """B's seconds on the warm-up requests (the time it ran, when sliced) against A's."""
    took = {
        lb: sum(r.seconds for rid, r in period.results.get(lb, {}).items() if rid in warm)
        for lb in ("A", "B")
    }
    if took["A"] and took["B"] > READY_FACTOR * took["A"] + READY_SLACK_S:
        return [f"system B took {took['B']:.1f} s on its warm-up request{'s' if len(warm) > 1 else ''} against the "
                f"baseline's {took['A']:.1f}: work while not timed"]  # fmt: skip
    return []


def request_speeds(run: PairedRun, label: str, sources: dict[str, str]) -> dict[str, float]:
    """A system's median output speed (tokens/s) per pool request (`sources`: neutral id -> pool id)."""
    by: dict[str, list[float]] = {}
    for p in run.periods:
        for rid, r in p.results[label].items():
            by.setdefault(sources.get(rid, rid), []).append(r.speed)
    return {k: statistics.median(v) for k, v in by.items()}


def baseline_slowed(run: PairedRun, record: dict[str, float] | None, sources: dict[str, str]) -> list[str]:
    """The baseline against its own record (tokens/s of the same tree in the same design, per pool
    request), on the requests both measured."""
    if not isinstance(record, dict):
        return []
    now = request_speeds(run, "A", sources)
    ratios = [now[k] / record[k] for k in now if record.get(k)]
    if len(ratios) < MIN_OVERLAP:
        return []
    ratio = statistics.median(ratios)
    if ratio < BASELINE_FLOOR:
        return [f"the baseline ran {1 - ratio:.0%} slower beside the candidate than its record on the "
                f"{len(ratios)} requests both measured: the candidate slows the system beside it (or something "
                "else did), so the paired gain overstates it"]  # fmt: skip
    return []
