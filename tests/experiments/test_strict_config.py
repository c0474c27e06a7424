"""Nothing in a config is dropped or misread silently: unknown keys (Hydra's own `+key=` suggestion) are refused
naming the closest valid key, a dtype given as a device is named, a command-line dict replaces the preset's."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from .helpers import REPO


def run_config(overrides):
    from flashtree.experiments.config import register, to_run_config

    register()
    with initialize_config_dir(config_dir=str(REPO / "flashtree" / "configs"), version_base="1.3"):
        return to_run_config(compose("config", overrides=overrides), overrides)


def train_config(overrides, name="tiny"):
    from flashtree.dspark.train_config import register, to_train_config

    register()
    with initialize_config_dir(config_dir=str(REPO / "flashtree" / "configs" / "train"), version_base="1.3"):
        return to_train_config(compose(name, overrides=overrides), overrides)


@pytest.mark.parametrize("override, message", [
    ("+tree.nn=4", "tree.nn: unknown key (did you mean tree.n?"),
    ("+engine.max_new_token=4", "engine.max_new_token: unknown key (did you mean engine.max_new_tokens?"),
    ("+sed=1", "sed: unknown key (did you mean seed?"),
    ("target.device=bfloat16", "target.device='bfloat16': not a torch device (that is a dtype, not a device)"),
])
def test_sweep_config_refuses_what_it_would_drop_or_misread(override, message):
    from flashtree.experiments.config import ConfigError

    with pytest.raises(ConfigError) as err:
        run_config([override])
    assert message in str(err.value)


@pytest.mark.parametrize("override, message", [
    ("data.sources={}", "data.sources={}: names no prompt source"),
    ("+data.source={}", "data.source: unknown key (did you mean data.sources?"),
    ("target.device=float16", "target.device='float16': not a torch device"),
])
def test_trainer_config_refuses_what_it_would_drop_or_misread(override, message):
    from flashtree.dspark.train_config import TrainConfigError

    with pytest.raises(TrainConfigError) as err:
        train_config([override])
    assert message in str(err.value)


def test_a_command_line_dict_replaces_the_presets():
    # flashtree/configs/train/default.yaml lists four sources; Hydra alone would merge and keep all four
    assert train_config(["data.sources={gsm8k-first-half: 2}"], name="default").data.sources == {"gsm8k-first-half": 2}
