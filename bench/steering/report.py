"""The lines after the runs (or over a results file: `--report`): a row per result, what each
`learned` arm's reward model did over its steps, each preference's targets and ratios, and for a
generated family the distribution over (preference, seed) pairs per target."""

from __future__ import annotations

import argparse
import os
from typing import Any

from bench.common import median, percentile
from bench.steering.measurement import Sampled, StepProbe, mean
from bench.steering.people import RaterSpec


def _table(results: list[dict[str, Any]], *, family: bool) -> None:
    print()
    head = f"{'rater':<14}" if family else ""
    print(f"{head}{'arm':<9}{'seed':>5}{'exp acc':>8}{'gain':>8}{'greedy':>8}{'gain':>7}{'labels':>8}"
          f"{'gain/100 labels':>17}{'rm acc':>8}{'pairs':>6}{'random':>8}{'pairs':>6}"
          f"{'held-out':>9}{'rm from':>8}{'skipped':>8}{'share':>7}{'gain':>7}{'arith':>7}{'gain':>7}{'untag':>7}"
          f"{'seconds':>9}{'load':>6}")
    for r in results:
        per100 = 100 * r["gain"] / r["labels"] if r["labels"] else float("nan")
        rm = f"{r['rm_acc']:.2f}" if r["rm_acc"] is not None else "-"
        rm_random = f"{r['rm_acc_random']:.2f}" if r["rm_acc_random"] is not None else "-"
        lead = f"{r['rater']:<14}" if family else ""
        print(f"{lead}{r['arm']:<9}{r['seed']:>5}{r['acc']:>8.4f}{r['gain']:>+8.4f}{r['greedy']:>8.3f}"
              f"{r['greedy_gain']:>+7.3f}{r['labels']:>8}{per100:>+17.4f}"
              f"{rm:>8}{r['rm_pairs']:>6}{rm_random:>8}{r['rm_pairs_random']:>6}{r['rm_heldout']:>9}"
              f"{r['usable_from'] or '-':>8}{r['skipped']:>8}"
              f"{r['share']:>7.3f}{r['share_gain']:>+7.3f}{r['arithmetic']:>7.3f}{r['arithmetic_gain']:>+7.3f}"
              f"{r['untagged']:>7.3f}{r['seconds']:>9.0f}{r['load']:>6.1f}")


def _probe_table(results: list[dict[str, Any]]) -> None:
    """Per `learned` arm run, what its reward model did over the steps (StepProbe, summed):
    the gate (first step open, steps open, steps it shut again after opening), the groups whose
    advantages carried the reward model's signal over the steps it was open, its within-group
    spread against the format reward's and the batch's, and where the labels went."""
    runs = [r for r in results if r.get("probes")]
    if not runs:
        return
    print()
    print(f"{'rater':<14}{'arm':<7}{'seed':>5}{'open from':>10}{'open':>6}{'reshut':>7}{'lb at open':>11}"
          f"{'weight':>7}{'signal/groups':>14}{'sd rm':>7}{'sd fmt':>7}{'sd batch':>9}{'slope':>7}{'apart':>6}{'alike':>6}"
          f"{'apart by open':>14}  labels by hand-out source")
    for r in runs:
        probes: list[StepProbe] = r["probes"]
        opened = [i for i, p in enumerate(probes) if p.open]
        first = opened[0] if opened else None
        reshut = sum(1 for i, p in enumerate(probes) if first is not None and i > first and not p.open)
        after = probes[first:] if first is not None else []
        signal = sum(p.signal_groups for p in after if p.open)
        groups = sum(p.groups for p in after if p.open)
        sd_rm = [p.rm_sd for p in after if p.rm_sd is not None]
        slopes = [p.slope for p in after if p.slope is not None]
        weights = [p.weight for p in after if p.open]
        sources: dict[str, int] = {}
        for p in probes:
            for k, v in p.labels.items():
                sources[k] = sources.get(k, 0) + v
        apart_by_open = sum(p.pairs_apart for p in probes[:first + 1]) if first is not None else None
        bound = probes[first].bound if first is not None else None
        print(f"{r['rater'][:13]:<14}{r['arm']:<7}{r['seed']:>5}{'-' if first is None else first + 1:>10}"
              f"{len(opened):>6}{reshut:>7}{'-' if bound is None else f'{bound:.2f}':>11}"
              f"{(f'{median(weights):.2f}' if weights else '-'):>7}{(f'{signal}/{groups}' if groups else '-'):>14}"
              f"{(f'{median(sd_rm):.3f}' if sd_rm else '-'):>7}{median([p.format_sd for p in probes]):>7.3f}"
              f"{median([p.batch_sd for p in probes]):>9.3f}{(f'{median(slopes):.2f}' if slopes else '-'):>7}"
              f"{sum(p.pairs_apart for p in probes):>6}{sum(p.pairs_alike for p in probes):>6}"
              f"{'-' if apart_by_open is None else apart_by_open:>14}  "
              + (" ".join(f"{k} {v}" for k, v in sorted(sources.items())) or "none"))


