"""SpeechBrain's own client on an artifact, as the README shows it, against a submission written from it.

    python -m matrix.sb_client ARTIFACT DATA SUBMISSION SAVEDIR [ALSO]

Loads `EncoderClassifier.from_hparams(source=ARTIFACT, savedir=SAVEDIR)` (offline: it reads ARTIFACT only),
runs `classify_file` on every file of DATA/test.csv and compares each label with SUBMISSION's row for that id.
Prints one JSON line {"files", "agree", "disagree": [...]} and exits 1 if any label differs. ALSO, another
submission of the same files, is compared too and reported under "also" without deciding the exit status.
Run by matrix/run.py with the leg's interpreter, under the offline guard.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    artifact, data, submission, savedir, *also = (Path(a) for a in argv)
    from speechbrain.inference.speaker import EncoderClassifier
    from speechbrain.utils.fetching import LocalStrategy

    classifier = EncoderClassifier.from_hparams(
        source=str(artifact), savedir=str(savedir), local_strategy=LocalStrategy.COPY
    )
    with open(data / "test.csv", newline="") as handle:
        tests = list(csv.DictReader(handle))
    labels = {row["id"]: classifier.classify_file(str(data / row["path"]))[3][0] for row in tests}
    found = compare(labels, submission)
    if also:
        found["also"] = compare(labels, also[0])
    print(json.dumps(found))
    return 1 if found["disagree"] or not tests else 0


def compare(labels: dict[str, str], submission: Path) -> dict:
    """SpeechBrain's label of each test id against `submission`'s."""
    with open(submission, newline="") as handle:
        submitted = {row["id"]: row["label"] for row in csv.DictReader(handle)}
    disagree = [
        {"id": id_, "speechbrain": label, "submission": submitted.get(id_)}
        for id_, label in labels.items()
        if label != submitted.get(id_)
    ]
    return {"files": len(labels), "agree": len(labels) - len(disagree), "disagree": disagree}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
