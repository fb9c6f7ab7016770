"""The competition's classes matched to a teacher's outputs, by scientific name.

BirdCLEF's labels are eBird codes (`asbfly`) with the scientific name in taxonomy.csv; other tables label by the
binomial itself (`acrocephalus_palustris`, `Acrocephalus palustris`). BirdNET's labels are
`Genus species_Common name`. A class is matched to the output whose scientific name is its own (case, `_`
and `-` ignored), else to an output whose whole label is the class itself (a teacher labelled by codes).
Classes the teacher does not have -- insects, frogs, rare endemics, a name in another taxonomy -- are listed
with the reason, and learn from their labels alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..core.progress import plural
from ..core.tables import TAXONOMY

# A binomial, as labels and taxonomy tables write it: two words of letters (a third, a subspecies, is allowed).
_BINOMIAL = re.compile(r"^[a-z]+ [a-z]+( [a-z]+)?$")
# A table is of bird recordings when this share of its classes are species a bird model knows (bird_signal).
BIRD_SHARE = 0.5


def normal_name(text: str) -> str:
    """A scientific name compared as a name: lower case, `_` and `-` as spaces, single spaces."""
    return " ".join(re.sub(r"[_\-]+", " ", text).lower().split())


def scientific_name(teacher_label: str) -> str:
    """The scientific name of a teacher's label (`Acrocephalus palustris_Marsh Warbler` -> `acrocephalus
    palustris`)."""
    return normal_name(
        teacher_label.split("_", 1)[0] if " " in teacher_label.split("_", 1)[0] else teacher_label
    )


@dataclass(frozen=True)
class ClassMap:
    """Which teacher output stands for each competition class (-1: none), and why not for the others."""

    classes: tuple[str, ...]
    outputs: tuple[int, ...]  # per class, the teacher output's index, or -1
    names: tuple[str, ...]  # per class, the teacher label it matched ("" when none)
    lacking: dict[str, str] = field(default_factory=dict)  # class -> why the teacher has no output for it

    @property
    def known(self) -> list[int]:
        """Indices of the classes the teacher has."""
        return [k for k, output in enumerate(self.outputs) if output >= 0]

    def describe(self) -> str:
        some = ", ".join(f"{c!r} ({why})" for c, why in list(self.lacking.items())[:5])
        more = f" ... and {len(self.lacking) - 5} more" if len(self.lacking) > 5 else ""
        lacking = (
            f"; it lacks {len(self.lacking)}, which learn from their labels alone: {some}{more}"
            if self.lacking
            else ""
        )
        return f"teacher knows {len(self.known)} of {len(self.classes)} classes{lacking}"

    def as_record(self) -> dict:
        return {
            "classes": {c: n for c, n in zip(self.classes, self.names, strict=True) if n},
            "lacking": dict(self.lacking),
        }


def match_classes(
    classes: Sequence[str],
    teacher_labels: Sequence[str],
    taxonomy: Mapping[str, str] | None = None,
    exclude: Iterable[str] = (),
) -> ClassMap:
    """Each class's teacher output: by its scientific name (taxonomy's, or the class's own when it is a
    binomial), else by a teacher label equal to the class. `exclude`: classes to leave unmatched on purpose."""
    taxonomy = taxonomy or {}
    by_name: dict[str, int] = {}
    for index, label in enumerate(teacher_labels):
        by_name.setdefault(scientific_name(label), index)
    by_label = {label: index for index, label in enumerate(teacher_labels)}
    excluded = set(exclude)
    outputs, names, lacking = [], [], {}
    for cls in classes:
        name = normal_name(taxonomy.get(cls, cls))
        if cls in excluded:
            index, why = -1, "left out of the teacher's map (teacher_exclude)"
        elif name in by_name:
            index, why = by_name[name], ""
        elif cls in by_label:
            index, why = by_label[cls], ""
        elif cls in taxonomy or _BINOMIAL.match(name):
            index, why = -1, f"{name.capitalize()} is not among the teacher's {len(teacher_labels)} outputs"
        else:
            index, why = -1, f"no scientific name (not in {TAXONOMY}, and not a binomial)"
        outputs.append(index)
        names.append(teacher_labels[index] if index >= 0 else "")
        if why:
            lacking[cls] = why
    return ClassMap(tuple(classes), tuple(outputs), tuple(names), lacking)


__all__ = ["ClassMap", "bird_signal", "match_classes", "normal_name", "scientific_name"]


def bird_signal(labels: list[str], taxonomy: dict[str, str]) -> str | None:
    """Why the classes `labels` are birds, or None: a taxonomy.csv (`core.tables.read_taxonomy`) naming their
    species (BirdCLEF ships one), or most of them species that BirdNET v2.4 knows by scientific name (when its
    labels are installed: the `birds` extra). A label that merely looks like two words ("crying_baby") is not enough."""
    if named := sum(label in taxonomy for label in labels):
        if named >= BIRD_SHARE * len(labels):
            return f"taxonomy.csv names the species of {named} of {plural(len(labels), 'class')}"
    from .model import TeacherError, find_teacher  # BirdNET's labels, when the `birds` extra is installed

    try:
        known = len(match_classes(labels, find_teacher("birdnet").labels, taxonomy).known)
    except TeacherError:  # BirdNET's labels are not installed here: the taxonomy alone decides
        return None
    if known >= BIRD_SHARE * len(labels):
        return f"{known} of {plural(len(labels), 'class')} are species BirdNET v2.4 knows"
    return None
