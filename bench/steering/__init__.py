"""How far a few human labels steer a run: held-out accuracy gain per arm, labels used, gain
per 100 labels, and the learned reward model's held-out pairwise accuracy, with beside it its
accuracy on the pairs the random share alone handed out (`RewardModel.accuracy_random`, "random"
and its pair count: the unbiased estimate; the rule's pairs straddle the model's decision).

The run has no automatic correctness reward (only `math_format`), so whatever the model
learns about correctness it learns from people. Scripted raters log in and rate **through the
same HTTP endpoints the annotation page posts to** (a real server process, `manage.py
runserver`, on the bench database; httpx with the login form, CSRF and session cookies): a
rater opens the annotation page (which hands out its queue under the run's selection rule),
reads each item's prompt and completion from the page, and posts a rating: by default 5 when
the `<answer>` is right, 1 when it is wrong (`bench.raters:correct`); a random rater posts 1..5
at random. `--rater MODULE:FUNCTION` rates by any function (prompt, completion) -> 1..5 instead,
from an importable module or a .py file anywhere: bench/raters.py ships the style preferences
`concise`, `working` (the working before the answer) and `in_words` (the number written in
words), which no reward term of the run knows. `--noise P` replaces a careful rating by a random
one with probability P; `--random-raters S` (with `--noisy-raters N`) is the share of `noisy`'s
raters answering at random. Beside the arithmetic accuracy, each arm reports the share of
completions (four sampled per held-out problem, seeded) the rater rates 4 or 5, before and
after, and the share of those samples whose `<answer>` is right whatever the style (the sampled
arithmetic accuracy: the expected accuracy below counts the warm-up's four forms only, word for
word, so an arm that learns a form of its own would read there as losing arithmetic). The targets are
read on the preferred share; the arithmetic against the `format` arm (no people) when it runs
beside (`--arms all,rm10,random10,noisy,format`). Arms, same steps and seeds:

- `all`: every rollout rated, `human` mode (the ceiling);
- `rm10`: 10% of rollouts rated, chosen by the selection rule (reward-model uncertainty in
  sibling pairs, `feedback.selection.pairs`, plus a 20% random share of pairs; `--pairs off`:
  single items), `learned` mode: the reward model (retrained as labels come in) scores the rest;
- `random10`: 10% rated, single items chosen uniformly at random, no reward model (`blend`, the
  wait window's fallback being the format reward);
- `noisy`: as `rm10` with two raters, one answering at random, reliability weights on (gold
  items marked by the owner through the Raters page, mixed in at 20%) and, from round 10,
  trust-aware hand-out (`feedback.trust`: a new rater rates 3 gold items before anything else,
  an untrusted one gets gold items only; `--trust off`: both served alike). The raters take
  turns at the page (who comes first alternates by step), each rating what the server hands
  them until the step's budget is spent: how the budget divides is the server's hand-out, not
  the bench's (round 9 split it blind, in whole pairs, 4 / 2 alternating).

What each arm sees of the preference: only the ratings people post. The run's reward terms are
`math_format` alone (one `<answer>` tag, whatever the style around it); the rater function lives
in the bench's `Rater` objects (a person at the page) and in the measurement off the clock, never
in the server, the selection rule, the reward model or the trainer. `all` sees a rating of every
rollout; `rm10` a rating of the 10% the selection rule hands out (ranked by the reward model's
uncertainty, which knows only earlier ratings) and the reward model's scores of the rest, the
reward model trained on those ratings over the run's own base model's hidden states; `random10`
ratings of a uniformly random 10% and the format reward elsewhere; `noisy` as `rm10`, with half
the raters answering at random and gold items the owner (who rates by the same function, a
person with the preference) marked on the Raters page; `format` no rating at all (the format
reward alone). What no arm sees: the rater function or a drawn preference's description, its
noise level, the held-out problems (the measurement's 200, never in the taskset) or another
arm's ratings; under `--rm-gate evidence` or `bound` alike the reward model sees only its own
arm's ratings. The demo model's warm-up shows each
style at a minority share (workers/models/demo.STYLES), drawn by a seed, not by any rater.

A generated family (`--raters generated:N`, issue 47): N preferences drawn by
bench.raters.preference_draw (seeds `--raters-start`..), each a person nobody here wrote:
likes or dislikes of a form the demo model writes, of a phrase, of a length band, their
combinations, combinations with the right answer (the mixed preferences), on a person's own
partial-credit scale, with a noise level the page applies (the preferred share is read on the
preference without its noise). Each preference runs every arm but `format` over the seeds;
`format` has no people, so it runs once per seed and every preference reads its samples (the
base's samples, too, are drawn once per seed). A drawn preference sees what a `--rater` does:
it lives in the bench's `Rater` objects and the measurement, nowhere in the run. The last lines
give, per target, the distribution over (preference, seed) pairs: median, 25th percentile, the
worst pair with its preference written out, and how many pairs meet it; pairs where `all` itself
gained no more than 0.02 have no ceiling to read rm10 against and are listed apart; the mixed
preferences' pairs are listed with their reward model's held-out accuracy. Targets (issue 47,
read on at least 8 preferences x 2 seeds x 30 steps; a figure on the three named raters alone
does not count): rm10/all >= 0.8 on the median and >= 0.6 on the 25th percentile with <= 0.1x
the labels; rm10 >= 2x random10 on the median; sampled arithmetic within 0.02 of `format` on the
median.

What a `learned` arm's reward model did, per step (printed under each step's line, and summed
in the table after the results): the gate (the newest version, its held-out accuracy and pairs,
the lower bound the gate reads, open or shut, and the weight its scores carry under
`--rm-gate evidence`), how many of the step's groups had a member rewarded by the reward model
and in how many those rewards differed by at least 0.125 (half a rating step: its signal
reaches the advantages), the within-group sd of its part of the reward against the format
reward's part and the batch's sd (the advantages' divisor), the calibration slope, the labels by
hand-out source (rule, random share, gold) and the sibling pairs rated apart (what teaches the
reward model) or alike. `--rm-gate evidence` (feedback.rm_gate) folds the reward model in from
when its bound is above chance, its calibrated scores drawn toward mid-scale by
(bound - 0.5) / (min_rm_accuracy - 0.5); `bound` folds it in all at once when the bound reaches
--min-rm-accuracy; `calibrated` (the default: the run config's own, kernel.config) folds it in
from when its bound is above chance at full weight (its out-of-fold calibration the only
discount). The arms see the same either way; only when and how much of the reward model's score
enters the rewards differs.

The loop runs in this process step by step, as bench/learning does (explore, the newest reward
model scores the new rollouts as the reward beat would, people rate, reward model trains and
scores, wait windows end, train); the wait window is ended by the
bench after the raters' turn, not by wall time. Accuracy is the expected accuracy (probability of
sampling the right `<answer>`, workers.models.demo.expected_accuracy) on the demo model's 200
held-out problems, off the clock; greedy accuracy is printed beside it (over a few dozen steps it
is mostly trajectory luck).

    python -m bench.steering [--steps 30] [--seeds 0,1] [--arms all,rm10,random10,noisy]
                             [--rm-base policy|judge|PATH] [--rm-kind head|likelihood|mlp|lora|classifier]
                             [--min-rm-accuracy 0.75] [--rm-confidence 0.95] [--min-rm-heldout-pairs 0]
                             [--crossval-folds 4] [--pairs on|off] [--w-auto 0.2] [--trust on|off]
                             [--rater bench.raters:correct|PATH.py:FUNCTION|generated:SEED | --raters generated:N
                              [--raters-start 0]] [--rm-gate calibrated|evidence|bound] [--noise 0] [--random-raters 0.5]
                             [--noisy-raters 2] [--max-tokens 32] [--verifier on|off] [--demo-styled SHARE] [--beta 0]
                             [--heldout 200] [--selection active|arrival]
                             [--out PATH [--resume | --report]]

`--out PATH` appends each (preference, seed, arm) result to a JSON-lines file the moment that
arm is done (its figures, its final samples, its step probes, the base's figures, the settings),
so a run stopped at any time keeps what finished; `--resume` reads the file back and runs only
what it does not hold (rows of other settings are refused), `--report` runs nothing and prints
the tables and the distribution per target over what the file holds. The order puts complete
pairs first: per seed, `format` (no people) once, then each preference's arms in turn.

`--selection arrival` hands rm10 and noisy their items in arrival order (the default before
2026-11-28) in place of the run config's own selection rule. The live loop's twin of this bench
is bench/live_steering.

Under `--rm-gate bound` a reward model is folded into rewards only once the lower bound of its
held-out accuracy at --rm-confidence reaches --min-rm-accuracy (a perfect model on 9 pairs at
0.75, 95%; a 0.9 one on ~30; one at 0.69 never); under the default `calibrated` from when that
bound is above chance. bench/reward_model measures how far the reward model gets on these labels with each base.

Targets (on the rater's preferred share): rm10 gain >= 0.8 x all's with <= 0.1 x its labels;
rm10 >= 2 x random10; noisy >= 0.8 x rm10; reward-model held-out (by prompt) accuracy >= 0.8;
sampled arithmetic accuracy no more than 0.02 below the `format` arm's. The last lines print
the verdicts (with the differences) and the ratios.

What each round measured, with its settings and load, is in bench/README.md (*Steering: the
rounds*, and the sections after it), not here.

The package: `config` (the arms' run configs and their overrides), `people` (the server, the
scripted raters at its pages, the preference they rate by), `measurement` (held-out accuracy,
rated samples, the per-step probe of the reward model), `arms` (one arm on one seed), `journal`
(the results file and the order the arms run in), `report` (the tables and the verdicts) and
`cli` (the flags and `main`).
"""

from __future__ import annotations

# bench/live_steering imports these from here (this package's face before it was split; issue 65).
from bench.steering.config import Override, arm_config
from bench.steering.measurement import Sampled, held_out_samples, samples_rated
from bench.steering.people import ITEM, PASSWORD, Rater

__all__ = ["ITEM", "PASSWORD", "Override", "Rater", "Sampled", "arm_config", "held_out_samples", "samples_rated"]
