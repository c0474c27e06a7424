"""Greedy tree walk + commit in one Triton launch (one program per request), bit-identical to the references
`verify_greedy` and `commit_plan`.

The walk follows, from the root, the first valid child whose token equals the target's choice at the current node
(K static steps over a W-wide vector; with a cap, at most cap[b] of them: simulated acceptance). The same program
then writes the commit: the accepted path, bonus and committed tokens, commit / KV lengths, the window permutation
(page size 1) applied in place to `req_to_token` when given, the copy list for paged KV, and a serving step's outputs
(`commit.step_commit`: the new sequence lengths, int32 commit lengths, output tokens, the window's slots in commit
order, the statistics rows' accepted depth), which would otherwise be as many small launches after it. Fixed shapes,
no host synchronisation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .types import CommitPlan, StepCommit, VerifyResult, VoteTree
from .workspace import Workspace


@triton.jit
def _walk_commit_kernel(
    tok_ptr, par_ptr, val_ptr,  # (bs, M) tree
    tgt_ptr,  # (bs, W) target tokens (walk mode)
    path_ptr, alen_ptr, bonus_ptr, ctok_ptr,  # VerifyResult: (bs, K+1), (bs,), (bs,), (bs, K+1)
    perm_ptr, csrc_ptr, cdst_ptr, cmask_ptr, kvlen_ptr,  # CommitPlan: (bs, W), (bs, K) x3, (bs,)
    cap_ptr,  # (bs,) optional: accepted nodes at most
    seq_ptr, newlen_ptr, clen_ptr, out_ptr,  # optional StepCommit: (bs,) x3, (bs, OW)
    loc_ptr, loc_stride, slots_ptr, stats_ptr,  # optional: window slots (bs, W) -> (bs, W); stats rows (bs, 4)
    r2t_ptr, rows_ptr, starts_ptr, r2t_stride,  # optional req_to_token rewrite
    M: tl.constexpr, W: tl.constexpr, K: tl.constexpr,
    WP: tl.constexpr, KP1: tl.constexpr, OW: tl.constexpr, OWP: tl.constexpr,
    FROM_PATH: tl.constexpr, WRITE_RESULT: tl.constexpr, HAS_CAP: tl.constexpr, HAS_STEP: tl.constexpr,
    HAS_SLOTS: tl.constexpr, HAS_STATS: tl.constexpr, HAS_R2T: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, WP)  # node index, 0 = root
    kidx = tl.arange(0, KP1)  # path position / depth
    node = (idx >= 1) & (idx < W)
    if FROM_PATH:
        path = tl.load(path_ptr + b * (K + 1) + kidx, mask=kidx < K + 1, other=-1)
        alen = tl.load(alen_ptr + b).to(tl.int32)
        src = tl.load(path_ptr + b * (K + 1) + 1 + kidx, mask=kidx < K, other=-1)
        csrc_ok = (src > 0) & (src != kidx + 1) & (kidx < K)
    else:
        tok = tl.load(tok_ptr + b * M + idx - 1, mask=node, other=-1)
        par = tl.load(par_ptr + b * M + idx - 1, mask=node, other=-1)
        val = tl.load(val_ptr + b * M + idx - 1, mask=node, other=0) != 0
        tgt = tl.load(tgt_ptr + b * W + idx, mask=idx < W, other=0)
        path = tl.where(kidx == 0, 0, -1).to(tl.int64)
        ctok = tl.full([KP1], -1, tl.int64)
        src = tl.full([KP1], -1, tl.int64)
        cur = tl.zeros([], tl.int64)
        alen = tl.zeros([], tl.int32)
        alive = tl.full([], 1, tl.int1)
        if HAS_CAP:
            cap = tl.load(cap_ptr + b).to(tl.int32)
        else:
            cap = tl.full([], K, tl.int32)
        for s in tl.static_range(K):
            want = tl.sum(tl.where(idx == cur, tgt, 0), axis=0)
            ctok = tl.where((kidx == s) & alive, want, ctok)
            hit = val & (par == cur) & (tok == want)
            child = tl.min(tl.where(hit, idx, WP), axis=0).to(tl.int64)
            found = alive & (child < W) & (s < cap)
            path = tl.where((kidx == s + 1) & found, child, path)
            src = tl.where((kidx == s) & found, child, src)
            cur = tl.where(found, child, cur)
            alen += found.to(tl.int32)
            alive = found
        bonus = tl.sum(tl.where(idx == cur, tgt, 0), axis=0)
        ctok = tl.where(kidx == alen, bonus, ctok)
        csrc_ok = (src > 0) & (src != kidx + 1) & (kidx < K)
        if WRITE_RESULT:
            tl.store(path_ptr + b * (K + 1) + kidx, path, mask=kidx < K + 1)
            tl.store(ctok_ptr + b * (K + 1) + kidx, ctok, mask=kidx < K + 1)
            tl.store(alen_ptr + b, alen.to(tl.int64))
            tl.store(bonus_ptr + b, bonus.to(tl.int64))

    # permutation: path first (in depth order), then the other nodes in increasing index
    hitp = path[None, :] == idx[:, None]  # [WP, KP1]
    on_path = tl.sum(hitp.to(tl.int32), axis=1) > 0
    at_depth = tl.sum(tl.where(hitp, kidx[None, :], 0), axis=1)
    offp = (~on_path) & (idx < W)
    before = offp[None, :] & (idx[None, :] < idx[:, None])
    position = tl.where(on_path, at_depth, alen + 1 + tl.sum(before.to(tl.int32), axis=1))
    tl.store(perm_ptr + b * W + position, idx.to(tl.int64), mask=idx < W)
    kd = (kidx + 1).to(tl.int64)
    tl.store(csrc_ptr + b * K + kidx, tl.where(csrc_ok, src, kd), mask=kidx < K)
    tl.store(cdst_ptr + b * K + kidx, kd, mask=kidx < K)
    tl.store(cmask_ptr + b * K + kidx, csrc_ok, mask=kidx < K)
    tl.store(kvlen_ptr + b, (alen + 1).to(tl.int64))
    if HAS_STEP:
        sl = tl.load(seq_ptr + b)
        tl.store(newlen_ptr + b, sl + (alen + 1).to(sl.dtype))
        tl.store(clen_ptr + b, (alen + 1).to(tl.int32))
        tl.store(out_ptr + b * OW + kidx, tl.maximum(ctok, 0), mask=kidx < K + 1)
        o = tl.arange(0, OWP)
        tl.store(out_ptr + b * OW + o, tl.zeros([OWP], tl.int64), mask=(o >= K + 1) & (o < OW))
    if HAS_SLOTS:
        loc = tl.load(loc_ptr + b * loc_stride + idx, mask=idx < W)
        tl.store(slots_ptr + b * W + position, loc, mask=idx < W)
    if HAS_STATS:
        tl.store(stats_ptr + b * 4 + 3, alen)
    if HAS_R2T:
        r = tl.load(rows_ptr + b).to(tl.int64)
        st = tl.load(starts_ptr + b).to(tl.int64)
        base = r2t_ptr + r * r2t_stride + st
        win = tl.load(base + idx, mask=idx < W)
        tl.debug_barrier()
        tl.store(base + position, win, mask=idx < W)


def _np2(x: int) -> int:
    return max(2, triton.next_power_of_2(x))


def walk_and_commit_triton(
    tree: VoteTree,
    target_tokens: torch.Tensor,
    seq_lens: torch.Tensor | None = None,
    req_to_token: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
    *,
    out_width: int = 0,
    window_slots: torch.Tensor | None = None,
    stats: torch.Tensor | None = None,
    cap: torch.Tensor | None = None,
    workspace: Workspace | None = None,
):
    """Greedy walk and commit in one launch.

    Returns (VerifyResult, CommitPlan, StepCommit or None): with `seq_lens` the step's outputs as
    `commit.step_commit(result, plan, seq_lens, out_width, window_slots, stats)` gives them (`stats` written in place).
    With `req_to_token`, `rows` and `starts`, the window `req_to_token[rows[b], starts[b] : starts[b] + W]` is
    rewritten in place as `apply_permutation` does (page size 1). `cap` (bs,): the walk accepts at most cap[b] nodes
    (`verify.cut_walk`'s result, walked). With a `workspace`, the outputs a step reads within itself only (all but
    the bonus and the StepCommit's lengths and tokens) come from it.
    """
    bs, w, k = tree.batch_size, tree.width, tree.k
    if target_tokens.shape != (bs, w):
        raise ValueError(f"target_tokens must be (bs, W) = {(bs, w)}, got {tuple(target_tokens.shape)}")
    has_r2t = req_to_token is not None
    if has_r2t and (rows is None or starts is None):
        raise ValueError("req_to_token needs rows and starts")
    has_step = seq_lens is not None
    if (window_slots is not None or stats is not None) and not has_step:
        raise ValueError("window_slots and stats need seq_lens")
    ow = max(out_width, k + 1)
    dev = tree.tokens.device
    i64 = dict(dtype=torch.int64, device=dev)

    def scratch():  # path, committed tokens, accept_len, permutation, copy src / dst / mask, kv_len
        return (torch.empty(bs, k + 1, **i64), torch.empty(bs, k + 1, **i64), torch.empty(bs, **i64),
                torch.empty(bs, w, **i64), torch.empty(bs, k, **i64), torch.empty(bs, k, **i64),
                torch.empty(bs, k, dtype=torch.bool, device=dev), torch.empty(bs, **i64))

    path, ctok, alen, perm, csrc, cdst, cmask, kvlen = (
        scratch() if workspace is None else workspace.take(("walk", bs, w, k, dev), scratch))
    bonus = torch.empty(bs, **i64)
    step = None
    if has_step:
        slots = None
        if window_slots is not None:
            if window_slots.stride(1) != 1:
                window_slots = window_slots.contiguous()
            dtype = window_slots.dtype
            slots = (torch.empty(bs, w, dtype=dtype, device=dev) if workspace is None else workspace.take(
                ("slots", bs, w, dtype, dev), lambda: (torch.empty(bs, w, dtype=dtype, device=dev),))[0])
        step = StepCommit(commit_len=torch.empty(bs, dtype=torch.int32, device=dev), seq_lens=torch.empty_like(seq_lens),
                          out_tokens=torch.empty(bs, ow, **i64), slots=slots)
    dummy = alen
    if bs > 0:
        _walk_commit_kernel[(bs,)](
            tree.tokens.contiguous(), tree.parents.contiguous(), tree.valid.contiguous(), target_tokens.contiguous(),
            path, alen, bonus, ctok, perm, csrc, cdst, cmask, kvlen,
            dummy if cap is None else cap.contiguous(),
            *((seq_lens, step.seq_lens, step.commit_len, step.out_tokens) if has_step else (dummy,) * 4),
            dummy if window_slots is None else window_slots, 0 if window_slots is None else window_slots.stride(0),
            dummy if window_slots is None else step.slots, dummy if stats is None else stats,
            req_to_token if has_r2t else dummy, rows if has_r2t else dummy, starts if has_r2t else dummy,
            req_to_token.stride(0) if has_r2t else 0,
            M=w - 1, W=w, K=k, WP=_np2(w), KP1=_np2(k + 1), OW=ow, OWP=_np2(ow),
            FROM_PATH=False, WRITE_RESULT=True, HAS_CAP=cap is not None, HAS_STEP=has_step,
            HAS_SLOTS=window_slots is not None, HAS_STATS=stats is not None, HAS_R2T=has_r2t, num_warps=1,
        )
    res = VerifyResult(path=path, accept_len=alen, bonus=bonus, tokens=ctok)
    plan = CommitPlan(permutation=perm, copy_src=csrc, copy_dst=cdst, copy_mask=cmask, kv_len=kvlen)
    return res, plan, step


def verify_greedy_triton(tree: VoteTree, target_tokens: torch.Tensor) -> VerifyResult:
    """Same signature and result as `flashtree.tree.verify_greedy`."""
    return walk_and_commit_triton(tree, target_tokens)[0]


def commit_plan_triton(tree: VoteTree, result: VerifyResult) -> CommitPlan:
    """Same signature and result as `flashtree.tree.commit_plan` (reads the accepted path, does not walk)."""
    bs, w, k = tree.batch_size, tree.width, tree.k
    dev = result.path.device
    i64 = dict(dtype=torch.int64, device=dev)
    perm = torch.empty(bs, w, **i64)
    csrc = torch.empty(bs, k, **i64)
    cdst = torch.empty(bs, k, **i64)
    cmask = torch.empty(bs, k, dtype=torch.bool, device=dev)
    kvlen = torch.empty(bs, **i64)
    path = result.path.contiguous()
    alen = result.accept_len.contiguous()
    if bs > 0:
        _walk_commit_kernel[(bs,)](
            path, path, path, path,
            path, alen, alen, path, perm, csrc, cdst, cmask, kvlen,
            alen, alen, alen, alen, alen, alen, 0, alen, alen, alen, alen, alen, 0,
            M=w - 1, W=w, K=k, WP=_np2(w), KP1=_np2(k + 1), OW=k + 1, OWP=_np2(k + 1),
            FROM_PATH=True, WRITE_RESULT=False, HAS_CAP=False, HAS_STEP=False, HAS_SLOTS=False, HAS_STATS=False,
            HAS_R2T=False, num_warps=1,
        )
    return CommitPlan(permutation=perm, copy_src=csrc, copy_dst=cdst, copy_mask=cmask, kv_len=kvlen)
