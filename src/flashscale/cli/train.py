"""`flashscale train [CONFIG] [--section.key VALUE ...] [--resume auto|PATH] [--out DIR]`: train a
Llama-family model from a TOML config (a bundled name: tiny, demo, 125M; or a path), every key of which
can be overridden on the command line.

Writes OUT/config.json (the resolved config), OUT/log.jsonl, OUT/tensorboard/, OUT/checkpoints/
(with checkpoint.every > 0; killed runs continue with --resume auto) and the final model as an HF
folder OUT/final (config.json, model.safetensors, tokenizer.json), which `flashscale eval`,
`flashscale generate`, `flashscale quantize` and transformers load.
"""

from __future__ import annotations

import argparse
from pathlib import Path

EPILOG = """\
examples:
  flashscale train tiny --out runs/tiny
  flashscale train demo --train.steps 200 --train.lr 1e-3 --out runs/demo
  flashscale train my.toml --data.files "corpus/*.txt.xz" --data.vocab_size 32768 --out runs/my
  flashscale train 125M --out runs/125M --checkpoint.every 500 --resume auto   # continue after a kill

values: bool true/false, lists comma-separated or as [a, b], "none" for an optional key.

multi-GPU (torchrun):
  torchrun --standalone --nproc-per-node 8 -m flashscale train 125M --out runs/125M
  torchrun --standalone --nproc-per-node 8 -m flashscale train 125M --parallel.tp 2 --parallel.pp 2 \
      --parallel.zero 1 --parallel.schedule 1f1b --out runs/125M        # dp = 8 / (tp * pp) = 2
  Each process drives one GPU; rank 0 logs and writes checkpoints. The parallel layout
  (data/tensor/pipeline axes, ZeRO stage, schedule) is set by the [parallel] keys (docs/parallel.md);
  with none of them and one process, the single-device engine runs.
"""


def add_parser(sub) -> None:
    from flashscale.train.config import available_configs, keys, sections
    from flashscale.train.typed import type_name

    p = sub.add_parser("train", help="train a model from a TOML config",
                       description=" ".join(__doc__.split("\n\n")[0].split("`: ", 1)[1].split()),
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
                       usage="flashscale train [CONFIG] [--section.key VALUE ...] [--resume auto|PATH] [--out DIR]")
    p.add_argument("config", nargs="?", default="tiny", metavar="CONFIG",
                   help=f"a TOML file or a bundled config: {', '.join(available_configs())} (default: tiny)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="output folder (default: runs/<config name>)")
    p.add_argument("--resume", default=None, metavar="auto|PATH",
                   help="continue from a checkpoint: 'auto' takes the newest complete one in the checkpoint "
                        "folder (a fresh start when there is none), or a step-NNNNNNNN folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    # Every config key is an option, so argparse consumes its value (and lists it under --help);
    # load_config parses and checks the values by the field's type.
    for section in sections():
        group = p.add_argument_group(f"[{section}] keys")
        for key, tp in keys(section).items():
            opt = f"--{section}.{key}"
            kw = dict(nargs="?", const="true") if tp is bool or tp == (bool | None) else {}
            group.add_argument(opt, dest=f"override:{section}.{key}", default=argparse.SUPPRESS,
                               metavar=_metavar(tp), help=type_name(tp), **kw)
    p.set_defaults(func=run)
    # Unknown --section.key options reach load_config, which names the valid keys in one line, instead
    # of argparse's generic "unrecognized arguments" (the subparsers action calls parse_known_args on
    # this parser; an instance of the subclass below keeps the leftovers for run()).
    p.__class__ = _KeepUnknownOverrides


class _KeepUnknownOverrides(argparse.ArgumentParser):
    def parse_known_args(self, args=None, namespace=None):
        ns, extra = super().parse_known_args(args, namespace)
        ns.unknown_overrides = [a for a in extra]
        return ns, []


def _metavar(tp) -> str:
    from flashscale.train.typed import type_name

    name = type_name(tp)
    return "V" if len(name) > 20 else name.upper().replace(" ", "_")


def overrides_from_args(args) -> list[str]:
    out = []
    for dest, value in vars(args).items():
        if dest.startswith("override:"):
            out += [f"--{dest.removeprefix('override:')}", value]
    return list(getattr(args, "unknown_overrides", [])) + out  # unknown first: load_config reports them


def default_out(config: str) -> Path:
    return Path("runs") / Path(config).stem


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from flashscale.models.checkpoint import save_hf
    from flashscale.parallel.launch import make_trainer, wants_parallel
    from flashscale.train.config import load_config
    from flashscale.train.metrics import fmt_mfu
    from flashscale.train.trainer import Trainer

    config = load_config(args.config, overrides_from_args(args))
    out = args.out if args.out is not None else default_out(args.config)
    parallel = wants_parallel(config)  # torchrun (WORLD_SIZE > 1) or [parallel] keys: the parallel engine
    if parallel:
        trainer = make_trainer(config, out_dir=out, progress=not args.no_progress)
    else:
        trainer = Trainer(config, out_dir=out, progress=not args.no_progress)
    console = Console(quiet=not trainer.is_main)
    trainer.setup()
    mc = trainer.model_config
    console.print(f"model: preset {config.model.preset!r}, {mc.num_params() / 1e6:.2f}M parameters; "
                  f"device {trainer.device}, {config.train.dtype}; {len(trainer.data.train):,} training tokens; "
                  f"output {out}")
    result = trainer.fit(resume=args.resume)
    if parallel:  # collective: rank 0 assembles the shards
        final = trainer.save_final(out / "final", tokenizer=trainer.data.tokenizer)
    else:
        final = save_hf(trainer.model, out / "final", tokenizer=trainer.data.tokenizer)

    table = Table(title="flashscale train: summary", show_header=False)
    for name, value in (
        ("steps", f"{result.steps} ({result.steps_run} in this run)"),
        ("tokens", f"{result.tokens:,}"),
        ("train loss (last log interval)", "-" if result.loss is None else f"{result.loss:.4f}"),
        ("validation loss / perplexity", f"{result.val_loss:.4f} / {result.val_ppl:.2f}"),
        ("throughput", f"{result.tokens_per_s:,.0f} tokens/s over {result.seconds:.1f} s"),
        ("MFU", fmt_mfu(result.mfu)),
        ("checkpoint", str(result.checkpoint) if result.checkpoint else "-"),
        ("final model (HF folder)", str(final)),
    ):
        table.add_row(name, value)
    console.print(table)
    return 0
