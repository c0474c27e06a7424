"""The commands the READMEs show, run as written with small limits.

Every command of the ```bash blocks of README.md and experiments/README.md, and every ```python block of README.md,
is read from the files when the tests are collected (the files change; nothing here copies a command). Small limits:
`python experiments/*.py` and `flashtree sweep|replay` commands get a tiny model, one prompt, four new tokens, no
W&B and temporary output folders appended (an override of the same key the command sets is replaced, so a sweep over
datasets becomes one dataset); Optuna sweeps run 2 trials; `scripts/*.sh` run as written (they are the small jobs);
Python blocks get `limit=1` and `max_new_tokens=8`. A `launcher=slurm` line cannot reach a cluster here: its config
is composed and printed with `--cfg all` instead. Commands that are not run are in NOT_RUN, each with its reason; a
command that matches no rule fails, so a new kind of command in a README needs a rule here. A command that runs,
under these limits, as an earlier one does is run once.

Marked slow: the Python blocks run the real SmolLM2-135M; the whole file takes about two minutes on 2 cores.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SHELL_DOCS = ("README.md", "experiments/README.md")
PYTHON_DOCS = ("README.md",)
PYTHONS = {"python", "python3", ".venv/bin/python"}
SMALL = {"target": "tiny-llama", "dataset": "builtin", "dataset.limit": "1", "engine.max_new_tokens": "4",
         "logger": "disabled"}
# Commands not run (a regex searched in the command line) and why.
NOT_RUN = {
    r"^make\b": "make sets up .venv (and one venv per sglang release) before its job: what CI and a new user run",
    r"sglang\.launch_server": "an sglang server needs a GPU and an sglang release; scripts/live_*_h200.sh run it on "
                              "the H200",
}
TIMEOUT_S = 300


def _blocks(doc: str, lang: str):
    """(first line number, text) of each ```lang block of doc."""
    lines = (ROOT / doc).read_text().splitlines()
    start = None
    for i, line in enumerate(lines):
        if start is None and line.strip() == f"```{lang}":
            start = i + 1
        elif start is not None and line.strip() == "```":
            yield start + 1, "\n".join(lines[start:i])
            start = None


def _shell_commands():
    """(doc:line, command line) of every command in the docs' bash blocks; continuation lines joined. A command that
    runs as an earlier one does once its limits are in (README.md repeats experiments/README.md's) is left out."""
    seen = set()
    for doc, line_no, command in _doc_commands():
        key = _as_run(command)
        if key not in seen:
            seen.add(key)
            yield pytest.param(command, id=f"{doc}:{line_no}")


def _as_run(command: str) -> tuple[str, ...]:
    """What a command runs under the small limits: a Hydra app's arguments after `_small`, any Python the same."""
    words = shlex.split(command)
    if len(words) > 1 and words[0] in PYTHONS and re.fullmatch(r"experiments/\w+\.py", words[1]):
        return ("python", words[1], *_small(words[2:], Path("tmp")))
    return tuple(words)


def _doc_commands():
    for doc in SHELL_DOCS:
        for first, text in _blocks(doc, "bash"):
            pending, at = "", None
            for n, line in enumerate(text.splitlines(), first):
                at = at or n
                if line.rstrip().endswith("\\"):
                    pending += line.rstrip()[:-1] + " "
                    continue
                command = " ".join(shlex.split(pending + line, comments=True))
                pending, line_no, at = "", at, None
                if command:
                    yield doc, line_no, command


def _python_blocks():
    for doc in PYTHON_DOCS:
        for first, text in _blocks(doc, "python"):
            yield pytest.param(text, id=f"{doc}:{first}")


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               WANDB_MODE="disabled", MPLBACKEND="Agg", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    env.pop("TRITON_INTERPRET", None)  # CPU tensors only: the references run, not the Triton kernels
    return env


