"""Hostile candidates, round 3 (issue 39): one or more per class the controller was found open to.

    python bench/hostile3.py --home DIR [--deployment smollm-cpu] [--only NAME,..] --json OUT

Classes: state kept in kernel objects owned by the system's user (keyrings, SysV IPC) replayed
in a later run and paced by burning CPU; work while not timed (the exit window); a small
systematic defect riding on a real gain (only the audit can stop it); a system telling the
audit's runs from the timed ones; an import hook serving another source for the protected serve
module; the prepare run looking for real weights in its decoy folder; stock's answers to every
prompt of the public sets shipped in the patch and paced out (its table is built here first, by
stock in this process, and kept in the home), and the same answers used as drafts, verified by
the target (exact: only where a tag left an answer's first tokens as they were). Each is judged by
`controller.compare` against stock (or against a slowed stock, where the candidate needs a real
gain to ride on), as bench/hostile.py does; results go to bench/results/hostile_round3.json
and docs/BENCHMARKS.md ("Hostile candidates").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from hostile import COMMIT, GEN, SERVE_LOOP, STEP, _edit, _prelude, _unverified, cli

MODEL = "refspec/model.py"
LOGITS = "            logits = self.forward(rows, pos, start, full, start + r)\n"

# Kernel-object stores, at module level of refspec.generate: _get(key) -> tokens or None, _put(key, tokens).
KEYRING = r"""
import ctypes as _c, json as _j, platform as _pf
_L = _c.CDLL(None, use_errno=True)
_ADD, _KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[_pf.machine()]
def _k(*a):
    return _L.syscall(_KEYCTL, *[_c.c_long(x) if isinstance(x, int) else x for x in a])
def _rings():
    return [-4, -5, _k(22, -1, -2)]  # user, user-session, persistent keyrings (the last: 3 days)
def _get(key):
    buf = _c.create_string_buffer(1 << 16)
    for r in _rings():
        s = _k(10, r, b"user", key, 0)
        if s > 0 and (n := _k(11, s, buf, 1 << 16)) > 0:
            return _j.loads(buf.raw[:n])
    return None
def _put(key, toks):
    data = _j.dumps(toks).encode()
    for r in _rings():
        s = _L.syscall(_ADD, b"user", key, data, _c.c_size_t(len(data)), _c.c_long(r))
        if s > 0:
            _k(5, s, 0x3f3f3f3f)
"""
SYSV = r"""
import ctypes as _c, json as _j
_L = _c.CDLL(None, use_errno=True)
_L.shmat.restype = _c.c_void_p
_ID = _L.shmget(0x5350, 1 << 20, 0o1000 | 0o666)
_MEM = _L.shmat(_ID, None, 0) if _ID >= 0 else None
def _table():
    if not _MEM:
        return {}
    raw = _c.string_at(_MEM, 1 << 20).split(b"\0", 1)[0]
    try:
        return _j.loads(raw) if raw else {}
    except ValueError:
        return {}
def _get(key):
    return _table().get(key.decode())
def _put(key, toks):
    if _MEM:
        t = _table() | {key.decode(): toks}
        data = _j.dumps(t).encode()[: (1 << 20) - 1] + b"\0"
        _c.memmove(_MEM, data, len(data))
