"""`rft evaluation create|figures|export|close` and the blind evaluations' lines of `rft
figures`: the same services and figures as the API and the run page (apps/evaluation)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from django.core.management.base import CommandError

from apps.evaluation.models import Evaluation
from apps.evaluation.selectors import evaluation_figures, labels, run_evaluations, votes_export
from apps.evaluation.services import VersionRef, evaluation_close, evaluation_create
from apps.runs.models import Run
from kernel.pairwise_stats import Figures

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def versions_parse(text: str) -> list[VersionRef] | None:
    """"0,5" or "0,12:4" (version 4 of run 12) -> refs; "" -> None (the default pair)."""
    if not text.strip():
        return None
    refs = []
    for part in text.split(","):
        run, _, number = part.strip().rpartition(":")
        try:
            refs.append(VersionRef(number=int(number), run_id=int(run) if run else None))
        except ValueError:
            raise CommandError(f"--versions: {part.strip()!r} is not N or RUN:N") from None
    return refs


def _prompts_file(path: str | None) -> list[str] | None:
    if path is None:
        return None
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"{path}: cannot read it ({exc})") from None
    prompts = [line.strip() for line in lines if line.strip()]
    if not prompts:
        raise CommandError(f"{path}: no prompts in it")
    return prompts


def _evaluation(pk: int) -> Evaluation:
    evaluation = Evaluation.objects.select_related("run").filter(pk=pk).first()
    if evaluation is None:
        raise CommandError(f"no evaluation {pk}")
    return evaluation


def figures_lines(evaluation: Evaluation, fig: Figures) -> list[str]:
    """An evaluation's figures as text (`rft evaluation figures`, `rft figures`)."""
    out = [f"evaluation {evaluation.pk} ({evaluation.status}): {' vs '.join(labels(evaluation))}, "
           f"{fig.votes} votes, {fig.checks} on planted checks, seed {evaluation.seed}"]
    for w in fig.win_rates:
        out.append(f"  {w.version} vs {w.baseline}: win rate {w.rate:.3f} [{w.interval.low:.3f}, {w.interval.high:.3f}] "
                   f"over {w.votes} votes: {w.verdict}; ±0.1 needs {w.votes_for_margin} votes")
    for s in fig.scores:
        out.append(f"  Bradley–Terry {s.version}: {s.score:+.3f} [{s.interval.low:+.3f}, {s.interval.high:+.3f}]")
    if fig.both_bad_share is not None:
        out.append(f"  both bad: {fig.both_bad_share:.3f}")
    if fig.left_share is not None and fig.left_interval is not None:
        out.append(f"  left side won {fig.left_share:.3f} of {fig.decisive} decisive votes "
                   f"[{fig.left_interval.low:.3f}, {fig.left_interval.high:.3f}]")
    for a in fig.agreement:
        if a.share is not None:
            out.append(f"  {a.voter}: agrees with the majority on {a.agreed} of {a.compared}")
    for c in fig.check_flags:
        if c.flagged:
            out.append(f"  {c.voter}: FLAGGED, picked a side on {c.sided} of {c.checks} identical pairs")
    return out


def evaluation_figures_lines(*, run: Run) -> list[str]:
    return [line for e in run_evaluations(run=run)[:5] for line in figures_lines(e, evaluation_figures(e))]


def _text(opts: Mapping[str, object], name: str) -> str:
    value = opts.get(name)
    return value if isinstance(value, str) else ""


def _number(opts: Mapping[str, object], name: str) -> int | None:
    value = opts.get(name)
    return value if isinstance(value, int) else None


def evaluation_command(opts: Mapping[str, object], *, write: Callable[[str], None], actor: Callable[[], User]) -> None:
    """`rft evaluation …` (argparse's options, apps/cli/management/commands/rft.py)."""
    action = _text(opts, "evaluation_action")
    if action == "create":
        run = Run.objects.filter(pk=_number(opts, "run") or 0).first()
        if run is None:
            raise CommandError(f"no run {opts['run']}")
        voters = [v.strip() for v in _text(opts, "voters").split(",") if v.strip()] or None
        evaluation = evaluation_create(run=run, by=actor(), versions=versions_parse(_text(opts, "versions")),
                                       prompts=_prompts_file(_text(opts, "prompts_file") or None),
                                       prompt_count=_number(opts, "prompts") or 20,
                                       votes_per_pair=_number(opts, "votes_per_pair") or 1, voters=voters,
                                       seed=_number(opts, "seed"), placement=_text(opts, "placement") or "page")
        between = ", also between annotation items" if evaluation.placement == "between" else ""
        write(f"evaluation {evaluation.pk} ({evaluation.status}): {' vs '.join(labels(evaluation))}, "
              f"{evaluation.prompts.count()} prompts, seed {evaluation.seed}, vote page /vote/{evaluation.token}/"
              f"{between}")
    elif action == "figures":
        evaluation = _evaluation(_number(opts, "evaluation") or 0)
        for line in figures_lines(evaluation, evaluation_figures(evaluation)):
            write(line)
    elif action == "export":
        evaluation = _evaluation(_number(opts, "evaluation") or 0)
        out = _text(opts, "out")
        if out == "-":
            for record in votes_export(evaluation):
                write(json.dumps(record, ensure_ascii=False))
            return
        lines = (json.dumps(r, ensure_ascii=False) + "\n" for r in votes_export(evaluation))
        try:
            with open(out, "w", encoding="utf-8") as fh:
                fh.writelines(lines)
        except OSError as exc:
            raise CommandError(f"{out}: cannot write it ({exc.strerror or exc})") from None
        write(f"wrote the votes of evaluation {evaluation.pk} to {out}")
    else:
        evaluation = evaluation_close(evaluation=_evaluation(_number(opts, "evaluation") or 0), by=actor())
        write(f"evaluation {evaluation.pk} is closed")
