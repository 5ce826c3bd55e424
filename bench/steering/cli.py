"""The bench's command line: its flags, their checks, and the runs they ask for (`main`)."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.common import DEMO_DIR, ROOT, own_conductor, processes_stop, setup_django
from bench.raters import correct, rater_load
from bench.steering.arms import run_arm
from bench.steering.config import ARMS, RM_GATE_DEFAULT, overrides_print
from bench.steering.journal import SETTINGS, Journal, report_from, seed_run
from bench.steering.measurement import HELDOUT, Sampled, held_out_accuracy, held_out_samples, mean, samples_rated
from bench.steering.people import PASSWORD, RaterSpec, server_start
from bench.steering.report import report
from kernel.reward_kinds import DEFAULT_REWARD_KIND, reward_kind_names


def _raters_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[RaterSpec]:
    """--rater's one function, or --raters generated:N's drawn preferences."""
    from bench.raters import GeneratedRater, preference_family

    if args.raters is None:
        try:
            rating = rater_load(args.rater)
        except ValueError as exc:
            parser.error(str(exc))
        drawn = rating if isinstance(rating, GeneratedRater) else None
        return [RaterSpec(name=args.rater, rating=rating, noise=_noise(args.noise, drawn),
                          description=drawn.describe() if drawn else args.rater, mixed=bool(drawn and drawn.mixed))]
    count = args.raters.removeprefix("generated:")
    if not args.raters.startswith("generated:") or not count.isdigit() or int(count) < 1:
        parser.error(f"--raters {args.raters!r}: expected generated:N, N a whole number of preferences to draw")
    if args.rater != parser.get_default("rater"):
        parser.error("--raters and --rater: one or the other")
    return [RaterSpec(name=f"generated:{p.seed}", rating=p, noise=_noise(args.noise, p), description=p.describe(),
                      mixed=p.mixed) for p in preference_family(int(count), start=args.raters_start)]


def _noise(page: float, drawn: Any) -> float:
    """A drawn preference's noise level and --noise's, each replacing a rating independently."""
    own = drawn.noise if drawn is not None else 0.0
    return 1.0 - (1.0 - page) * (1.0 - own)


def _journal_of(parser: argparse.ArgumentParser, args: argparse.Namespace, raters: list[RaterSpec]) -> Journal:
    """--out / --resume / --report: the results file, read back where asked."""
    if (args.resume or args.report) and args.out is None:
        parser.error("--resume and --report read the --out file: name it")
    settings = {k: getattr(args, k) for k in SETTINGS}
    if args.heldout != HELDOUT:
        # Named only where it is not the default: the files written before the flag stay readable.
        settings["heldout"] = args.heldout
    if args.selection != "active":
        settings["selection"] = args.selection
    journal = Journal(args.out, settings)
    if args.out is not None and not (args.resume or args.report) and args.out.exists() and args.out.stat().st_size:
        parser.error(f"--out {args.out} holds results already: --resume to go on with them, or name another file")
    try:
        journal.read(raters)
    except ValueError as exc:
        parser.error(str(exc))
    return journal


def _parser() -> argparse.ArgumentParser:
    """The bench's flags (`--help` lists them)."""
    # The usage line names the bench as it did while it was one module, bench/steering.py.
    parser = argparse.ArgumentParser(prog="steering.py")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--arms", default=",".join(ARMS), help="of " + ",".join(ARMS) + ",auto,format")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--share", type=float, default=0.1, help="share of rollouts rated in the 10%% arms")
    parser.add_argument("--rm-base", default="policy",
                        help="the reward model's base: policy (the demo model), judge (bench/reward_model's), or a path")
    parser.add_argument("--min-rm-accuracy", type=float, default=0.75)
    parser.add_argument("--rm-kind", default=DEFAULT_REWARD_KIND, choices=reward_kind_names())
    parser.add_argument("--rater", default="bench.raters:correct",
                        help="MODULE:FUNCTION, a function (prompt, completion) -> 1..5 that the careful raters rate "
                             "by; MODULE an importable module or a .py file anywhere (bench/raters.py: correct, "
                             "concise, working, in_words)")
    parser.add_argument("--raters", default=None, metavar="generated:N",
                        help="in place of --rater: N preferences drawn from bench.raters' generated family "
                             "(preference_draw, seeds --raters-start..+N-1), each run over --seeds; prints the "
                             "distribution per target (median, 25th percentile, worst with its preference, share met)")
    parser.add_argument("--raters-start", type=int, default=0, help="the first drawn preference's seed (--raters)")
    parser.add_argument("--noise", type=float, default=0.0,
                        help="probability that a careful rater's rating is replaced by a random one")
    parser.add_argument("--random-raters", type=float, default=0.5,
                        help="noisy: share of its raters who answer at random (at least one stays careful)")
    parser.add_argument("--noisy-raters", type=int, default=2, help="noisy: how many raters")
    parser.add_argument("--heldout", type=int, default=HELDOUT,
                        help="measure on the first this many of the demo model's held-out problems (each sampled 4 "
                             "times); fewer only to check that the bench runs (its smoke tests): 200 is the measurement")
    parser.add_argument("--max-tokens", type=int, default=32,
                        help="sampling.max_tokens of the runs (the demo model's styled answers take up to ~25)")
    parser.add_argument("--min-rm-heldout-pairs", type=int, default=0)
    parser.add_argument("--rm-confidence", type=float, default=0.95,
                        help="the reward model is used once its held-out accuracy's lower bound at this "
                             "confidence reaches --min-rm-accuracy (0.5: the point estimate)")
    parser.add_argument("--w-auto", type=float, default=0.2,
                        help="weight of the automatic (format) reward beside people's and the reward model's "
                             "in random10 / rm10 / noisy (the format reward alone loses accuracy: arm `format`)")
    parser.add_argument("--crossval-folds", type=int, default=4,
                        help="the reward model's held-out accuracy by k-fold cross-validation over prompts "
                             "(0: the held-out split; the head and likelihood kinds' default 4)")
    parser.add_argument("--pairs", default="on", choices=["on", "off"],
                        help="rm10 / noisy: the selection rule hands out sibling pairs (feedback.selection.pairs)")
    parser.add_argument("--trust", default="on", choices=["on", "off"],
                        help="noisy: trust-aware hand-out (feedback.trust: 3 gold items first, untrusted raters "
                             "get gold items only); off: round 9's hand-out, both raters served alike")
    parser.add_argument("--verifier", default="off", choices=["on", "off"],
                        help="on: the run's reward terms check the arithmetic too (math_accuracy beside "
                             "math_format, weighted by --w-auto beside people): people teach a style, the "
                             "verifier keeps what it knows; `format` is then that verifier without people")
    parser.add_argument("--beta", type=float, default=0.0,
                        help="trainer.params.beta: a KL penalty toward the base model in every arm (0: none, the "
                             "run's default)")
    parser.add_argument("--rm-gate", default=RM_GATE_DEFAULT, choices=["bound", "evidence", "calibrated"],
                        help=f"feedback.rm_gate (default: the run config's, {RM_GATE_DEFAULT}): bound, the "
                             "reward model in all at once when its held-out accuracy's lower bound reaches "
                             "--min-rm-accuracy; evidence, from when the bound is above chance, "
                             "weighted by how far it has come (apps.feedback.reward_model.versions.reward_model_weight); "
                             "calibrated, from when the bound is above chance, at its calibration's scale")
    parser.add_argument("--scale-rewards", default="batch", choices=["group", "batch", "none"])
    parser.add_argument("--selection", default="active", choices=["active", "arrival"],
                        help="rm10 / noisy's hand-out: active, the run config's default (the reward model's least "
                             "sure sibling pairs, a fifth at random); arrival, the queue in arrival order (the "
                             "default before 2026-11-28)")
    parser.add_argument("--demo-styled", type=float, default=None,
                        help="build the demo model with this share of styled warm-up answers, split evenly "
                             "among its styles (DemoSettings.styled, 0.75 by default: every style a quarter, "
                             "the bare answer too; 0.45: RECIPE 6's share), in a directory of its own beside "
                             "BENCH_DEMO_DIR")
    parser.add_argument("--out", type=Path, default=None, metavar="PATH",
                        help="append each (preference, seed, arm) result to this JSON-lines file as soon as it is "
                             "done (a run stopped at any time keeps what finished)")
    parser.add_argument("--resume", action="store_true",
                        help="with --out: read the file first and skip what it holds (same settings only)")
    parser.add_argument("--report", action="store_true",
                        help="with --out: run nothing, print the tables and the distribution per target over what "
                             "the file holds for these preferences, seeds and arms")
    return parser


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    raters = _raters_of(parser, args)
    journal = _journal_of(parser, args, raters)
    if args.verifier == "on" and any(getattr(r.rating, "__wrapped__", r.rating) is correct for r in raters):
        parser.error("--verifier on with the correctness rater gives the run the rater's own answer key: "
                     "nothing would be learned from people (use a style rater)")
    if not 0.0 <= args.noise <= 1.0 or not 0.0 <= args.random_raters <= 1.0:
        parser.error("--noise and --random-raters are shares between 0 and 1")
    if args.beta < 0:
        parser.error("--beta is a KL weight, 0 or more")
    if args.demo_styled is not None and not 0.0 <= args.demo_styled < 1.0:
        parser.error("--demo-styled is a share from 0 to below 1 (some bare answers stay)")
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = args.arms.split(",")
    if args.report:
        held, held_base = report_from(journal, raters=raters, arms=arms, seeds=seeds)
        print(f"{len(held)} results from {args.out}")
        report(held, raters=raters, arms=arms, seeds=seeds, base=held_base, args=args)
        return
    results, base = _runs(args, raters=raters, journal=journal, seeds=seeds, arms=arms)
    report(results, raters=raters, arms=arms, seeds=seeds, base=base, args=args)


