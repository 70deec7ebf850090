"""What a model is made of, read from its GGUF metadata or Hugging Face config.json: layers, heads, bytes."""

from __future__ import annotations

import functools
import json
import stat
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmplay.errors import LlmplayError
from llmplay.jsonvalue import as_list, as_mapping

if TYPE_CHECKING:
    from gguf import GGUFReader


class ModelFactsError(LlmplayError):
    """The model file or config cannot be read into facts (layers, heads, parameters)."""


@dataclass(frozen=True)
class ModelFacts:
    name: str
    architecture: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    params: int
    weight_bytes: int  # exact for GGUF (tensor sizes); estimated for config.json
    quantization: str  # e.g. "Q4_K_M", "bf16", "fp8", "awq"
    source: str  # where the facts came from, for the report

    @property
    def bytes_per_param(self) -> float:
        return self.weight_bytes / self.params if self.params else 0.0

    def kv_bytes_per_token(self, kv_dtype_bytes: float) -> float:
        """2 (K and V) × layers × kv_heads × head_dim × dtype bytes (CHECKLIST §4)."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * kv_dtype_bytes


def _whole(value: object) -> int:
    """int() of a metadata number; TypeError for anything else, as int() raises."""
    if isinstance(value, (int, float, str)):
        return int(value)
    raise TypeError(f"not a number: {value!r}")


def _gguf_value(reader: GGUFReader, key: str) -> object:
    field = reader.fields.get(key)
    if field is None:
        return None
    return field.contents()


def model_facts_from_gguf(path: str | Path) -> ModelFacts:
    """Facts from GGUF metadata; parameters and bytes are summed over the tensors actually stored."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return _gguf_facts(p, None)
    return _gguf_facts(p, (st.st_size, st.st_mtime_ns, st.st_ino) if stat.S_ISREG(st.st_mode) else None)


# The reader parses every metadata field, the vocabulary's hundreds of thousands of parts included: seconds for one
# file, and a tuning session diagnoses each of its runs on the same model. Keyed on the file's size, modification
# time and inode, so a model rewritten in place is read again.
@functools.lru_cache(maxsize=16)
def _gguf_facts(p: Path, identity: tuple[int, int, int] | None) -> ModelFacts:
    try:
        import gguf  # deferred: optional extra `cpu`; config.json models never need it
    except ImportError as e:
        raise ModelFactsError(f"reading {p} needs the gguf package: pip install 'llmplay[cpu]' ({e})") from e
    if identity is None:
        raise ModelFactsError(f"{p}: no such GGUF file")
    try:
        reader = gguf.GGUFReader(str(p))
    except Exception as e:
        raise ModelFactsError(f"{p}: not a readable GGUF file ({type(e).__name__}: {e})") from e
    arch = _gguf_value(reader, "general.architecture")
    if not arch:
        raise ModelFactsError(f"{p}: GGUF has no general.architecture")

    def num(key: str) -> int | None:
        v = _gguf_value(reader, f"{arch}.{key}")
        if v is None:
            return None
        if isinstance(v, (list, tuple)):  # per-layer arrays (e.g. head_count_kv): the largest layer
            v = max(v) if v else None
        return None if v is None else _whole(v)

    layers = num("block_count")
    heads = num("attention.head_count")
    hidden = num("embedding_length")
    if not (layers and heads and hidden):
        raise ModelFactsError(f"{p}: GGUF lacks {arch}.block_count / attention.head_count / embedding_length")
    kv_heads = num("attention.head_count_kv") or heads
    head_dim = num("attention.key_length") or hidden // heads
    params = sum(int(t.n_elements) for t in reader.tensors)
    weight_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    if not params:
        raise ModelFactsError(f"{p}: GGUF holds no tensors (a vocab-only file?); point at the model weights")
    ftype = _gguf_value(reader, "general.file_type")
    if ftype is not None:
        try:
            quant = gguf.LlamaFileType(_whole(ftype)).name.removeprefix("MOSTLY_")
        except ValueError:
            quant = f"file_type {ftype}"
    else:  # the type holding most bytes
        by_type: Counter[str] = Counter()
        for t in reader.tensors:
            by_type[gguf.GGMLQuantizationType(int(t.tensor_type)).name] += int(t.n_bytes)
        quant = by_type.most_common(1)[0][0] if by_type else "unknown"
    name = _gguf_value(reader, "general.name") or p.stem
    return ModelFacts(
        str(name), str(arch), layers, heads, kv_heads, head_dim, hidden, params, weight_bytes, quant, f"gguf:{p}"
    )