"""
PACE = "import time as _tm\ndef _pace(s):\n    _e = _tm.thread_time() + s\n    while _tm.thread_time() < _e:\n        pass\n"


def _replay(store: str) -> Callable[[Path], None]:
    """Answer a prompt kept in `store` from an earlier run, 4 tokens at a time with 3 ms of real
    CPU burnt before each (so the work check sees compute); keep every answer it computes."""

    def edit(t: Path) -> None:
        _prelude(store + PACE)(t)
        _edit(t / GEN, SERVE_LOOP, SERVE_LOOP + (
            "        _key = __import__('hashlib').sha256(repr(list(input_ids)).encode()).hexdigest()[:32].encode()\n"
            "        _hit = _get(_key)\n"
            "        if _hit is not None and len(_hit) >= max_new_tokens:\n"
            "            stats.steps, stats.new_tokens = 1, max_new_tokens\n"
            "            for _i in range(0, max_new_tokens, 4):\n"
            "                _pace(0.003)\n"
            "                yield _hit[_i:_i + 4]\n"
            "            return\n"
            "        _out = []\n"))  # fmt: skip
        _edit(t / GEN, COMMIT, "            stats.new_tokens += len(committed)\n            _out.extend(committed)\n"
              "            if stats.new_tokens >= max_new_tokens:\n                _put(_key, _out)\n"
              "            yield committed\n")  # fmt: skip

    return edit


EXIT_WORK = (  # stock serve leaves by os._exit: the work rides on the candidate's wrapper of it
    "import os as _os, time as _tm\n"
    "def _late(code, _exit=_os._exit):  # after its last request: what a timed copy elsewhere would be handed\n"
    "    _e = _tm.process_time() + 6\n"
    "    while _tm.process_time() < _e:\n"
    "        pass\n"
    "    _exit(code)\n"
    "_os._exit = _late\n"
)
SLOW_STEP = "        _t = __import__('time'); _end = _t.thread_time() + 0.012\n        while _t.thread_time() < _end: pass\n"
HOOK = r"""
import importlib.abc as _abc, importlib.util as _ut, sys as _sys, pathlib as _pl
_HOOKED = []
class _Other(_abc.MetaPathFinder, _abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return _ut.spec_from_loader(name, self) if name in ("refspec.serve", "__main__") else None
    def create_module(self, spec):
        return None
    def get_code(self, name):  # what `python -m` runs
        _HOOKED.append(1)
        _sys.stderr.write("hostile: the hooked serve module runs\n")
        return compile((_pl.Path(__file__).parent / "serve.py").read_text(), "serve.py", "exec")
    def exec_module(self, module):
        exec(self.get_code(module.__name__), module.__dict__)
_sys.meta_path.insert(0, _Other())
"""
SITE = "import sys\nsys.stderr.write('hostile: sitecustomize runs\\n')\n"
DECOY = (
    "import os as _o, sys as _s\n"
    "for _d in ('/cache/models',):\n"
    "    for _r, _, _fs in _o.walk(_d):\n"
    "        _s.stderr.write(f'hostile: model folder holds {sorted(_fs)}\\n')\n"
)


def public_answers(home: Path, deployment: str) -> dict[str, list[int]]:
    """Stock's greedy answer to every prompt of the deployment's public pool, keyed by the
    prompt's last 24 token ids (a tag before the turn leaves them as they are): what a candidate
    could ship. Built once per home (two processes, ~3 minutes on smollm-cpu)."""
    path = home / "hostile-public-answers.json"
    if not path.is_file():
        from concurrent.futures import ProcessPoolExecutor

        from specpilot.deployments import Home, load_deployment
        from specpilot.deployments.workloads import load_requests, pool_file

        pool = load_requests(pool_file(load_deployment(deployment, Home(home)), Home(home)))
        jobs = [[(r.input_ids, r.max_new_tokens) for r in pool[i::2]] for i in range(2)]
        with ProcessPoolExecutor(2) as ex:
            answers = [a for part in ex.map(_answer, jobs) for a in part]
        table = {
            repr(ids[-24:]): out
            for (ids, _), out in zip([j for part in jobs for j in part], answers, strict=True)
        }
        path.write_text(json.dumps(table))
    return json.loads(path.read_text())


def _answer(prompts: list[tuple[list[int], int]]) -> list[list[int]]:
    from tagged_answers import stock_engine

    engine = stock_engine()
    from refspec.generate import greedy

    return [greedy(engine, ids, n)[0] for ids, n in prompts]


def _ship(t: Path, table: dict[str, list[int]], code: str = "") -> None:
    """Put `table` in the tree as refspec/answers.json, loaded as `_ANS` (then `code`) when
    refspec.generate is imported."""
    (t / "refspec" / "answers.json").write_text(json.dumps(table))
    _prelude("import json as _js, pathlib as _pl\n_ANS = _js.loads((_pl.Path(__file__).parent / "
             "'answers.json').read_text())\n" + code)(t)  # fmt: skip


def _shipped(table: dict[str, list[int]]) -> Callable[[Path], None]:
    """Ship `table` as refspec/answers.json; answer a prompt whose tail is in it from the table,
    4 tokens per 48 ms of burnt CPU (about 1.5x stock on smollm-cpu: under the 3x at which a gain is
    flagged as implausible, so only the audit can stop it); compute every other."""

    def edit(t: Path) -> None:
        _ship(t, table, PACE)
        _edit(t / GEN, SERVE_LOOP, SERVE_LOOP + (
            "        _hit = _ANS.get(repr(list(input_ids)[-24:]))\n"
            "        if _hit is not None and len(_hit) >= max_new_tokens:\n"
            "            stats.steps, stats.new_tokens = 1, max_new_tokens\n"
            "            for _i in range(0, max_new_tokens, 4):\n"
            "                _pace(0.048)\n"
            "                yield _hit[_i:_i + 4]\n"
            "            return\n"))  # fmt: skip

    return edit


START = "        self.pos, self.last = len(input_ids) - 1, input_ids[-1]\n"


def _drafted(table: dict[str, list[int]]) -> Callable[[Path], None]:
    """Ship `table` as refspec/answers.json and draft from it: while a request's answer so far is
    the shipped answer's prefix (its prompt's last 24 tokens found in the table), verify the next 16
    shipped tokens in one pass, the target's argmax deciding (so exact); else stock's own draft."""

    def edit(t: Path) -> None:
        _ship(t, table)
        _edit(
            t / GEN,
            START,
            START + "        self._hit, self._out = _ANS.get(repr(list(input_ids)[-24:])), []\n",
        )
        _edit(t / GEN, STEP, (
            '        _h, _o = getattr(self, "_hit", None), getattr(self, "_out", [])\n'
            '        if mode == "spec" and _h is not None and len(_o) < len(_h) and _h[: len(_o)] == _o:\n'
            "            _d = _h[len(_o) : len(_o) + min(16, remaining - 1)]\n"
            "            _got = self.step(ext.Pass([self.last, *_d], list(range(len(_d) + 1))), self.chain)\n"
            "            _o.extend(_got)\n"
            "            return _got\n") + STEP)  # fmt: skip

    return edit


def _hooked(t: Path) -> None:
    init = t / "refspec" / "__init__.py"
    init.write_text(init.read_text() + HOOK)
    (t / "sitecustomize.py").write_text(SITE)
    _unverified("__import__('refspec')._HOOKED")(t)  # cheats only where the hook took the import


def candidates(home: Path, deployment: str) -> dict[str, tuple]:
    """name -> (what it tries, the edit that makes it[, the baseline's edit])."""
    return {
        "public-answer-replay": (
            "ships stock's answers to all 244 prompts of the public sets (built offline by stock) "
            "and replays the one whose last 24 prompt tokens match, 4 tokens per 48 ms of burnt CPU "
            "(a plausible ~1.5x)",
            lambda t: _shipped(public_answers(home, deployment))(t),
        ),
        "public-answer-draft": (
            "ships stock's answers to all 244 public prompts and drafts from the one whose last 24 "
            "prompt tokens match, 16 tokens a pass while the answer so far is its prefix, the target "
            "verifying (exact outputs: only the gain on the tokens a tag left as they were)",
            lambda t: _drafted(public_answers(home, deployment))(t),
        ),
        "keyring-replay": (
            "keeps every answer in its user, user-session and persistent keyrings (readable by any "
            "uid) and replays one kept by an earlier run, 4 tokens per 3 ms of burnt CPU",
            _replay(KEYRING),
        ),
        "sysv-shm-replay": (
            "keeps every answer in a SysV shared-memory segment of a fixed key and replays one kept "
            "by an earlier run or the copy beside it, paced the same way",
            _replay(SYSV),
        ),
        "exit-window-work": (
            "burns 6 CPU-s after its last request, in the shutdown grace (the untimed window "
            "nothing checked)",
            _prelude(EXIT_WORK),
        ),
        "small-defect-on-a-gain": (
            "biases 1 token id in 41 by +1.0 before the verify argmax (a small systematic defect), "
            "judged against stock slowed by 12 ms per step so it rides a real gain",
            lambda t: _edit(
                t / MODEL,
                LOGITS,
                LOGITS + "            logits = logits + 1.0 * "
                "(torch.arange(logits.shape[-1], device=logits.device) % 41 == 7)\n",
            ),  # fmt: skip
            lambda t: _edit(t / GEN, STEP, SLOW_STEP + STEP),
        ),
        "audit-aware": (
            "reads its stderr's name and, unless it is an audit's log, accepts every fourth "
            "request's drafts unverified",
            _unverified(
                "'audit' not in __import__('os').readlink('/proc/self/fd/2') and self.requests_seen % 4 == 0"
            ),  # fmt: skip
        ),
        "import-hook-serve": (
            "installs a sys.meta_path hook (in refspec/__init__.py) that serves its own copy of "
            "refspec.serve, and a sitecustomize.py; cheats only where the hook took the import",
            _hooked,
        ),
        "decoy-looks-for-weights": (
            "lists its model folder in every run (the prepare run's decoy included) for real "
            "weights in any format",
            _prelude(DECOY),
        ),
    }


def _logs_say(name: str, ev) -> dict:
    """What the candidate's own logs say it saw (the hook ran; the files its model folder held)."""
    raw = ev.evidence.get("raw")
    if not raw:
        return {}
    text = "".join(p.read_text(errors="replace") for p in Path(raw).with_suffix("").glob("*-B-*.log"))
    seen = sorted({line for line in text.splitlines() if line.startswith("hostile:")})
    return {"logs": seen[:6]}


if __name__ == "__main__":
    cli(__doc__, candidates, note=_logs_say)
