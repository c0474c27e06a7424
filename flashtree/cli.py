"""The `flashtree` command: each subcommand is one of the Hydra apps, composed from the configs shipped inside the
package (flashtree/configs/), so a `pip install flashtree[experiments]` can sweep without a checkout.

    flashtree sweep [--multirun] key=value ...    τ, per-depth acceptance, tokens/s per configuration
    flashtree replay key=value ...                record once, replay the (N, W) grid at temperature 0
    flashtree train-drafter key=value ...         train a DSPARK block drafter
    flashtree live [+preset=NAME] key=value ...   sglang servers: identity, speed, sampled
    flashtree plots DIR [--out DIR]               figures of a sweep's collected table
    flashtree collect DIR                         rebuild and print a sweep's collected table
    flashtree accept-table RECORDING --out FILE   per tree shape, a replay's accepted lengths (FLASHTREE_SIMULATE_ACC)

`flashtree <app> --help` describes the app's groups and keys; `--cfg job` prints the composed config.
The scripts experiments/*.py run the same apps.
"""

from __future__ import annotations

import importlib
import sys

from flashtree.apps import APPS

TOOLS = {"plots": "flashtree.results.plots:main", "collect": "flashtree.results.collect:main",
         "accept-table": "flashtree.engine.accept_table:main"}


def _load(ref: str):
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def run_app(name: str, argv: list[str] | None = None):
    """Run Hydra app `name` on `argv` (default: this process's arguments), as `flashtree <name> ...` does."""
    import hydra

    from flashtree.config_help import register_resolver

    register_resolver()  # every app's hydra.help.template is ${flashtree_help:<name>}
    app = APPS[name]
    _load(app.register)()
    job = _load(app.job)

    @hydra.main(version_base="1.3", config_path=str(app.config_dir), config_name=app.config_name)
    def main(cfg):
        result = job(cfg)
        if app.exit_status and result:
            sys.exit(result)
        return result

    if argv is not None:
        sys.argv = [f"flashtree {name}", *argv]  # Hydra reads its command line from sys.argv
    return main()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return
    name, rest = argv[0], argv[1:]
    if name in TOOLS:
        _load(TOOLS[name])(rest)
    elif name in APPS:
        run_app(name, rest)
    else:
        sys.exit(f"flashtree: unknown command {name!r}; use one of {', '.join([*APPS, *TOOLS])} (flashtree --help)")


if __name__ == "__main__":
    main()
