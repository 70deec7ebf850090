"""Set-up and the vLLM images install with uv configured from pip's own settings (llmplay.package_install): a private
index, a wheel folder or a constraint given to pip must hold for uv too, and a setting uv cannot honour means pip."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from llmplay import package_install
from llmplay.package_install import install_command, parse_pip_config, uv_settings

LISTED = """global.cert='/etc/ssl/certs/ca.crt'
global.extra-index-url='file:///srv/a/simple file:///srv/b/simple'
global.find-links='/srv/wheels'
global.constraint='/etc/pip/constraints.txt'
install.trusted-host='pypi.internal'
:env:.find-links='/opt/wheels'
:env:.disable-pip-version-check='1'
:env:.default-timeout='180'
"""


def test_pip_settings_map_onto_uv_options_and_pip_variables_win_over_files() -> None:
    settings = uv_settings(parse_pip_config(LISTED))
    assert settings.unmapped == []
    opts = settings.options
    assert opts[:2] == ["--index-strategy", "unsafe-best-match"]  # pip's best match across every index
    pairs = list(zip(opts[2::2], opts[3::2], strict=True))
    assert ("--extra-index-url", "file:///srv/a/simple") in pairs
    assert ("--extra-index-url", "file:///srv/b/simple") in pairs
    assert ("--find-links", "/opt/wheels") in pairs and ("--find-links", "/srv/wheels") not in pairs
    assert ("--constraint", "/etc/pip/constraints.txt") in pairs
    assert ("--allow-insecure-host", "pypi.internal") in pairs
    assert settings.env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca.crt", "UV_HTTP_TIMEOUT": "180"}


def test_a_pip_setting_without_a_uv_equivalent_means_pip_and_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert uv_settings(parse_pip_config("global.use-feature='truststore'\n")).unmapped == ["use-feature"]
    monkeypatch.setattr(package_install, "uv_binary", lambda: "/usr/bin/uv")
    monkeypatch.setattr(
        package_install.subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout="global.use-feature='truststore'\n"),
    )
    argv, env, which = install_command("/venv/bin/python", ["pkg"])
    assert argv[:3] == ["/venv/bin/python", "-m", "pip"] and env == {}
    assert which == "pip (pip's setting use-feature has no uv equivalent)"


def test_no_bytecode_is_pips_no_compile_and_nothing_for_uv(monkeypatch: pytest.MonkeyPatch) -> None:
    """uv writes no bytecode unless asked, so only pip needs telling; a uv argv with pip's flag would fail."""
    monkeypatch.setattr(package_install, "uv_binary", lambda: None)
    argv, _, which = install_command("/venv/bin/python", ["pkg"], bytecode=False)
    assert which.startswith("pip") and "--no-compile" in argv and argv[-1] == "pkg"
    assert "--no-compile" not in install_command("/venv/bin/python", ["pkg"])[0]
    monkeypatch.setattr(package_install, "uv_binary", lambda: "/usr/bin/uv")
    monkeypatch.setattr(package_install.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=""))
    argv, _, which = install_command("/venv/bin/python", ["pkg"], bytecode=False)
    assert which == "uv" and argv[:3] == ["/usr/bin/uv", "pip", "install"]
    assert "--no-compile" not in argv and "--compile-bytecode" not in argv


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel holding one module, written by hand: the smallest thing an installer accepts."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return wheel


@pytest.mark.skipif(package_install.uv_binary() is None, reason="uv is not installed (pip install llmplay[test])")
def test_uv_installs_from_the_wheel_folder_and_under_the_constraint_pip_is_configured_with(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("1.0", "2.0"):
        _wheel(wheels, "llmplaydemo", version)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("llmplaydemo<2\n")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # pip's configuration as PIP_* variables (as a machine's pip.conf would give it): no index, a wheel folder, a cap.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CONSTRAINT": str(constraints),
        "PIP_CONFIG_FILE": os.devnull,
        "LLMPLAY_CACHE": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "llmplay.package_install", "--python", python, "--", "llmplaydemo"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "installing with uv" in done.stderr
    out = subprocess.run(
        [python, "-c", "import llmplaydemo; print(llmplaydemo.VERSION)"], capture_output=True, text=True
    )
    assert out.stdout.strip() == "1.0"  # the constraint held: 2.0 lies in the folder too
    assert (tmp_path / "cache" / "uv").is_dir()  # uv's cache beside llmplay's