def _rater_summary(rater: RaterSpec, results: list[dict[str, Any]], *, arms: list[str], seeds: list[int],
                   base: list[Sampled], args: argparse.Namespace) -> None:
    by_arm = {a: [r for r in results if r["arm"] == a] for a in arms}
    gain = {a: mean([r["gain"] for r in rs]) for a, rs in by_arm.items()}
    labels = {a: mean([r["labels"] for r in rs]) for a, rs in by_arm.items()}
    share_gain = {a: mean([r["share_gain"] for r in rs]) for a, rs in by_arm.items()}
    arithmetic = {a: mean([r["arithmetic"] for r in rs]) for a, rs in by_arm.items()}
    print(f"rater {rater.name} (noise {rater.noise:g}): preferred share gain per arm (base "
          f"{mean([b.share for b in base]):.3f}): " + ", ".join(f"{a} {g:+.3f}" for a, g in share_gain.items())
          + "; sampled arithmetic accuracy beside (base " + f"{mean([b.arithmetic for b in base]):.3f}): "
          + ", ".join(f"{a} {g:.3f}" for a, g in arithmetic.items())
          + "; expected (plain-form) accuracy gain: " + ", ".join(f"{a} {g:+.4f}" for a, g in gain.items()))
    rm_accs = [r["rm_acc"] for r in results if r["arm"] == "rm10" and r["rm_acc"] is not None]
    rm_randoms = [r["rm_acc_random"] for r in results if r["arm"] == "rm10" and r["rm_acc_random"] is not None]

    def ratio(x: str, y: str, what: dict[str, float]) -> str:
        if x not in what or y not in what or what[y] == 0:
            return "n/a"
        if what[y] <= 0:
            # A ratio of losses says nothing about steering: report it as not measured.
            return f"n/a ({y} gained {what[y]:+.3f})"
        return f"{what[x] / what[y]:.2f}"

    def verdict(x: str, y: str, k: float) -> str:
        """The target as the issue words it, x's preference gain at least k times y's, read as
        the inequality: where y lost, a ratio of a gain to a loss says nothing, while x gaining
        meets it; the difference is printed beside (a gain near zero makes the ratio noise)."""
        if x not in share_gain or y not in share_gain:
            return "n/a"
        met = share_gain[x] > 0 and share_gain[x] >= k * share_gain[y]
        return (f"{'met' if met else 'NOT met'} ({x} {share_gain[x]:+.3f} against {k:g} x {y} {share_gain[y]:+.3f}; "
                f"difference {share_gain[x] - share_gain[y]:+.3f})")

    # An arm without people (`format`: the format reward alone) is the arithmetic's yardstick.
    drops = ", ".join(f"{a} {arithmetic[a] - arithmetic['format']:+.3f}" for a in arithmetic if a != "format") \
        if "format" in arithmetic else "n/a (run the `format` arm beside)"
    print(f"targets (on the preferred share): rm10 >= 0.8 x all {verdict('rm10', 'all', 0.8)}; rm10 >= 2 x random10 "
          f"{verdict('rm10', 'random10', 2)}; noisy >= 0.8 x rm10 {verdict('noisy', 'rm10', 0.8)}; arithmetic "
          f"against `format` (>= -0.02): {drops}")
    if "format" in share_gain:
        # random10 trains on the format reward wherever no one rated (90% of groups), and the
        # format reward alone moves some preferences (concise: a single tag favours a bare
        # answer): what each arm gained beyond the arm without people is what people taught.
        beyond = {a: g - share_gain["format"] for a, g in share_gain.items() if a != "format"}
        print("beyond `format` (what people taught): " + ", ".join(f"{a} {g:+.3f}" for a, g in beyond.items())
              + f"; rm10/random10 on it {ratio('rm10', 'random10', beyond)}")
    print(f"rm10/all share gain {ratio('rm10', 'all', share_gain)} (target >= 0.8) with labels "
          f"{ratio('rm10', 'all', labels)} (<= 0.1); rm10/random10 {ratio('rm10', 'random10', share_gain)} (>= 2); "
          f"noisy/rm10 {ratio('noisy', 'rm10', share_gain)} (>= 0.8); rm held-out (by prompt) accuracy "
          f"{mean(rm_accs):.2f} (>= 0.8) on "
          f"{sum(r['rm_heldout'] for r in results if r['arm'] == 'rm10')} held-out pairs, on the random share only "
          f"{mean(rm_randoms):.2f} on {sum(r['rm_pairs_random'] for r in results if r['arm'] == 'rm10')}; "
          f"seeds {args.seeds}, {args.steps} steps, load {os.getloadavg()[0]:.1f}")


