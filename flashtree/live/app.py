"""The live benchmark run: start every server the phases name, run the phases in order, stop each server after the
last phase that uses it, write the phase results, the tables and the servers' stage-time lines.

    run(cfg)   cfg: the composed DictConfig of experiments/live.py (or a LiveConfig); -> exit status
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from flashtree.experiments.config import ConfigError
from flashtree.live import features, grammar, identity, memory, sampled, speed
from flashtree.live.commands import Instance, all_instances, phase_instances, shell_line
from flashtree.live.config import SPEED_PHASES, LiveConfig, to_live_config
from flashtree.live.prompts import Prompts, load
from flashtree.live.servers import ServerManager, ServerStartError, launch_environ
from flashtree.live.tables import request_record, write_tables

STAGE_LINE = "stage times"  # FLASHTREE_STAGE_TIMES log lines
PROFILE_LINE = "flashtree host profile"  # FLASHTREE_PROFILE_HOST reports


def describe(cfg: LiveConfig, plan: dict[str, list[Instance]]) -> str:
    """What a run would start and measure (the dry run's output)."""
    lines = [f"model {cfg.model.name}: target {cfg.model.target}, draft {cfg.model.draft}"
             + (f" ({cfg.model.label})" if cfg.model.label else ""),
             f"prompts: {cfg.prompts.source}, {cfg.prompts.count}"
             + (f" x {cfg.prompts.input_len} tokens" if cfg.prompts.source == "random" else ""), "servers:"]
    for inst in all_instances(plan):
        lines += [f"  {inst.name}: {cfg.servers[inst.server].description}", f"    {shell_line(inst, 'PORT')}"]
    lines.append("phases:")
    for phase, instances in plan.items():
        p = getattr(cfg.phases, phase)
        what = (f"concurrencies {list(p.concurrencies)}, {p.rounds} round(s), client {p.backend}"
                + (f", {p.constrained:.0%} of the requests constrained to {p.regex!r}" if p.constrained else "")
                + (", each level paired with the same level all free" if p.paired else "")
                if phase in SPEED_PHASES else f"{p.prompts} prompts x {p.max_new_tokens} tokens"
                if phase == "identity" else f"regex {p.regex!r}" if phase == "grammar"
                else f"{len(features.requests(p.logit_bias, 1, p.skip))} feature requests x {p.max_new_tokens} tokens"
                if phase == "features"
                else f"{p.samples} draws x {p.tokens} tokens at T {p.temperature}")
        lines.append(f"  {phase}: {', '.join(i.name for i in instances)}; {what}")
        if phase in SPEED_PHASES and p.backend == "bench_serving":
            cmd = speed.bench_serving_command(cfg.live.python or sys.executable, 0, model=cfg.model.target,
                                              dataset="OUT/prompts.jsonl", conc=p.concurrencies[0],
                                              num_prompts=speed.requests_per_level(p.concurrencies[0], p.min_requests),
                                              max_new_tokens=p.max_new_tokens, output_file="OUT/bench.jsonl")
            lines.append("    " + " ".join(cmd).replace("--port 0", "--port PORT"))
    if cfg.model.dummy is not None and "speed" in plan:
        lines += memory.describe(cfg, all_instances(plan))
    return "\n".join(lines)


def prepare_models(cfg: LiveConfig, out: Path) -> None:
    """Write a dummy model's configs; otherwise check the checkpoints are there and the draft's block is the one the
    presets assume."""
    m = cfg.model
    if m.dummy is not None:
        from flashtree.live.dummy import write

        for path in write(m.dummy, m.target, m.draft, m.draft_block_size, m.algorithm):
            print(f"[live] wrote {path}", flush=True)
    else:
        for what, path in (("model.target", m.target), ("model.draft", m.draft)):
            if not (Path(path) / "config.json").is_file():
                raise ConfigError(f"{what}={path!r}: no config.json there (stage the checkpoints first: "
                                  "scripts/live_smollm2_h200.sh's header says how)")
        from flashtree.dspark.config import DSparkConfig
        from flashtree.dspark.dflash_format import load_dflash_config

        block = (load_dflash_config if m.algorithm == "DFLASH" else DSparkConfig.load)(m.draft).block_size
        if block != m.draft_block_size:
            raise ConfigError(f"model.draft_block_size={m.draft_block_size}: the draft at {m.draft} has block_size "
                              f"{block}; set model.draft_block_size={block}")
    (out / "draft_config.json").write_text((Path(m.draft) / "config.json").read_text())


def machine(cfg: LiveConfig) -> dict:
    """The GPU and the servers' sglang release, for the results and their figures (None where not found)."""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.splitlines()[0].strip() or None
    except (OSError, IndexError, subprocess.SubprocessError):
        gpu = None
    python = cfg.live.python or sys.executable
    try:
        release = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                                 capture_output=True, text=True, timeout=60).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        release = None
    return {"gpu": gpu, "sglang": release}


