"""What a run needs before its first step: the device, seeds and determinism switches, the corpus
files, the tokenizer, the token file and its train/validation split, and the model config.

Kept apart from the loop (trainer.py) so the demo, the benchmark and the parallel launcher build the
same data the same way.
"""

from __future__ import annotations

import glob
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from flashscale.models.config import LlamaConfig
from flashscale.train.config import Config, DataSection, ModelSection

BUNDLED = "bundled"  # the bundled training texts
BUNDLED_EVAL = "bundled-eval"  # the bundled held-out evaluation text (moby_dick)


def resolve_device(device: str) -> torch.device:
    """"auto" -> cuda when available, else cpu; "cuda" without a GPU is a user error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device='cuda' but torch sees no CUDA GPU; use 'auto' or 'cpu'")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"train.device={device!r}: expected one of 'auto', 'cpu', 'cuda'")
    return torch.device(device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds every CUDA device too


def set_deterministic(device: torch.device) -> None:
    """Deterministic CUDA kernels where PyTorch has them (embedding and index_add backward otherwise
    use float atomics, whose summation order changes run to run). cuBLAS needs a fixed workspace for
    reproducible reductions; the variable is read when cuBLAS initializes, so this must run before the
    first CUDA matmul (the trainer calls it first). warn_only: an op without a deterministic version
    warns instead of failing the run. On the CPU nothing is switched: its kernels are deterministic
    for a fixed thread count already, and the deterministic-mode CPU fallbacks cost 6x a step
    (measured on the tiny preset, 2026-11)."""
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
        # Deterministic mode also fills every torch.empty with NaN (to expose reads of uninitialized
        # memory): a memset per activation buffer that buys nothing for code that writes before it reads.
        torch.utils.deterministic.fill_uninitialized_memory = False


def configure_cpu() -> None:
    """Flush denormals to zero. Adam's second moments of small gradients fall below 1e-38, and x86
    handles denormal floats in microcode: measured 12x slower steps on the tiny preset without this
    (2026-11). Values that small carry no information for training. Process-wide, so every run of a
    process (and a resumed one) computes with the same setting."""
    torch.set_flush_denormal(True)


# -------------------------------------------------------------------------------------------- data

def resolve_files(entries: list[str], key: str = "data.files") -> list[Path]:
    """data.files -> paths: "bundled" (the bundled training texts), "bundled-eval" (the bundled held-out
    text), files, folders, glob patterns."""
    from flashscale.data.corpus import EVAL_NAME, bundled_files, text_files, train_files

    out: list[Path] = []
    for entry in entries:
        if entry == BUNDLED:
            out.extend(train_files())
            continue
        if entry == BUNDLED_EVAL:
            out.append(bundled_files()[EVAL_NAME])
            continue
        path = os.path.expanduser(entry)
        if any(c in path for c in "*?["):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                raise FileNotFoundError(f"{key}: pattern {entry!r} matches no file")
            for m in matches:
                out.extend(text_files(m))
            continue
        if not os.path.exists(path):
            raise FileNotFoundError(f"{key}: corpus path {entry!r} does not exist "
                                    f"(expected a .txt/.xz/.jsonl file, a folder of them, a glob, or 'bundled')")
        out.extend(text_files(path))
    return out


def cache_dir(data: DataSection) -> Path:
    from flashscale.data.cache import resolve_cache_dir

    return resolve_cache_dir(data.cache_dir)


def get_tokenizer(data: DataSection, files: list[Path]) -> Tokenizer:
    """data.tokenizer "train": a byte-level BPE of data.vocab_size trained on `files` (cached by content
    hash); else the tokenizer at that path."""
    from flashscale.data.tokenizer import load_tokenizer, train_tokenizer_on_files

    if data.tokenizer == "train":
        return train_tokenizer_on_files(files, data.vocab_size, cache_dir=cache_dir(data),
                                        max_chars=data.tokenizer_max_chars)
    return load_tokenizer(data.tokenizer)


@dataclass
class Data:
    files: list[Path]  # training files
    tokenizer: Tokenizer
    eos_id: int
    train: np.ndarray  # (N_train,) token ids, a memmap view
    val: np.ndarray  # (N_val,)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)


def prepare_data(data: DataSection) -> Data:
    """Corpus files -> tokenizer -> cached token file -> (train, val): data.val_files tokenized apart,
    or else a split of the training stream on a document boundary."""
    from flashscale.data.tokenizer import eos_token_id
    from flashscale.data.tokens import prepare_tokens, split_tokens

    files = resolve_files(data.files)
    val_paths = resolve_files(data.val_files, "data.val_files") if data.val_files else []
    overlap = sorted({str(p.resolve()) for p in files} & {str(p.resolve()) for p in val_paths})
    if overlap:
        raise ValueError(f"data.val_files shares files with data.files: {overlap[:3]}; validation text "
                         f"must be held out of training")
    tok = get_tokenizer(data, files)
    tf = prepare_tokens(files, tok, cache_dir(data))
    if val_paths:
        train, val = tf.tokens, prepare_tokens(val_paths, tok, cache_dir(data)).tokens
    else:
        train, val = split_tokens(tf, data.val_fraction)
    need = data.seq_len + 1
    for name, part in (("training", train), ("validation", val)):
        if len(part) < need:
            raise ValueError(f"data: the {name} split holds {len(part)} tokens, fewer than one window of "
                             f"data.seq_len + 1 = {need}; add text or lower data.seq_len / change data.val_fraction")
    return Data(files=files, tokenizer=tok, eos_id=eos_token_id(tok), train=train, val=val)


def model_config(model: ModelSection, *, vocab_size: int, eos_id: int | None, seq_len: int) -> LlamaConfig:
    """The preset with the tokenizer's vocabulary and end-of-text id, then the section's overrides.

    The trained tokenizers have one special token that ends every document and so also precedes every
    document but the first: it is both eos and bos."""
    cfg = model.build(vocab_size=vocab_size, bos_token_id=eos_id, eos_token_id=eos_id)
    if cfg.vocab_size < vocab_size:
        raise ValueError(f"model.vocab_size={cfg.vocab_size} is smaller than the tokenizer's vocabulary "
                         f"({vocab_size} tokens); remove the override or raise it")
    if cfg.max_position_embeddings < seq_len:
        raise ValueError(f"data.seq_len={seq_len} exceeds model.max_position_embeddings="
                         f"{cfg.max_position_embeddings}; lower one or raise the other")
    return cfg


def val_batches(val: np.ndarray, *, seq_len: int, batch_size: int, max_batches: int
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed validation set: consecutive non-overlapping windows of seq_len + 1 tokens from the
    start of the validation split, batch_size a batch, at most max_batches batches (fewer when the split
    is short; the last batch may be smaller). Each (x, y) is (b, seq_len) int64."""
    w = seq_len + 1
    n = min(len(val) // w, batch_size * max_batches)
    windows = torch.from_numpy(np.asarray(val[: n * w], dtype=np.int64)).view(n, w)  # (n, S+1)
    return [(windows[i:i + batch_size, :-1], windows[i:i + batch_size, 1:]) for i in range(0, n, batch_size)]


def prepare(config: Config) -> tuple[torch.device, Data, LlamaConfig]:
    device = resolve_device(config.train.device)
    data = prepare_data(config.data)
    cfg = model_config(config.model, vocab_size=data.vocab_size, eos_id=data.eos_id, seq_len=config.data.seq_len)
    return device, data, cfg
