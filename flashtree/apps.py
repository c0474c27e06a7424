"""The Hydra apps flashtree ships: each one's config folder (inside the package), its schema registration and its
job. `flashtree.cli` runs them; `flashtree.config_help` describes them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "configs"


@dataclass(frozen=True)
class App:
    config_dir: Path
    config_name: str
    register: str  # "module:function" that puts the app's schemas in Hydra's ConfigStore
    job: str  # "module:function" run on the composed config
    exit_status: bool = False  # the job returns a process exit status (live)


APPS = {
    "sweep": App(CONFIGS, "config", "flashtree.experiments.config:register", "flashtree.experiments.app:run_job"),
    "replay": App(CONFIGS, "replay", "flashtree.experiments.config:register", "flashtree.experiments.replay_app:run_replay"),
    "train-drafter": App(CONFIGS / "train", "default", "flashtree.dspark.train_config:register",
                         "flashtree.dspark.train_app:run"),
    "live": App(CONFIGS / "live", "live", "flashtree.live.config:register", "flashtree.live.app:run", exit_status=True),
}
