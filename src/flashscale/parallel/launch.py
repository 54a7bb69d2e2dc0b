"""`flashscale train` on a (pp, dp, tp) mesh: the trainer loop unchanged, the ParallelEngine under it.

torchrun starts one process per GPU (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the environment);
each runs the whole command. The data-parallel coordinates pick each process's share of the batch
(tensor- and pipeline-parallel peers share one); rank 0 logs and writes the trainer's files; every
rank writes its engine shards into the checkpoint folder rank 0 renames (a file system they share).
"""

from __future__ import annotations

import os
from pathlib import Path

from flashscale.parallel.config import ParallelConfig
from flashscale.parallel.engine import parallel_engine_factory
from flashscale.parallel.mesh import validate_layout
from flashscale.train import checkpoint as ckpt
from flashscale.train.config import Config
from flashscale.train.trainer import Trainer


def wants_parallel(config: Config) -> bool:
    """A torchrun launch, or any [parallel] key set: the parallel engine (world size 1 runs it too)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or config.parallel != ParallelConfig()


class ParallelTrainer(Trainer):
    """Trainer whose checkpoints hold every rank's engine shards (flashscale.parallel.checkpoint)."""

    def _save(self, step: int, tokens: int) -> Path:
        final = self.ckpt_dir / ckpt.step_dir_name(step)
        if self.is_main:
            # train.checkpoint.save_checkpoint creates the temporary folder, then calls engine.save, whose
            # first barrier releases the other ranks into it; after it, rank 0 alone renames the folder.
            super()._save(step, tokens)
        else:
            self.engine.save(self.ckpt_dir / f".tmp-{final.name}" / ckpt.ENGINE_DIR)  # save_checkpoint's name
        self.engine.barrier()  # complete (renamed) before any rank goes on
        return final

    def save_final(self, directory: str | Path, *, tokenizer=None) -> Path:
        """Collective: the trained model as an HF folder (rank 0 writes it)."""
        self.setup()
        self.engine.export_hf(Path(directory), tokenizer=tokenizer)
        return Path(directory)


def make_trainer(config: Config, **kwargs) -> ParallelTrainer:
    """A ParallelTrainer for this process of a torchrun launch (or a single process). The layout is
    checked against the world size here and against the model when the engine is built, both before
    any process group exists."""
    pc = config.parallel
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    pp, dp, tp = validate_layout(pc, world)
    if config.train.batch_size % (dp * config.train.micro_batches):
        raise ValueError(f"train.batch_size={config.train.batch_size} must be divisible by dp ({dp}) x "
                         f"train.micro_batches ({config.train.micro_batches})")
    if pc.schedule == "interleaved" and config.train.micro_batches % pp:
        raise ValueError(f"parallel.schedule='interleaved' needs train.micro_batches divisible by pp={pp}, got "
                         f"{config.train.micro_batches}")
    return ParallelTrainer(config, engine_factory=parallel_engine_factory(pc), rank=rank, world_size=world,
                           dp_rank=(rank // tp) % dp, dp_size=dp, **kwargs)
