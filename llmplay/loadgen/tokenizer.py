"""Token counting and exact-length prompt text: the engine's own tokenizer where reachable, else a word ratio."""

from __future__ import annotations

import re
import weakref
from pathlib import Path
from typing import Protocol, runtime_checkable

import httpx
import numpy as np

from llmplay.errors import InfrastructureError

# Short, frequent English words: each is a single token in the BPE/SentencePiece
# vocabularies of every mainstream model family (Llama, Qwen, Mistral, GPT-2),
# so a text of n of them is close to n tokens even without the real tokenizer.
WORDS: tuple[str, ...] = tuple(
    """the of and to in is was for on are with as by at be this from or have an they which one you
    had not but what all were when we there can more if no out so said up its about into than them
    time only new some could these two may first then do any like my now over such our man me even
    most made after also did many off before must well back through years much where your way down
    should because each just those people how too little state good very make world still own see
    men work long get here between both life being under never day same another know while last
    might us great old year since come came show every last house part place found again take
    water small end home give hand high keep light air line thing last city tree cross farm hard
    start story sea draw left late run don press close night real few north open seem together next
    white begin got walk example ease paper group always music those both mark often letter until
    mile river car feet care second book carry took science eat room friend began idea fish
    mountain stop once base hear horse cut sure watch color face wood main enough plain girl usual
    young ready above ever red list though feel talk bird soon body dog family direct pose leave
    song measure door product black short numeral class wind question happen complete ship area half
    rock order fire south problem piece told knew pass farm top whole king size heard best hour
    better true during hundred five remember step early hold west ground interest reach fast five
    sing listen six table travel less morning ten simple several vowel toward war lay against
    pattern slow center love person money serve appear road map rain rule govern pull cold notice
    voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star
    box noun field rest correct able pound done beauty drive stood contain front teach week final
    gave green quick develop ocean warm free minute strong special mind behind clear tail produce
    fact street inch multiply nothing course stay wheel full force blue object decide surface deep
    moon island foot system busy test record boat common gold possible plane dry wonder laugh
    thousand ago ran check game shape yes hot miss brought heat snow tire bring distant fill east
    paint language among""".split()
)

_WORDLIKE = re.compile(r"\w+|[^\w\s]")


@runtime_checkable
class Tokenizer(Protocol):
    """What workload generation needs: count tokens and make text of an exact (or near) token count."""

    @property
    def name(self) -> str: ...

    @property
    def exact(self) -> bool: ...

    def count(self, text: str) -> int: ...

    def make_text(self, n_tokens: int, rng: np.random.Generator | int) -> str: ...

    def close(self) -> None:
        """Release what it holds (an HTTP client to the engine); the owner calls it once it is done."""


def _rng(rng_or_seed: np.random.Generator | int) -> np.random.Generator:
    if isinstance(rng_or_seed, np.random.Generator):
        return rng_or_seed
    return np.random.default_rng(rng_or_seed)


def _random_words(n_words: int, rng: np.random.Generator) -> str:
    idx = rng.integers(0, len(WORDS), size=max(n_words, 0))
    return " ".join(WORDS[i] for i in idx)


class WordRatioTokenizer:
    """Approximate: tokens = round(words-and-punctuation x ratio). Used when no engine tokenizer is reachable."""

    exact = False

    def __init__(self, tokens_per_word: float = 1.0):
        # 1.0 fits the WORDS vocabulary; ~1.3 fits general English prose (ShareGPT replies).
        self.tokens_per_word = tokens_per_word
        self.name = f"word-ratio({tokens_per_word:g} tokens/word, approximate)"

    def count(self, text: str) -> int:
        return round(len(_WORDLIKE.findall(text)) * self.tokens_per_word)

    def make_text(self, n_tokens: int, rng: np.random.Generator | int) -> str:
        return _random_words(round(n_tokens / self.tokens_per_word), _rng(rng))

    def close(self) -> None:
        pass

    @classmethod
    def calibrated(cls, reference: Tokenizer, sample_text: str) -> WordRatioTokenizer:
        """Fit the ratio on sample_text against an exact tokenizer (e.g. once, while the engine is up)."""
        words = len(_WORDLIKE.findall(sample_text))
        return cls(reference.count(sample_text) / words if words else 1.0)