# `all` gaining less than this on a (preference, seed) pair has no ceiling to read rm10 against:
# the pair is counted apart (with every label the run did not move the preference beyond noise,
# ~0.02 on 800 samples).
CEILING = 0.02


def family_pairs(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (preference, seed): rm10's share gain against all's (the ratio, where all gained
    beyond CEILING), against random10's (met as rm10 > 0 and >= 2x random10's), rm10's sampled
    arithmetic against `format`'s on the same seed, rm10's labels against all's, and its reward
    model's held-out accuracy. Every figure a plain function of the rows: tests recompute it."""
    index = {(r["rater"], r["seed"], r["arm"]): r for r in results}
    out = []
    for rater, seed in dict.fromkeys((r["rater"], r["seed"]) for r in results):
        arm = {a: index.get((rater, seed, a)) for a in ("all", "rm10", "random10", "format")}
        rm10, every, rand, fmt = arm["rm10"], arm["all"], arm["random10"], arm["format"]
        if rm10 is None:
            continue
        pair: dict[str, Any] = {"rater": rater, "seed": seed, "rm10": rm10["share_gain"], "rm_acc": rm10["rm_acc"],
                                "load": max(r["load"] for r in (rm10, every, rand, fmt) if r is not None)}
        if every is not None:
            pair["all"] = every["share_gain"]
            pair["ratio"] = rm10["share_gain"] / every["share_gain"] if every["share_gain"] > CEILING else None
            pair["labels"] = rm10["labels"] / every["labels"] if every["labels"] else None
        if rand is not None:
            pair["random10"] = rand["share_gain"]
            pair["vs_random"] = rm10["share_gain"] > 0 and rm10["share_gain"] >= 2 * rand["share_gain"]
        if fmt is not None:
            pair["arithmetic"] = rm10["arithmetic"] - fmt["arithmetic"]
        out.append(pair)
    return out


