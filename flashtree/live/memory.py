"""GPU memory of dummy-weight servers sharing one GPU, by sglang 0.5.17's accounting, so a preset can be checked before
it runs: the bf16 weights and KV bytes per token of a `DummyShapes` target (and its DSPARK draft), and the smallest
`--mem-fraction-static` at which every server still gets the KV pool its `--max-total-tokens` asks for.

sglang sizes a server's KV pool as the free memory after loading its weights minus `(1 - fraction)` x the free memory
it saw before loading them, capped by `--max-total-tokens`; a DSPARK server's pool holds the draft's layers too. So a
server started after others sees less free memory, and its pool shrinks unless the fraction leaves room for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from flashtree.live.dummy import DummyShapes

if TYPE_CHECKING:  # the sizes alone import without omegaconf (the sglang test environments have none)
    from flashtree.live.commands import Instance
    from flashtree.live.config import LiveConfig

GiB = 1 << 30
BF16 = 2
# per server besides weights and KV: CUDA context, CUDA graphs, activations (an allowance). It understates servers
# whose verify graphs hold many tokens: the graphs keep vocabulary-wide logits per token, and a planner captures one
# verify runner per width of its menu (live run 47, Llama shapes on an H100, CUDA graphs to bs 64: the chain held
# 2.3 GiB beyond weights and KV, an N = 32 / W = 32 tree with a budget 6.8, and auto over a 64-token window ran out
# of memory at 13.6 while capturing its third width, where this check passed the three at 79 GiB)
OVERHEAD_GIB = 4.0


def layer_params(s: DummyShapes) -> int:
    q, kv = s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    return s.hidden_size * (2 * q + 2 * kv) + 3 * s.hidden_size * s.intermediate_size  # q, o, k, v; gated MLP


def weight_bytes(s: DummyShapes, speculative: bool) -> int:
    """Target weights (untied embedding and LM head), plus the DSPARK draft's: its layers, the fc over the target
    layers it reads, the Markov head's two rank-R factors (it borrows the target's embedding and LM head)."""
    target = s.num_hidden_layers * layer_params(s) + 2 * s.vocab_size * s.hidden_size
    draft = (s.draft_layers * layer_params(s) + s.draft_target_layers * s.hidden_size ** 2
             + 2 * s.vocab_size * s.markov_rank)
    return BF16 * (target + (draft if speculative else 0))


def kv_bytes_per_token(s: DummyShapes, speculative: bool) -> int:
    layers = s.num_hidden_layers + (s.draft_layers if speculative else 0)
    return 2 * layers * s.num_key_value_heads * s.head_dim * BF16  # K and V


def tokens_needed(concurrency: int, input_len: int, max_new_tokens: int, window: int) -> int:
    """KV slots of `concurrency` requests at their longest (the verify window reserved on top)."""
    return concurrency * (input_len + max_new_tokens + window)


@dataclass(frozen=True)
class ServerMemory:
    name: str
    weights: int  # bytes
    kv_per_token: int  # bytes
    slots: int  # KV slots of its pool (--max-total-tokens)
    need: int  # KV slots its requests need at once

    @property
    def kv(self) -> int:
        return self.slots * self.kv_per_token

    @property
    def total(self) -> int:
        return self.weights + self.kv + int(OVERHEAD_GIB * GiB)


def min_fraction(servers: list[ServerMemory], free_gib: float) -> float:
    """The smallest --mem-fraction-static giving every server its KV pool even when each measures its free memory
    before loading while the earlier servers hold nothing yet, and sizes its pool after they hold everything (the
    worst overlap of staggered starts; servers started strictly one after another need less)."""
    need, free = 0.0, free_gib * GiB
    for k, s in enumerate(servers):
        after = free - sum(o.total for o in servers[:k]) - s.weights
        need = max(need, 1 - (after - s.kv) / free)  # after - (1 - f) * free >= kv
    return need


def fits(servers: list[ServerMemory], fraction: float, free_gib: float) -> bool:
    """Every pool holds what its requests need, all servers fit the GPU, and `fraction` gives each its pool."""
    return (all(s.slots >= s.need for s in servers) and sum(s.total for s in servers) <= free_gib * GiB
            and fraction >= min_fraction(servers, free_gib))


def server_memory(cfg: LiveConfig, inst: Instance) -> ServerMemory:
    """What `inst` of a dummy-weight model holds; its pool is its `--max-total-tokens`, else what its speed phase
    needs at its largest concurrency."""
    from flashtree.live.commands import window

    s, server, speed = cfg.model.dummy, cfg.servers[inst.server], cfg.phases.speed
    spec = server.speculative
    need = tokens_needed(max(speed.concurrencies), cfg.prompts.input_len, speed.max_new_tokens,
                         window(server, cfg.model) if spec else 1)
    slots = int(inst.argv[inst.argv.index("--max-total-tokens") + 1]) if "--max-total-tokens" in inst.argv else need
    return ServerMemory(inst.name, weight_bytes(s, spec), kv_bytes_per_token(s, spec), slots, need)


def describe(cfg: LiveConfig, instances: list[Instance]) -> list[str]:
    """The dry run's memory lines for the servers of a dummy-weight model on a GPU of `live.gpu_gib`, and a warning
    where they do not fit."""
    servers = [server_memory(cfg, i) for i in instances]
    gib = cfg.live.gpu_gib
    lines = [f"memory (bf16, sglang 0.5.17's accounting, the servers at once on one GPU of {gib:g} GiB free, "
             "live.gpu_gib):"]
    lines += [f"  {m.name}: weights {m.weights / GiB:.1f} GiB + KV {m.slots} slots {m.kv / GiB:.1f} GiB "
              f"(needs {m.need})" for m in servers]
    lines.append(f"  all: {sum(m.total for m in servers) / GiB:.1f} GiB of {gib:g} with "
                 f"{OVERHEAD_GIB:.0f} GiB each for graphs and activations; --mem-fraction-static "
                 f"{cfg.model.mem_fraction_static} (needs >= {min_fraction(servers, gib):.3f})")
    if not fits(servers, cfg.model.mem_fraction_static, gib):
        lines.append(f"  WARNING: these servers do not fit a GPU of {gib:g} GiB as configured")
    return lines
