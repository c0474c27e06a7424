"""flashtree's Triton kernels against their peers on one GPU, in one run.

    python benchmarks/bench_kernels.py --out results/         # a JSON row per shape as it goes, then the tables;
                                                              # writes results/kernels.jsonl
    python benchmarks/kernel_tables.py results/kernels.jsonl  # the tables again, from a saved run

Per shape: flashtree's time (eager and CUDA-graph replay), each peer's time (flashmap 0.1.0 if importable, SDPA,
flex_attention, sglang's Triton extend attention if importable, torch argmax / Gumbel-max), the memory floor at the
measured copy rate, the ratios, and an output check. Times are triton.testing.do_bench medians in microseconds.

    python benchmarks/bench_kernels.py --parts attention-tune --out results/   # a launch sweep of the verify attention
    python benchmarks/bench_kernels.py --parts attention-small --out results/  # the bs-1 launch grid, in-graph too
    python benchmarks/bench_kernels.py --parts policies-tune --out results/    # the prob build's launch variants
    python benchmarks/bench_kernels.py --parts attention-early --out results/  # prefix_ready, in a graph of layers

`attention-tune` (not in the default parts, ~1.5 min) times the verify attention's launch variants (`tune` overrides:
splits, key tile, warps, stages, bf16 partials, the fused merge, ...) at bs 1 / 4K, bs 1 / 32K and bs 8 / 4K, then
the default and the best tiles at bs 64 / 8K, every point checked against the fp32 reference, and ends with the best
point per shape (the `verify_attn_tune_best` table). `attention-small` (not in the default, ~4 min) times a grid of
launches at bs 1 / 4K and bs 1 / 32K (rows per program, key tile, split counts),
each point checked, then the default and the fastest points per call inside one CUDA graph of 36 calls over 36
distinct KV caches (a 36-layer forward's cost a layer, without the one replay's launch overhead), then the fastest
tiles at bs 8 / 4K and bs 64 / 8K. `policies-tune` (not in the default parts, under a minute) times
the prob build's default launch, then its selections (radix, radix-fused, radix-span, rank) at 1 / 2 / 4 / 8 / 16
warps with radix-span's knobs (parent, pass loop, equality loop, digit) at the policies' shapes, every point checked
against the torch reference, and ends with a table per shape (the best point: `policy_build_tune_best`). Without CUDA
(TRITON_INTERPRET=1) only its checks run.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
import traceback
import types

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kernel_tables  # noqa: E402

from flashtree.attention.triton_verify import launch_choice, tree_attention_paged_triton, tree_attention_triton  # noqa: E402,E501
from flashtree.sampler.triton_sampler import sample_candidates_triton, sample_rows_triton  # noqa: E402
from flashtree.tree import to_eagle, verify_inputs  # noqa: E402
from flashtree.tree.build import build_vote_tree  # noqa: E402 (the torch reference the kernels are checked against)
from flashtree.tree.commit import commit_plan  # noqa: E402
from flashtree.tree.verify import verify_greedy  # noqa: E402
from flashtree.tree.triton_build import build_vote_tree_eagle_triton  # noqa: E402
from flashtree.tree.triton_walk import walk_and_commit_triton  # noqa: E402

ROWS: list = []
OUT_FILE = None


def log(**kw):
    ROWS.append(kw)
    line = json.dumps(kw)
    print(line, flush=True)
    if OUT_FILE:
        with open(OUT_FILE, "a") as fh:
            fh.write(line + "\n")


def bench(fn, rep=40):
    return triton.testing.do_bench(fn, warmup=5, rep=rep, return_mode="median") * 1e3


def graphed(fn):
    return graphed_out(fn)[0]


def try_graph(fn):
    try:
        return bench(graphed(fn))
    except Exception as e:  # noqa: BLE001
        print("graph failed:", repr(e)[:300], flush=True)
        return None


def ratio(a, b):
    return None if a is None or b is None else round(a / b, 2)


def ceiling():
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=5, rep=50, return_mode="median")
    bw = 2 * x.numel() / (ms * 1e-3)
    del x, y
    torch.cuda.empty_cache()
    log(kind="ceiling", copy_TBps=round(bw / 1e12, 3))
    return bw


def anchor_candidates(bs, n, k, vocab=50, device="cuda"):
    base = torch.randint(0, vocab, (bs, 1, k), device=device)
    flip = torch.rand(bs, n, k, device=device) < 0.25
    return torch.where(flip, torch.randint(0, vocab, (bs, n, k), device=device), base)


def part_builder():
    try:
        from flashmap.sglang.tree import build_tree_abi

        comp = torch.compile(build_tree_abi, dynamic=True)
    except Exception as e:  # noqa: BLE001
        print("flashmap not importable:", repr(e)[:200])
        build_tree_abi = comp = None
    for bs, n, k, w in [(1, 8, 15, 16), (16, 8, 15, 16), (64, 8, 15, 16), (64, 32, 15, 32), (256, 16, 15, 16)]:
        cands = anchor_candidates(bs, n, k)
        fn = lambda: build_vote_tree_eagle_triton(cands, w)  # noqa: E731
        tree, enc = fn()
        ref = build_vote_tree(cands, w)
        same_ref = all(torch.equal(getattr(tree, f), getattr(ref, f)) for f in
                       ["tokens", "parents", "depth", "votes", "valid", "first_candidate"])
        same_ref &= torch.equal(enc.parent_list, to_eagle(ref).parent_list)
        row = dict(kind="tree_build", bs=bs, n=n, k=k, width=w, same_as_reference=same_ref,
                   flashtree_eager_us=bench(fn), flashtree_graph_us=try_graph(fn))
        if build_tree_abi is not None:
            tok, ids, _ = build_tree_abi(cands, w)
            row["same_as_flashmap"] = bool(torch.equal(tok, enc.draft_tokens) and torch.equal(ids, enc.top_scores_index))
            row["flashmap_eager_us"] = bench(lambda: build_tree_abi(cands, w))
            f2 = lambda: comp(cands, w)  # noqa: E731
            f2()
            row["flashmap_compiled_graph_us"] = try_graph(f2)
            row["speedup_vs_flashmap_graph"] = ratio(row["flashmap_compiled_graph_us"], row["flashtree_graph_us"])
        log(**row)


def consistent_logq(cands, vocab=50):
    """Per-position log q that is a function of (depth, token, previous token), as a draft's is (shared prefixes
    share their path log-probability): what the prob build ranks."""
    k, dev = cands.shape[2], cands.device
    table = -torch.rand(k, vocab + 1, vocab, device=dev) * 3
    prev = torch.cat([torch.full_like(cands[:, :, :1], vocab), cands[:, :, :-1]], dim=2)
    return table[torch.arange(k, device=dev).view(1, 1, k).expand_as(cands), prev, cands]


def trees_equal(tree, ref):
    return all(torch.equal(getattr(tree, f).cpu(), getattr(ref, f)) for f in ["tokens", "parents", "depth", "valid"])


def part_policies():
    """The server's tree policies: prob's build against its torch builder, timed as the fused launch (the path sums
    in the kernel) with each selection and as the former cumsum + scored launch, and best-first's tree grown from a
    vanilla Markov head (W - 1 rounds, as the server's draft graph tail runs it: each round's top k through the
    top-k kernels) against the same rounds through a full log-softmax and torch's top-k; best-first over independent
    positions (DFLASH) as its one-launch build against the torch rounds, with the per-position top-k that feeds it."""
    from flashtree.patches.policy_draws import grow, vanilla_step_logits
    from flashtree.sampler import reference
    from flashtree.tree import DraftScores, build_tree
    from flashtree.tree.build import build_prob_tree, build_scored_tree
    from flashtree.tree.triton_build import build_prob_tree_triton, build_scored_tree_triton

    fields = ["tokens", "parents", "depth", "votes", "valid", "first_candidate"]
    for bs, n, k, w in [(1, 8, 15, 16), (64, 8, 15, 16), (64, 32, 15, 32), (64, 64, 8, 64)]:
        cands = anchor_candidates(bs, n, k)
        logp = consistent_logq(cands)
        ref_fn = lambda: build_scored_tree(cands, w, logp.cumsum(dim=2))  # noqa: E731
        torch_eager_us, torch_graph_us = bench(ref_fn), try_graph(ref_fn)
        # the fused build sums as torch's CPU cumsum (in float64), which CUDA's need not: its reference runs on the CPU
        fused_ref = build_prob_tree(cands.cpu(), w, logp.cpu())
        builds = {
            "fused_auto": (lambda: build_prob_tree_triton(cands, w, logp), fused_ref),  # the server's launch
            "fused_radix": (lambda: build_prob_tree_triton(cands, w, logp, select="radix"), fused_ref),
            "fused_rank": (lambda: build_prob_tree_triton(cands, w, logp, select="rank"), fused_ref),
            "cumsum_scored": (lambda: build_scored_tree_triton(cands, w, logp.cumsum(dim=2)), ref_fn()),
        }
        for build, (fn, ref) in builds.items():
            tree = fn()
            same = all(torch.equal(getattr(tree, f).cpu(), getattr(ref, f).cpu()) for f in fields)
            log(kind="policy_build", policy="prob", build=build, bs=bs, n=n, k=k, width=w, vocab=None,
                same_as_reference=same, flashtree_eager_us=bench(fn), flashtree_graph_us=try_graph(fn),
                torch_eager_us=torch_eager_us, torch_graph_us=torch_graph_us)
    for bs, k, w, vocab, rank in [(1, 8, 16, 49152, 32), (64, 8, 16, 49152, 32), (64, 8, 32, 49152, 32),
                                  (64, 8, 32, 151936, 256)]:
        base = torch.randn(bs, k, vocab, device="cuda", dtype=torch.bfloat16)
        w1 = torch.randn(vocab, rank, device="cuda", dtype=torch.bfloat16) * 0.1
        w2 = torch.randn(vocab, rank, device="cuda", dtype=torch.bfloat16) * 0.1
        anchor = torch.randint(0, vocab, (bs,), device="cuda")
        fn = lambda: grow(base, anchor, w1, w2, width=w)  # noqa: E731
        # the torch builder: each round's full log-softmax and torch top-k; the check's reference takes the top k by
        # a stable sort (bf16 logits tie: the kernels take the lower token, as the sort does)
        logits = vanilla_step_logits(base, w1, w2)
        full = DraftScores(anchor=anchor, step_logprobs=lambda r, p, t: logits(r, p, t).float().log_softmax(-1))
        by_sort = DraftScores(anchor=anchor, step_logprobs=full.step_logprobs,
                              step_topk=lambda r, p, t, n: reference.row_topk_logprobs(logits(r, p, t), n))
        shape = torch.zeros((bs, 1, k), dtype=torch.long, device="cuda")
        torch_fn = lambda: build_tree(shape, w, "best-first", full)  # noqa: E731
        tree, ref = fn(), build_tree(shape, w, "best-first", by_sort)
        same = all(torch.equal(getattr(tree, f), getattr(ref, f)) for f in ["tokens", "parents", "depth", "valid"])
        log(kind="policy_build", policy="best-first", bs=bs, n=0, k=k, width=w, vocab=vocab, same_as_reference=same,
            flashtree_eager_us=bench(fn, rep=10), flashtree_graph_us=try_graph(fn),
            torch_eager_us=bench(torch_fn, rep=10), torch_graph_us=try_graph(torch_fn))
    # best-first over independent positions (DFLASH): the build from each position's top W - 1 (one launch) against
    # the registered builder's rounds over the same table; then the top-k that feeds it, over the block's logits
    from flashtree.sampler import row_topk_logprobs
    from flashtree.sampler.triton_topk import row_topk_logprobs as triton_topk
    from flashtree.tree.policies.best_first import best_first, grow_marginal, marginal_topk_scores
    from flashtree.tree.triton_grow import grow_marginal_triton

    for bs, k, w, vocab in [(1, 15, 16, 151936), (64, 15, 16, 151936), (64, 15, 32, 151936), (64, 8, 64, 49152)]:
        logits = torch.randn(bs * k, vocab, device="cuda", dtype=torch.bfloat16)
        topk_fn = lambda: row_topk_logprobs(logits, w - 1)  # noqa: E731  (the threshold select)
        rounds_fn = lambda: triton_topk(logits, w - 1, select="rounds")  # noqa: E731
        want_ids = reference.row_topk_logprobs(logits, w - 1)[1]
        topk_same = all(torch.equal(f()[1], want_ids) for f in (topk_fn, rounds_fn))
        top, ids = (t.view(bs, k, -1) for t in topk_fn())
        fn = lambda: grow_marginal_triton(top, ids, w)  # noqa: E731
        ref = grow_marginal(top.cpu(), ids.cpu(), w)
        same = trees_equal(fn(), ref)
        shape = torch.zeros((bs, 1, k), dtype=torch.long, device="cuda")
        rounds = lambda: best_first(shape, w, marginal_topk_scores(top, ids))  # noqa: E731  (the torch rounds)
        log(kind="policy_build", policy="best-first", build="marginal", bs=bs, n=0, k=k, width=w, vocab=vocab,
            same_as_reference=same, flashtree_eager_us=bench(fn), flashtree_graph_us=try_graph(fn),
            no_prefetch_graph_us=try_graph(lambda: grow_marginal_triton(top, ids, w, prefetch=False)),
            shuffle_max_graph_us=try_graph(lambda: grow_marginal_triton(top, ids, w, redux=False)),
            shuffle_max_same_as_reference=trees_equal(grow_marginal_triton(top, ids, w, redux=False), ref),
            torch_eager_us=bench(rounds, rep=10), torch_graph_us=try_graph(rounds),
            topk_eager_us=bench(topk_fn), topk_graph_us=try_graph(topk_fn), topk_rounds_graph_us=try_graph(rounds_fn),
            topk_same_as_reference=topk_same)


# policies-tune: the prob build's shapes (bs, N, K, W), the anchor's first (the budget cuts the last)
PT_SHAPES = [(64, 32, 15, 32), (64, 8, 15, 16), (1, 8, 15, 16), (64, 64, 8, 64)]
PT_FIELDS = ["tokens", "parents", "depth", "votes", "valid", "first_candidate"]


def policies_tune_points(n, k):
    """(select, tune, launch) of each launch timed at N, K (select and tune as `build_prob_tree_triton` takes them,
    launch: `launch_choice`'s), one point per distinct launch: the shipped one first, then per warp count (1 to 8 at up
    to RANK_MAX_SLOTS slots, else 2 to 16: one warp spills there) the byte-wise radix select, radix-fused and
    radix-span unrolled with the parents by max, radix-span with them by scan, its passes as a loop and its equality
    masks in blocks of 8 candidates too, and rank with 32- and 128-slot chunks where it is an option; that last
    radix-span with 5- and 6-bit digits at 4 and 8 warps."""
    from flashtree.tree.triton_build import RANK_MAX_SLOTS, _np2, launch_choice

    few = _np2(n) * _np2(k) <= RANK_MAX_SLOTS
    pts = [("auto", {})]
    for w in (1, 2, 4, 8) if few else (2, 4, 8, 16):
        scan = dict(num_warps=w, parent="scan")
        pts += [("radix", dict(num_warps=w)), ("radix-fused", dict(num_warps=w)), ("radix-span", dict(num_warps=w)),
                ("radix-span", scan), ("radix-span", dict(scan, passes="loop")),
                ("radix-span", dict(scan, passes="loop", eq_unroll=8))]
        if few:
            pts += [("rank", dict(num_warps=w)), ("rank", dict(num_warps=w, rank_chunk=128))]
    pts += [("radix-span", dict(num_warps=w, parent="scan", passes="loop", eq_unroll=8, digit=d))
            for w in (4, 8) for d in (5, 6)]
    seen, out = set(), []
    for sel, tune in pts:
        c = launch_choice(n, k, sel, tune)
        if c["select"] not in ("radix-fused", "radix-span"):
            c.pop("digit")  # read by those two only
            c.pop("passes")
        if c["select"] != "rank":
            c.pop("rank_chunk")
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append((sel, tune, c))
    return out


def n_slots_per_thread(n, k, warps):
    return triton.next_power_of_2(n) * triton.next_power_of_2(k) // (32 * warps)


def _pt_compile(job):
    """Compiles one policies-tune launch into Triton's cache (a worker of a process pool: the sweep's compiles run
    side by side; the timing process then loads them)."""
    from flashtree.tree.triton_build import build_prob_tree_triton

    n, k, w, sel, tune = job
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cands = torch.zeros(1, n, k, dtype=torch.long, device=dev)
    build_prob_tree_triton(cands, w, torch.zeros(1, n, k, device=dev), select=sel, tune=tune)
    if dev == "cuda":
        torch.cuda.synchronize()


def precompile(jobs, workers=14):
    precompile_with(_pt_compile, jobs, workers)


def precompile_with(compile_one, jobs, workers=14):
    """Runs `compile_one` over `jobs` in a process pool: Triton's compiles side by side into its on-disk cache, from
    which the timing process then loads them."""
    import concurrent.futures
    import multiprocessing

    t = time.time()
    try:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(min(workers, os.cpu_count() or 1, len(jobs)), ctx) as ex:
            list(ex.map(compile_one, jobs))
    except Exception as e:  # noqa: BLE001 (the timing loop compiles what is missing)
        print("precompile failed:", repr(e)[:300], flush=True)
    print(f"# precompiled {len(jobs)} launches in {time.time() - t:.1f}s", flush=True)


def graphed_out(fn):
    """(replay, the captured call's result: what each replay rewrites), after three warm-up calls on a side stream."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g.replay, out


def part_policies_tune(budget_s=60.0):
    """The prob build's launch variants side by side (`policies_tune_points`) at PT_SHAPES, graphed. Every point is
    checked against the torch reference on the CPU twice: its eager call, and its graph replayed on a second input
    copied into the captured one. After `budget_s` seconds no new point is timed. Ends with a table per shape, fastest
    first, and the best point against the shipped one (`policy_build_tune_best`). Without CUDA (TRITON_INTERPRET=1)
    only the checks run, at bs 2."""
    from flashtree.tree.build import build_prob_tree
    from flashtree.tree.triton_build import build_prob_tree_triton

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    t0 = time.time()
    if cuda:
        tiny = torch.zeros(1, device="cuda")
        log(kind="graph_floor", one_kernel_us=try_graph(lambda: tiny.add_(1)))
        jobs = {(n, k, w, tuple(sorted(c.items()))) for _, n, k, w in PT_SHAPES for *_, c in policies_tune_points(n, k)}
        jobs = [(n, k, w, dict(c).pop("select"), {x: v for x, v in c if x != "select"}) for n, k, w, c in jobs]
        # the slowest compiles (many slots a thread, wide digits) first
        jobs.sort(key=lambda j: (-n_slots_per_thread(j[0], j[1], j[4]["num_warps"]), -j[4].get("digit", 0)))
        precompile(jobs)

    def same(tree, ref):
        return all(torch.equal(getattr(tree, f).cpu(), getattr(ref, f)) for f in PT_FIELDS)

    rows, skipped = {}, 0
    for bs, n, k, w in PT_SHAPES:
        bs = bs if cuda else min(bs, 2)
        cands = anchor_candidates(bs, n, k, device=dev)
        logp = consistent_logq(cands)
        cands2 = anchor_candidates(bs, n, k, device=dev)
        logp2 = consistent_logq(cands2)
        # the fused build sums as torch's CPU cumsum (in float64): its reference runs on the CPU
        ref = build_prob_tree(cands.cpu(), w, logp.cpu())
        ref2 = build_prob_tree(cands2.cpu(), w, logp2.cpu())
        shape = rows.setdefault((bs, n, k, w), [])
        shipped = None  # the shipped point's graph and inputs: timed again after the others, a noise gauge
        for sel, tune, launch in policies_tune_points(n, k):
            if cuda and time.time() - t0 > budget_s:
                skipped += 1
                continue
            row = dict(kind="policy_build_tune", policy="prob", bs=bs, n=n, k=k, width=w, build=sel, tune=tune,
                       launch=launch, same_as_reference=False, flashtree_graph_us=None)
            x, lq = cands.clone(), logp.clone()
            fn = lambda: build_prob_tree_triton(x, w, lq, select=sel, tune=tune)  # noqa: E731
            try:
                ok = same(fn(), ref)
                if cuda:
                    replay, out = graphed_out(fn)
                    row["flashtree_graph_us"] = round(bench(replay), 2)
                    x.copy_(cands2)
                    lq.copy_(logp2)
                    replay()
                    ok = ok and same(out, ref2)
                    if sel == "auto":
                        shipped = (replay, x, lq)
                row["same_as_reference"] = ok
            except Exception as e:  # noqa: BLE001
                row["error"] = repr(e)[:300]
            log(**row)
            shape.append(row)
        if shipped is not None:
            replay, x, lq = shipped
            x.copy_(cands)
            lq.copy_(logp)
            shape[0]["again_us"] = round(bench(replay), 2)
            del shipped, replay
    if skipped:
        log(kind="policy_build_tune_skipped", points=skipped, budget_s=budget_s)
    print("# policies-tune: graph µs per launch, fastest first", flush=True)
    for (bs, n, k, w), pts in rows.items():
        print(f"\nbs {bs}, N {n}, K {k}, W {w}")
        print("| graph µs | select | warps | parent | digit | passes | eq unroll | rank chunk | same as reference |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        timed = sorted(pts, key=lambda r: (r["flashtree_graph_us"] is None, r["flashtree_graph_us"] or 0))
        for r in timed:
            c = r["launch"]
            tag = f" (shipped; again {kernel_tables.num(r.get('again_us'), 2)})" if r["build"] == "auto" else ""
            print(f"| {kernel_tables.num(r['flashtree_graph_us'], 2)} | {c['select']}{tag} | "
                  f"{c['num_warps']} | {c['parent']} | {c.get('digit', '–')} | {c.get('passes', '–')} | "
                  f"{c['eq_unroll'] or 'all'} | {c.get('rank_chunk', '–')} | "
                  f"{kernel_tables.yes(r['same_as_reference'])} |")
        good = [r for r in pts if r["same_as_reference"] and r["flashtree_graph_us"] is not None]
        if good:
            best = min(good, key=lambda r: r["flashtree_graph_us"])
            ship = next((r for r in pts if r["build"] == "auto"), {})
            log(kind="policy_build_tune_best", bs=bs, n=n, k=k, width=w, shipped_us=ship.get("flashtree_graph_us"),
                shipped_again_us=ship.get("again_us"), best_us=best["flashtree_graph_us"],
                speedup_vs_shipped=ratio(ship.get("flashtree_graph_us"), best["flashtree_graph_us"]),
                build=best["build"], tune=best["tune"], launch=best["launch"],
                all_same_as_reference=all(r["same_as_reference"] for r in pts))
        elif not cuda:
            log(kind="policy_build_tune_checked", bs=bs, n=n, k=k, width=w, points=len(pts),
                all_same_as_reference=all(r["same_as_reference"] for r in pts))


def part_walk():
    for bs, n, k, w in [(1, 8, 15, 16), (64, 8, 15, 16), (64, 32, 15, 32), (256, 16, 15, 16)]:
        cands = anchor_candidates(bs, n, k)
        tree, _ = build_vote_tree_eagle_triton(cands, w)
        # targets that follow the first child often: deep acceptance
        tgt = torch.randint(0, 50, (bs, w), device="cuda")
        ref_tree = build_vote_tree(cands, w)
        for c in range(w - 1, 0, -1):
            p = ref_tree.parents[:, c - 1]
            keep = ref_tree.valid[:, c - 1] & (torch.rand(bs, device="cuda") < 0.9)
            tgt[keep, p[keep]] = ref_tree.tokens[keep, c - 1]
        seq = torch.randint(100, 4000, (bs,), device="cuda")
        r2t = torch.arange(bs * 8192, device="cuda", dtype=torch.int32).view(bs, 8192)
        rows = torch.arange(bs, device="cuda")
        starts = seq.clone()
        res_ref = verify_greedy(ref_tree, tgt)
        plan_ref = commit_plan(ref_tree, res_ref)
        res, plan, _ = walk_and_commit_triton(tree, tgt, seq)
        same = all(torch.equal(getattr(res, f), getattr(res_ref, f)) for f in ["path", "accept_len", "bonus", "tokens"])
        same &= all(torch.equal(getattr(plan, f), getattr(plan_ref, f)) for f in
                    ["permutation", "copy_src", "copy_dst", "copy_mask", "kv_len"])
        fn = lambda: walk_and_commit_triton(tree, tgt, seq, r2t, rows, starts)  # noqa: E731

        def whole():  # the tree path's own kernels in a step: build, then walk + commit
            t, _ = build_vote_tree_eagle_triton(cands, w)
            return walk_and_commit_triton(t, tgt, seq, r2t, rows, starts)

        log(kind="walk_commit", bs=bs, n=n, k=k, width=w, same_as_reference=same,
            mean_accept=round(res.accept_len.float().mean().item(), 2),
            flashtree_eager_us=bench(fn), flashtree_graph_us=try_graph(fn),
            build_plus_walk_graph_us=try_graph(whole),
            torch_reference_eager_us=bench(lambda: commit_plan(ref_tree, verify_greedy(ref_tree, tgt))))


def host_and_wall_us(fn, calls=200):
    """Per call: host time to issue `calls` back-to-back calls, and wall time until the device has run them (the
    larger of host and device time per call: what a host-bound decode step pays)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return round((t1 - t0) / calls * 1e6, 1), round((t2 - t0) / calls * 1e6, 1)


def part_inputs():
    """The tree step's verify inputs: flashtree's one launch (ids, positions, FULL_MASK, statistics rows) against the
    path it replaced (`to_eagle` + sglang's `build_tree_kernel_efficient` + the ids concatenation)."""
    try:
        from sglang.srt.speculative.eagle_utils import TreeMaskMode, build_tree_kernel_efficient
    except Exception as e:  # noqa: BLE001
        print("sglang not importable:", repr(e)[:200])
        build_tree_kernel_efficient = None
    for bs, n, k, w in [(1, 8, 8, 9), (8, 8, 8, 9), (32, 8, 8, 9), (64, 32, 15, 32)]:
        cands = anchor_candidates(bs, n, k)
        tree, _ = build_vote_tree_eagle_triton(cands, w)
        anchor = torch.randint(0, 50, (bs,), device="cuda")
        seq = torch.randint(100, 600, (bs,), device="cuda")
        total = int(seq.sum())
        mine = lambda: verify_inputs(tree, anchor, seq, total, cands)  # noqa: E731
        inp = mine()
        host, wall = host_and_wall_us(mine)
        row = dict(kind="verify_inputs", bs=bs, n=n, k=k, width=w, flashtree_host_us=host, flashtree_wall_us=wall,
                   flashtree_graph_us=try_graph(mine))
        if build_tree_kernel_efficient is not None:
            def peer():
                enc = to_eagle(tree)
                out = build_tree_kernel_efficient(
                    anchor, enc.parent_list, enc.top_scores_index, enc.draft_tokens, seq, total, enc.topk,
                    enc.spec_steps, enc.num_verify_tokens, tree_mask_mode=TreeMaskMode.FULL_MASK)
                return out, torch.cat([anchor.view(bs, 1), tree.tokens], dim=1)

            out, ids = peer()
            row["same_as_sglang"] = bool(torch.equal(out[0], inp.mask) and torch.equal(out[1], inp.positions)
                                         and torch.equal(ids, inp.ids))
            row["sglang_host_us"], row["sglang_wall_us"] = host_and_wall_us(peer)
            row["wall_speedup_vs_sglang"] = ratio(row["sglang_wall_us"], wall)
        log(**row)


def part_markov(min_rank: int = 0):
    """The tree step's N draft draws through a vanilla Markov head (DSPARK's draft graph tail): flashtree's Markov
    draws (fused and GEMM + pick forms, K steps) against the torch ops the graph tail ran before (sglang's
    VanillaMarkov step: embedding + GEMV + add on the repeated base logits, then exponential noise + Gumbel-max)."""
    import torch.nn.functional as F

    from flashtree.patches.graph_draws import gumbel_pick
    from flashtree.sampler.markov import candidate_rows, new_state
    from flashtree.sampler.triton_markov import GEMM_MIN_RANK, markov_draws_fused, markov_draws_gemm

    # SmolLM2's head (V 49152, rank 32), then Qwen3-8B's DSPARK head (V 151936, rank 256) at the live batch sizes
    for bs, n, k, v, rank in [(1, 8, 7, 49152, 32), (8, 8, 7, 49152, 32), (32, 8, 7, 49152, 32),
                              (64, 8, 7, 49152, 32), (1, 8, 15, 151936, 64), (1, 8, 7, 151936, 256),
                              (8, 8, 7, 151936, 256), (32, 8, 7, 151936, 256), (64, 8, 7, 151936, 256)]:
        if rank < min_rank:
            continue
        base = (torch.randn(bs, k, v, device="cuda") * 3).bfloat16()
        w1 = torch.randn(v, rank, device="cuda").bfloat16()
        w2 = (torch.randn(v, rank, device="cuda") / rank**0.5).bfloat16()
        anchor = torch.randint(0, v, (bs,), device="cuda")
        inv, greedy = candidate_rows(bs, n, 0.7, "cuda")
        noise = torch.empty(bs * n, v, device="cuda")
        state = new_state(0, "cuda")

        def peer():
            b, prev, out = base.repeat_interleave(n, dim=0), anchor.repeat_interleave(n), []
            for j in range(k):
                prev = gumbel_pick(b[:, j] + F.linear(F.embedding(prev, w1), w2), noise.exponential_(), inv, greedy)
                out.append(prev)
            return torch.stack(out, 1).view(bs, n, k)

        ref = peer()
        row = dict(kind="markov_draws", bs=bs, n=n, k=k, vocab=v, rank=rank, dtype="bf16",
                   torch_graph_us=try_graph(peer), torch_wall_us=host_and_wall_us(peer)[1])
        # the two forms with their shipped launch choices, the GEMM form's row blocks and log q
        variants = {"fused": lambda: markov_draws_fused(base, anchor, w1, w2, n, inv, greedy, state),
                    "gemm": lambda: markov_draws_gemm(base, anchor, w1, w2, n, inv, greedy, state),
                    "gemm_br32": lambda: markov_draws_gemm(base, anchor, w1, w2, n, inv, greedy, state, block_rows=32),
                    "gemm_bv512": lambda: markov_draws_gemm(base, anchor, w1, w2, n, inv, greedy, state, block_v=512),
                    "gemm_logp": lambda: markov_draws_gemm(base, anchor, w1, w2, n, inv, greedy, state,
                                                           return_logp=True)[0]}
        for tag, mine in variants.items():
            got = mine()
            row[f"greedy_same_{tag}"] = bool(torch.equal(got[:, 0], ref[:, 0]))
            row[f"flashtree_graph_us_{tag}"] = try_graph(mine)
        row["shipped"] = "gemm" if rank >= GEMM_MIN_RANK else "fused"
        row["flashtree_graph_us_shipped"] = row[f"flashtree_graph_us_{row['shipped']}"]
        row["greedy_same_shipped"] = row[f"greedy_same_{row['shipped']}"]
        row["speedup_graph_shipped"] = ratio(row["torch_graph_us"], row["flashtree_graph_us_shipped"])
        log(**row)


def part_sampler(bw):
    try:
        from flashmap.sglang.kernels import sample_rows as fm_sample
    except Exception as e:  # noqa: BLE001
        print("flashmap sampler not importable:", repr(e)[:200])
        fm_sample = None
    for rows, vocab, dtype in [(15, 151936, torch.bfloat16), (960, 32768, torch.bfloat16),
                               (960, 151936, torch.bfloat16), (960, 151936, torch.float32)]:
        logits = torch.randn(rows, vocab, device="cuda").to(dtype)
        t_samp = torch.full((rows,), 0.7, device="cuda")
        t_greedy = torch.zeros(rows, device="cuda")
        floor = rows * vocab * logits.element_size() / bw * 1e6
        argmax = logits.argmax(-1)
        row = dict(kind="sampler", rows=rows, vocab=vocab, dtype=str(dtype).split(".")[-1], floor_us=floor,
                   greedy_equals_torch_argmax=torch.equal(sample_rows_triton(logits, t_greedy), argmax),
                   greedy_only_equals_torch_argmax=torch.equal(sample_rows_triton(logits, 0.0), argmax))
        fs = lambda: sample_rows_triton(logits, t_samp)  # noqa: E731
        fg = lambda: sample_rows_triton(logits, t_greedy)  # noqa: E731 (per-row temperatures: the mixed-batch path)
        fo = lambda: sample_rows_triton(logits, 0.0)  # noqa: E731 (all greedy, known on the host: one launch)
        row["flashtree_sample_eager_us"] = bench(fs)
        row["flashtree_sample_graph_us"] = try_graph(fs)
        row["flashtree_greedy_eager_us"] = bench(fg)
        row["flashtree_greedy_graph_us"] = try_graph(fg)
        row["flashtree_greedy_only_eager_us"] = bench(fo)
        row["flashtree_greedy_only_graph_us"] = try_graph(fo)
        row["torch_argmax_us"] = bench(lambda: logits.argmax(-1))
        row["torch_argmax_graph_us"] = try_graph(lambda: logits.argmax(-1))

        def gumbel():
            u = torch.rand(rows, vocab, device="cuda")
            return (logits.float() / 0.7 - torch.log(-torch.log(u))).argmax(-1)

        row["torch_gumbel_us"] = bench(gumbel)
        if fm_sample is not None and dtype == torch.bfloat16:
            greedy = torch.zeros(rows, dtype=torch.int32, device="cuda")
            seed = torch.zeros((), dtype=torch.int64, device="cuda")
            fm = lambda: fm_sample(logits, t_samp, greedy, seed)  # noqa: E731
            row["flashmap_us"] = bench(fm)
            row["flashmap_graph_us"] = try_graph(fm)
        row["sample_graph_vs_floor"] = ratio(row["flashtree_sample_graph_us"], floor)
        row["greedy_graph_vs_floor"] = ratio(row["flashtree_greedy_graph_us"], floor)
        row["greedy_only_graph_vs_floor"] = ratio(row["flashtree_greedy_only_graph_us"], floor)
        row["greedy_vs_torch_argmax_graph"] = ratio(row["flashtree_greedy_graph_us"], row["torch_argmax_graph_us"])
        row["greedy_only_vs_torch_argmax_graph"] = ratio(row["flashtree_greedy_only_graph_us"],
                                                         row["torch_argmax_graph_us"])
        log(**row)
    # N-candidate form: 8 draws per row from one read
    logits = torch.randn(960, 151936, device="cuda").to(torch.bfloat16)
    t = torch.full((960,), 0.7, device="cuda")
    fn = lambda: sample_candidates_triton(logits, t, 8)  # noqa: E731
    log(kind="sampler_candidates", rows=960, vocab=151936, n=8, flashtree_eager_us=bench(fn),
        flashtree_graph_us=try_graph(fn), floor_us=960 * 151936 * 2 / bw * 1e6)


def tree_mask(bs, L, generator=None, device="cuda"):
    """(bs, L, L) ancestor-or-self masks of random trees (node i's parent drawn below i)."""
    allowed = torch.zeros(bs, L, L, dtype=torch.bool)
    idx = torch.arange(bs)
    for i in range(L):
        allowed[:, i, i] = True
        if i:
            p = torch.randint(0, i, (bs,), generator=generator)
            allowed[idx, i] |= allowed[idx, p]
    return allowed.to(device)


def sglang_extend_attention():
    """sglang's Triton extend attention (the kernel its Triton backend verifies trees with), or None."""
    errors = []
    # sglang 0.5.17 moved it from layers/attention/triton_ops to kernels/ops/attention
    for module in ["sglang.kernels.ops.attention.extend_attention",
                   "sglang.srt.layers.attention.triton_ops.extend_attention"]:
        try:
            return importlib.import_module(module).extend_attention_fwd
        except Exception as e:  # noqa: BLE001
            errors.append(f"{module}: {e!r}"[:160])
    print("sglang extend_attention_fwd not importable, sglang peer skipped:", "; ".join(errors), flush=True)
    return None


def attention_case(bs, prefix, L, hq=32, hkv=8, d=128, device="cuda"):
    """One verify shape's inputs (bf16, prefixes at random slots of `k_buf` / `v_buf`, a random tree mask in the QLEN
    layout), the same keys gathered contiguous for SDPA and flex (`kk`, `vv`, `qq`, the FULL mask `full`), and the
    fp32 reference `ref` (SDPA request by request); `err(o)` is o's error relative to it. `device`: CUDA, or CPU for
    a dry run under the Triton interpreter."""
    total = bs * prefix + 64
    k_buf = torch.randn(total, hkv, d, dtype=torch.bfloat16, device=device)
    v_buf = torch.randn(total, hkv, d, dtype=torch.bfloat16, device=device)
    kv_indices = (torch.randperm(total - 64, device=device)[: bs * prefix] + 64).to(torch.int64)
    kv_indptr = torch.arange(0, bs + 1, device=device, dtype=torch.int32) * prefix
    qo_indptr = torch.arange(0, bs + 1, device=device, dtype=torch.int32) * L
    q = torch.randn(bs * L, hq, d, dtype=torch.bfloat16, device=device)
    k = torch.randn(bs * L, hkv, d, dtype=torch.bfloat16, device=device)
    v = torch.randn(bs * L, hkv, d, dtype=torch.bfloat16, device=device)
    allowed = tree_mask(bs, L, device=device)
    qlen = allowed.reshape(-1).to(torch.uint8)
    kp = k_buf[kv_indices].view(bs, prefix, hkv, d)
    vp = v_buf[kv_indices].view(bs, prefix, hkv, d)
    kk = torch.cat([kp, k.view(bs, L, hkv, d)], 1).transpose(1, 2).contiguous()
    vv = torch.cat([vp, v.view(bs, L, hkv, d)], 1).transpose(1, 2).contiguous()
    del kp, vp
    qq = q.view(bs, L, hq, d).transpose(1, 2).contiguous()
    full = torch.ones(bs, 1, L, prefix + L, dtype=torch.bool, device=device)
    full[:, 0, :, prefix:] = allowed
    ref = torch.empty(bs * L, hq, d, dtype=torch.float32, device=device)
    for b in range(bs):  # fp32 reference, request by request
        r = torch.nn.functional.scaled_dot_product_attention(qq[b:b + 1].float(), kk[b:b + 1].float(),
                                                             vv[b:b + 1].float(), attn_mask=full[b:b + 1],
                                                             enable_gqa=True)
        ref[b * L:(b + 1) * L] = r[0].transpose(0, 1)

    def err(o):
        return ((o.float() - ref).norm() / ref.norm()).item()

    return types.SimpleNamespace(bs=bs, prefix=prefix, L=L, hq=hq, hkv=hkv, d=d, k_buf=k_buf, v_buf=v_buf,
                                 kv_indices=kv_indices, kv_indptr=kv_indptr, qo_indptr=qo_indptr, q=q, k=k, v=v,
                                 allowed=allowed, qlen=qlen, kk=kk, vv=vv, qq=qq, full=full, ref=ref, err=err)


def part_attention(bw, with_flex=True, splits=()):
    try:
        from flashmap.sglang.verify_attention import SplitKVVerify
    except Exception as e:  # noqa: BLE001
        print("flashmap attention not importable:", repr(e)[:200])
        SplitKVVerify = None
    extend_attention_fwd = sglang_extend_attention()
    flex = None
    if with_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
    hq, hkv, d = 32, 8, 128
    tiny = torch.zeros(1, device="cuda")  # what a replay of one and of two trivial kernels costs in this harness
    log(kind="graph_floor", one_kernel_us=try_graph(lambda: tiny.add_(1)),
        two_kernels_us=try_graph(lambda: tiny.add_(1).add_(1)))
    for bs, prefix, L in [(1, 4096, 16), (1, 32768, 16), (8, 4096, 16), (32, 4096, 32), (64, 2048, 16),
                          (64, 8192, 16)]:
        c = attention_case(bs, prefix, L, hq, hkv, d)
        k_buf, v_buf, kv_indices, kv_indptr, qo_indptr = c.k_buf, c.v_buf, c.kv_indices, c.kv_indptr, c.qo_indptr
        q, k, v, allowed, qlen, err = c.q, c.k, c.v, c.allowed, c.qlen, c.err
        kk, vv, qq, full = c.kk, c.vv, c.qq, c.full
        o1 = torch.empty_like(q)
        f1 = lambda: tree_attention_triton(q, k, v, k_buf, v_buf, kv_indptr, kv_indices, qlen, L, out=o1)  # noqa
        f1()
        floor = bs * prefix * hkv * d * 2 * 2 / bw * 1e6
        launch = launch_choice(bs, hq, hkv, d, d, L, prefix, q.device, dtype=q.dtype)
        row = dict(kind="verify_attn", bs=bs, prefix=prefix, L=L, floor_us=floor, flashtree_err=err(o1),
                   flashtree_eager_us=bench(f1), flashtree_graph_us=try_graph(f1),
                   splits=launch.splits, parts=launch.parts, block_m=launch.block_m, block_n=launch.block_n,
                   warps=launch.warps, stages=launch.stages)
        for n in splits if bs == 1 else ():  # --attn-splits: the split count swept at the bs-1 shapes
            o4 = torch.empty_like(q)
            f4 = lambda: tree_attention_triton(q, k, v, k_buf, v_buf, kv_indptr, kv_indices, qlen, L, out=o4,  # noqa
                                               num_splits=n)
            f4()
            g4 = try_graph(f4)
            log(kind="verify_attn_splits", bs=bs, prefix=prefix, L=L, splits=n, floor_us=floor, flashtree_err=err(o4),
                flashtree_graph_us=g4, flashtree_graph_vs_floor=ratio(g4, floor), chosen=n == launch.splits)
        if SplitKVVerify is not None:
            o2 = torch.empty_like(q)
            sk = SplitKVVerify()
            sk.qlen_mask = True
            f2 = lambda: sk(q, k, v, o2, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, qlen, False, None, L)  # noqa
            f2()
            row.update(flashmap_err=err(o2), flashmap_eager_us=bench(f2), flashmap_graph_us=try_graph(f2))
        if extend_attention_fwd is not None:
            o3 = torch.empty_like(q)
            fm = torch.ones(bs, L, prefix + L, dtype=torch.bool, device="cuda")
            fm[:, :, prefix:] = allowed
            fm = fm.reshape(-1)
            mip = torch.arange(0, bs + 1, device="cuda", dtype=torch.int64) * (L * (prefix + L))
            f3 = lambda: extend_attention_fwd(q, k, v, o3, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, fm,  # noqa
                                              True, mip, L, 1.0, 1.0, skip_prefix_custom_mask=True)
            try:
                f3()
                e3 = err(o3)  # same bar as the tests put on flashtree's kernel: 1e-2 relative to fp32
                row.update(sglang_err=e3, sglang_matches_fp32_ref=e3 < 1e-2, sglang_eager_us=bench(f3),
                           sglang_graph_us=try_graph(f3))
            except Exception as e:  # noqa: BLE001
                print("sglang extend failed", repr(e)[:200])
        sd = lambda: torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=full, enable_gqa=True)  # noqa
        row.update(sdpa_eager_us=bench(sd), sdpa_graph_us=try_graph(sd))
        if flex is not None:
            try:
                tm = allowed

                def mask_mod(b, h, qi, ki):
                    return (ki < prefix) | tm[b, qi, (ki - prefix).clamp(min=0)]

                bm = create_block_mask(mask_mod, bs, None, L, prefix + L, device="cuda", BLOCK_SIZE=128)
                fx = lambda: flex(qq, kk, vv, block_mask=bm, enable_gqa=True)  # noqa: E731
                fx()
                row.update(flex_graph_us=try_graph(fx))
            except Exception as e:  # noqa: BLE001
                print("flex failed", repr(e)[:200])
        g = row["flashtree_graph_us"]
        row["flashtree_graph_vs_floor"] = ratio(g, floor)
        for peer in ["flashmap_graph_us", "sglang_graph_us", "sdpa_graph_us", "flex_graph_us"]:
            if row.get(peer) is not None:
                row["speedup_vs_" + peer[:-3]] = ratio(row[peer], g)
        log(**row)
        del c, k_buf, v_buf, kk, vv
        torch.cuda.empty_cache()
    # paged layout at bs 64 / 8192
    bs, prefix, L = 64, 8192, 16
    for page in (16, 64):
        npages = bs * prefix // page + 4
        kc = torch.randn(npages, page, hkv, d, dtype=torch.bfloat16, device="cuda")
        vc = torch.randn(npages, page, hkv, d, dtype=torch.bfloat16, device="cuda")
        pt = (torch.randperm(npages - 4, device="cuda")[: bs * prefix // page] + 4).view(bs, -1).to(torch.int32)
        lens = torch.full((bs,), prefix, device="cuda", dtype=torch.int32)
        q = torch.randn(bs * L, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(bs * L, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(bs * L, hkv, d, dtype=torch.bfloat16, device="cuda")
        qlen = tree_mask(bs, L).reshape(-1).to(torch.uint8)
        o = torch.empty_like(q)
        fp = lambda: tree_attention_paged_triton(q, k, v, kc, vc, pt, lens, page, qlen, L, out=o)  # noqa: E731
        fp()
        floor = bs * prefix * hkv * d * 2 * 2 / bw * 1e6
        g = try_graph(fp)
        log(kind="verify_attn_paged", bs=bs, prefix=prefix, L=L, page=page, floor_us=floor, flashtree_eager_us=bench(fp),
            flashtree_graph_us=g, flashtree_graph_vs_floor=ratio(g, floor))
        del kc, vc
        torch.cuda.empty_cache()


# attention-tune: (bs, prefix, L) -> the split counts of its coarse pass
TUNE_SHAPES = {(1, 4096, 16): (8, 16, 32, 64), (1, 32768, 16): (8, 16, 32, 64, 128), (8, 4096, 16): (2, 4, 8, 16)}
TUNE_MERGE_LAUNCH_MAX = 64  # more splits are timed fused only: a merge launch of 129 parts unrolled compiles ~9 s
TUNE_LARGE = (64, 8192, 16)  # the large-batch check: the default launch and the small shapes' best tiles
TUNE_HEADS = (32, 8, 128)  # Qwen3-8B: query heads, KV heads, head dim
# one knob at a time around a shape's best coarse point: tune key -> (values, the Launch field it sets)
TUNE_KNOBS = {"block_n": ((32, 64, 128), "block_n"), "num_warps": ((4, 8), "warps"),
              "num_stages": ((2, 3, 4), "stages"), "tree_part": ((True, False), None),
              "prefetch": ((False, True), "prefetch")}
TUNE_MERGE = {True: ("merge_unroll", (1, 2, 4, 8)), False: ("merge_rows", (2, 4, 8, 16))}  # by fused


def knob_value(launch, knob):
    """The value of tune key `knob` a logged launch ran with."""
    if knob == "tree_part":
        return launch["parts"] > launch["splits"]
    return launch[TUNE_KNOBS[knob][1] if knob in TUNE_KNOBS else knob]


def tune_point(c, cfg, stage, seen, knob=None):
    """Times launch `cfg` (`splits`, None for the heuristic, plus `tune` keys) on case `c`, graphed, and checks its
    output against the fp32 reference after an eager call and after the replays (into an output filled with NaN: a
    fused merge whose counters did not return to zero would leave it there). A launch `seen` already is not timed
    again; one that fails (compile, resources, launch) is logged with its error and skipped."""
    tune = {k: v for k, v in cfg.items() if k != "splits"}
    row = dict(kind="verify_attn_tune", stage=stage, knob=knob, bs=c.bs, prefix=c.prefix, L=c.L, tune=cfg,
               floor_us=c.floor_us, matches=False)
    try:
        launch = launch_choice(c.bs, c.hq, c.hkv, c.d, c.d, c.L, c.prefix, c.q.device, cfg.get("splits"), tune,
                               c.q.dtype)
    except ValueError as e:
        log(**row, error=repr(e)[:300])
        return row
    key = dataclasses.astuple(launch)
    if key in seen:
        return seen[key]
    row["launch"] = dataclasses.asdict(launch)
    o = torch.empty_like(c.q)
    f = lambda: tree_attention_triton(c.q, c.k, c.v, c.k_buf, c.v_buf, c.kv_indptr, c.kv_indices, c.qlen, c.L,  # noqa
                                      out=o, num_splits=cfg.get("splits"), tune=tune)
    try:
        f()
        e = c.err(o)
        o.fill_(float("nan"))
        g = bench(graphed(f))
        eg = c.err(o)
        row.update(graph_us=round(g, 2), vs_floor=ratio(g, c.floor_us), err=e, graph_err=eg,
                   matches=bool(e <= 1e-2 and eg <= 1e-2))
    except Exception as ex:  # noqa: BLE001
        row["error"] = repr(ex)[:300]
    log(**row)
    seen[key] = row
    return row


def best_row(seen):
    rows = [r for r in seen.values() if r["matches"]]
    return min(rows, key=lambda r: r["graph_us"]) if rows else None


def part_attention_tune(bw, budget_s=120.0):
    """A launch sweep of the verify attention at small batches, graphed, every point checked against the fp32
    reference. Per shape of TUNE_SHAPES: the default launch; a coarse pass (split counts x fp32 / bf16 partials x
    fused merge off / on at the default tile, fused only above TUNE_MERGE_LAUNCH_MAX splits); one knob at a time
    around its best point (key tile, warps, stages, the tree's own part, the merge's unroll or rows); the knobs that
    helped, together; the best point's split count halved and doubled. Then the default and the small shapes' best
    tiles at TUNE_LARGE. The passes after the coarse one start no new point after `budget_s` seconds. Ends with the
    best point per shape."""
    t0 = time.time()
    hq, hkv, d = TUNE_HEADS
    skipped = 0

    def room():  # within the budget; else one more point skipped
        nonlocal skipped
        if time.time() - t0 <= budget_s:
            return True
        skipped += 1
        return False

    def case(shape):
        c = attention_case(*shape, hq, hkv, d)
        del c.kk, c.vv, c.qq, c.full  # the peers' copies: not needed here
        c.floor_us = shape[0] * shape[1] * hkv * d * 2 * 2 / bw * 1e6
        return c

    tiny = torch.zeros(1, device="cuda")
    log(kind="graph_floor", one_kernel_us=try_graph(lambda: tiny.add_(1)),
        two_kernels_us=try_graph(lambda: tiny.add_(1).add_(1)))
    cases, seen = {}, {}
    for shape, splits in TUNE_SHAPES.items():
        c = cases[shape] = case(shape)
        seen[shape] = {}
        tune_point(c, {}, "default", seen[shape])
        for n in splits:
            for partials in ("fp32", "bf16"):
                for fused in (True,) if n > TUNE_MERGE_LAUNCH_MAX else (False, True):
                    tune_point(c, dict(splits=n, partials=partials, fused_merge=fused), "coarse", seen[shape])
    for shape, c in cases.items():
        base = best_row(seen[shape])
        if base is None:
            continue
        cfg = {**base["tune"], "splits": base["launch"]["splits"]}
        merge_knob, merge_values = TUNE_MERGE[base["launch"]["fused"]]
        knobs = {**{k: values for k, (values, _) in TUNE_KNOBS.items()}, merge_knob: merge_values}
        for knob, values in knobs.items():
            for value in values:
                if value != knob_value(base["launch"], knob) and room():
                    tune_point(c, {**cfg, knob: value}, "knob", seen[shape], knob)
        better = {}  # knob -> (value, µs) of the knob points that beat the coarse best
        for r in seen[shape].values():
            if r["stage"] == "knob" and r["matches"] and r["graph_us"] < base["graph_us"]:
                if r["knob"] not in better or r["graph_us"] < better[r["knob"]][1]:
                    better[r["knob"]] = (r["tune"][r["knob"]], r["graph_us"])
        if len(better) > 1 and room():
            tune_point(c, {**cfg, **{k: v for k, (v, _) in better.items()}}, "combined", seen[shape])
        top = best_row(seen[shape])
        for n in (top["launch"]["splits"] // 2, top["launch"]["splits"] * 2):
            if n >= 2 and (top["launch"]["fused"] or n <= TUNE_MERGE_LAUNCH_MAX) and room():
                tune_point(c, {**top["tune"], "splits": n}, "splits", seen[shape])
    if skipped:
        log(kind="verify_attn_tune_skipped", points=skipped, budget_s=budget_s)
    del c
    cases.clear()
    torch.cuda.empty_cache()
    c = case(TUNE_LARGE)
    seen[TUNE_LARGE] = {}
    tune_point(c, {}, "default", seen[TUNE_LARGE])
    for shape in TUNE_SHAPES:
        b = best_row(seen[shape])
        if b is not None:
            tile = {k: b["launch"][field] for k, (_, field) in TUNE_KNOBS.items() if field}
            tune_point(c, tile, f"tile of bs {shape[0]} / {shape[1]}", seen[TUNE_LARGE])
    del c
    torch.cuda.empty_cache()
    print("# attention-tune: the best point per shape", flush=True)
    for shape in [*TUNE_SHAPES, TUNE_LARGE]:
        rows = list(seen[shape].values())
        b = best_row(seen[shape])
        default = next((r for r in rows if r["stage"] == "default"), {})
        out = dict(kind="verify_attn_tune_best", bs=shape[0], prefix=shape[1], L=shape[2], points=len(rows),
                   failed=sum(not r["matches"] for r in rows), default_us=default.get("graph_us"))
        if b is not None:
            out.update(floor_us=b["floor_us"], graph_us=b["graph_us"], vs_floor=b["vs_floor"],
                       speedup_vs_default=ratio(out["default_us"], b["graph_us"]), tune=b["tune"], launch=b["launch"],
                       err=max(b["err"], b["graph_err"]))
        log(**out)
    print(f"# attention-tune took {time.time() - t0:.1f}s", flush=True)


# attention-small: the small-batch launch grid. Every point is timed as one graph replay (as every other figure of
# this file) and the best of them, with the default, also per call inside one graph of LAYERS calls over LAYERS
# distinct KV caches: what a captured forward of LAYERS layers pays a layer, without the replay's own launch cost.
# Twice: each layer's keys at slots of its own (`in_graph_us`: no layer's slot list is in L2 either), and every layer
# at the same slots (`in_graph_shared_us`), as a server's forward has it: one kv_indices for all its layers' pools.
# Kernel runs 12 and 13 swept prefetch depth, warps, stages, the fused merge, PDL and 4 split counts a shape
# (benchmarks/HISTORY.md section 13); this grid is what they left open: rows per program against key tile.
SMALL_SHAPES = {(1, 4096, 16): (8, 16), (1, 32768, 16): (8, 16)}
SMALL_GRID = dict(block_m=(16, 32, 64), block_n=(32, 64, 128))
SMALL_IN_GRAPH = 8  # the fastest points per shape (by one replay) that are timed in the graph too
LAYERS = 36  # Qwen3-8B's layers


def small_points(splits):
    """The grid's launches at these split counts (the rest as the default launch has it), a merge launch only up to
    TUNE_MERGE_LAUNCH_MAX splits."""
    import itertools

    keys = list(SMALL_GRID)
    for n in splits:
        for values in itertools.product(*SMALL_GRID.values()):
            cfg = dict(zip(keys, values), splits=n)
            if cfg.get("fused_merge") or n <= TUNE_MERGE_LAUNCH_MAX:
                yield cfg


def _attn_compile(job):
    """Compiles one attention-small launch into Triton's cache (a worker of a process pool, as `_pt_compile`)."""
    from flashtree.attention.triton_verify import tree_attention_triton

    prefix, cfg = job
    hq, hkv, d = TUNE_HEADS
    L = 16
    kb = torch.zeros(prefix + 1, hkv, d, dtype=torch.bfloat16, device="cuda")
    idx = torch.arange(prefix, device="cuda", dtype=torch.int64)
    indptr = torch.tensor([0, prefix], device="cuda", dtype=torch.int32)
    q = torch.zeros(L, hq, d, dtype=torch.bfloat16, device="cuda")
    kv = torch.zeros(L, hkv, d, dtype=torch.bfloat16, device="cuda")
    mask = torch.ones(L * L, dtype=torch.uint8, device="cuda")
    tune = {k: v for k, v in cfg.items() if k != "splits"}
    try:
        tree_attention_triton(q, kv, kv, kb, kb, indptr, idx, mask, L, num_splits=cfg["splits"], tune=tune)
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 (a launch that fails is logged by the timing loop)
        pass


def in_graph_us(fn_for, layers=LAYERS):
    """µs per call of `fn_for(i)` (i = 0 .. layers - 1) captured one after the other in one graph and replayed."""
    replay = graphed(lambda: [fn_for(i) for i in range(layers)])
    return bench(replay) / layers


def fresh_caches(c, n):
    """n KV caches of case c's size, each with its prefix at fresh random slots (one per layer of a graph): no
    layer's K / V is still in L2 when its call runs."""
    total = c.k_buf.shape[0]
    return [(torch.randn_like(c.k_buf), torch.randn_like(c.v_buf),
             (torch.randperm(total - 64, device=c.k_buf.device)[: c.kv_indices.numel()] + 64).to(torch.int64))
            for _ in range(n)]


def part_attention_small(bw, budget_s=240.0, device="cuda"):
    """The small-batch launch grid (SMALL_SHAPES x small_points), each point checked against the fp32 reference and
    timed as one graph replay; the default launch and the SMALL_IN_GRAPH fastest points also per call in a graph of
    LAYERS calls over LAYERS distinct KV caches; then the fastest bs-1 tiles at bs 8 / 4K and bs 64 / 8K (the default
    launch's other shapes). Ends with one verify_attn_small_best row per shape."""
    t0 = time.time()
    hq, hkv, d = TUNE_HEADS
    jobs = [(shape[1], cfg) for shape, splits in SMALL_SHAPES.items() for cfg in small_points(splits)]
    if device == "cuda" and budget_s > 0:  # budget 0: the default launches only
        precompile_with(_attn_compile, jobs)
    tiny = torch.zeros(1, device=device)
    log(kind="graph_floor", one_kernel_us=try_graph(lambda: tiny.add_(1)),
        two_kernels_us=try_graph(lambda: tiny.add_(1).add_(1)),
        in_graph_one_kernel_us=in_graph_us(lambda i: tiny.add_(1)),
        in_graph_two_kernels_us=in_graph_us(lambda i: tiny.add_(1).add_(1)))
    best = {}
    for shape, splits in SMALL_SHAPES.items():
        c = attention_case(*shape, hq, hkv, d, device=device)
        del c.kk, c.vv, c.qq, c.full
        c.floor_us = shape[0] * shape[1] * hkv * d * 2 * 2 / bw * 1e6
        seen = {}
        default = tune_point(c, {}, "default", seen)
        for cfg in small_points(splits):
            if time.time() - t0 >= budget_s:
                log(kind="verify_attn_small_skipped", bs=shape[0], prefix=shape[1], budget_s=budget_s)
                break
            tune_point(c, cfg, "small", seen)
        bufs = fresh_caches(c, LAYERS)
        ok = sorted((r for r in seen.values() if r["matches"] and r is not default), key=lambda r: r["graph_us"])
        for r in [default, *ok[:SMALL_IN_GRAPH]]:
            if not r.get("matches"):
                continue
            launch = r["launch"]
            tune = {k: v for k, v in r["tune"].items() if k != "splits"}
            o = torch.empty_like(c.q)
            for key, slots in (("in_graph_us", lambda i: bufs[i][2]), ("in_graph_shared_us", lambda i: c.kv_indices)):
                r[key] = round(in_graph_us(
                    lambda i: tree_attention_triton(c.q, c.k, c.v, bufs[i][0], bufs[i][1], c.kv_indptr, slots(i),
                                                    c.qlen, c.L, out=o, num_splits=r["tune"].get("splits"),
                                                    tune=tune), len(bufs)), 2)
            log(kind="verify_attn_small_in_graph", bs=c.bs, prefix=c.prefix, L=c.L, stage=r["stage"], tune=r["tune"],
                launch=launch, floor_us=c.floor_us, graph_us=r["graph_us"], in_graph_us=r["in_graph_us"],
                in_graph_shared_us=r["in_graph_shared_us"], layers=LAYERS)
        timed = [r for r in seen.values() if "in_graph_us" in r]
        b1 = ok[0] if ok else None
        bg = min(timed, key=lambda r: r["in_graph_us"]) if timed else None
        best[shape] = b1
        log(kind="verify_attn_small_best", bs=shape[0], prefix=shape[1], L=shape[2], floor_us=c.floor_us,
            points=len(seen), failed=sum(not r["matches"] for r in seen.values()),
            default_us=default.get("graph_us"), default_in_graph_us=default.get("in_graph_us"),
            graph_us=b1 and b1["graph_us"], launch=b1 and b1["launch"], tune=b1 and b1["tune"],
            best_in_graph_us=bg and bg["in_graph_us"], best_in_graph_launch=bg and bg["launch"],
            best_in_graph_tune=bg and bg["tune"], best_in_graph_graph_us=bg and bg["graph_us"])
        del c, bufs
        torch.cuda.empty_cache()
    for shape in [(8, 4096, 16), TUNE_LARGE]:  # the bs-1 winners' tiles where the default launch also runs
        c = attention_case(*shape, hq, hkv, d, device=device)
        del c.kk, c.vv, c.qq, c.full
        c.floor_us = shape[0] * shape[1] * hkv * d * 2 * 2 / bw * 1e6
        seen = {}
        tune_point(c, {}, "default", seen)
        for b in best.values():
            if b is not None:
                tile = {k: b["launch"][f] for k, f in (("block_m", "block_m"), ("block_n", "block_n"),
                                                       ("num_warps", "warps"), ("num_stages", "stages"))}
                tune_point(c, tile, "bs-1 tile", seen)
                tune_point(c, {**tile, "partials": "bf16"}, "bs-1 tile", seen)
        del c
        torch.cuda.empty_cache()
    print(f"# attention-small took {time.time() - t0:.1f}s", flush=True)


# attention-early: what a server's call gains by reading its prefix's index (and first key tile) before its launch's
# wait (`prefix_ready`, tune `early`). Per call in one graph of a shape's layers, each layer over a KV cache of its
# own, two ways: back to back (`in_graph_us`, as attention-small times it) and with a stand-in for sglang's KV store
# (a copy of the verify tokens' K into a buffer of the layer's) between the layers (`with_store_us`), since in a
# server the kernel just before the verify is that store, not the previous layer's merge. Two rounds, the variants'
# order reversed in the second.
EARLY_SHAPES = {(1, 4096, 16): LAYERS, (1, 32768, 16): LAYERS, (8, 4096, 16): LAYERS, TUNE_LARGE: 8}
EARLY_VARIANTS = {"plain": (False, 0), "early1": (True, 1), "early2": (True, 2)}


def part_attention_early(bw, device="cuda"):
    hq, hkv, d = TUNE_HEADS
    for shape, layers in EARLY_SHAPES.items():
        c = attention_case(*shape, hq, hkv, d, device=device)
        del c.kk, c.vv, c.qq, c.full
        floor = shape[0] * shape[1] * hkv * d * 2 * 2 / bw * 1e6
        # layer 0 is the case's own cache: its output is checked against the reference after each graph's replays
        bufs = [(c.k_buf, c.v_buf, c.kv_indices)] + fresh_caches(c, layers - 1)
        outs = [torch.empty_like(c.q) for _ in range(layers)]
        stores = [torch.empty_like(c.k) for _ in range(layers)]
        for rnd in range(2):
            names = list(EARLY_VARIANTS) if rnd == 0 else list(reversed(EARLY_VARIANTS))
            for name in names:
                ready, early = EARLY_VARIANTS[name]

                def call(i, store=False):
                    if store:
                        stores[i].copy_(c.k)
                    return tree_attention_triton(c.q, c.k, c.v, bufs[i][0], bufs[i][1], c.kv_indptr, bufs[i][2],
                                                 c.qlen, c.L, out=outs[i], tune=dict(early=early), prefix_ready=ready)

                row = dict(kind="verify_attn_early", bs=shape[0], prefix=shape[1], L=shape[2], layers=layers,
                           variant=name, prefix_ready=ready, early=early, round=rnd, floor_us=round(floor, 2))
                try:
                    errs = [c.err(call(0))]
                    row["in_graph_us"] = round(in_graph_us(call, layers), 2)
                    errs.append(c.err(outs[0]))
                    row["with_store_us"] = round(in_graph_us(lambda i: call(i, True), layers), 2)
                    errs.append(c.err(outs[0]))
                    row.update(err=round(max(errs), 5), matches=max(errs) <= 2e-2)
                except Exception as e:  # noqa: BLE001
                    row.update(error=repr(e)[:300], matches=False)
                log(**row)
        del c, bufs, outs, stores
        torch.cuda.empty_cache()


def main():
    global OUT_FILE
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results")
    ap.add_argument("--parts", default="builder,policies,walk,inputs,markov,sampler,attention",
                    help="comma-separated; also attention-tune (a launch sweep of the verify attention at small "
                    "batches), attention-small (the bs-1 launch grid, timed in a graph of 36 layers too), "
                    "attention-early (prefix_ready's reads before the launch's wait, in a graph of layers) and "
                    "policies-tune (the prob build's launch variants), not in the default")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--markov-min-rank", type=int, default=0, help="markov: only heads of at least this rank")
    ap.add_argument("--attn-splits", default="", help="attention: also time these split counts at the bs-1 shapes "
                    "(comma-separated, e.g. 8,16,32,64); the heuristic's choice is marked")
    ap.add_argument("--tune-budget", type=float, default=120.0, help="attention-tune: seconds after which its knob "
                    "and combination passes start no new point (the coarse pass and the large-batch check always run)")
    ap.add_argument("--small-budget", type=float, default=240.0, help="attention-small: seconds after which its "
                    "grid times no new point")
    ap.add_argument("--policies-tune-budget", type=float, default=60.0, help="policies-tune: seconds after which "
                    "it times no new point")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    OUT_FILE = os.path.join(a.out, "kernels.jsonl")
    open(OUT_FILE, "w").close()
    cuda = torch.cuda.is_available()  # without it only policies-tune's checks run (TRITON_INTERPRET=1)
    log(kind="env", torch=torch.__version__, triton=triton.__version__,
        gpu=torch.cuda.get_device_name() if cuda else "none", python=sys.version.split()[0],
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    torch.manual_seed(0)
    bw = ceiling() if cuda else None
    parts = {"builder": part_builder, "policies": part_policies, "walk": part_walk, "inputs": part_inputs, "markov": lambda: part_markov(a.markov_min_rank),
             "sampler": lambda: part_sampler(bw),
             "attention": lambda: part_attention(bw, not a.no_flex, [int(x) for x in a.attn_splits.split(",") if x]),
             "attention-tune": lambda: part_attention_tune(bw, a.tune_budget),
             "attention-small": lambda: part_attention_small(bw, a.small_budget),
             "attention-early": lambda: part_attention_early(bw),
             "policies-tune": lambda: part_policies_tune(a.policies_tune_budget)}
    for name in a.parts.split(","):
        t = time.time()
        try:
            parts[name]()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            log(kind="error", part=name, error=repr(e)[:500])
        print(f"# {name} took {time.time() - t:.1f}s", flush=True)
    print(kernel_tables.tables(ROWS))


if __name__ == "__main__":
    main()