class _VocabularyTokenizer:
    """Exact prompts from a model's own vocabulary: a random window of its tokens, decoded, then nudged until
    the text re-encodes to exactly n tokens. Subclasses say how to encode and decode."""

    exact = True
    _corpus: list[int]

    def tokenize(self, text: str) -> list[int]:
        raise NotImplementedError

    def detokenize(self, tokens: list[int]) -> str:
        raise NotImplementedError

    def close(self) -> None:
        pass  # a local vocabulary holds nothing; LlamaCppTokenizer closes its client

    def count(self, text: str) -> int:
        return len(self.tokenize(text))

    def make_text(self, n_tokens: int, rng: np.random.Generator | int) -> str:
        if n_tokens <= 0:
            return ""
        gen = _rng(rng)
        if len(self._corpus) < 4 * n_tokens + 64:
            # One encode builds a corpus every later prompt slices from.
            self._corpus = self.tokenize(_random_words(max(4 * n_tokens + 64, 2048), np.random.default_rng(0)))
        start = int(gen.integers(0, max(1, len(self._corpus) - n_tokens)))
        want, text = n_tokens, ""
        for _ in range(8):
            text = self.detokenize(self._corpus[start : start + want]).strip()
            got = self.count(text)
            if got == n_tokens:
                return text
            # Merges across the window edges change the count by a token or two; nudge and retry.
            want = max(1, want + (n_tokens - got))
            if start + want > len(self._corpus):
                start = max(0, len(self._corpus) - want)
        return text


class LlamaCppTokenizer(_VocabularyTokenizer):
    """Exact counts through a llama.cpp server's /tokenize and /detokenize (the model's own vocabulary).

    Counts exclude the BOS token the server adds to a prompt, so usage.prompt_tokens is
    typically count(prompt) + 1.
    """

    def __init__(self, base_url: str, *, timeout_s: float = 10.0, client: httpx.Client | None = None):
        self.base_url = base_url.rstrip("/")
        self.name = f"llama.cpp /tokenize at {self.base_url}"
        self._client = client or httpx.Client(timeout=timeout_s, trust_env=False)
        self._corpus: list[int] = []
        if client is None:
            # Callers rarely close a tokenizer; closing the client with it keeps sockets from leaking.
            self._finalizer = weakref.finalize(self, self._client.close)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> LlamaCppTokenizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tokenize(self, text: str) -> list[int]:
        try:
            resp = self._client.post(f"{self.base_url}/tokenize", json={"content": text, "add_special": False})
            resp.raise_for_status()
            return list(resp.json()["tokens"])
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise InfrastructureError(
                f"tokenizer at {self.base_url}/tokenize failed: {exc}; expected a llama.cpp server"
            ) from exc

    def detokenize(self, tokens: list[int]) -> str:
        try:
            resp = self._client.post(f"{self.base_url}/detokenize", json={"tokens": tokens})
            resp.raise_for_status()
            return str(resp.json()["content"])
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise InfrastructureError(
                f"tokenizer at {self.base_url}/detokenize failed: {exc}; expected a llama.cpp server"
            ) from exc