def _runs(args: argparse.Namespace, *, raters: list[RaterSpec], journal: Journal, seeds: list[int],
          arms: list[str]) -> tuple[list[dict[str, Any]], dict[tuple[str, int], Sampled]]:
    """Every arm of every preference on every seed (what the journal holds skipped), against
    the bench's server on the bench database: the results and the base's figures."""
    tmp = Path(tempfile.mkdtemp(prefix="rft-bench-steering-"))
    os.environ["RFT_STORAGE_DIR"] = str(tmp / "storage")
    os.environ["REDIS_URL"] = ""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("RFT_FAST_PASSWORD_HASHER", "1")
    setup_django()
    import logging

    import torch
    from django.contrib.auth.models import User

    from workers.models.demo import DemoSettings, demo_model_build

    logging.disable(logging.INFO)
    torch.set_num_threads(1)
    demo_settings, demo_dir = DemoSettings(), DEMO_DIR
    if args.demo_styled is not None and args.demo_styled != demo_settings.styled:
        # A directory of its own: the default one is the suite's and the other benches'.
        demo_settings = DemoSettings(styled=args.demo_styled)
        demo_dir = DEMO_DIR.with_name(f"{DEMO_DIR.name}-styled-{args.demo_styled:g}")
    demo = demo_model_build(out=demo_dir, settings=demo_settings, progress=False, log=lambda _: None).out
    owner, _ = User.objects.get_or_create(username="bench-steering-owner")
    owner.set_password(PASSWORD)
    owner.save()
    rm_base: str | None = None
    if args.rm_base == "judge":
        from bench.reward_model import JUDGE_DIR, judge_settings

        rm_base = str(demo_model_build(out=JUDGE_DIR, settings=judge_settings(), progress=False, log=lambda _: None).out)
    elif args.rm_base != "policy":
        rm_base = args.rm_base
    # What every arm's run sets: the product's defaults but for these (printed first).
    settings: dict[str, Any] = dict(
        steps=args.steps, tasks=args.tasks, repeat=args.repeat, lr=args.lr, rm_base=rm_base,
        min_rm_accuracy=args.min_rm_accuracy, scale_rewards=args.scale_rewards, rm_kind=args.rm_kind,
        min_rm_heldout_pairs=args.min_rm_heldout_pairs, rm_confidence=args.rm_confidence, w_auto=args.w_auto,
        crossval_folds=args.crossval_folds, pairs=args.pairs == "on", trust=args.trust == "on",
        max_tokens=args.max_tokens, verifier=args.verifier == "on", beta=args.beta, rm_gate=args.rm_gate,
        selection=args.selection)
    overrides_print(arms, model=str(demo), seed=seeds[0], **settings)
    base_acc = held_out_accuracy(str(demo), demo, args.heldout)
    # The base's samples, drawn once per seed and read by every rater.
    base_samples = {seed: held_out_samples(str(demo), demo, max_tokens=args.max_tokens, seed=seed, heldout=args.heldout)
                    for seed in seeds}
    base = {(r.name, seed): samples_rated(base_samples[seed], r.rating) for r in raters for seed in seeds}
    for r in raters:
        if len(raters) > 1:
            print(f"preference {r.description}", flush=True)
        print(f"base expected accuracy {base_acc[0]:.4f}, greedy {base_acc[1]:.3f}, sampled arithmetic "
              f"{mean([base[r.name, s].arithmetic for s in seeds]):.3f}, rater {r.name}'s preferred "
              f"share {mean([base[r.name, s].share for s in seeds]):.3f}, untagged "
              f"{mean([base[r.name, s].untagged for s in seeds]):.3f} (demo model {demo}, styled warm-up share "
              f"{demo_settings.styled:g})  load {os.getloadavg()[0]:.1f}", flush=True)
    proc, url = server_start(tmp)
    results: list[dict[str, Any]] = []
    try:
        # The loop explores and trains itself (run_arm): nothing goes to a Celery queue.
        with own_conductor():
            for seed in seeds:
                common = dict(url=url, seed=seed, share=args.share, demo=demo, owner_user=owner, base_acc=base_acc,
                              noisy_raters=args.noisy_raters, random_share=args.random_raters, heldout=args.heldout,
                              **settings)
                results += seed_run(seed, raters=raters, arms=arms, base=base, journal=journal,
                                    run=lambda arm, rating, noise: run_arm(arm, rating=rating, noise=noise, **common))
    finally:
        processes_stop([proc])
        # Kept for a look after the run (the demo model may live elsewhere: BENCH_DEMO_DIR).
        (ROOT / ".cache").mkdir(exist_ok=True)
        shutil.copy(tmp / "server.log", ROOT / ".cache" / "bench-steering-server.log")
        shutil.rmtree(tmp, ignore_errors=True)
    return results, base
