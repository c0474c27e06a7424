"""Replay equals direct greedy runs, step for step, for configurations other than the recorded one."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from flashtree.engine.replay import record, replay

from .helpers import run_app


def fields(steps):
    return [(s.position, s.accept_len, s.tree_size, s.distinct_candidates, s.accepted_path, s.accepted_depth_votes,
             s.oracle_len) for s in steps]


def check_replay_matches(target: str, prompts: list[list[int]], configs, n_max: int, max_new: int):
    from flashtree.drafters import load_drafter
    from flashtree.engine import tree_generate
    from flashtree.models import load_target

    model, tok = load_target(target)
    stop = [tok.eos_token_id]
    drafter = load_drafter("default", model)
    accepted = []
    for ids in prompts:
        rec = record(model, drafter, ids, n_max=n_max, max_new_tokens=max_new, stop_ids=stop)
        for n, w in configs:
            direct = tree_generate(model, drafter, torch.tensor([ids]), n=n, width=w, max_new_tokens=max_new,
                                   stop_token_ids=stop)
            replayed = replay(rec, n, w)
            assert fields(replayed) == fields(direct.steps), (n, w)
            accepted += [s.accept_len for s in replayed]
    return accepted


def test_replay_equals_direct_on_a_tiny_model():
    from flashtree.datasets import encode_prompts, load_prompts
    from flashtree.models import load_target

    _, tok = load_target("tiny-llama")
    prompts = encode_prompts(tok, load_prompts("builtin", limit=2))
    check_replay_matches("tiny-llama", prompts, [(1, 4), (2, 8), (3, 16)], n_max=4, max_new=24)


@pytest.mark.slow
def test_replay_equals_direct_on_smollm2_with_real_acceptance():
    from flashtree.datasets import encode_prompts, load_prompts
    from flashtree.models import load_target

    _, tok = load_target("smollm2-135m")
    prompts = encode_prompts(tok, load_prompts("humaneval", limit=1) + load_prompts("builtin", limit=2)[1:])
    accepted = check_replay_matches("smollm2-135m", prompts, [(1, 4), (2, 16), (4, 8)], n_max=8, max_new=24)
    assert sum(accepted) > 0 and max(accepted) >= 2  # real multi-token acceptance went through the comparison


def test_replay_app_writes_the_grid_and_reuses_its_recording(tmp_path):
    out = tmp_path / "replay"
    common = ["target=tiny-llama", "dataset.limit=2", "engine.max_new_tokens=12", "replay.n_max=4",
              "logger.wandb.mode=disabled", "logger.progress=false", f"hydra.run.dir={out}"]
    run_app("replay.py", [*common, "replay.ns=[1,4]", "replay.widths=[4,8]"], cwd=tmp_path)
    table = pd.read_parquet(out / "summary.parquet")
    assert sorted(zip(table["tree.n"], table["tree.width"])) == [(1, 4), (1, 8), (4, 4), (4, 8)]
    assert (table["mode"] == "replay").all()
    again = run_app("replay.py", [*common, "replay.ns=[2]", "replay.widths=[16]"], cwd=tmp_path)
    assert "reusing" in again.stdout
    assert len(pd.read_parquet(out / "summary.parquet")) == 5


def test_replay_refuses_sampling(tmp_path):
    proc = run_app("replay.py", ["target=tiny-llama", "engine.temperature=0.7", f"hydra.run.dir={tmp_path}/r"],
                   cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "engine.temperature" in proc.stderr


def test_a_truncated_recording_is_named_set_aside_and_recorded_again(tmp_path):
    out = tmp_path / "replay"
    args = ["target=tiny-llama", "dataset.limit=1", "engine.max_new_tokens=6", "replay.n_max=2", "replay.ns=[1]",
            "replay.widths=[4]", "logger.wandb.mode=disabled", "logger.progress=false", f"hydra.run.dir={out}"]
    run_app("replay.py", args, cwd=tmp_path)
    recording = out / "recording.pt"
    recording.write_bytes(recording.read_bytes()[:200])
    again = run_app("replay.py", args, cwd=tmp_path)
    assert f"the replay recording {recording} is damaged" in again.stdout
    assert "recording again" in again.stdout
    assert (out / "recording.pt.damaged").is_file()
    assert torch.load(recording, weights_only=False)["recordings"]
