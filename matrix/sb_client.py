"""SpeechBrain's own client on an artifact, as the README shows it, against a submission written from it.

    python -m matrix.sb_client ARTIFACT DATA SUBMISSION SAVEDIR

Loads `EncoderClassifier.from_hparams(source=ARTIFACT, savedir=SAVEDIR)` (offline: it reads ARTIFACT only),
runs `classify_file` on every file of DATA/test.csv and compares each label with SUBMISSION's row for that id.
Prints one JSON line {"files", "agree", "disagree": [...]} and exits 1 if any label differs. Run by
matrix/run.py with the leg's interpreter, under the offline guard.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    artifact, data, submission, savedir = (Path(a) for a in argv)
    from speechbrain.inference.speaker import EncoderClassifier
    from speechbrain.utils.fetching import LocalStrategy

    classifier = EncoderClassifier.from_hparams(
        source=str(artifact), savedir=str(savedir), local_strategy=LocalStrategy.COPY
    )
    with open(submission, newline="") as handle:
        submitted = {row["id"]: row["label"] for row in csv.DictReader(handle)}
    with open(data / "test.csv", newline="") as handle:
        tests = list(csv.DictReader(handle))
    disagree = []
    for row in tests:
        label = classifier.classify_file(str(data / row["path"]))[3][0]
        if label != submitted.get(row["id"]):
            disagree.append({"id": row["id"], "speechbrain": label, "submission": submitted.get(row["id"])})
    print(json.dumps({"files": len(tests), "agree": len(tests) - len(disagree), "disagree": disagree}))
    return 1 if disagree or not tests else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
