"""Every worker-dependent refusal of the tree path, one function per point of a server's start, each raising
ToggleError (a SystemExit) with one message that names the setting and what to do.

`at_worker_start`: DSparkWorkerV2.__init__ (the window, depth, draft rows, parallelism, the target's attention
backend, the release's own limits).
`at_init_cuda_graphs`: the first point at which sglang has allocated the KV pools (the paged-KV copy commit).
`flashmap_draft` / `flashmap_keeps_n`: a FlashMap draft at worker start (flashmap_draft.py asks).
Toggle values that need no worker are checked in toggles.py, release hooks in plan.py.
"""

from __future__ import annotations

from .toggles import ToggleError, TreeToggles


# The target attention backends whose verify takes the tree's FULL_MASK (sglang's --attention-backend names).
VERIFY_BACKENDS = ("triton", "flashinfer")


def verify_backend(adapter, worker) -> None:
    """The target verifies the tree under its custom mask on Triton and FlashInfer only; sglang's other backends
    verify DSPARK's chain causally (or key their tree path on EAGLE's top-k), so they are refused, as is leaving the
    choice to sglang (--attention-backend unset). FlashInfer only on the releases whose verify input hands it the
    tree mask and the window's slots as flashtree's tests check them (adapter.flashinfer_verify)."""
    backends = VERIFY_BACKENDS if adapter.flashinfer_verify else ("triton",)
    args = getattr(worker, "server_args", None)
    if args is None:  # no server context (a worker built outside sglang's launcher)
        return
    flags = {"--attention-backend": getattr(args, "attention_backend", None)}
    for flag in ("--prefill-attention-backend", "--decode-attention-backend"):
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None:
            flags[flag] = value
    bad = {flag: value for flag, value in flags.items() if value not in backends}
    if not bad and "flashinfer" in flags.values() and str(getattr(args, "dtype", "")) in ("float32", "torch.float32"):
        # seen on the H200 (sglang 0.5.17, flashinfer 0.6.15): the first forward stops with KeyError: torch.float32
        raise ToggleError(
            "flashtree: FLASHTREE_TREE_N is set on a --dtype float32 server with --attention-backend flashinfer, "
            "which has no float32 attention kernels: start with --dtype bfloat16 or float16, or use "
            "--attention-backend triton for float32"
        )
    if bad:
        got = ", ".join(f"{flag} {value if value is not None else 'unset (sglang picks)'}" for flag, value in bad.items())
        raise ToggleError(
            f"flashtree: FLASHTREE_TREE_N is set but this server runs {got}; the tree verify supports "
            f"--attention-backend {' or '.join(backends)} on sglang {adapter.release}: start with "
            f"{'one of them' if len(backends) > 1 else 'it'} or unset FLASHTREE_TREE_N"
        )


def at_worker_start(adapter, toggles: TreeToggles, worker) -> None:
    verify_backend(adapter, worker)
    parallel = adapter.parallelism(worker)
    refused = [p for p in parallel if not (toggles.tp and p.startswith("--tp-size"))]  # FLASHTREE_TP: tp_sync.py
    if refused:
        settings = " ".join(refused)
        flags = " / ".join(p.split()[0] for p in refused)
        opt_in = ""
        if any(p.startswith("--tp-size") for p in refused):
            opt_in = ("; for --tp-size, FLASHTREE_TP=1 opts in to the tree path's tensor-parallel sync (not yet proven "
                      "on GPUs)")
        raise ToggleError(
            f"flashtree: FLASHTREE_TREE_N is set but this server runs {settings}; the tree path is single-GPU only for "
            f"now: drop {flags} or unset FLASHTREE_TREE_N{opt_in}"
        )
    from flashtree.tree.policies import POLICIES, get_policy

    lacking = [f for f in get_policy(toggles.tree_policy).needs_scores if f not in adapter.draft_scores]
    if lacking:
        raise ToggleError(
            f"flashtree: FLASHTREE_TREE_POLICY={toggles.tree_policy} ranks nodes by the draft's {', '.join(lacking)}, "
            f"which {adapter.algorithm}'s tree step does not compute; allowed here: "
            f"{', '.join(n for n, p in POLICIES.items() if set(p.needs_scores) <= set(adapter.draft_scores))}"
        )
    gamma = adapter.gamma(worker)
    window = gamma + 1
    if toggles.tree_width and toggles.tree_width > window:
        raise ToggleError(
            f"flashtree: FLASHTREE_TREE_WIDTH={toggles.tree_width} exceeds {adapter.algorithm}'s verify window "
            f"(--speculative-num-draft-tokens = gamma + 1 = {window}); allowed: 'auto' or an integer from 2 to {window}"
        )
    if toggles.tree_depth > gamma:
        raise ToggleError(
            f"flashtree: FLASHTREE_TREE_DEPTH={toggles.tree_depth} exceeds {adapter.algorithm}'s draft block (gamma = {gamma}); "
            f"allowed: 'auto' or an integer from 1 to {gamma} (a wider window: raise --speculative-num-draft-tokens)"
        )
    depth = toggles.tree_depth or gamma
    rows = toggles.draft_rows or gamma
    if not depth <= rows <= gamma:
        raise ToggleError(
            f"flashtree: FLASHTREE_DRAFT_ROWS={rows} is outside the draft rows a tree step can run, from the tree's "
            f"depth ({depth}) to {adapter.algorithm}'s gamma ({gamma}); allowed: 'auto' or an integer from {depth} to {gamma}"
        )
    if rows < gamma:
        adapter.check_draft_rows(rows)
    refuse = adapter.unsupported_worker(worker)
    if refuse:
        raise ToggleError(f"flashtree: FLASHTREE_TREE_N is set but {refuse}; unset FLASHTREE_TREE_N for this server")


