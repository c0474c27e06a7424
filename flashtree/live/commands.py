"""From named presets to processes: the `python -m sglang.launch_server` command line and environment of each server.

A server instance is one named server (`flashtree/configs/live/servers/`) in one precision profile of the model, with the extra
environment of the phase that runs it; instances that agree on all three are one process shared by the phases.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from flashtree.live.config import LiveConfig, ModelConfig, PrecisionConfig, ServerConfig

HOST = "127.0.0.1"  # every server listens on loopback only


@dataclass(frozen=True)
class Instance:
    """One server process: `name` (precision-server[-phase]) is its log's and its results' label."""

    name: str
    server: str
    precision: str
    argv: tuple[str, ...]  # launch command without --host / --port
    env: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    label: str = ""

    def command(self, port: int, nccl_port: int | None = None) -> list[str]:
        """The launch command on `port`; with `nccl_port`, sglang's torch.distributed rendezvous port too."""
        rendezvous = ["--nccl-port", str(nccl_port)] if nccl_port is not None else []
        return [*self.argv, "--host", HOST, "--port", str(port), *rendezvous]


def toggles(server: ServerConfig) -> dict[str, str]:
    """flashtree's FLASHTREE_* toggles of `server` (flashtree/patches/README.md), then its extra environment."""
    env: dict[str, str] = {}
    if server.tree_n is not None:
        env["FLASHTREE_TREE_N"] = str(server.tree_n)
    for key, value in (("FLASHTREE_TREE_DEPTH", server.depth), ("FLASHTREE_TREE_BUDGET", server.budget),
                       ("FLASHTREE_DRAFT_ROWS", server.draft_rows), ("FLASHTREE_TREE_MAX_BS", server.max_bs),
                       ("FLASHTREE_DRAFT_TEMPERATURE", server.draft_temperature),
                       ("FLASHTREE_TREE_POLICY", server.policy)):
        if value is not None:
            env[key] = str(value)
    for key, on in (("FLASHTREE_EXACT_VERIFY", server.exact_verify), ("FLASHTREE_FUSED_SAMPLER", server.fused_sampler)):
        if on:
            env[key] = "1"
    for key, value in (("FLASHTREE_SPLITKV_VERIFY", server.split_kv), ("FLASHTREE_GRAPH_DRAWS", server.graph_draws)):
        if value is not None:
            env[key] = "1" if value else "0"
    env.update({str(k): str(v) for k, v in server.env.items()})
    return env


def window(server: ServerConfig, model: ModelConfig) -> int:
    """DSPARK's verify window W (--speculative-num-draft-tokens): the server's, else the draft's block + 1."""
    return server.window if server.window is not None else model.draft_block_size + 1


def with_flag(args, flag: str, value) -> list[str]:
    """`args` with `flag`'s value replaced by `value` (appended where absent; None: `args` as they are)."""
    args = list(args)
    if value is None:
        return args
    if flag in args[:-1]:
        at = args.index(flag)
        return args[:at + 1] + [str(value)] + args[at + 2:]
    return args + [flag, str(value)]


def launch_args(server: ServerConfig, model: ModelConfig, precision: PrecisionConfig, python: str) -> list[str]:
    model_args = with_flag(model.args, "--attention-backend", server.attention_backend)
    argv = [python, "-m", "sglang.launch_server", "--model-path", model.target, *model_args,
            "--page-size", str(server.page_size), "--mem-fraction-static", str(model.mem_fraction_static),
            "--dtype", precision.dtype, "--max-running-requests", str(precision.max_running_requests),
            "--cuda-graph-bs-decode", *map(str, precision.cuda_graph_bs), *precision.args]
    if model.dummy is not None:
        argv += ["--load-format", "dummy", "--skip-tokenizer-init"]
    if server.speculative:
        w = window(server, model)
        argv += ["--speculative-algorithm", model.algorithm, "--speculative-draft-model-path", model.draft,
                 "--speculative-num-draft-tokens", str(w), "--speculative-draft-attention-backend", "triton"]
        # DSPARK refuses a window other than the draft's block + 1 without this; DFLASH's window is its block
        if model.algorithm == "DSPARK" and w - 1 != model.draft_block_size:
            argv += ["--speculative-dspark-block-size", str(w - 1)]
        if model.dummy is not None:
            argv += ["--speculative-draft-load-format", "dummy"]
    return argv + list(server.args)


def instance(cfg: LiveConfig, server: str, precision: str, phase: str, phase_env: dict) -> Instance:
    python = cfg.live.python or sys.executable
    argv = launch_args(cfg.servers[server], cfg.model, cfg.model.precisions[precision], python)
    env = {**toggles(cfg.servers[server]), **{str(k): str(v) for k, v in phase_env.items()}}
    name = f"{precision}-{server}" + (f"-{phase}" if phase_env else "")
    return Instance(name, server, precision, tuple(argv), env, cfg.model.label)


def phase_instances(cfg: LiveConfig) -> dict[str, list[Instance]]:
    """phase -> its server instances, in the phase's order (the first is the reference of identity / sampled)."""
    return {p: [instance(cfg, s, getattr(cfg.phases, p).precision, p, getattr(cfg.phases, p).env)
                for s in getattr(cfg.phases, p).servers] for p in cfg.run}


def all_instances(plan: dict[str, list[Instance]]) -> list[Instance]:
    """Every distinct instance of a plan, in first-use order."""
    seen: dict[str, Instance] = {}
    for instances in plan.values():
        for inst in instances:
            seen.setdefault(inst.name, inst)
    return list(seen.values())


def shell_line(inst: Instance, port: int) -> str:
    """The instance as one copy-pasteable shell line (env, then command)."""
    import shlex

    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in inst.env.items())
    return (env + " " if env else "") + shlex.join(inst.command(port))