def save(out: Path, phase: str, result: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{phase}_results.json").write_text(json.dumps(result, indent=1, default=str))


class Run:
    """One run's state: the servers, the prompts, the request records for the tables."""

    def __init__(self, cfg: LiveConfig, manager: ServerManager, prompts: Prompts, out: Path):
        self.cfg, self.manager, self.prompts, self.out = cfg, manager, prompts, out
        self.records: list[dict] = []
        self.failed: list[str] = []

    def ports(self, instances) -> dict[str, int]:
        return {i.name: self.manager.port(i.name) for i in instances}

    def keep(self, phase: str, name: str, conc: int, rnd: int, responses: list[dict]) -> None:
        self.records += [request_record(name, phase, conc, rnd, k, r) for k, r in enumerate(responses)]

    def identity(self, instances) -> dict:
        p = self.cfg.phases.identity
        result, responses = identity.run_identity(self.ports(instances), self.prompts.ids[: p.prompts],
                                                  p.max_new_tokens, p.in_flight, p.timeout_s)
        for name, rs in responses.items():
            self.keep("identity", name, p.in_flight, 0, rs)
        return result

    def sampled(self, instances) -> dict:
        p = self.cfg.phases.sampled
        result, _ = sampled.run_sampled(self.ports(instances), self.prompts.ids[0], p.samples, p.tokens, p.temperature,
                                        p.timeout_s)
        return result

    def grammar(self, instances) -> dict:
        p = self.cfg.phases.grammar
        return grammar.run_grammar(self.ports(instances), self.prompts.ids, p.regex, p.max_new_tokens, p.timeout_s)

    def features(self, instances) -> dict:
        p = self.cfg.phases.features
        tree = {i.name: self.cfg.servers[i.server].tree_n is not None for i in instances}
        return features.run_features(self.ports(instances), tree, dict(p.logit_bias), p.max_new_tokens, p.logprob_tol,
                                     list(p.may_refuse), p.timeout_s, list(p.skip))

    def speed(self, instances, phase: str = "speed") -> dict:
        from tqdm import tqdm

        p = getattr(self.cfg.phases, phase)
        out = self.out / phase if phase != "speed" else self.out
        deadline = time.monotonic() + p.timeout_s
        names = [i.name for i in instances]
        runs = {n: {c: [] for c in p.concurrencies} for n in names}
        result = {"model": self.cfg.model.name, "max_new_tokens": p.max_new_tokens, "rounds": p.rounds,
                  "client": p.backend, "label": self.cfg.model.label, **machine(self.cfg), "servers": {}}
        bar = tqdm(total=p.rounds * len(names) * len(p.concurrencies), desc=phase, file=sys.stdout)
        for rnd in range(p.rounds):
            # every other round in reverse order, so drift over the run falls on every server alike
            for name in names[:: -1 if rnd % 2 else 1]:
                for c in p.concurrencies:
                    left = deadline - time.monotonic()
                    try:
                        if left <= 0:
                            raise TimeoutError(f"phase time limit {p.timeout_s:.0f} s reached")
                        row = self.level(phase, name, c, rnd, left)
                    except Exception as err:  # noqa: BLE001 - recorded; the other levels still run
                        row = {"concurrency": c, "error": f"{type(err).__name__}: {err}"[:300]}
                    runs[name][c].append({**row, **({"label": self.cfg.model.label} if self.cfg.model.label else {})})
                    bar.update()
                    bar.write(f"[live] {phase} {name} c={c} round {rnd}: {json.dumps(runs[name][c][-1])[:300]}")
                result["servers"][name] = [speed.merge_rounds(runs[name][c]) for c in p.concurrencies]
                save(out, "speed", result)  # a run cut short keeps the servers already measured
        bar.close()
        return result

    def paired_level(self, p, port: int, phase: str, name: str, conc: int, rnd: int) -> dict:
        """The constrained level and the same level all free, back to back (free first in even rounds): the
        constrained row with the free rate and their ratio; the free requests reach the tables as phase `<phase>-free`."""
        rows = {}
        for constrained in (0.0, p.constrained)[:: -1 if rnd % 2 else 1]:
            rows[constrained], rs = speed.ids_level(port, self.prompts.ids, conc, p.max_new_tokens, p.min_requests,
                                                    burst=rnd == 0 and not rows, constrained=constrained,
                                                    regex=p.regex)
            self.keep(phase if constrained else f"{phase}-free", name, conc, rnd, rs)
        return speed.paired_row(rows[p.constrained], rows[0.0])

    def level(self, phase: str, name: str, conc: int, rnd: int, left_s: float) -> dict:
        p = getattr(self.cfg.phases, phase)
        port = self.manager.port(name)
        if p.backend == "ids":
            if p.paired:
                return self.paired_level(p, port, phase, name, conc, rnd)
            row, rs = speed.ids_level(port, self.prompts.ids, conc, p.max_new_tokens, p.min_requests, burst=rnd == 0,
                                      constrained=p.constrained, regex=p.regex)
            self.keep(phase, name, conc, rnd, rs)
            return row
        cmd = speed.bench_serving_command(self.cfg.live.python or sys.executable, port, model=self.cfg.model.target,
                                          dataset=str(self.out / "prompts.jsonl"), conc=conc,
                                          num_prompts=speed.requests_per_level(conc, p.min_requests),
                                          max_new_tokens=p.max_new_tokens,
                                          output_file=str(self.out / "logs" / f"bench_{name}.jsonl"))
        return speed.bench_serving_level(cmd, self.out / "logs" / f"bench_{name}.jsonl",
                                         self.out / "logs" / f"bench_{name}.log", left_s)


def stage_times(log_dir: Path, out_file: Path) -> None:
    """The servers' FLASHTREE_STAGE_TIMES lines, each tagged with its server."""
    lines = []
    for log in sorted(log_dir.glob("server_*.log")):
        tag = f"[{log.stem}] "
        lines += [tag + line[:420] for line in log.read_text(errors="replace").splitlines() if STAGE_LINE in line]
    if lines:
        out_file.write_text("\n".join(lines) + "\n")


def host_profiles(log_dir: Path, out_file: Path) -> None:
    """The servers' FLASHTREE_PROFILE_HOST reports (a header line, then indented rows), each tagged with its server."""
    lines = []
    for log in sorted(log_dir.glob("server_*.log")):
        inside = False
        for line in log.read_text(errors="replace").splitlines():
            inside = PROFILE_LINE in line or (inside and line.startswith("  "))
            if inside:
                lines.append(f"[{log.stem}] {line}" if PROFILE_LINE in line else line)
    if lines:
        out_file.write_text("\n".join(lines) + "\n")


def run(cfg) -> int:
    raw = cfg
    cfg = cfg if isinstance(cfg, LiveConfig) else to_live_config(cfg)
    plan = phase_instances(cfg)
    for inst in all_instances(plan):
        launch_environ(inst)  # a server whose toggles could not take effect stops the run before any server starts
    print(describe(cfg, plan), flush=True)
    if cfg.live.dry_run:
        return 0
    out = Path(cfg.live.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prepare_models(cfg, out)
    prompts = load(cfg)
    if prompts.texts is not None:
        speed.write_custom_dataset(prompts.texts, out / "prompts.jsonl")
    print(f"[live] prompts: {prompts.source}", flush=True)
    with ServerManager(out / "logs", work_dir=cfg.live.work_dir, stagger_s=cfg.live.stagger_s,
                       stop_timeout_s=cfg.live.stop_timeout_s) as manager:
        for inst in all_instances(plan):
            manager.start(inst)
        try:
            not_started = manager.wait_healthy(cfg.live.start_timeout_s, keep_going=cfg.live.keep_going)
        except ServerStartError as err:
            print(f"[live] {err}", file=sys.stderr, flush=True)
            return 2
        state = Run(cfg, manager, prompts, out)
        state.failed += [f"start:{n}" for n in not_started]
        plan = without(plan, not_started)
        last_use = {i.name: k for k, phase in enumerate(cfg.run) if phase in plan for i in plan[phase]}
        for name in set(manager.running) - set(last_use):  # in no phase that still runs
            manager.stop(name)
        interrupted = False
        try:
            for k, phase in enumerate(cfg.run):
                print(f"[live] phase {phase}", flush=True)
                if phase not in plan:
                    print(f"[live] phase {phase} not run: its servers did not start", flush=True)
                    state.failed.append(f"{phase}:not-run")
                    continue
                if phase in ("stage", "mixed"):
                    result = state.speed(plan[phase], phase)
                else:
                    result = getattr(state, phase)(plan[phase])
                    save(out, phase, result)
                if phase in ("speed", "mixed"):
                    print(speed.table(result), flush=True)
                verdicts = {n: s.get("status") for n, s in result["servers"].items() if isinstance(s, dict)}
                state.failed += [f"{phase}:{n}" for n, v in verdicts.items() if v in ("fail", "not-run")]
                if verdicts:
                    print(f"[live] {phase}: {verdicts}", flush=True)
                for inst in plan[phase]:
                    if last_use[inst.name] == k:
                        manager.stop(inst.name)
        except KeyboardInterrupt:  # Ctrl-C, or LIVE_S's SIGINT: what ran still reaches the tables
            interrupted = True
            print("[live] interrupted: stopping the servers, then the tables of the requests that finished", flush=True)
    config = _plain(raw)
    presets = {i.name: i.server for insts in plan.values() for i in insts}
    tables = write_tables(state.records, config, out, presets)
    stage_times(out / "logs", out / "stage_times.txt")
    host_profiles(out / "logs", out / "host_profile.txt")
    where = ", ".join(map(str, tables)) if tables else "none (no phase recorded requests)"
    print(f"[live] tables: {where}; not passed: {state.failed or 'none'}", flush=True)
    return 130 if interrupted else 1 if state.failed else 0


COMPARED = ("identity", "sampled", "grammar", "features")  # phases of a reference (the first server) and the others


def without(plan: dict[str, list[Instance]], failed) -> dict[str, list[Instance]]:
    """The plan without the servers that failed to start; a phase left with no server, or a compared phase left
    without its reference or anything to compare, is dropped."""
    out = {}
    for phase, instances in plan.items():
        kept = [i for i in instances if i.name not in failed]
        if phase in COMPARED and (len(kept) < 2 or kept[0] is not instances[0]):
            continue
        if kept:
            out[phase] = kept
    return out


def _plain(cfg) -> dict:
    if isinstance(cfg, LiveConfig):
        import dataclasses

        return dataclasses.asdict(cfg)
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)