class HfTokenizer(_VocabularyTokenizer):
    """Exact counts from a Hugging Face `tokenizer.json` on disk (the `tokenizers` library), for engines
    without a tokenize endpoint: vLLM, SGLang, TGI and TensorRT-LLM read the same file from model_dir."""

    def __init__(self, path: str | Path):
        try:
            from tokenizers import Tokenizer as _HfTokenizer  # deferred: optional (the hf extra)
        except ImportError as exc:
            raise InfrastructureError(
                "reading tokenizer.json needs the `tokenizers` package; expected `pip install 'llmplay[hf]'`"
            ) from exc
        self.path = Path(path)
        self._tok = _HfTokenizer.from_file(str(self.path))
        self.name = f"tokenizer.json at {self.path}"
        self._corpus: list[int] = []

    def tokenize(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def detokenize(self, tokens: list[int]) -> str:
        return str(self._tok.decode(tokens))


def find_tokenizer_json(model_dir: str | None) -> Path | None:
    if not model_dir:
        return None
    candidate = Path(model_dir) / "tokenizer.json"
    return candidate if candidate.is_file() else None


class FallbackTokenizer:
    """The engine's tokenizer while it answers; a word-ratio estimate calibrated against it once it stops.

    An engine that freezes mid-trial must not take the load generator down with it: the requests it can
    no longer serve still have to be sent and recorded (as timeouts), so prompts keep coming.
    """

    def __init__(self, primary: Tokenizer):
        self.primary = primary
        self.fallback: WordRatioTokenizer | None = None
        self.failure: str | None = None
        try:
            self._ratio = WordRatioTokenizer.calibrated(primary, _random_words(200, np.random.default_rng(1)))
        except InfrastructureError:
            self._ratio = WordRatioTokenizer()

    @property
    def estimate(self) -> WordRatioTokenizer:
        """The word ratio calibrated against the engine's tokenizer: counts that need no engine."""
        return self._ratio

    @property
    def exact(self) -> bool:
        return self.fallback is None and self.primary.exact

    @property
    def name(self) -> str:
        if self.fallback is None:
            return self.primary.name
        return f"{self.primary.name}, then {self.fallback.name} after it failed ({self.failure})"

    def _fail(self, exc: InfrastructureError) -> WordRatioTokenizer:
        self.failure, self.fallback = str(exc).split(";")[0], self._ratio
        return self._ratio

    def count(self, text: str) -> int:
        if self.fallback is None:
            try:
                return self.primary.count(text)
            except InfrastructureError as exc:
                self._fail(exc)
        return self._ratio.count(text)

    def make_text(self, n_tokens: int, rng: np.random.Generator | int) -> str:
        if self.fallback is None:
            try:
                return self.primary.make_text(n_tokens, rng)
            except InfrastructureError as exc:
                self._fail(exc)
        return self._ratio.make_text(n_tokens, rng)

    def close(self) -> None:
        self.primary.close()


def probe_llamacpp(base_url: str, timeout_s: float = 5.0) -> bool:
    """True when base_url answers llama.cpp's /tokenize."""
    try:
        resp = httpx.post(f"{base_url.rstrip('/')}/tokenize", json={"content": "hello world"}, timeout=timeout_s)
        return resp.status_code == 200 and isinstance(resp.json().get("tokens"), list)
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def make_tokenizer(kind: str = "auto", base_url: str | None = None, model_dir: str | None = None) -> Tokenizer:
    """kind: auto (llama.cpp /tokenize if the endpoint has it, else model_dir/tokenizer.json, else word
    ratio) | llamacpp | hf | word."""
    if kind == "hf":
        path = find_tokenizer_json(model_dir)
        if path is None:
            raise InfrastructureError(f"no tokenizer.json in {model_dir}; expected the model's Hugging Face files")
        return HfTokenizer(path)
    if kind == "word":
        return WordRatioTokenizer()
    if kind == "llamacpp":
        if base_url is None:
            raise InfrastructureError("tokenizer 'llamacpp' needs the endpoint URL; expected --url")
        return LlamaCppTokenizer(base_url)
    if kind != "auto":
        raise InfrastructureError(f"unknown tokenizer {kind!r}; expected auto, llamacpp, hf or word")
    if base_url is not None and probe_llamacpp(base_url):
        return FallbackTokenizer(LlamaCppTokenizer(base_url))
    path = find_tokenizer_json(model_dir)
    if path is not None:
        try:
            return HfTokenizer(path)
        except InfrastructureError:
            pass  # no `tokenizers` installed: the word ratio is the honest fallback, and its name says so
    return WordRatioTokenizer()