def _run(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 0, f"{shlex.join(argv)}\nexit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run


def _key(arg: str) -> str | None:
    """The override key of a Hydra command-line argument (`+a.b=1` -> `a.b`), None for a flag."""
    if arg.startswith("-") or "=" not in arg:
        return None
    return arg.split("=", 1)[0].lstrip("+~")


def _small(args: list[str], tmp: Path) -> list[str]:
    """args with the small-limit overrides in place of any the command sets itself."""
    extra = dict(SMALL)
    if "sweeper=optuna" in args:
        extra["hydra.sweeper.n_trials"] = "2"
    extra["hydra.run.dir"] = str(tmp / "run")
    extra["hydra.sweep.dir"] = str(tmp / "sweep")
    kept = [a for a in args if _key(a) not in extra]
    return kept + [f"{k}={v}" for k, v in extra.items()]


def _first_values(args: list[str]) -> list[str]:
    """A multirun's arguments as one run: each comma sweep `k=a,b` -> `k=a` (lists in brackets untouched)."""
    out = []
    for a in args:
        key = _key(a)
        if key is not None and not a.split("=", 1)[1].startswith(("[", "'", '"')):
            a = a.split(",", 1)[0]
        out.append(a)
    return [a for a in out if a not in ("--multirun", "-m")]


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory) -> Path:
    """A finished two-configuration sweep, for commands that take `multirun/<name>`."""
    tmp = tmp_path_factory.mktemp("sweep")
    _run([sys.executable, "experiments/sweep.py", "--multirun", "tree.n=1,4", "tree.width=4",
          *_small([], tmp)], _env())
    return tmp / "sweep"


@pytest.mark.parametrize("command", list(_shell_commands()))
def test_readme_shell_command(command, tmp_path, request):
    for pattern, reason in NOT_RUN.items():
        if re.search(pattern, command):
            pytest.skip(f"not run: {reason}")
    words = shlex.split(command)
    env = _env()
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):  # leading VAR=value
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if not words:
        return  # assignments only
    program, args = words[0], words[1:]
    if program in PYTHONS and args and re.fullmatch(r"experiments/\w+\.py", args[0]):
        app, args = args[0], args[1:]
        if "launcher=slurm" in args:  # no cluster here: compose the job's config (launcher included) and print it
            run = _run([sys.executable, app, *_first_values(_small(args, tmp_path)), "--cfg", "all"], env)
            assert "SlurmLauncher" in run.stdout
            return
        _run([sys.executable, app, *_small(args, tmp_path)], env)
        assert (tmp_path / "run").exists() or (tmp_path / "sweep").exists()
    elif program == "flashtree" and args[:1] in (["sweep"], ["replay"]):  # the installed command: same apps
        _run([sys.executable, "-m", "flashtree.cli", args[0], *_small(args[1:], tmp_path)], env)
        assert (tmp_path / "run").exists() or (tmp_path / "sweep").exists()
    elif program in PYTHONS and args[:1] == ["-m"] and args[1].startswith("flashtree."):
        placeholders = [a for a in args if re.search(r"<\w+>", a)]
        assert all(re.fullmatch(r"multirun/<\w+>", a) for a in placeholders), f"no rule for {placeholders}"
        sweep = str(request.getfixturevalue("small_sweep")) if placeholders else None
        _run([sys.executable, *[sweep if a in placeholders else a for a in args]], env)
    elif re.fullmatch(r"(\./)?scripts/\w+\.sh", program):
        name = f"test-readme-{uuid.uuid4().hex[:8]}"  # the script's sweep folder multirun/<NAME>, removed after
        env.update(PYTHON=sys.executable, NAME=name)
        had_multirun = (ROOT / "multirun").exists()
        try:
            # as written: the scripts are the small jobs (the main job replays a shipped recording in about 1.5 minutes)
            _run(["bash", program, *args], env)
        finally:
            for folder in ((name, f"replay-{name}") if had_multirun else ("",)):
                shutil.rmtree(ROOT / "multirun" / folder, ignore_errors=True)
    else:
        pytest.fail(f"no rule to run this README command: {command!r} (add one, or a NOT_RUN entry with its reason)")


@pytest.mark.parametrize("code", list(_python_blocks()))
def test_readme_python_block(code):
    code = re.sub(r"\blimit=\d+", "limit=1", code)
    code = re.sub(r"\bmax_new_tokens=\d+", "max_new_tokens=8", code)
    env = _env()
    env["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
    _run([sys.executable, "-c", code], env)
