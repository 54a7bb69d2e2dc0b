"""A HF `tokenizers.Tokenizer` rebuilt from a GGUF file's tokenizer metadata (tokenizer.ggml.*).

Two tokenizer models, as llama.cpp defines them:
  "gpt2"  byte-level BPE (tokens + merges), with the pre-tokenizer regex llama.cpp picks by
          tokenizer.ggml.pre (SmolLM2's "smollm": single digits, then GPT-2's regex);
  "llama" SentencePiece BPE (tokens + scores, byte fallback). SentencePiece merges the adjacent pair
          whose merged piece has the highest score, which is BPE with merges ranked by that score, so
          the merges are derived from the scores (as transformers' LlamaConverter does).
Control tokens (token_type 3) become special added tokens, user-defined ones (4) plain added tokens,
so "<|im_start|>" in text encodes to its id as in the original tokenizer.json.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from flashscale.errors import UserError

# llama.cpp's token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer regexes of llama.cpp's pre types (llama-vocab.cpp), as the HF tokenizer.json has them.
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2_PRE = ("default", "gpt-2", "gpt2", "mpt", "olmo", "jais")
_DIGITS_GPT2_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")
_SPLIT_PRE = {"llama-bpe": _LLAMA3_REGEX, "llama3": _LLAMA3_REGEX, "qwen2": _QWEN2_REGEX}


def _byte_level_pre_tokenizer(pre: str, add_prefix_space: bool):
    if pre in _GPT2_PRE:
        return pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    if pre in _DIGITS_GPT2_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space,
                                                                 use_regex=True)])
    if pre in _SPLIT_PRE:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_PRE[pre]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False)])
    known = ", ".join(_GPT2_PRE + _DIGITS_GPT2_PRE + tuple(_SPLIT_PRE))
    raise UserError(f"GGUF tokenizer.ggml.pre={pre!r} is not supported; supported: {known}")


def _spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's score-ordered merging: every split of a normal piece
    into two pieces of the vocabulary, ranked by the merged piece's score (ties: lower id first)."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED)}
    ranked = []
    for piece, i in vocab.items():
        if types[i] != NORMAL:
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], i, vocab[left], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _post_processor(bos: str | None, bos_id: int | None, eos: str | None, eos_id: int | None,
                    add_bos: bool, add_eos: bool):
    pre = f"{bos}:0 " if add_bos and bos is not None else ""
    post = f" {eos}:0" if add_eos and eos is not None else ""
    if not pre and not post:
        return None
    special = [(t, i) for t, i, on in ((bos, bos_id, pre), (eos, eos_id, post)) if on]
    pair_pre, pair_post = pre.replace(":0", ":1"), post.replace(":0", ":1")
    return processors.TemplateProcessing(single=f"{pre}$A:0{post}",
                                         pair=f"{pre}$A:0{post} {pair_pre}$B:1{pair_post}",
                                         special_tokens=special)


def build_tokenizer(meta: dict[str, Any]) -> tuple[Tokenizer, dict[str, Any]]:
    """(tokenizer, tokenizer_config entries) from GGUF metadata {key: python value}.

    The second item holds what transformers' tokenizer_config.json wants: bos/eos/unk/pad token strings
    and the chat template, when the GGUF has them.
    """
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise UserError("GGUF file has no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens missing)")
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise UserError(f"GGUF tokenizer: {len(tokens)} tokens but {len(types)} token types")

    def special_id(name: str) -> int | None:
        i = meta.get(f"tokenizer.ggml.{name}_token_id")
        return int(i) if i is not None and 0 <= int(i) < len(tokens) else None

    def tok_str(i: int | None) -> str | None:
        return None if i is None else tokens[i]

    bos_id, eos_id, unk_id, pad_id = (special_id(n) for n in ("bos", "eos", "unknown", "padding"))
    if kind == "gpt2":
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None:
            raise UserError("GGUF gpt2 tokenizer has no tokenizer.ggml.merges")
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        if any(len(p) != 2 for p in pairs):
            raise UserError("GGUF tokenizer.ggml.merges: expected 'left right' strings")
        pre = meta.get("tokenizer.ggml.pre", "default")
        add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs, fuse_unk=False,
                                   byte_fallback=False, ignore_merges=pre in ("llama-bpe", "llama3")))
        tok.pre_tokenizer = _byte_level_pre_tokenizer(pre, add_prefix)
        tok.decoder = decoders.ByteLevel()
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        byte_post = processors.ByteLevel(trim_offsets=False)
    elif kind == "llama":
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None or len(scores) != len(tokens):
            raise UserError("GGUF llama (SentencePiece) tokenizer needs tokenizer.ggml.scores, one per token")
        add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        merges = _spm_merges(tokens, [float(s) for s in scores], types)
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                   unk_token=tok_str(unk_id), fuse_unk=True, byte_fallback=True))
        # llama.cpp (like SentencePiece's dummy prefix) puts "▁" before every text fragment, also one
        # that starts with a space and one that follows a special token: HF's "legacy" Llama normalizer.
        # (A Metaspace pre-tokenizer would skip the prefix before a leading space.)
        steps = [normalizers.Prepend("▁")] if add_prefix else []
        tok.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if add_prefix else []))
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
        byte_post = None
    else:
        raise UserError(f"GGUF tokenizer.ggml.model={kind!r} is not supported; supported: 'gpt2' (byte-level "
                        "BPE), 'llama' (SentencePiece)")

    # Already in the vocabulary, so their ids stay; added tokens are matched before pre-tokenization.
    special = [AddedToken(t, special=True, normalized=False)
               for i, t in enumerate(tokens) if types[i] in (CONTROL, UNKNOWN)]
    user = [AddedToken(t, special=False, normalized=False)
            for i, t in enumerate(tokens) if types[i] == USER_DEFINED]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    template = _post_processor(tok_str(bos_id), bos_id, tok_str(eos_id), eos_id, add_bos, add_eos)
    parts = [p for p in (byte_post, template) if p is not None]
    if parts:
        tok.post_processor = parts[0] if len(parts) == 1 else processors.Sequence(parts)

    tc: dict[str, Any] = {}
    for key, i in (("bos_token", bos_id), ("eos_token", eos_id), ("unk_token", unk_id), ("pad_token", pad_id)):
        if i is not None:
            tc[key] = tokens[i]
    if meta.get("tokenizer.chat_template"):
        tc["chat_template"] = meta["tokenizer.chat_template"]
    return tok, tc