def at_init_cuda_graphs(adapter, worker, page_size: int) -> None:
    """What only the KV pools tell (sglang builds the workers before the pools): pools the tree commit cannot write
    (translated KV ids); page size > 1: the target KV pool must take the copy commit."""
    refuse = adapter.unsupported_pools(worker)
    if refuse:
        raise ToggleError(f"flashtree: FLASHTREE_TREE_N is set but {refuse}; unset FLASHTREE_TREE_N for this server")
    if page_size == 1:
        return
    missing = adapter.copy_commit_unsupported(worker)
    if missing:
        raise ToggleError(
            f"flashtree: with --page-size {page_size} the tree path commits by copying the accepted KV, but {missing}; "
            "allowed: start the server with --page-size 1, or unset FLASHTREE_TREE_N"
        )


def flashmap_draft(adapter, worker, model, gaps: list[str]) -> None:
    """A FlashMap draft (flashmap 0.1.0's sglang model) the tree path can draw N noise samples from; `gaps`: what
    of flashmap's protocol the model lacks."""
    head = f"flashtree: the draft is flashmap's sglang model ({type(model).__name__})"
    if not adapter.flashmap_noise_draws:
        raise ToggleError(
            f"{head}; drawing its N candidates from its noise is available on sglang 0.5.20 only (the release flashmap "
            f"0.1.0 targets), and this server runs sglang {adapter.release}. Serve it on sglang 0.5.20, or unset "
            "FLASHTREE_TREE_N"
        )
    if gaps:
        raise ToggleError(f"{head}, but it lacks {', '.join(gaps)}; flashtree supports flashmap 0.1.0's model")
    if model.tree_mode:
        raise ToggleError(
            f"{head} with FLASHMAP_TREE_N set: flashmap's own tree decode would compete with flashtree's. Unset "
            "FLASHMAP_TREE_N (FLASHTREE_TREE_N sets the candidate count)"
        )
    if int(model.num_steps) != 1:
        raise ToggleError(
            f"{head} takes {model.num_steps} jumps; several candidates per forward take one: set FLASHMAP_NUM_STEPS=1"
        )
    gamma = adapter.gamma(worker)
    if int(model.block_size) != gamma:
        raise ToggleError(
            f"{head} drafts blocks of {model.block_size}, but DSPARK verifies {gamma} drafts; several candidates per "
            f"forward need the whole block: drop --speculative-dspark-block-size"
        )


def flashmap_keeps_n(model, n: int, batch_bound: int) -> None:
    """After flashtree set the FlashMap draft's candidate count: its tree_n_for keeps n at every batch size."""
    if model.tree_n_for(1) != n or model.tree_n_for(batch_bound) != n:
        raise ToggleError(
            f"flashtree: the draft is flashmap's sglang model ({type(model).__name__}), but its tree_n_for does not "
            f"keep {n} candidates per request; flashtree supports flashmap 0.1.0's"
        )
