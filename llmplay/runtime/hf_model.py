"""The tiny random-weight Llama in Hugging Face format (config.json, safetensors, tokenizer.json), for engines
that read a model directory (vLLM): the same architecture, sizes and vocabulary as the llama.cpp tiny GGUF.

Written once into the cache at a stable path (so a playbook can mount it), rebuilt when its inputs change.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from llmplay.cache_dir import TINY_HF_MODEL
from llmplay.runtime.cache import Log, content_key, default_cache_dir
from llmplay.runtime.cpu_image import CHAT_TEMPLATE, MODEL_PARAMS, ModelParams, vocab_path

KEY_FILE = ".llmplay-key"


def model_dir(cache: Path) -> Path:
    return cache / TINY_HF_MODEL


def write_safetensors(path: Path, tensors: Mapping[str, np.ndarray]) -> Path:
    """The safetensors layout: an 8-byte little-endian header size, a JSON header of dtype/shape/offsets,
    then the raw little-endian bytes, each tensor contiguous in the header's order."""
    dtypes = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    blobs = []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": dtypes[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for data in blobs:
            f.write(data)
    return path


def _vocabulary(vocab_file: Path) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of llama.cpp's SPM vocabulary (the GGUF the llama.cpp model uses)."""
    import gguf  # deferred: an optional dependency (the `cpu` extra)

    reader = gguf.GGUFReader(str(vocab_file))
    tokens = [str(t) for t in reader.fields["tokenizer.ggml.tokens"].contents()]
    scores = [float(s) for s in reader.fields["tokenizer.ggml.scores"].contents()]
    types = [int(t) for t in reader.fields["tokenizer.ggml.token_type"].contents()]
    return tokens, scores, types


def tokenizer_json(tokens: list[str], scores: list[float], types: list[int]) -> str:
    """A Hugging Face tokenizer of the SPM vocabulary: Unigram with byte fallback, as sentencepiece reads it."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors  # deferred: the `hf` extra
    from tokenizers.models import Unigram

    tok = Tokenizer(Unigram(list(zip(tokens, scores, strict=True)), unk_id=0, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    control = 3  # gguf's TokenType.CONTROL: <s>, </s>
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types, strict=True) if k == control]
    )
    # Llama prepends <s> to every prompt; the engine's tokenizer adds it through this post-processor.
    bos = tokens.index("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return str(tok.to_str())


def _weights(p: ModelParams, n_vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(p["seed"])
    head_dim = p["n_embd"] // p["n_head"]

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(p["init_std"])

    ones = np.ones(p["n_embd"], dtype=np.float32)
    out = {"model.embed_tokens.weight": mat(n_vocab, p["n_embd"]), "model.norm.weight": ones}
    for i in range(p["n_layer"]):
        pre = f"model.layers.{i}."
        out[pre + "input_layernorm.weight"] = ones
        out[pre + "post_attention_layernorm.weight"] = ones
        out[pre + "self_attn.q_proj.weight"] = mat(p["n_head"] * head_dim, p["n_embd"])
        out[pre + "self_attn.k_proj.weight"] = mat(p["n_head_kv"] * head_dim, p["n_embd"])
        out[pre + "self_attn.v_proj.weight"] = mat(p["n_head_kv"] * head_dim, p["n_embd"])
        out[pre + "self_attn.o_proj.weight"] = mat(p["n_embd"], p["n_head"] * head_dim)
        out[pre + "mlp.gate_proj.weight"] = mat(p["n_ff"], p["n_embd"])
        out[pre + "mlp.up_proj.weight"] = mat(p["n_ff"], p["n_embd"])
        out[pre + "mlp.down_proj.weight"] = mat(p["n_embd"], p["n_ff"])
    return out


def _config(p: ModelParams, n_vocab: int, bos: int, eos: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": p["n_embd"],
        "intermediate_size": p["n_ff"],
        "num_hidden_layers": p["n_layer"],
        "num_attention_heads": p["n_head"],
        "num_key_value_heads": p["n_head_kv"],
        "head_dim": p["n_embd"] // p["n_head"],
        "max_position_embeddings": p["n_ctx_train"],
        "rope_theta": p["rope_freq_base"],
        "rms_norm_eps": p["rms_eps"],
        "vocab_size": n_vocab,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
    }


def write_tiny_hf_model(cache: Path | None = None, force: bool = False, log: Log = print) -> Path:
    """The model directory in the cache, written (atomically, as a whole) when missing, stale or forced."""
    cache = cache or default_cache_dir()
    dest = model_dir(cache)
    key = content_key(MODEL_PARAMS, CHAT_TEMPLATE, "hf-1")
    if not force and (dest / KEY_FILE).is_file() and (dest / KEY_FILE).read_text().strip() == key:
        return dest
    tokens, scores, types = _vocabulary(vocab_path(cache, log))
    bos, eos = tokens.index("<s>"), tokens.index("</s>")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_safetensors(tmp / "model.safetensors", _weights(MODEL_PARAMS, len(tokens)))
    (tmp / "config.json").write_text(json.dumps(_config(MODEL_PARAMS, len(tokens), bos, eos), indent=1))
    (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}))
    (tmp / "tokenizer.json").write_text(tokenizer_json(tokens, scores, types))
    (tmp / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "add_bos_token": True,
                "chat_template": CHAT_TEMPLATE,
                "model_max_length": MODEL_PARAMS["n_ctx_train"],
            },
            indent=1,
        )
    )
    (tmp / KEY_FILE).write_text(key)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    size = sum(f.stat().st_size for f in dest.iterdir())
    log(f"wrote {dest} ({size / 2**20:.1f} MiB, {len(tokens)} tokens)")
    return dest