def family_summary(raters: list[RaterSpec], results: list[dict[str, Any]], *, seeds: list[int],
                   args: argparse.Namespace) -> None:
    """The distribution over (preference, seed) pairs per target: median, 25th percentile,
    worst case (its preference written out) and the share of pairs meeting the target."""
    described = {r.name: r.description for r in raters}
    mixed = {r.name for r in raters if r.mixed}
    pairs = family_pairs(results)
    loads = [r["load"] for r in results]  # each run's load average at its end
    load = f"load {min(loads):.1f}-{max(loads):.1f}" if loads else "load -"
    print()
    print(f"family: {len(raters)} drawn preferences x {len(seeds)} seeds = {len(pairs)} pairs, {args.steps} steps "
          f"({len(mixed)} preferences mix correctness in), {load}")

    def spread(name: str, values: list[tuple[float, dict[str, Any]]], *, target: str, met: int, of: int) -> None:
        if not values:
            print(f"  {name}: n/a")
            return
        figures = [v for v, _ in values]
        worst_value, worst = min(values, key=lambda x: x[0])
        print(f"  {name}: median {median(figures):+.3f}, 25th percentile {percentile(figures, 0.25):+.3f}, worst "
              f"{worst_value:+.3f} ({worst['rater']} seed {worst['seed']}: {described[worst['rater']]}); "
              f"met {met}/{of} pairs ({target})")

    ratios = [(p["ratio"], p) for p in pairs if p.get("ratio") is not None]
    no_ceiling = [p for p in pairs if "all" in p and p.get("ratio") is None]
    spread("rm10/all share gain", ratios, target=">= 0.8; the family's target: median >= 0.8, 25th percentile >= 0.6",
           met=sum(1 for v, _ in ratios if v >= 0.8), of=len(ratios))
    if no_ceiling:
        print(f"  ... and {len(no_ceiling)} pairs where `all` gained <= {CEILING} (no ceiling to read against): "
              + ", ".join(f"{p['rater']} s{p['seed']} all {p['all']:+.3f} rm10 {p['rm10']:+.3f}" for p in no_ceiling))
    labels = [p["labels"] for p in pairs if p.get("labels") is not None]
    if labels:
        print(f"  rm10/all labels: at most {max(labels):.3f} (target <= 0.1)")
    vs = [p for p in pairs if "vs_random" in p]
    spread("rm10 - random10 share gain", [(p["rm10"] - p["random10"], p) for p in vs],
           target="rm10 > 0 and >= 2 x random10; the family's target: the median", met=sum(p["vs_random"] for p in vs),
           of=len(vs))
    if vs:
        gained = [(p["rm10"] / p["random10"], p) for p in vs if p["random10"] > CEILING]
        print(f"  rm10/random10 where random10 gained > {CEILING}: "
              + (f"median {median([v for v, _ in gained]):.2f} on {len(gained)} pairs" if gained else "no such pair")
              + f"; median rm10 {median([p['rm10'] for p in vs]):+.3f} against 2 x random10 "
              f"{2 * median([p['random10'] for p in vs]):+.3f}")
    arith = [(p["arithmetic"], p) for p in pairs if "arithmetic" in p]
    spread("rm10 - format sampled arithmetic", arith, target=">= -0.02; the family's target: the median",
           met=sum(1 for v, _ in arith if v >= -0.02), of=len(arith))
    mixed_pairs = [p for p in pairs if p["rater"] in mixed]
    if mixed_pairs:
        shown = []
        for p in mixed_pairs:
            ratio = "-" if p.get("ratio") is None else f"{p['ratio']:.2f}"
            acc = "-" if p["rm_acc"] is None else f"{p['rm_acc']:.2f}"
            every = f" all {p['all']:+.3f} ratio {ratio}" if "all" in p else ""
            shown.append(f"{p['rater']} s{p['seed']} rm10 {p['rm10']:+.3f}{every} rm held-out accuracy {acc}")
        print("  mixed (style + correctness): " + "; ".join(shown))
    mid = median([v for v, _ in ratios]) if ratios else float("nan")
    p25 = percentile([v for v, _ in ratios], 0.25) if ratios else float("nan")
    print(f"family verdict: rm10/all median {mid:.2f} (>= 0.8), 25th percentile {p25:.2f} (>= 0.6) on "
          f"{len(ratios)} pairs; seeds {args.seeds}, {args.steps} steps, {load}")


def report(results: list[dict[str, Any]], *, raters: list[RaterSpec], arms: list[str], seeds: list[int],
           base: dict[tuple[str, int], Sampled], args: argparse.Namespace) -> None:
    """The tables and summaries after the runs (or over a results file: --report)."""
    _table(results, family=len(raters) > 1)
    _probe_table(results)
    for r in raters:
        mine = [x for x in results if x["rater"] == r.name]
        if mine:  # a stopped run's file: the arms that finished
            _rater_summary(r, mine, arms=[a for a in arms if any(x["arm"] == a for x in mine)], seeds=seeds,
                           base=[base[r.name, s] for s in seeds if (r.name, s) in base], args=args)
    if len(raters) > 1:
        family_summary(raters, results, seeds=seeds, args=args)
