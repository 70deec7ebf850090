"""The two llama-cpp-python releases the llama.cpp upgrade tests build from source (tests/history/
test_llamacpp_upgrade.py), pinned here alone: `scripts/setup.sh --test` reads them to compile both in the background
while the rest of set-up downloads (`python -m llmplay_testing.llamacpp_releases` prints them).

Chosen for how fast they compile from an empty cache: their llama.cpp trees (commits 7841fc7 and 4227c9b, as
the releases' changelogs say) are about half the size of 0.3.36's. Both serve OpenAI-style streams on
/v1/completions, take every flag cpu-tiny passes and export the `llamacpp:*` counters the adapter reads (not yet the
cached-prompt one); their ggml does not number its releases, so their version label names the release alone. The
newer one no longer has --dump-kv-cache, which the re-test's flag diff and the preflight show.
"""

from __future__ import annotations

OLDER, NEWER = "0.3.8", "0.3.16"
UPGRADE_RELEASES = (OLDER, NEWER)

if __name__ == "__main__":
    print(*UPGRADE_RELEASES)
