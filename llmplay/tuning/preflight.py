"""The preflight: before the first trial, every flag of every configuration of the run (baseline and each
step; knobs and raw `extra_args`) is checked against the flags the image itself accepts, so a flag an
engine release renamed or dropped stops the run in seconds with the step, its YAML line and the nearest
accepted flag, instead of failing every trial of an hour on a GPU."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from llmplay.engines.base import Engine
from llmplay.errors import PlaybookError
from llmplay.files import display_path
from llmplay.runtime.image_flags import ImageFlags
from llmplay.spec import Config, Playbook, apply_step

_NUMBER = re.compile(r"^-\d")


@dataclass(frozen=True)
class FlagSite:
    """Flags one place of the playbook passes: the engine's own (model, port), a knob, or extra_args."""

    config: str  # "baseline" or the step's name
    path: str  # YAML path, e.g. steps[1].set.max_num_seqs
    image: str
    flags: tuple[str, ...]


@dataclass(frozen=True)
class PreflightResult:
    engine: Engine  # the adapter specialised to the image's release
    images: tuple[ImageFlags, ...]
    checked_flags: int

    def describe(self) -> str:
        parts = []
        for im in self.images:
            how = "cached" if im.cached else f"`--help` took {im.help_s:.1f}s"
            parts.append(f"{im.image} ({self.engine.kind} {im.version or 'version not labelled'}; {how})")
        return f"preflight: {self.checked_flags} flag(s) of the run accepted by " + ", ".join(parts)


def flag_names(argv: tuple[str, ...] | list[str]) -> list[str]:
    """The flags in an argv fragment: `--name` and `--name=value` give `--name`; values and negative numbers none."""
    return [token.split("=", 1)[0] for token in argv if token.startswith("-") and not _NUMBER.match(token)]


def flag_sites(playbook: Playbook, engine: Engine, default_image: str) -> Iterator[FlagSite]:
    """Where each flag of the run comes from: the baseline's, then what each step changes on top of it."""
    base = playbook.engine
    image = base.image or default_image
    yield FlagSite("baseline", "engine", image, tuple(engine.base_command(base, base.port or engine.default_port)))
    for knob, value in base.args.items():
        yield FlagSite("baseline", f"engine.args.{knob}", image, tuple(engine.render_knob(knob, value)))
    if base.extra_args:
        yield FlagSite("baseline", "engine.extra_args", image, base.extra_args)
    baseline = Config("baseline", base, playbook.workload)
    for i, step in enumerate(playbook.steps):
        config, _ = apply_step(baseline, step)
        spec = config.engine
        step_image = spec.image or default_image
        for change in step.changes:
            knob = change.target.removeprefix("args.")
            written = f"steps[{i}].set.{knob}"
            if f"steps[{i}].set.{knob}" not in playbook.sites and f"steps[{i}].set.{change.target}" in playbook.sites:
                written = f"steps[{i}].set.{change.target}"
            if change.target.startswith("args."):
                yield FlagSite(step.name, written, step_image, tuple(engine.render_knob(knob, spec.args.get(knob))))
            elif change.target == "extra_args":
                yield FlagSite(step.name, written, step_image, spec.extra_args)
            elif change.target == "image" and step_image != image:
                # Another image: every flag of this configuration must be one it accepts.
                yield FlagSite(step.name, written, step_image, tuple(engine.server_args(spec)))
        # Every value a step's kind may try (each value a search may race) is one the image must accept, not only
        # the first; the loader keeps the step's own line for those, so the step is named.
        for change in step.choice.tried():
            if change.target.startswith("args."):
                knob = change.target.removeprefix("args.")
                yield FlagSite(step.name, f"steps[{i}]", step_image, tuple(engine.render_knob(knob, change.knob_value)))


def nearest_flag(flag: str, accepted: frozenset[str]) -> str | None:
    close = difflib.get_close_matches(flag, sorted(f for f in accepted if f.startswith("--")), n=1, cutoff=0.5)
    return close[0] if close else None


def check_flags(
    playbook: Playbook, engine: Engine, images: dict[str, ImageFlags], default_image: str
) -> tuple[list[str], int]:
    """(one problem line per flag an image does not accept, each named once; how many flags were checked)."""
    problems: dict[str, None] = {}
    checked = 0
    for site in flag_sites(playbook, engine, default_image):
        known = images.get(site.image)
        if known is None:
            continue
        for flag in flag_names(site.flags):
            checked += 1
            if flag in known.flags:
                continue
            where = playbook.sites.get(site.path) or playbook.sites.get("engine") or display_path(playbook.path)
            near = nearest_flag(flag, known.flags)
            hint = f"nearest accepted flag: {near}" if near else "no accepted flag is close"
            who = "the baseline" if site.config == "baseline" else f"step '{site.config}'"
            version = f"{engine.kind} {known.version}" if known.version else engine.kind
            problems[
                f"{where}: {site.path}: {who} passes {flag}, which image {site.image} ({version}) does not accept; "
                f"{hint} (from the image's `--help`)"
            ] = None
    return list(problems), checked


def run_images(playbook: Playbook, engine: Engine) -> list[str]:
    """Every engine image the run starts: the baseline's, then each step's, once each."""
    wanted = [playbook.engine.image or engine.default_image]
    wanted += [str(c.value) for s in playbook.steps for c in s.changes if c.target == "image" and c.value]
    return list(dict.fromkeys(wanted))


def preflight(
    playbook: Playbook, engine: Engine, flags_of: Callable[[str], ImageFlags | None], report: Callable[[str], None]
) -> PreflightResult:
    """Ask every image of the run for its flags (`flags_of`, cached per image id), specialise the adapter to the
    baseline image's release, and raise PlaybookError (exit code 2) naming every flag an image lacks."""
    default_image = engine.default_image
    images: dict[str, ImageFlags] = {}
    for image in run_images(playbook, engine):
        found = flags_of(image)
        if found is None:
            report(f"preflight: image {image} is not on this machine; its flags are not checked")
            continue
        images[image] = found
    base = images.get(playbook.engine.image or default_image)
    versioned = engine.at(base.version if base else None)
    problems, checked = check_flags(playbook, versioned, images, default_image)
    if problems:
        raise PlaybookError("\n".join(problems))
    return PreflightResult(versioned, tuple(images.values()), checked)