# bytes per weight; 4-bit group-quantized formats carry scales/zeros (~0.16 bit per weight at group 128)
QUANT_BYTES: Mapping[str, float] = {
    "fp32": 4,
    "float32": 4,
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "none": 2,
    "fp8": 1,
    "int8": 1,
    "w8a8": 1,
    "fbgemm_fp8": 1,
    "compressed-tensors": 1,
    "awq": 0.52,
    "gptq": 0.52,
    "int4": 0.5,
    "w4a16": 0.52,
    "marlin": 0.52,
    "bitsandbytes": 0.52,
    "nvfp4": 0.5625,
    "mxfp4": 0.53125,
}


def model_facts_from_hf_config(config_path: str | Path, quantization: str | None = None) -> ModelFacts:
    """Facts from a Hugging Face config.json; parameters are counted from the shapes (decoder-only,
    gated MLP, MoE experts counted in full) and embeddings stay at the checkpoint dtype, as
    weight-only quantizers leave them."""
    p = Path(config_path)
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ModelFactsError(f"{p}: cannot read config.json ({e})") from e
    top = as_mapping(cfg)
    cfg = as_mapping(top.get("text_config")) or top  # multimodal wrappers keep the LM under text_config

    def first(*keys: str) -> object:
        return next((cfg[k] for k in keys if cfg.get(k) is not None), None)

    def get(*keys: str, default: float = 0) -> float:
        value = first(*keys)
        if value is None:
            return default
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        raise ModelFactsError(f"{p}: config.json {keys[0]} is {value!r}; expected a number")

    layers = get("num_hidden_layers", "n_layer", "num_layers")
    heads = get("num_attention_heads", "n_head")
    hidden = get("hidden_size", "n_embd", "d_model")
    if not (layers and heads and hidden):
        raise ModelFactsError(f"{p}: config.json lacks num_hidden_layers / num_attention_heads / hidden_size")
    kv_heads = get("num_key_value_heads", "num_kv_heads", default=heads)
    head_dim = get("head_dim", default=hidden // heads)
    inter = get("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    vocab = get("vocab_size", default=0)
    experts = get("num_local_experts", "num_experts", "n_routed_experts", default=0) or 0
    moe_inter = get("moe_intermediate_size", default=inter)
    shared = get("n_shared_experts", "num_shared_experts", default=0) or 0
    tied = bool(top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)))

    attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    if experts:
        mlp = experts * 3 * hidden * moe_inter + shared * 3 * hidden * moe_inter + hidden * experts
    else:
        mlp = 3 * hidden * inter
    per_layer = attn + mlp + 2 * hidden
    embed = vocab * hidden * (1 if tied else 2)
    params = layers * per_layer + embed + hidden

    dtype = str(first("torch_dtype", "dtype") or top.get("torch_dtype", "bfloat16")).replace("torch.", "")
    base_bytes = QUANT_BYTES.get(dtype, 2)
    q = quantization
    qcfg = as_mapping(top.get("quantization_config")) or as_mapping(cfg.get("quantization_config"))
    if q is None and qcfg:
        q = str(qcfg.get("quant_method", "")).lower()
        if q in ("gptq", "awq") or not q:
            bits = qcfg.get("bits")
            q = q or (f"int{bits}" if bits else "int8")
    q = (q or dtype).lower()
    if q not in QUANT_BYTES:
        raise ModelFactsError(f"{p}: unknown quantization '{q}'; expected one of {', '.join(sorted(QUANT_BYTES))}")
    body_bytes = QUANT_BYTES[q]
    weight_bytes = int(layers * per_layer * body_bytes + (embed + hidden) * base_bytes)
    name = top.get("_name_or_path") or p.parent.name
    arch = (as_list(top.get("architectures")) or [top.get("model_type", "unknown")])[0]
    return ModelFacts(
        str(name),
        str(arch),
        int(layers),
        int(heads),
        int(kv_heads),
        int(head_dim),
        int(hidden),
        int(params),
        weight_bytes,
        q,
        f"config.json:{p}",
    )
