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

Earlier rounds (60 steps, 8 tasks x 8, lr 1e-4, likelihood reward model over the *judge* base,
`--rm-base judge`: bench/reward_model's stronger demo model, which brings its own knowledge of
right answers, so "correctness from people only" holds for the policy's signal, not for the
reward model's features; over the policy base it stays at 0.66-0.69, never usable):
- round 7 (base 0.1443, seeds 0/1): `all` +0.007 / +0.029; `rm10` -0.004 / -0.006 (gate 20
  held-out pairs, usable from ~step 50), +0.024 / +0.021 with the gate at 8; `random10` -0.078 /
  -0.070; `noisy` never got a usable reward model.
- round 8 (base 0.1627; Wilson gate, earned rater trust, no optimizer step on batches without
  signal, `--crossval-folds 4`), seeds 0-3: `all` +0.020 (0.011..0.025), `rm10` +0.008
  (-0.035..+0.043; reward model 0.94-0.97 on 94-148 pairs from 360 labels, usable from step 3-18)
  = 0.41x `all` with 0.094x its labels, `random10` -0.083 (the format reward alone: -0.06),
  `noisy` -0.096 / -0.128 (14 / 9 clean pairs by the end: usable from step 50 / never). Labels
  were single items (uncertainty, ranked on scores the new rollouts did not have yet, plus a
  random share), so a careful rater's three a step rarely put a right and a wrong answer of one
  prompt side by side.

Measured 2026-11-23, round 9 (60 steps, 8 tasks x 8, lr 1e-4, seeds 0 / 1, `--rm-base judge
--crossval-folds 4`, base expected accuracy 0.1443, load 3.3-5.5 on the shared 2-core box; ~4.5 s
a step for rm10 / noisy, 8.5 for all), labels in sibling pairs (`feedback.selection.pairs`) and
the new rollouts scored before the raters' turn:
- `all`: +0.024 / +0.014 (3840 labels).
- `rm10`: +0.029 / +0.031 (360 labels): mean +0.030 = 1.57x `all`'s +0.019 with 0.094x its
  labels (1.21x / 2.21x per seed); reward model 0.99 on 293 / 297 cross-validated pairs (round
  8: 112 / 148 from the same 360 labels), usable from step 3 / 9.
- `random10`: -0.050 / -0.043 (single items at random; 11 / 8 steps without signal).
- `noisy`: -0.007 / +0.010 (mean +0.002 = 0.06x `rm10`); reward model 0.98 on 63 / 85 clean
  pairs (round 8: 14 / 9), usable from step 15 / 18 (round 8: 50 / never).
Met: rm10 >= 0.8x all with <= 0.1x labels (on each seed), reward-model held-out accuracy >= 0.85
(judge base; the pairs the rule picks straddle the model's decision, so they are easier than
random pairs: the figure is optimistic). Not met: rm10 >= 2x random10 (random10 loses: no ratio;
rm10 is ahead by 0.07-0.08 on each seed), noisy >= 0.8x rm10 (its reward model is usable, but
from step 15-18, on a quarter of rm10's pairs: the careful rater's half of the budget). Two seeds;
the between-seed spread of `all` (0.010) is as large as the rm10 - all difference (0.011): rm10 >=
0.8x all holds on both, rm10 above all is not shown.
Ablation, same seeds, new rollouts still scored before the raters' turn, `--pairs off` (single
items as in round 8): `rm10` +0.035 / +0.016 (mean +0.026; reward model 1.00 on 119 / 0.90 on 80
pairs, usable from step 6 / 15); `noisy` -0.049 / -0.011 (6 / 16 clean pairs, usable never / from
step 15). Pairs give 2.5-3.7x the reward-model pairs from the same 360 labels (4-14x for noisy's
careful rater) and make noisy's reward model usable on both seeds; rm10's gain moves within the
spread. What would likely meet noisy >= 0.8x rm10: more of the budget to the rater who earned
trust (the split here is blind, 3 / 3), or gold items from step 1 so trust is earned sooner.

Measured 2026-11-23, round 10 (same settings: 60 steps, 8 tasks x 8, lr 1e-4, `--rm-base judge
--crossval-folds 4`, base expected accuracy 0.1443; load 4.1-7.0 on the shared 2-core box, two or
three benches at once on separate bench databases, 2.5-6.5 s a step): trust-aware hand-out
(`feedback.trust`: a new rater rates 3 gold items before anything else, an untrusted one gets
gold items only) and the raters' turns at the page in place of the blind split:
- `rm10` (one rater, unchanged by either): +0.046 / +0.012 / +0.048 / +0.045 (seeds 0-3; round 9
  seeds 0 / 1: +0.029 / +0.031); reward model 0.98-1.00 on 253-330 pairs, usable from step 3 / 15
  / 3 / 3. Seed 2 again: +0.057.
- `noisy`: +0.047 / +0.013 / +0.024 / +0.036 (seeds 0-3); reward model 0.98-1.00 on 246-277
  pairs (round 9: 63 / 85), usable from step 8 / 15 / 11 / 9 (round 9: 15 / 18). Seed 2 again:
  +0.045, usable from step 6 (the same seed moves by 0.02: trajectory luck, unseeded hand-out).
  Where the 360 labels went: the careful rater 348-353 (10 of them gold), the random one 7-12 (7-10 of them
  gold; he is untrusted after his 3 first gold items and then gets only the gold items left).
- noisy / rm10: 1.02 / 1.06 / 0.51 / 0.80 per seed (seed 2 again: 0.79); seeds 0 / 1 (the
  target's seeds): mean +0.030 vs +0.029 = 1.03x (round 9: 0.06x); seeds 0-3, first runs: +0.030
  vs +0.038 = 0.795x; all five runs of each: +0.033 vs +0.042 = 0.79x; seed 2's two runs averaged first:
  0.84x.
- ablation `--trust off` (the new turns at the page, both raters served alike), seeds 0 / 1:
  `noisy` +0.001 / +0.002, careful 180 / random 180 labels, reward model 0.97 / 0.99 on 118 / 97
  pairs: the turns alone change nothing; the gain comes from the hand-out.
Met: noisy >= 0.8x rm10 on seeds 0 / 1 (1.03x). Over four seeds it sits at the target, 0.79-0.84x
by how the runs are pooled: not shown to hold beyond the spread. What is left: noisy's reward
model becomes usable a few steps later than rm10's (8-11 vs 3 on seeds 0 / 2 / 3), as step 1's budget goes to gold (the random rater's 3
first, then 3 more of the gold items he is untrusted on) and the careful rater's first 3 labels
are gold too, then 20% of his hand-outs (`gold_rate`) until the 12 gold items are used up. Counting
the first gold items toward `gold_rate`, or pacing an untrusted rater's gold re-checks, would move
a few labels back to the first steps; not done this round. The between-seed spread of rm10 itself
(+0.012..+0.057) is larger than the noisy - rm10 difference on any seed.
Re-measured on the merged code (the hand-out above plus out-of-fold calibration of the
cross-validated reward model: round 10's main), same settings, one bench per seed, two at a
time, load 0.5-6.9, ~1.4-2.3 s a step for rm10 / noisy, 4.1 for all:
- `all`: +0.024 / +0.014 (seeds 0 / 1; 3840 labels).
- `rm10`: +0.042 / +0.040 / +0.030 / +0.037 (seeds 0-3; mean +0.037); reward model 0.99-1.00 on
  300-312 pairs, usable from step 3 / 9 / 3 / 6. Seeds 0 / 1: +0.041 = 2.16x `all`'s +0.019 with
  0.094x its labels.
- `random10`: -0.029 / -0.026 (seeds 0 / 1; 21 / 15 steps without signal).
- `noisy`: +0.041 / +0.025 / +0.030 / +0.058 (mean +0.039); reward model 0.99-1.00 on 253-298
  pairs, usable from step 11 / 6 / 9 / 9. noisy / rm10 per seed 0.97 / 0.62 / 0.99 / 1.57;
  seeds 0 / 1: +0.033 vs +0.041 = 0.80x; seeds 0-3: 1.03x.
Met on these runs: rm10 >= 0.8x all with 0.094x its labels (2.16x); reward-model held-out
accuracy >= 0.85 (0.99-1.00, optimistic as said above); noisy >= 0.8x rm10 (0.80x on seeds
0 / 1, 1.03x over four seeds, with a per-seed spread of 0.62-1.57). rm10 >= 2x random10 has no
ratio while random10 loses (rm10 is ahead by 0.07 on each seed).

Round 11 (smoke only, no full bench): the hand-out's random draws are seeded by the run's seed
and its hand-out count (apps.feedback.handout.lease.handout_rng), so the same seed repeats: two runs of
`--steps 2 --seeds 0 --arms rm10 --share 0.5 --crossval-folds 4` handed out the same 64 items
in the same order and ended at the same expected accuracy (0.1356; reward model v1 0.74 on 43
pairs in both, v2 0.62 / 0.63 on 71), load 4.7-6.7. The "random" column (accuracy on the pairs
only the random share handed out) read 1.00 on 2 pairs. Of that run's 71 rating pairs 53 joined
two rule-chosen members, 16 a rule-chosen and a random one (counted as chosen) and 2 two random
ones (of 12 items the random share handed out, in 6 sibling pairs): at a 20% share the
unbiased figure is thin beside the held-out accuracy, so the `learned` gate stays on the latter.

Measured 2026-11-23, round 11 (same settings: 60 steps, 8 tasks x 8, lr 1e-4, `--rm-base judge
--crossval-folds 4`, base 0.1443; seeds 0 / 1, one bench per arm, two or three at once on
separate bench databases, load 1.2-8.4), the hand-out now seeded (a re-run repeats its labels):
- `all`: +0.024 / +0.014 (3840 labels; as round 10: the seeding does not touch it).
- `rm10`: +0.038 / +0.026 (mean +0.032 = 1.70x `all`'s +0.019 with 0.094x its labels); reward
  model 0.99 on 302 / 294 pairs, usable from step 3 / 9; on the random share alone 1.00 on 8 / 8.
- `random10`: -0.031 / -0.029 (19 / 14 steps without signal).
- `noisy`: +0.060 / +0.038 (mean +0.049 = 1.51x `rm10`; 1.57 / 1.44 per seed); reward model 1.00 on
  283 / 274 pairs, usable from step 6 / 7; random share 1.00 on 5 / 4. Labels: careful 353, random
  7 (all 7 gold).
Met: rm10 >= 0.8x all with <= 0.1x labels (1.70x); noisy >= 0.8x rm10 (1.51x, each seed above
1); reward-model held-out accuracy >= 0.85 (0.99-1.00; the unbiased random-share figure agrees
but rests on 4-8 pairs). Not met: rm10 >= 2x random10 (random10 loses; no ratio). Per-seed
spread stays large (rm10 +0.026..+0.038): two seeds.
Tried and not kept: counting the `gold_first` items toward `gold_rate` (a new rater's next 12
items all fresh, not 20% gold on top). noisy went to +0.064 / -0.005, usable from step 8 / 15
(against 6 / 7 without it, same seeds and code otherwise): the careful rater's earned trust
grows with the gold he rates, so fewer early gold items made his labels count later.

Measured 2026-11-23, round 13 (same settings and code path; seeds 2, 3, 4 added, one bench per
run of seeds, each seed ~7 minutes for the four arms, load 1.1-2.8), so five seeds in all:
| arm      | s0     | s1     | s2     | s3     | s4     | median | sum    |
| all      | +0.024 | +0.014 | +0.008 | +0.043 | +0.015 | +0.015 | +0.104 |
| rm10     | +0.038 | +0.026 | +0.052 | +0.028 | +0.037 | +0.037 | +0.182 |
| random10 | -0.031 | -0.029 | -0.042 | -0.066 | -0.019 | -0.031 | -0.187 |
| noisy    | +0.060 | +0.038 | +0.028 | +0.035 | +0.020 | +0.035 | +0.182 |
- rm10 / all: 1.75 on the sums, 2.5 on the medians, with 0.094x the labels; per seed 1.6 / 1.9 /
  6.5 / 0.65 / 2.5 (seed 3's `all` gained most of any). Met on the sums, the medians and 4 of 5 seeds.
- noisy / rm10: 1.00 on the sums, 0.95 on the medians; per seed 1.57 / 1.44 / 0.54 / 1.25 / 0.53.
  Met on the sums and medians, 3 of 5 seeds: the random rater gets gold only (7 labels, all gold,
  on every seed), so what noisy pays is the careful rater's gold and a later start (reward model
  usable from step 6-8 against 3-6).
- Reward model: held-out 0.99-1.00 on 268-319 pairs per run, random share 1.00 on 4-9.
- rm10 >= 2x random10: random10 loses on every seed (-0.019..-0.066: the format reward alone,
  with 90% of groups on the fallback, drifts the model down), so rm10 beats it by 0.057-0.094 and
  the inequality holds, but a ratio of a gain to a loss says nothing.

Re-run 2026-11-23, round 14, seeds 0 and 1 on this code (a fresh machine: the demo and judge
models built anew; base 0.1443 again), load 1.3-2.8, ~9 minutes a seed for the four arms:
| arm      | s0      | s1      | labels | reward model (held-out / random share)   | usable from |
| all      | +0.0237 | +0.0126 | 3840   | -                                        | -           |
| rm10     | +0.0565 | +0.0307 | 360    | 0.99 on 302 / 1.00 on 8; 0.98 on 294 / 7 | 3 / 9       |
| random10 | -0.0312 | -0.0293 | 360    | -                                        | -           |
| noisy    | +0.0607 | +0.0373 | 360    | 1.00 on 261 / 6; 1.00 / 7                | 6 / 7       |
all, random10 and noisy repeat round 11's figures to the third decimal, and the hand-out too
(the same pair counts); rm10 gained more on both seeds (+0.038 / +0.026 in round 11): the
difference comes after the hand-out, in what the reward model scored or the trainer made of
it, and was not traced. The verdict line (new) reads every target met on each seed: rm10 / all
2.39 and 2.43 with 0.094x the labels; noisy / rm10 1.07 and 1.21; rm10 >= 2 x random10 as the
inequality (random10 lost).

Measured 2026-11-25 (round 12: the reward model over the run's own base, `--rm-base policy`,
the default; the held-out split by prompt; 30 steps, 8 tasks x 8, seed 0 only, base expected
accuracy 0.1627; load 7-24 on the shared 2-core box, other helpers' benches and suites running):
correctness through people, `--rater bench.raters:correct`, rm10 (180 labels):
- `--rm-kind head` (the new default): -0.048 (random10 beside it: -0.055); reward model 0.80 on
  10 held-out pairs (by prompt), never usable (the gate needs its lower bound at 0.75).
- `--rm-kind head --crossval-folds 4`: -0.066; out-of-fold accuracy 0.37 on 63 pairs: the demo
  model's hidden states do not carry correctness (on such features k-fold estimates fall below
  chance), never usable.
- `--rm-kind likelihood`: -0.013; 0.88 on 17 held-out pairs, never usable.
One seed each and no reward model ever used: the differences are the trajectory's, not the
kinds'. Style preferences (`concise`, `working`, `in_words`): that round's demo model's (RECIPE 4) sampled
completions (max_tokens 12 or 32) are the bare `<answer>N</answer>` every time, so their
preferred shares are 1.00, 0.00 and 0.00 before any run: nothing to amplify or learn (a pair
needs two siblings rated apart) until the demo model's warm-up produces those behaviours some of
the time. Over the demo model the `head` kind learns a style it sees: a word's presence, 1.00
on pairs of unseen prompts from 45 labels (tests/rewards/test_learned_reward_model.py).

Measured 2026-11-25 on the styled demo model (RECIPE 6: 55% bare answers, 15% each of working
first / number in words / preamble; base sampled arithmetic 0.130-0.134, greedy 0.260), each style
rater, 15 steps, 8 tasks x 8, lr 1e-4, reward model `head` over the run's own base (never the
judge), `--arms all,rm10,random10,noisy,format`, seeds 0 / 1 / 2, one bench per rater and seed, up
to six at once on the shared 2-core box, load 19-54 (other helpers' suites and benches beside).
Preferred share (rated 4-5, 800 samples on the 200 held-out problems) gain per seed, median:
| rater (base share)   | all                     | rm10 (90 labels)        | random10                | noisy                   | format (no people)      |
| concise (0.48-0.52)  | +.330 +.336 +.315 +.330 | +.275 +.269 +.179 +.269 | +.164 -.028 +.105 +.105 | +.125 -.024 +.154 +.125 | +.089 -.004 +.057 +.057 |
| working (0.16-0.17)  | +.522 +.608 +.642 +.608 | +.269 +.119 +.274 +.269 | -.026 +.085 +.009 +.009 | +.015 +.114 +.235 +.114 | -.078 +.014 +.016 +.014 |
| in_words (0.06-0.07) | +.299 +.277 +.309 +.299 | +.006 +.054 +.003 +.006 | -.004 +.012 -.014 -.004 | +.035 +.031 -.019 +.031 | -.015 +.014 -.035 -.015 |
- rm10 / all on the medians (labels 90 / 960 = 0.094x): concise 0.81 (met), working 0.44, in_words
  0.02 (not met). `all` is the ceiling on every rater and seed: no lag or wait-window loss shows.
  rm10 falls short where its reward model comes late: it is folded in only once its held-out
  (by prompt) accuracy's lower bound reaches 0.75, ~10 perfect held-out pairs; at 6 labels a step,
  a quarter held out, and a pair needing two siblings rated apart, it was usable from step 6 / 6 /
  15 (concise), 6 / never / 12 (working), 15 / never / never (in_words) of 15. in_words is rare in
  the base (6-7% of samples), so pairs rated apart are rare. Its held-out accuracy when measured:
  1.00 on 11-13 pairs (concise), 1.00 / 1.00 / 0.93 on 9 / 8 / 42 (working), 1.00 / 1.00 / 0.80 on
  24 / 1 / 10 (in_words): >= 0.8 everywhere, on few pairs. A longer run (30-60 steps, as the
  correctness rounds) was not measured for lack of time on the box.
- rm10 against random10 (medians): concise +0.164 (2.56x, met), working +0.260 (random10 +0.009:
  met as the inequality), in_words +0.010 (random10 lost: met only as the inequality, both near 0).
- noisy / rm10 on the medians: concise 0.47, working 0.42 (not met), in_words 5.0 (both near 0:
  +0.031 against +0.006). Its reward model was usable on two runs of nine (working, from step 12
  / 9): gold items and trust take the first steps' labels, and the careful rater's half of the
  budget gives held-out pairs at half rm10's pace.
- Sampled arithmetic accuracy against `format` (same seed; format 0.133 against the base 0.130, seed 0):
  all -0.030 / -0.012 / +0.000 (concise), -0.070 / -0.076 / -0.046 (working), -0.062 / -0.039 /
  -0.069 (in_words); rm10 -0.054 / -0.003 / -0.031, -0.044 / -0.016 / -0.018, -0.019 / -0.029 /
  -0.024; random10 -0.001..-0.034; noisy +0.008..-0.040.
  Not met (<= 0.02 asked) for `all`, and for rm10 on most runs: the styles the warm-up shows are
  less accurate than the bare answer (base samples by form, seed 0: bare 0.159 right, working
  0.124, words 0.057, others 0.117), so amplifying a style costs arithmetic, beyond which nothing
  in a style rater holds the arithmetic up (it rates right and wrong alike).

Re-measured the same way with `--crossval-folds 4` (now the default of `head`: every rated pair
is held out once, so the gate sees ~4x the evidence), seeds 0 / 1 / 2, three benches at once,
load 6-40 (helpers' benches beside), 2026-11-25:
| rater                | all                     | rm10 (90 labels)        | random10                | noisy                   | format                  |
| concise              | +.305 +.320 +.276 +.305 | +.230 +.266 +.259 +.259 | +.075 -.010 +.051 +.051 | +.162 +.084 +.139 +.139 | +.065 -.007 +.034 +.034 |
| working              | +.406 +.519 +.529 +.519 | +.069 +.285 +.465 +.285 | +.013 +.029 +.025 +.025 | +.120 +.188 +.205 +.188 | -.023 -.012 -.005 -.012 |
| in_words             | +.234 +.243 +.231 +.234 | +.196 +.178 +.134 +.178 | -.014 +.055 -.014 -.014 | +.004 +.029 -.014 +.004 | -.012 +.000 -.009 -.009 |
- rm10's reward model usable from step 6 / 3 / 3 (concise), 12 / 3 / 3 (working), 3 / 3 / 3
  (in_words) of 15 (before: 6 / 6 / 15, 6 / never / 12, 15 / never / never); held-out (by
  prompt, out of fold) accuracy 0.86-0.97 on 54-97 pairs.
- rm10 / all per seed: concise 0.75 / 0.83 / 0.94 (median 0.83, met), working 0.17 / 0.55 / 0.88
  (0.55, not met: seed 0's model came at step 12), in_words 0.84 / 0.73 / 0.58 (0.73, not met;
  was 0.02). rm10 against random10: met on the medians for all three (in_words as a difference,
  +0.192). noisy / rm10 (medians): 0.54, 0.66, 0.02: not met; its model is usable late or never
  on in_words (20-29 held-out pairs: trust's gold items and the random rater's half of the budget).
- Sampled arithmetic against `format` (same seed), rm10: concise -0.026 / -0.051 / +0.028,
  working +0.000 / +0.002 / -0.020, in_words -0.075 / -0.029 / -0.057: not met beyond working.

Measured 2026-11-25 at the bench's default length, 30 steps (same settings otherwise: 8 tasks x 8,
lr 1e-4, `head` over the run's own base, 4 folds; 180 labels in the 10% arms against 1920),
seeds 0 / 1 / 2, one bench per rater and seed, three at once, load 2.0-4.7, ~6 minutes a bench:
| rater    | all                     | rm10                    | random10                | noisy                   | format                  |
| concise  | +.425 +.440 +.387 +.425 | +.384 +.426 +.381 +.384 | +.233 +.115 +.220 +.220 | +.378 +.402 +.350 +.378 | +.181 +.049 +.174 +.174 |
| working  | +.706 +.705 +.726 +.706 | +.672 +.726 +.706 +.706 | -.063 +.078 -.053 -.053 | +.666 +.686 +.655 +.666 | -.123 -.020 -.070 -.070 |
| in_words | +.473 +.411 +.427 +.427 | +.292 +.294 +.222 +.292 | -.035 +.025 -.025 -.025 | +.227 +.229 +.128 +.227 | -.038 -.003 -.056 -.038 |
(preferred-share gain per seed, then the median.)
- rm10 / all (medians; per seed): concise 0.90 (0.90 / 0.97 / 0.98), working 1.00 (0.95 / 1.03 /
  0.97): met with 0.094x the labels; in_words 0.68 (0.62 / 0.71 / 0.52): not met. Over 15 steps
  the reward model's late start weighed more (0.83 / 0.55 / 0.73): at 30 the ceiling `all` nears
  saturation on concise and working while rm10 keeps climbing.
- noisy / rm10: concise 0.98, working 0.94 (met on every seed), in_words 0.78 (0.78 / 0.78 /
  0.57: not met); noisy's model usable from step 6-9, 6, 6-18.
- rm10 against random10: working and in_words met as the inequality (random10 lost; rm10 ahead by
  +0.76 / +0.32); concise 1.74x (+0.164), not met as a ratio: `format`, with no people at all,
  gains +0.174 on concise (the format reward's single tag favours a bare answer), so random10's
  gain is mostly the format reward's.
- Reward model held-out (by prompt, out of fold) accuracy, rm10: concise 0.92 / 0.99 / 0.99,
  working 0.95 / 0.93 / 0.91, in_words 0.78 / 0.91 / 0.86 on 114-161 pairs (>= 0.8 but for
  in_words seed 0). in_words rates 5 only when the words name the tagged number (3 for other
  number words): a match between two spellings, which a linear head on pooled features can only
  approximate; likely why its model and its rm10 trail (not traced).
- Sampled arithmetic against `format` (same seed): all -0.056..+0.016, rm10 -0.088..+0.001, noisy
  -0.104..+0.026: not met (<= 0.02 asked). `format` itself loses 0.033 on seeds 0 / 1 (nothing in
  the run holds the arithmetic up) and amplifying a style loses more: the styled forms are less
  accurate in the base.

`--verifier on` (same day, seed 0, 30 steps, the head before its log-probability features, load
3.3-5.2): the run keeps the verifier it has for what it knows (math_accuracy beside math_format,
at --w-auto beside people's weight 1; `all` then blends too), and `format` becomes that verifier
without people. The arm without people gains arithmetic (sampled 0.130 -> 0.169); against it:
| rater    | --w-auto | all share / arith | rm10 share / arith | noisy share / arith | random10 share / arith |
| concise  | 0.5      | +.381 / -.003     | +.368 / -.015      | +.369 / -.008       | +.216 / +.010          |
| working  | 0.5      | +.709 / -.081     | +.518 / -.066      | +.491 / -.094       | -.119 / +.003          |
| in_words | 0.5      | +.406 / -.074     | +.287 / -.066      | +.193 / -.041       | -.034 / +.006          |
| concise  | 0.2      | +.397 / +.001     | +.378 / -.031      | +.359 / -.023       | +.205 / +.017          |
| working  | 0.2      | +.713 / -.098     | +.555 / -.083      | +.595 / -.090       | -.106 / -.001          |
| in_words | 0.2      | +.403 / -.084     | +.263 / -.092      | +.208 / -.064       | -.039 / +.016          |
Concise at --w-auto 0.5 on seeds 1 / 2 too (load 2.6-4.8): shares all +.381 +.429 +.379, rm10 +.368
+.399 +.366 (0.96x all on the medians, 0.094x the labels), noisy +.369 +.392 +.330 (1.00x rm10),
random10 +.216 +.246 +.219, the verifier alone +.219 +.214 +.216; arithmetic against it (seeds
0 / 1 / 2) all -.003 +.020 -.001, rm10 -.015 +.024 -.036, noisy -.008 -.014 -.012, random10
+.010 +.009 +.003.
With the verifier at half the weight of people, concise keeps its arithmetic within 0.02 on the
medians (rm10's seed 2 loses 0.036); working and in_words do not, at either weight: people rate a style whose
forms the base model gets wrong more often (bare 0.159, working 0.124, words 0.057 right), and a
rating of 5 for any working outweighs the verifier's point for a right answer, so the runs trade
arithmetic for the style. What would hold both: a warm-up whose styles are as accurate as the
bare answer, or raters who rate the style only on right answers (a preference of its own).

Why in_words trails (same day): over the rm10 run of seed 0, each version's scores of sibling
pairs the rater rated apart, by rating: 5 v 1 0.88-1.00 and 3 v 1 0.87-1.00 right, but 5 v 3
(words that name the tagged number against words that do not) 0.38-0.77, 0.55-0.64 from version 5
on, while most late pairs are 5 v 3: the head does not see whether two spellings of a number
agree. The run's own base does: its mean token log-probability is -0.42 on completions rated 5
and -1.04 on those rated 3. Tried and not kept: the head pooling the completion's mean and
least token log-probability beside its states (a crafted 5-v-3 preference over the demo model,
60 pairs: held-out 0.63 -> above 0.8). In the bench, 3 seeds x 3 raters, arms rm10 / noisy
(the other arms use no reward model): in_words rm10 +0.320 / +0.290 / +0.219 (median +0.290
against +0.292), its model 0.80 / 0.81 / 0.77, late 5 v 3 pairs 0.64-0.82; noisy +0.177 / +0.103
/ +0.128 (against +0.227 / +0.229 / +0.128: usable from step 15 / 24 / 18 against 6 / 12 / 18);
working rm10 median +0.714 (+0.706), noisy +0.679 (+0.666); concise rm10 +0.384 (+0.384), noisy
+0.394 (+0.378). No preference's rm10 moved beyond the seeds' spread and in_words' noisy arm
got its model later: reverted. The few 5 v 3 pairs of the first steps do not weigh two
features among 515 against the others; what might: features chosen per preference, or a head
that sees the completion's token states rather than their pools.

Offline, 2026-11-25 (no bench run): 9,600 completions sampled from the styled demo model (600
training prompts x 16), rated by `in_words`, pairs of one prompt rated apart, the held-out quarter
of the prompts by `prompt_fold` (3,000 pairs, 123-227 of them 5 v 3); a training set of 150 pairs
half of them 5 v 3, as late rm10 labels are. Held-out 5 v 3 accuracy of the head (5 v 1 and 3 v 1
are 0.97-1.00 throughout): 0.69-0.75 over three splits; with the last layer's maximum or a middle
layer's mean beside its features 0.69-0.76; with the completion's token log-probability mean /
least / sum 0.72-0.80; L2 1e-3..10 0.58-0.70 (1e-2, the default, 0.68 on that split). The whole
model trained as a `classifier` (TRL's RewardTrainer, the issue's "full head") on the same 150
pairs: 0.60-0.67 (4-8 epochs, lr 2e-4..1e-3), below the head. The head on 600 pairs, 300 of them
5 v 3: 0.83. So the head is short of 5 v 3 pairs, not of features a full model would find: rm10's
reward model has 114-161 pairs of every kind after 30 steps.

Tried 2026-11-25 and not kept, two ways to give it more of them:
- The pair score as the chance the model orders the pair wrong, min(p_a (1 - p_b), p_b (1 - p_a))
  x 4, in place of the chance the two ratings differ (which puts first the words-v-bare pairs
  the model already separates). in_words, 30 steps, seeds 0 / 1 / 2 (the hand-out is seeded,
  so the figures above repeat on the old rule), load 2.6-4.7: rm10 +0.226 / +0.299 / +0.241
  (median +0.241 against +0.292), noisy +0.173 / +0.176 / +0.131 (against +0.227 / +0.229 /
  +0.128). The rule hands out the hard pairs, so the held-out accuracy over what was rated
  falls (seed 0's last version 0.56 on 154 pairs, against 0.78) and the gate, which reads it,
  keeps the reward model out of more steps. Reverted, not run on the other raters.
- Offline (a fresh sample, 480 training prompts x 8, 180 labelled items in 90 sibling pairs half
  from groups with two number-word completions): the head on every pair of those items rated
  apart across prompts (~10,500 pairs) against only the sibling pairs (28-30): held-out
  5 v 3 0.57-0.62 against 0.35-0.55 at L2 1e-2 (40 held-out 5 v 3 pairs, three draws); above
  the sibling pairs, far below 0.8. Not built.

Measured 2026-11-25 on a balanced warm-up (`--demo-styled 0.75`: the demo model built with every
style at a quarter of the warm-up answers, the bare one too; drawn by a seed, no rater in it),
same settings otherwise (30 steps, 8 tasks x 8, lr 1e-4, `head` over the run's own base, 4 folds),
seeds 0 / 1 / 2, one bench per rater, three at once beside the full suite, load 4.9-15.0. The
styled demo model (RECIPE 6, 55% bare) answers in the styles it saw least less accurately (200
held-out problems x 8 samples: bare 0.176 right, working 0.084, words 0.120, preamble 0.107),
so amplifying a style cost arithmetic; the balanced one: bare 0.194, working 0.183, words 0.154,
preamble 0.216 (sampled arithmetic 0.174 against 0.135; base preferred shares concise 0.30,
working 0.20, in_words 0.18; greedy 0.31). Preferred-share gain per seed, then the median:
| rater    | all                     | rm10                    | random10                | noisy                   | format                  |
| concise  | +.571 +.529 +.489 +.529 | +.534 +.526 +.493 +.526 | +.185 +.218 +.124 +.185 | +.447 +.458 +.440 +.447 | +.095 +.096 +.124 +.096 |
| working  | +.734 +.701 +.715 +.715 | +.688 +.691 +.691 +.691 | +.084 +.010 +.085 +.084 | +.660 +.635 +.619 +.635 | -.049 -.075 -.107 -.075 |
| in_words | +.504 +.501 +.540 +.504 | +.400 +.456 +.341 +.400 | -.018 -.055 +.016 -.018 | +.300 +.268 +.365 +.300 | -.066 -.051 -.055 -.055 |
- rm10 / all (medians, 0.094x the labels): concise 0.99, working 0.97 (met), in_words 0.79 (per
  seed 0.79 / 0.91 / 0.63; on the styled model 0.68): not met, by 0.01 on the medians.
- rm10 against random10: concise 2.84x (met; 1.74x on the styled model, where `format` alone
  gained +0.174 on concise, here +0.096: a bare answer is no longer the best-formed), working
  8.2x, in_words met as the inequality (random10 lost; rm10 ahead by +0.418).
- noisy / rm10: concise 0.85, working 0.92 (met), in_words 0.75 (0.78 on the styled model): not
  met; noisy's in_words model usable from step 12 / 15 / 7 against rm10's 6 / 3 / 12.
- Reward model held-out (by prompt, out of fold), rm10: concise 1.00 / 1.00 / 0.99, working 0.93 /
  0.96 / 0.94, in_words 0.86 / 0.82 / 0.74 on 128-173 pairs.
- Sampled arithmetic against `format` (same seed; `format` 0.105 / 0.119 / 0.133), rm10: working
  -0.007 / +0.001 / -0.028, in_words -0.003 / +0.003 / -0.025 (met on the medians; 2 of 3 seeds),
  concise -0.039 / -0.075 / -0.038 (not met); `all` concise -0.016..-0.064, working -0.023..+0.025,
  in_words -0.041..-0.012. The styles now cost no arithmetic by their form; what is left is
  drift: a style rater rates right and wrong answers alike, so nothing holds the arithmetic up,
  and on concise the runs drift further down than `format` (not traced).
The same balanced warm-up with `--verifier on --w-auto 0.5` (the run's correctness check kept
beside people at half their weight; `format` is then the verifier alone), seed 0 only, load
4.2-7.3; share gain / sampled arithmetic (against the verifier alone, 0.161):
| rater    | all                  | rm10                 | noisy                | random10             |
| concise  | +.525 / .152 (-.009) | +.474 / .204 (+.042) | +.347 / .214 (+.052) | +.056 / .180 (+.019) |
| working  | +.704 / .150 (-.011) | +.539 / .134 (-.027) | +.626 / .151 (-.010) | +.076 / .164 (+.003) |
| in_words | +.504 / .125 (-.036) | +.404 / .140 (-.021) | +.336 / .135 (-.026) | +.009 / .177 (+.016) |
rm10 / all 0.90, 0.77, 0.80; noisy / rm10 0.73, 1.16, 0.83; rm10 / random10 8.4x, 7.1x, 46x. The
verifier lifts concise's arithmetic (the bare answer, now as accurate as any, gets the verifier's
point beside people's 5) but not the other two beyond `format`'s reach: one seed, within the
spread of the runs above; not a finding.

Why the arithmetic drifts, and what holds it (2026-11-25, balanced warm-up, 30 steps, same
settings; the untagged share is the new column: answers with no `<answer>` at all). On concise,
seed 0, rm10 takes the preferred share from 0.29 to 0.82 while the bare answer's expected
accuracy (the probability of sampling the right `<answer>N</answer>`) stays at 0.054: the bare
form's mass grows threefold and all of the growth goes to wrong numbers; greedy accuracy falls
0.31 -> 0.065, and the untagged share does not move (0.055 -> 0.045: the form is not lost, the
numbers are). `format`, with no people, drifts too (sampled 0.146 -> 0.105): nothing in the run
rewards a right number, and every update on the style reinforces the sampled numbers with it. A
KL penalty toward the base model (`--beta`, the run's `trainer.params.beta`) keeps what the base knows
and no reward term checks; seed 0, concise, share gain / sampled arithmetic against `format`:
beta 0: rm10 +.534 / -.039, all +.571 / -.016; 0.04: rm10 +.532 / -.035, all +.566 / -.009; 0.3:
rm10 +.489 / +.002; 1.0: rm10 +.305 / +.025 (`format` itself 0.105, 0.113, 0.163, 0.161). At 0.3,
the three style raters, seeds 0 / 1 / 2, one bench per rater, three at once, load 2.9-4.6, ~35
minutes a bench (base: sampled arithmetic 0.157; preferred shares concise 0.30, working 0.20,
in_words 0.18):
| rater    | all                     | rm10                    | random10                | noisy                   | format                  |
| concise  | +.505 +.505 +.456 +.505 | +.489 +.493 +.471 +.489 | +.075 +.048 -.004 +.048 | +.394 +.402 +.436 +.402 | +.056 +.075 +.014 +.056 |
| working  | +.672 +.659 +.660 +.660 | +.596 +.590 +.642 +.596 | +.033 +.005 +.010 +.010 | +.426 +.524 +.621 +.524 | -.023 -.020 -.061 -.023 |
| in_words | +.498 +.506 +.496 +.498 | +.416 +.459 +.424 +.424 | -.006 +.015 -.001 -.001 | +.385 +.065 +.349 +.349 | -.066 -.042 -.005 -.042 |
- rm10 / all (medians, 0.094x the labels): concise 0.97, working 0.90, in_words 0.85 (per seed
  0.84 / 0.91 / 0.85; at beta 0 0.79, 0.63 on seed 2): met for all three.
- rm10 against random10: concise 10x (+0.441), working 60x (+0.586), in_words met as the
  inequality (random10 -0.001, rm10 ahead by +0.425): met.
- noisy / rm10 (medians): concise 0.82, working 0.88, in_words 0.82: met on the medians; per seed
  concise 0.81 / 0.82 / 0.93, working 0.71 / 0.89 / 0.97, in_words 0.92 / 0.14 / 0.82 (in_words'
  seed 1: noisy's reward model usable from step 27 of 30, against 9 and 7 on the other seeds).
- Reward model held-out (by prompt, out of fold), rm10: concise 0.98 / 0.99 / 1.00, working 0.96 /
  0.91 / 0.95, in_words 0.90 / 0.86 / 0.93 on 136-183 pairs: >= 0.8 on every seed (at beta 0
  in_words 0.86 / 0.82 / 0.74).
- Sampled arithmetic against `format` (same seed; `format` 0.163 / 0.186 / 0.169, above the base's
  0.157: at 0.3 the arm without people no longer drifts down):
  concise: rm10 +.003 / +.009 / +.019, noisy +.010 / -.038 / +.000, all -.019 / -.006 / -.020;
  working: rm10 -.018 / -.021 / -.004, noisy -.009 / -.020 / -.006, all -.006 / -.027 / -.011;
  in_words: rm10 -.013 / -.034 / -.045, noisy -.016 / -.020 / -.024, all -.033 / -.031 / -.053.
  Met on the medians for concise (rm10 +0.009, noisy +0.000, all -0.019) and working (-0.018,
  -0.009, -0.011); not for in_words (rm10 -0.034, all -0.033; noisy -0.020). The number written in
  words is a second copy of the answer, one more place for the number to go wrong. The penalty
  cost in_words no share gain (rm10 +0.424 at 0.3, +0.400 at 0); 0.6 holds its arithmetic too
  (below).
At beta 0.6 (same day, same settings, seeds 0 / 1 / 2, every arm; up to six benches at once, load
0.5-8), share gain per seed, then the median:
| rater    | all                     | rm10                    | random10                | noisy                   | format                  |
| concise  | +.424 +.444 +.401 +.424 | +.426 +.416 +.376 +.416 | +.050 +.019 -.011 +.019 | +.360 +.364 +.358 +.360 | +.032 -.001 +.016 +.016 |
| working  | +.481 +.451 +.495 +.481 | +.412 +.465 +.474 +.465 | -.010 +.016 +.021 +.016 | +.365 +.406 +.527 +.406 | -.003 -.023 -.008 -.008 |
| in_words | +.324 +.421 +.405 +.405 | +.326 +.363 +.379 +.363 | -.060 +.019 -.014 -.014 | +.264 +.349 +.318 +.318 | -.044 +.010 -.008 -.008 |
- rm10 / all per seed: concise 1.00 / 0.94 / 0.94, working 0.86 / 1.03 / 0.96, in_words 1.01 / 0.86
  / 0.94: met on every seed. noisy / rm10: concise 0.85 / 0.88 / 0.95, working 0.89 / 0.87 / 1.11,
  in_words 0.81 / 0.96 / 0.84: met on every seed. rm10 against random10: concise 22x, working 29x
  on the medians, at least 8x on every seed where random10 gained; in_words met (random10 lost on
  the median; seed 1 +0.363 against 2 x +0.019).
- Sampled arithmetic against `format`, per seed: concise rm10 -.003 / +.020 / +.033, noisy +.009 /
  +.008 / +.031, all +.010 / +.013 / +.044; working rm10 +.002 / +.003 / +.005, noisy .000 / +.004 /
  +.002, all -.011 / -.004 / +.025, random10 concise +.009 / -.005 / +.006, working +.016 / +.017 /
  +.020; in_words
  rm10 -.008 / -.014 / -.011, noisy -.010 / -.019 / -.016, all -.003 / -.021 / -.001, random10
  -.001 / .000 / +.002: within 0.02 everywhere but in_words' `all` on seed 1 (-0.021).
- Reward model held-out (by prompt), rm10: concise 0.99 / 0.98 / 0.98, working 0.90 / 0.93 / 0.99,
  in_words 0.91 / 0.88 / 0.86.
- The price: smaller gains (all: concise +0.42 against +0.51 at 0.3, working +0.48 against +0.66,
  in_words +0.41 against +0.50). So 0.6 meets every target on all three preferences, on every
  seed; 0.3 keeps more of the style and holds concise and working on the medians only.
So a team teaching a style with no verifier for what the base already does well sets
`trainer.params.beta` (docs/guide/human-signal.md, *Teaching a style*); the run's default stays 0 (TRL's, and the
correctness runs' tests and benches are measured there).

The same at beta 0.6 on the styled demo model (RECIPE 6: 55% bare, 15% a style; its styles
less accurate than its bare answer), 2026-11-26 on a fresh machine (this build: greedy 0.305,
sampled arithmetic 0.137), seeds 0 / 1 / 2, every arm, one bench per rater, three at once, load
1.8-6.3, ~35 minutes a bench:
| rater    | all                     | rm10                    | random10                | noisy                   | format                  |
| concise  | +.354 +.370 +.316 +.354 | +.329 +.350 +.290 +.329 | +.062 +.090 +.055 +.062 | +.304 +.296 +.299 +.299 | +.027 +.083 +.051 +.051 |
| working  | +.520 +.516 +.559 +.520 | +.420 +.479 +.511 +.479 | +.003 -.030 -.006 -.006 | +.407 +.365 +.450 +.407 | -.014 -.059 -.012 -.014 |
| in_words | +.264 +.272 +.261 +.264 | +.244 +.229 +.171 +.229 | -.003 -.005 +.000 -.003 | +.146 +.180 +.149 +.149 | -.006 -.016 -.016 -.016 |
- concise: every target on every seed: rm10 / all 0.93 / 0.95 / 0.92, noisy / rm10 0.92 / 0.85 /
  1.03, rm10 3.9-5.3x random10, reward model 0.95-0.98, arithmetic against `format` rm10 +.000 /
  +.035 / +.038, noisy +.015..+.028, all +.010..+.021.
- working: rm10 / all 0.81 / 0.93 / 0.91 (met), noisy / rm10 0.97 / 0.76 / 0.88 (0.88 on the
  median), random10 lost (met as the inequality), reward model 0.90-0.96; arithmetic not met:
  rm10 -.042 / -.023 / -.031, all -.049 / -.034 / -.035, noisy -.028..-.062.
- in_words: rm10 / all 0.92 / 0.84 / 0.66 (0.84 on the median), noisy / rm10 0.60 / 0.79 / 0.87
  (0.79: not met), reward model 0.83-0.86; arithmetic not met: rm10 -.045 / -.010 / -.046.
On this warm-up the penalty cannot hold what the form itself costs: a working or words answer
is right less often than a bare one in the base (0.084 and 0.120 against 0.176, above), so
amplifying it lowers the arithmetic by construction; the penalty only stops the drift beyond
that. Concise amplifies the bare answer, the most accurate form, and gains arithmetic.
The run's verifier kept (`--verifier on --w-auto 1.0`, people and the verifier at the same
weight, as the demo run), `working`, arms rm10 and `format` (the verifier alone), seeds 0 / 1 /
2, load 4.9-6.3: at beta 0 rm10's share +.349 / +.542 / +.598 with arithmetic 0.128 / 0.124 /
0.114 against the verifier alone's 0.212 / 0.159 / 0.171; at beta 0.6 +.268 / +.316 / +.302 with
0.117 / 0.128 / 0.130 against 0.164 / 0.154 / 0.184 (base 0.137). With a verifier the penalty
halves the style's gain and keeps no arithmetic that the verifier did not (rm10 -0.057 against
the verifier alone on the median at beta 0, -0.046 at 0.6): `make run`'s demo run, which keeps
its verifier, stays at beta 0.

The demo model's default is now that balanced warm-up (RECIPE 7, 2026-11-26: a quarter each,
trained on to greedy 0.3, where the 2026-11-25 balanced figures above were of a build at the old
target 0.2; held-out samples 0.225 right, by form bare 0.240, working 0.250, words
0.174, preamble 0.272). At beta 0.6, same settings otherwise, seeds 0 / 1 / 2, every arm, one bench
per rater, three at once, the last 40 minutes beside the demo-model test modules then the full
suite, load 4.1-10.0, ~65 minutes a bench (base: sampled arithmetic 0.207, greedy 0.335,
preferred shares concise 0.27, working 0.24, in_words 0.21):
| rater    | all                     | rm10                    | random10                | noisy                   | format                  |
| concise  | +.470 +.409 +.417 +.417 | +.444 +.398 +.405 +.405 | +.056 +.011 +.030 +.030 | +.376 +.154 +.375 +.375 | +.040 -.039 +.032 +.032 |
| working  | +.469 +.515 +.529 +.515 | +.449 +.542 +.486 +.486 | -.011 +.026 -.011 -.011 | +.448 +.497 +.430 +.448 | -.011 +.000 -.043 -.011 |
| in_words | +.356 +.388 +.422 +.388 | +.320 +.379 +.355 +.355 | -.016 -.001 +.025 -.001 | +.090 +.339 +.417 +.339 | +.006 +.014 -.009 +.006 |
- rm10 / all per seed (0.094x the labels): concise 0.94 / 0.97 / 0.97, working 0.96 / 1.05 /
  0.92, in_words 0.90 / 0.98 / 0.84: met on every seed. Working's seed 1 has rm10 above `all`
  (+.542 against +.515): under the penalty both arms near the same ceiling (the style share
  the KL term allows), and the seeds' spread of `all` (0.06) is wider than the gap.
- rm10 against random10: concise 7.9x / 35x / 14x; working and in_words met as the inequality
  (random10's median -0.011 and -0.001; on the seeds where it gained, 21x and 14x).
- noisy / rm10: working 1.00 / 0.92 / 0.88 (every seed); concise 0.85 / 0.39 / 0.93 and in_words
  0.28 / 0.89 / 1.18: met on the medians (0.85, 0.89), not on one seed each (concise seed 1,
  in_words seed 0: a usable reward model from step 9 and 8, yet a third of rm10's gain; not traced).
- Reward model held-out (by prompt, out of fold), rm10: concise 0.97-1.00, working 0.94-0.98,
  in_words 0.85-0.90; noisy 0.79-0.99.
- Sampled arithmetic against `format` (same seed; `format` 0.225 / 0.156 / 0.196: its own seeds
  spread by 0.07, and each figure, 800 samples, has a standard error of ~0.014, so a difference
  of two arms ~0.02: the target sits at the measure's noise), rm10 / noisy / all:
  concise -.015 +.040 -.016 / +.003 +.071 +.011 / -.026 +.038 -.025: met for rm10 and noisy;
  working -.015 +.045 +.010 / +.003 +.049 -.003 / -.030 +.022 +.007: met;
  in_words -.043 +.034 -.044 / -.013 +.030 -.023 / -.038 +.022 -.024: not met for rm10 (median
  -0.043) nor `all`; noisy's median -0.013. The words form is still the least accurate (0.174
  against the bare 0.240): the one style whose form costs arithmetic.
So on the default demo model at beta 0.6 every target holds on the medians for concise and
working, and for in_words but its arithmetic; against RECIPE 6 (above), working no longer costs
arithmetic (-0.031 there on the median) and `make run`'s demo style is one whose form is as
accurate as the bare answer.

Measured 2026-11-26 (issue 47, reduced: the machine allowed no more), the generated family's first
four draws (generated:0-3; three of them mix correctness in), seed 0 only, 15 steps, 8 tasks x 8,
lr 1e-4, `--beta 0.6`, `head` over the run's own base, 4 folds, arms all, rm10, random10 and
`format` (once for the seed: its arithmetic, 0.158, is every preference's yardstick), rm10 both
with `--rm-gate bound` (the default then) and `--rm-gate evidence`; up to three benches at once beside
other helpers' suites, load 12-24 on the shared 2-core box. Preferred-share gain:
| preference (base share)         | all   | rm10 bound | rm10 evidence | random10 | rm in use, bound / evidence |
| generated:0 style (0.018)       | +.010 | +.000      | +.000         | -.003    | 3 / 13 of 15 steps          |
| generated:1 mixed (0.220)       | +.105 | +.005      | +.016         | -.004    | 0 / 7                       |
| generated:2 mixed (0.347)       | +.191 | +.100      | +.184         | +.044    | 3 / 13                      |
| generated:3 mixed (0.237)       | +.052 | +.030      | +.045         | +.004    | 6 / 13                      |
- generated:0 (a strict scale: 1.8% of the base's answers rated 4-5) has no ceiling: `all` itself
  gained +0.010 in 15 steps. On the other three, rm10/all: bound 0.05 / 0.52 / 0.57 (median 0.52,
  25th percentile 0.29), evidence 0.15 / 0.96 / 0.86 (median 0.86, 25th percentile 0.51), with
  0.094x the labels; rm10 >= 2x random10 on 3 of 4 pairs either way; rm10's sampled arithmetic
  against `format`: median +0.005 (bound), +0.004 (evidence), every pair within 0.02. Reward model
  held-out accuracy on the mixed ones 0.56-0.81: the correctness half is what a head on the
  policy's hidden states does not learn (generated:1: 0.71-0.73, rm10 0.05-0.15 of `all`).
- Why the reward model did not move the policy (the per-step probe): under `bound` the gate
  opened and shut again. "rm from" (the first step it was usable) read 3 / - / 9 / 3, yet it was
  in use on 3, 0, 3 and 6 steps of 15. On generated:0 and :3 the first version, fitted on ~20
  pairs, was right on all of its few held-out pairs (bound 0.86-0.89); the next, on ~40 pairs, was
  honestly at 0.82-0.84 and its bound at 0.70-0.73, just under 0.75: shut from step 6 (generated:3
  reopened for steps 9-11 at 0.75, then shut at 0.68 and 0.48); generated:2 opened at step 9 (bound
  0.77) and shut at 12 (0.73). While shut, 90% of the groups train on the format reward alone. When
  it was in use its scores were not too small: the within-group sd of its part of the reward was
  0.03-0.23 against the format reward's 0.00-0.03 (the demo model's answers are nearly all
  tagged), the batch sd 0.13-0.19 (medians), and its rewards differed by at least half a rating
  step in 24 of 24 groups (generated:2, bound) and 38-67% of them under `evidence` (weights below
  1 on most steps; those runs' probe missed the steps where a new version came in, fixed since). The label budget went as
  asked (72 by the rule, 18 by the random share; 90-105 sibling pairs rated apart per run). So the
  evidence points at the gate, not at the scale of the scores or the hand-out: `--rm-gate
  evidence` kept the model in from its first version on (weight 0.08-1.0 by its bound), and
  rm10/all went from 0.52 to 0.86 on the median. One seed and three pairs with a ceiling: the
  issue's 8 preferences x 2 seeds x 30 steps were not run (~3 h of the 2-core box at this load
  for the four arms; `--raters generated:8 --seeds 0,1 --beta 0.6 --arms all,rm10,random10,format`
  and again with `--arms rm10 --rm-gate evidence`). The default stayed `bound` until then (it is
`calibrated` now: the run config's own, kernel.config).

The target run, started 2026-11-26 (`--raters generated:8 --seeds 0,1 --steps 30 --beta 0.6 --arms
all,rm10,random10,format --rm-gate evidence --out FILE`, rm10 under `evidence` only: a `bound`
arm beside is one more 30-step run per pair, ~11 minutes at load 8-16, where `all` takes ~22),
load 4-16: two pairs had finished by 18:09 UTC. generated:0 seed 0 (a strict length preference,
base share 0.022): all +0.010 (no ceiling), rm10 +0.006, random10 -0.009, format +0.005, rm10's
arithmetic -0.030 against `format`. generated:1 seed 0 (mixed: a preamble and the right answer):
all +0.163, rm10 +0.053 (0.32x, not met), random10 +0.005 (rm10 10.5x: met), arithmetic +0.005
(met); its reward model 0.68 held out, in on 19 steps at weight 0.34 with a calibration slope of
0.01: its rewards differed by half a rating step in 0 of 152 groups, so the run learned from the
10% of labels alone; a better reward model, not the gate, is what that pair needs. No target is
read on one pair with a ceiling; `--report` on the file gives whatever finished after. The
reward model over the family (bench/reward_model --raters generated:8, seed 0, 200 labels):
`head` 0.813 on the mean (the mixed four 0.747), `mlp` 0.831 (0.774).

The selection rule of rm10 and noisy is the run config's own default since 2026-11-28 (issue
62 item 1: the reward model's least sure sibling pairs, a fifth of the pairs at random); it was
arrival order there, and the arms overrode it. `--selection arrival` runs them in arrival order
(three pairs of the family, seed 0, 30 steps: rm10 active +0.306 / +0.301 / +0.236 against
+0.242 / +0.260 / +0.258 in arrival order; bench/README.md). The live loop's twin of this bench
is bench/live_steering.

Under `--rm-gate bound` a reward model is folded into rewards only once the lower bound of its
held-out accuracy at --rm-confidence reaches --min-rm-accuracy (a perfect model on 9 pairs at
0.75, 95%; a 0.9 one on ~30; one at 0.69 never); under the default `calibrated` from when that
bound is above chance. bench/reward_model measures how far the reward model gets on these labels with each base.

Targets (on the rater's preferred share): rm10 gain >= 0.8 x all's with <= 0.1 x its labels;
rm10 >= 2 x random10; noisy >= 0.8 x rm10; reward-model held-out (by prompt) accuracy >= 0.8;
sampled arithmetic accuracy no more than 0.02 below the `format` arm's. The last lines print
the verdicts (with the differences) and the ratios.
"""

from __future__ import annotations

import argparse
import html
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from kernel.config import FeedbackSettings
from kernel.preferences import ANSWER
from kernel.reward_kinds import DEFAULT_REWARD_KIND, reward_kind_get, reward_kind_names
from bench.common import BENCH_DB, DEMO_DIR, ROOT, free_port, median, own_conductor, percentile, processes_stop, \
    setup_django, wait_windows_end
from bench.raters import Rating, correct, rater_load

# The gate of the rm10 / random10 / noisy arms unless --rm-gate says otherwise: the run config's
# own default, so that the bench measures what a run that names no gate does.
RM_GATE_DEFAULT: str = FeedbackSettings.model_fields["rm_gate"].default

PASSWORD = "bench-steering-pw"
ARMS = ("all", "rm10", "random10", "noisy")
# `auto` (a control, not in the default arms): the automatic correctness reward
# (math_accuracy) in place of people, `auto` mode; the rewards `all` gets from its rater,
# without the annotation path. `all` and `auto` apart means the human path loses signal.
# `format` (a control too): the format reward alone, no people: what `random10` trains on
# wherever no one rated (its wait window's fallback).


@dataclass(frozen=True)
class Override:
    """One setting an arm's run takes other than the product's default (kernel.config's
    `config_validate` of a config naming only the model): its dotted path, value and why."""

    path: str
    value: object
    reason: str


def arm_config(arm: str, *, model: str, steps: int, tasks: int, repeat: int, seed: int, lr: float,
               rm_base: str | None = None, min_rm_accuracy: float = 0.75, scale_rewards: str = "batch",
               rm_kind: str = "head", min_rm_heldout_pairs: int = 0,
               rm_confidence: float = 0.95, w_auto: float = 0.2, crossval_folds: int = 4,
               pairs: bool = True, trust: bool = True, max_tokens: int = 32,
               verifier: bool = False, beta: float = 0.0,
               rm_gate: str = RM_GATE_DEFAULT, selection: str = "active") -> tuple[dict[str, object], list[Override]]:
    """The run config of `arm` and the overrides it is made of: the product's defaults
    (kernel.config) with these settings, and nothing else, set (`overrides_print` shows them at
    the bench's start; tests/test_bench_steering_config.py checks that no other setting differs)."""
    if arm not in (*ARMS, "auto", "format"):
        raise SystemExit(f"unknown arm {arm!r}")
    loop = "the bench's loop explores, rates and trains in turn in this process"
    o = [
        Override("model", model, "the demo model (workers/models/demo), its styles at a minority share"),
        Override("engine", "transformers", "rollouts sampled in this process (no vLLM server)"),
        Override("algorithm", "grpo", "the figures are GRPO's"),
        Override("mode", "sync", loop),
        Override("sync_interval", 1, loop),
        Override("explore_batch_size", tasks, "--tasks"),
        Override("repeat_times", repeat, "--repeat"),
        Override("train_batch_size", tasks * repeat, "one explore step's rollouts per train step"),
        Override("total_steps", steps, "--steps"),
        Override("epochs", 4, "enough passes over the demo taskset for --steps at --tasks a step"),
        Override("seed", seed, "--seeds"),
        Override("sampling.temperature", 1.0, "sampled as the measurement samples"),
        Override("sampling.max_tokens", max_tokens, "--max-tokens"),
        # Only the format reward: correctness comes from people (or the model learned from them);
        # with `verifier`, the correctness check too (a team teaching a style keeps the verifier
        # it has for what it knows; people teach what it does not).
        Override("rewards", [{"name": "math_accuracy"}, {"name": "math_format"}] if verifier else [{"name": "math_format"}],
                 "the verifier beside people (--verifier on)" if verifier else
                 "the format reward alone: whatever the run learns of correctness it learns from people"),
        Override("trainer.learning_rate", lr, "--lr"),
        Override("trainer.params.loss_type", "grpo", "GRPO's own loss, as the earlier rounds measured"),
        # Advantages scaled by the batch's reward spread, not each group's: under per-group
        # scaling a group whose members a reward model scores nearly alike (all wrong, say) gets
        # its small differences blown up to unit-size advantages, i.e. trains on the model's noise.
        Override("trainer.params.scale_rewards", scale_rewards,
                 "--scale-rewards: per-group scaling blows a reward model's small differences up to unit advantages"),
        Override("trainer.params.beta", beta, "--beta: a KL penalty toward the base model (what no reward term checks)"),
    ]
    if arm == "auto":
        return _nested(o + [Override("rewards", [{"name": "math_accuracy"}], "the automatic correctness reward in place of people"),
                            Override("feedback.mode", "auto", "no people (a control)")])
    if arm == "format":
        return _nested(o + [Override("feedback.mode", "auto", "no people: the format reward alone (a control)")])
    wait = [Override("feedback.wait_seconds", 3600, "the bench ends each wait window itself after the raters' turn"),
            Override("feedback.fallback", "auto", "an unrated member keeps its automatic reward")]
    overlap = Override("feedback.overlap", 1, "one rating an item")
    weights = [Override("feedback.w_auto", w_auto, "--w-auto"), Override("feedback.w_human", 1.0, "a rating at full weight")]
    if arm == "all":
        if verifier:  # people's ratings beside the verifier, weighted as in the other arms
            return _nested(o + [Override("feedback.mode", "blend", "people's ratings beside the verifier"),
                                *weights, overlap, *wait])
        return _nested(o + [Override("feedback.mode", "human", "every rollout rated (the ceiling)"), overlap, *wait])
    if arm == "random10":
        return _nested(o + [Override("feedback.mode", "blend", "ratings where given, the format reward elsewhere"),
                            *weights, overlap, *wait,
                            Override("feedback.selection.random_share", 1.0, "items chosen uniformly at random"),
                            Override("feedback.selection.pairs", False, "single items")])
    # A reward model steers only once it ranks held-out pairs well on enough of them: one at
    # chance folded into rewards trains the policy on noise (the round-5 arms lost accuracy).
    learned = [
        Override("feedback.mode", "learned", "the reward model, trained on the labels, scores the rest"),
        *weights, Override("feedback.w_rm", 1.0, "the reward model's score at full weight"),
        Override("feedback.min_rm_accuracy", min_rm_accuracy, "--min-rm-accuracy"),
        Override("feedback.min_rm_heldout_pairs", min_rm_heldout_pairs, "--min-rm-heldout-pairs"),
        Override("feedback.rm_accuracy_confidence", rm_confidence, "--rm-confidence"),
        Override("feedback.rm_gate", rm_gate, "--rm-gate"),
        overlap, *wait,
        # Active selection (the reward model's least sure sibling pairs and a fifth at random)
        # is the product's default (kernel.config.SelectionRule): nothing to override, but to
        # measure against the queue in arrival order, the default before 2026-11-28.
        *([Override("feedback.selection.uncertainty", 0.0, "--selection arrival: the queue in arrival order"),
           Override("feedback.selection.random_share", 0.0, "--selection arrival: no random share")]
          if selection == "arrival" else []),
        Override("feedback.selection.pairs", pairs, "--pairs"),
        Override("reward_model.enabled", True, "the learned arms' reward model"),
        Override("reward_model.kind", rm_kind, "--rm-kind"),
        Override("reward_model.base", rm_base or model, "--rm-base"),
        Override("reward_model.retrain_every", 16, "a new version every 16 new labels (every 2-3 steps at rm10's 6 labels a step)"),
        Override("reward_model.heldout_share", 0.25, "the held-out split of a kind without folds"),
        Override("reward_model.epochs", 6, "the reward model's training as the steering rounds measured it"),
        Override("reward_model.learning_rate", 3e-4, "the reward model's training as the steering rounds measured it"),
        Override("reward_model.batch_size", 16, "the reward model's training as the steering rounds measured it"),
        Override("reward_model.max_length", 64, "the demo's prompts and --max-tokens completions fit"),
        # a kind without folds (classifier, lora) measures on the held-out prompt split
        Override("reward_model.crossval_folds", crossval_folds if reward_kind_get(rm_kind).crossval else 0,
                 "--crossval-folds (0 for a kind without folds)"),
    ]
    if arm == "rm10":
        return _nested(o + learned)
    # noisy: trust-aware hand-out (`--trust on`): a new rater rates 3 gold items before anything
    # else, an untrusted one gets gold items only (apps.feedback.handout.lease._claim_selected).
    hand_out = [Override("feedback.trust.gold_first", 3, "--trust on: a new rater rates 3 gold items first"),
                Override("feedback.trust.untrusted_share", 0.0, "--trust on: an untrusted rater gets gold items only")]
    return _nested(o + learned + [
        Override("feedback.rater_weighting", "gold", "reliability weights from the owner's gold items"),
        Override("feedback.gold_rate", 0.2, "gold items mixed in at 20%"), *(hand_out if trust else [])])


def _nested(overrides: list[Override]) -> tuple[dict[str, object], list[Override]]:
    """The config the overrides make (a later one of a path replaces an earlier one), and the
    overrides as they stand, one a path."""
    last = {o.path: o for o in overrides}
    config: dict[str, object] = {}
    for o in last.values():
        *parents, leaf = o.path.split(".")
        node = config
        for key in parents:
            child = node.setdefault(key, {})
            assert isinstance(child, dict)
            node = child
        node[leaf] = o.value
    return config, list(last.values())


def overrides_print(arms: list[str], **settings: Any) -> None:
    """What the arms change of the product's defaults (kernel.config), each with its reason:
    those every arm shares once, then each arm's own."""
    made = {arm: arm_config(arm, **settings)[1] for arm in arms}
    shared = [o for o in made[arms[0]] if all(o in made[arm] for arm in arms[1:])]
    print("the arms' run configs: the product's defaults (kernel.config) but for these overrides", flush=True)
    for title, overrides in [("every arm", shared), *((arm, [o for o in made[arm] if o not in shared]) for arm in arms)]:
        print(f"  {title}:", flush=True)
        for o in overrides:
            print(f"    {o.path} = {o.value!r}  ({o.reason})", flush=True)


# ---------------------------------------------------------------- the server and raters


def server_start(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = free_port()
    env = {**os.environ, "DATABASE_URL": BENCH_DB, "REDIS_URL": "", "RFT_STORAGE_DIR": str(tmp / "storage"),
           "DJANGO_SETTINGS_MODULE": "rftweb.settings", "RFT_FAST_PASSWORD_HASHER": "1"}
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload",
                             "--skip-checks"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(url + "/health/", timeout=2).status_code < 500:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the bench server did not start; see {tmp / 'server.log'}")
        time.sleep(0.3)


ITEM = re.compile(r'<article class="item" id="item-(\d+)" data-assignment="(\d+)" data-experience="(\d+)".*?'
                  r'<pre class="prompt">(.*?)</pre>\s*<div class="completion">(.*?)</div>', re.DOTALL)


class Rater:
    """A person at the annotation page, scripted: logs in through the login form, and rates
    with the forms' own POSTs (CSRF token and session cookie included)."""

    def __init__(self, url: str, username: str, *, careful: bool, seed: int, rating: Rating = correct,
                 noise: float = 0.0) -> None:
        import httpx

        self.url, self.username, self.careful = url, username, careful
        # A careful rater rates by `rating` (bench/raters.py, or --rater's), each rating
        # replaced by a random one with probability `noise`; a careless one rates at random.
        self.rating, self.noise = rating, noise
        self.rng = random.Random(seed)
        self.http = httpx.Client(base_url=url, timeout=60, follow_redirects=False)
        self.http.get("/login/")
        r = self.http.post("/login/", data={"username": username, "password": PASSWORD, "next": "/",
                                            "csrfmiddlewaretoken": self.http.cookies["csrftoken"]})
        if r.status_code != 302:
            raise SystemExit(f"{username} could not log in ({r.status_code})")
        self.labels = 0
        self.retries = 0

    def post(self, path: str, data: dict[str, str]) -> Any:
        # A person whose submit fails (a busy shared database answers 500 now and then) submits
        # again; the services are idempotent per assignment, so nothing is counted twice.
        for attempt in range(6):
            r = self.http.post(path, data={**data, "csrfmiddlewaretoken": self.http.cookies["csrftoken"]},
                               headers={"HX-Request": "true"})
            if r.status_code < 500:
                return r
            self.retries += 1
            time.sleep(0.5 * (attempt + 1))
        return r

    def get(self, path: str) -> Any:
        for attempt in range(6):
            r = self.http.get(path)
            if r.status_code < 500:
                return r
            self.retries += 1
            time.sleep(0.5 * (attempt + 1))
        return r

    def score_for(self, prompt: str, completion: str) -> int:
        if not self.careful:
            return self.rng.randint(1, 5)
        score = self.rating(prompt, completion)
        if self.noise and self.rng.random() < self.noise:
            return self.rng.randint(1, 5)
        return score

    def rate(self, run_id: int, budget: int | None) -> int:
        """Open the annotation page, rate up to `budget` items (None: all), skip the rest."""
        done = 0
        while budget is None or done < budget:
            page = self.get(f"/runs/{run_id}/annotate/")
            page.raise_for_status()
            items = ITEM.findall(page.text)
            if not items:
                break
            for _, assignment, _exp, prompt, completion in items:
                if budget is not None and done >= budget:
                    self.post(f"/runs/{run_id}/annotate/items/{assignment}/skip/", {})
                    continue
                # What a person reads: the rendered completion's text (its markup dropped, the
                # completion's own characters, `<answer>` tags included, unescaped).
                shown = html.unescape(re.sub(r"<[^>]+>", "", completion)).strip()
                score = self.score_for(html.unescape(prompt), shown)
                r = self.post(f"/runs/{run_id}/annotate/items/{assignment}/rate/", {"score": str(score)})
                if r.status_code != 200:
                    raise SystemExit(f"rating failed: {r.status_code} {r.text[:200]}")
                done += 1
        self.labels += done
        return done


# ---------------------------------------------------------------- one arm


# The demo model's held-out problems the measurements read (the first `--heldout` of them).
HELDOUT = 200


def _accuracy(model_dir: str, tokenizer_dir: Path, heldout: int = HELDOUT) -> tuple[float, float]:
    """(expected, greedy) accuracy on the held-out problems. Gains are measured on the
    expected accuracy (the probability of sampling the right answer, what GRPO maximises):
    greedy accuracy over a few dozen steps is mostly trajectory luck (the learn helper's
    measurement, workers.models.demo.expected_accuracy)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.models.demo import DemoSettings, _problems, expected_accuracy, greedy_accuracy

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    problems = _problems(DemoSettings())[1][:heldout]
    expected = expected_accuracy(model=model, tokenizer=tokenizer, problems=problems)
    return expected, greedy_accuracy(model=model, tokenizer=tokenizer, problems=problems)


@dataclass(frozen=True)
class Sampled:
    """What a model's sampled completions on the held-out problems show."""

    # The share the rater rates 4 or 5: how often the model does what the rater prefers.
    share: float
    # The share whose `<answer>` is right, whatever the style around it.
    arithmetic: float
    # The share with no `<answer>` at all: where arithmetic falls because answers stop coming.
    untagged: float


def held_out_samples(model_dir: str, tokenizer_dir: Path, *, max_tokens: int, seed: int,
             samples: int = 4, heldout: int = HELDOUT) -> list[tuple[str, str]]:
    """(prompt, completion) for `samples` completions sampled per held-out problem
    (temperature 1, seeded): drawn once per model and read by every rater (`_rated`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.models.demo import DemoSettings, _encode, _problems

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    problems = [p for p in _problems(DemoSettings())[1][:heldout] for _ in range(samples)]
    torch.manual_seed(seed)
    out: list[tuple[str, str]] = []
    for start in range(0, len(problems), 200):
        chunk = problems[start:start + 200]
        prompts = [_encode(tokenizer, p)[0] for p in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            generated = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=True,
                                       temperature=1.0, top_k=0, top_p=1.0)
        for prompt_ids, row in zip(prompts, generated[:, width:].tolist(), strict=True):
            out.append((tokenizer.decode(prompt_ids, skip_special_tokens=True),
                        tokenizer.decode(row, skip_special_tokens=True)))
    return out


def samples_rated(samples: list[tuple[str, str]], rating: Rating) -> Sampled:
    """The preferred share (rated 4 or 5), arithmetic accuracy and untagged share of `samples`.
    The expected accuracy counts the warm-up's four forms word for word, so a run that learns a
    form of its own would read as losing arithmetic there; this reads the answer in any style."""
    from bench.raters import correct as right

    liked = sum(1 for prompt, completion in samples if rating(prompt, completion) >= 4)
    rightly = sum(1 for prompt, completion in samples if right(prompt, completion) == 5)
    untagged = sum(1 for _, completion in samples if ANSWER.search(completion) is None)
    n = max(1, len(samples))
    return Sampled(share=liked / n, arithmetic=rightly / n, untagged=untagged / n)


def _sampled(model_dir: str, tokenizer_dir: Path, rating: Rating, *, max_tokens: int, seed: int,
             samples: int = 4) -> Sampled:
    """`samples_rated` over `held_out_samples` of one model."""
    return samples_rated(held_out_samples(model_dir, tokenizer_dir, max_tokens=max_tokens, seed=seed, samples=samples), rating)


def _gold_mark(owner: Rater, run: Any) -> int:
    """The owner marks a few explored completions as gold through the Raters page form."""
    from apps.buffer.models import Experience

    marked = 0
    for exp_id, prompt, response in (Experience.objects.filter(run=run, is_expert=False).order_by("id")
                                     .values_list("pk", "prompt_text", "response_text")[:12]):
        score = owner.score_for(prompt, response)
        r = owner.post(f"/runs/{run.pk}/signal/raters/", {"experience": str(exp_id), "score": str(score)})
        if r.status_code not in (200, 302):
            raise SystemExit(f"gold marking failed: {r.status_code}")
        marked += 1
    return marked


@dataclass(frozen=True)
class StepProbe:
    """What one step of a `learned` arm did with its reward model, read from the rows the
    trainer is about to take (after the wait window's end): whether the gate let the reward
    model in and why, how many groups' advantages carry its scores, how large those are beside
    the format reward inside a group, and where the step's labels went."""

    version: int | None  # the newest reward-model version (None: none trained yet)
    accuracy: float | None  # its held-out (out-of-fold) pairwise accuracy
    heldout: int  # on how many held-out pairs
    bound: float | None  # the gate's lower bound of that accuracy
    open: bool  # the gate let a version score rewards this step
    weight: float  # the share of its calibrated score a reward carries (feedback.rm_gate evidence; 1 under bound)
    slope: float | None  # the calibration's slope (raw score -> the human scale) of the version in use
    groups: int
    rm_groups: int  # groups with at least one member rewarded by the reward model
    signal_groups: int  # groups whose reward-model rewards differ by >= SIGNAL (its signal reaches the advantages)
    rm_sd: float | None  # median over rm groups of the within-group sd of w_rm x calibrated score
    format_sd: float  # median over groups of the within-group sd of w_auto x format reward (all members)
    batch_sd: float  # the sd of every reward in the batch (the advantages' divisor under batch scaling)
    labels: dict[str, int]  # this step's ratings by hand-out source (rule, random, gold, arrival...)
    pairs_apart: int  # sibling pairs rated this step with different ratings (what teaches the reward model)
    pairs_alike: int  # sibling pairs rated alike


# A group's reward-model rewards differing by less than this (an eighth of the human scale,
# half a rating step) do not move its advantages beyond the format reward's and the noise.
SIGNAL = 0.125


def _sd(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return float((sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5)  # float ** float is Any in typeshed


def _step_probe(run: Any, *, after_assignment: int) -> tuple[StepProbe, int]:
    """The probe of the step about to train, and the newest assignment id (the next step's
    labels are the assignments after it)."""
    from collections import defaultdict

    from apps.buffer.models import Experience
    from apps.feedback.reward_model.versions import (reward_model_latest, reward_model_lower_bound, reward_model_usable,
                                       reward_model_weight, rm_reward_score)
    from apps.feedback.models import Assignment
    from apps.rewards.models import RewardModel, RewardModelScore
    from kernel.fold import reward_learned

    feedback_cfg = run.cfg.feedback
    latest = reward_model_latest(run=run)
    usable = reward_model_usable(run=run)
    rows = list(Experience.objects.filter(run=run, is_expert=False, status=Experience.Status.READY)
                .values("pk", "group_id", "reward", "auto_reward", "human_reward"))
    weight = reward_model_weight(run=run, rm=usable) if usable is not None else 0.0
    # A group folds when a usable version first scores it (before people rate, by the version
    # then newest), so a member's reward may come from any version: each is checked.
    versions = {rm.pk: rm for rm in RewardModel.objects.filter(run=run)}
    weights = {pk: reward_model_weight(run=run, rm=rm) for pk, rm in versions.items()}
    scored: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for exp_id, rm_id, score in RewardModelScore.objects.filter(
            experience_id__in=[r["pk"] for r in rows]).values_list("experience_id", "reward_model_id", "score"):
        scored[exp_id].append((rm_id, score))
    groups: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        groups[row["group_id"]].append(row)
    rm_groups = signal_groups = pairs_apart = pairs_alike = 0
    rm_sds: list[float] = []
    format_sds: list[float] = []
    for members in groups.values():
        rm_parts = []
        for m in members:
            if m["human_reward"] is not None or m["reward"] is None:
                continue
            for rm_id, score in scored.get(m["pk"], []):
                part = rm_reward_score(rm=versions[rm_id], score=score, weight=weights[rm_id])
                # Rewarded by the reward model: its reward is the learned fold of this score.
                if abs(m["reward"] - reward_learned(feedback_cfg=feedback_cfg, auto=m["auto_reward"], rm=part)) < 1e-6:
                    rm_parts.append(feedback_cfg.w_rm * part)
                    break
        if rm_parts:
            rm_groups += 1
            rm_sds.append(_sd(rm_parts))
            signal_groups += max(rm_parts) - min(rm_parts) >= SIGNAL
        format_sds.append(_sd([feedback_cfg.w_auto * (m["auto_reward"] or 0.0) for m in members]))
        rated = [m["human_reward"] for m in members if m["human_reward"] is not None]
        for i, a in enumerate(rated):
            for b in rated[i + 1:]:
                if abs(a - b) > 1e-9:
                    pairs_apart += 1
                else:
                    pairs_alike += 1
    done = list(Assignment.objects.filter(run=run, pk__gt=after_assignment).values_list("pk", "source", "status"))
    labels: dict[str, int] = defaultdict(int)
    for _, source, status in done:
        if status == Assignment.Status.DONE:
            labels[source] += 1
    probe = StepProbe(
        version=latest.version if latest else None, accuracy=latest.accuracy if latest else None,
        heldout=latest.pairs_heldout if latest else 0,
        bound=reward_model_lower_bound(run=run, rm=latest) if latest else None, open=usable is not None, weight=weight,
        slope=usable.scale if usable else None, groups=len(groups), rm_groups=rm_groups, signal_groups=signal_groups,
        rm_sd=median(rm_sds) if rm_sds else None, format_sd=median(format_sds),
        batch_sd=_sd([r["reward"] for r in rows if r["reward"] is not None]), labels=dict(labels),
        pairs_apart=pairs_apart, pairs_alike=pairs_alike)
    return probe, max([after_assignment] + [pk for pk, _, _ in done])


def _probe_line(p: StepProbe) -> str:
    gate = "-" if p.version is None else (
        f"v{p.version} {p.accuracy or 0:.2f}/{p.heldout} lb {p.bound or 0:.2f} "
        + (f"OPEN x{p.weight:.2f}" if p.open else "shut"))
    rm_sd = "-" if p.rm_sd is None else f"{p.rm_sd:.3f}"
    slope = "-" if p.slope is None else f"{p.slope:.2f}"
    budget = " ".join(f"{k} {v}" for k, v in sorted(p.labels.items())) or "none"
    return (f"gate {gate}  slope {slope}  groups rm {p.rm_groups}/{p.groups} signal {p.signal_groups}  "
            f"sd rm {rm_sd} format {p.format_sd:.3f} batch {p.batch_sd:.3f}  labels {budget}  "
            f"pairs apart {p.pairs_apart} alike {p.pairs_alike}")


def run_arm(arm: str, *, url: str, seed: int, steps: int, tasks: int, repeat: int, lr: float, share: float,
            demo: Path, owner_user: Any, base_acc: tuple[float, float], rm_base: str | None = None,
            min_rm_accuracy: float = 0.75, scale_rewards: str = "batch", rm_kind: str = "head",
            min_rm_heldout_pairs: int = 0, rm_confidence: float = 0.95, w_auto: float = 0.2,
            crossval_folds: int = 4, pairs: bool = True, trust: bool = True, rating: Rating = correct,
            noise: float = 0.0, noisy_raters: int = 2, random_share: float = 0.5, max_tokens: int = 32,
            verifier: bool = False, beta: float = 0.0, rm_gate: str = RM_GATE_DEFAULT, selection: str = "active",
            heldout: int = HELDOUT) -> dict[str, Any]:
    """One arm on one seed: the run's figures and its final model's held-out samples
    (`samples`, rated by each rater afterwards: `_measured`); a `learned` arm's step probes."""
    from django.contrib.auth.models import User
    from django.utils import timezone

    from apps.buffer.importers import taskset_import
    from apps.buffer.models import Experience
    from apps.buffer.services import task_attempts_create
    from apps.feedback.models import Feedback
    from apps.feedback.reward_model.versions import reward_model_usable
    from apps.rewards.models import RewardModel
    from apps.runs.models import Metric, ModelVersion, Run, RunMember
    from apps.runs.ports import run_view_of
    from apps.runs.services import run_create
    from workers.models.demo import TASKSET_FILE
    from workers.explore.explorer import explore
    from workers.reward.trainer import reward_model_score_run, reward_model_train_run
    from workers.trainer.step import trainer_step

    taskset = taskset_import(name=f"steering {arm} {seed}", path=demo / TASKSET_FILE, owner=owner_user)
    run = run_create(name=f"steering {arm} s{seed}", owner=owner_user, taskset=taskset,
                     config=arm_config(arm, model=str(demo), steps=steps, tasks=tasks, repeat=repeat, seed=seed, lr=lr,
                                    rm_base=rm_base, min_rm_accuracy=min_rm_accuracy, scale_rewards=scale_rewards,
                                    rm_kind=rm_kind, min_rm_heldout_pairs=min_rm_heldout_pairs,
                                    rm_confidence=rm_confidence, w_auto=w_auto, crossval_folds=crossval_folds,
                                    pairs=pairs, trust=trust, max_tokens=max_tokens, verifier=verifier,
                                    beta=beta, rm_gate=rm_gate, selection=selection)[0])
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    for epoch in range(run.cfg.epochs):
        task_attempts_create(run=run, epoch=epoch)
    # noisy: `noisy_raters` people, `random_share` of them (at least one careful) answering at
    # random, the careless ones last (the turns at the page rotate by step).
    count = max(2, noisy_raters) if arm == "noisy" else 1
    careless = min(count - 1, round(random_share * count)) if arm == "noisy" else 0
    names = [f"r{run.pk}{chr(ord('a') + i)}" for i in range(count)]
    for name in names:
        RunMember.objects.create(run=run, user=User.objects.create_user(username=name, password=PASSWORD),
                                 role=RunMember.Role.ANNOTATOR)
    raters = [Rater(url, name, careful=i < count - careless, seed=seed * 100 + i, rating=rating, noise=noise)
              for i, name in enumerate(names)]
    owner = Rater(url, owner_user.username, careful=True, seed=seed, rating=rating)
    rm_seconds = 0.0
    usable_from: int | None = None
    probes: list[StepProbe] = []
    last_assignment = 0
    started = time.perf_counter()
    for step in range(1, steps + 1):
        summary = explore(run_id=run.pk, step=step, worker="bench-explorer")
        if not summary.get("tasks"):
            raise SystemExit(f"{arm}: explore step {step} found no tasks: {summary}")
        if arm == "noisy" and step == 1:
            _gold_mark(owner, run)
        rollouts = tasks * repeat
        if run.cfg.reward_model.enabled:
            # The newest version scores the new rollouts before people see them, as the
            # reward beat does in a deployment: the selection rule ranks by those scores.
            t = time.perf_counter()
            reward_model_score_run(run=run_view_of(run))
            rm_seconds += time.perf_counter() - t
        if arm in ("auto", "format"):
            pass
        elif arm == "all":
            for r in raters:
                r.rate(run.pk, None)
        else:
            # The step's budget is the people's time: the raters take turns at the page (who
            # comes first alternates by step) and each rates what the server hands them until
            # the budget is spent. How much each one gets is the server's hand-out (the
            # selection rule, and `feedback.trust` by measured trust), not a split by the bench,
            # which does not know who answers at random. Two raters both handed items share the
            # budget about evenly over the steps, as round 9's blind 4 / 2 split did.
            left = max(1, round(share * rollouts))
            turn = raters[step % len(raters):] + raters[:step % len(raters)]
            while left > 0:
                got = 0
                for r in turn:
                    if left > 0:
                        done = r.rate(run.pk, left)
                        left -= done
                        got += done
                if got == 0:
                    break  # nothing left to hand out to anyone
        if run.cfg.reward_model.enabled:
            t = time.perf_counter()
            reward_model_train_run(run=run_view_of(run))
            reward_model_score_run(run=run_view_of(run))
            rm_seconds += time.perf_counter() - t
            if usable_from is None and reward_model_usable(run=run) is not None:
                usable_from = step
        # The wait window ends after the raters' turn (the fallback: the format reward); this
        # arm's run's windows only, whatever else the database holds.
        wait_windows_end(run_ids=[run.pk], now=timezone.now() + timedelta(days=1))
        if run.cfg.feedback.mode == "learned":
            probe, last_assignment = _step_probe(run, after_assignment=last_assignment)
            probes.append(probe)
        result = trainer_step(run_id=run.pk, step=step, worker="bench-trainer")
        if result.get("status") != "trained":
            raise SystemExit(f"{arm}: train step {step}: {result}")
        rm = RewardModel.objects.filter(run=run).order_by("-version").first()
        print(f"  {arm} s{seed} step {step:3d}  labels {Feedback.objects.filter(run=run, kind='rating').count():4d}"
              f"  rm {('v%d %.2f/%d' % (rm.version, rm.accuracy or 0, rm.pairs_heldout)) if rm else '-':>12}"
              f" random {_rm_random(rm):>9}"
              f"{'*' if usable_from else ' '}"
              f"  {time.perf_counter() - started:6.0f} s  load {os.getloadavg()[0]:.1f}"
              + (f"\n      {_probe_line(probes[-1])}" if probes and len(probes) == step else ""), flush=True)
    checkpoint = ModelVersion.objects.get(run=run, train_step=steps).checkpoint
    acc, greedy = _accuracy(checkpoint, demo, heldout)
    samples = held_out_samples(checkpoint, demo, max_tokens=max_tokens, seed=seed, heldout=heldout)
    rm = RewardModel.objects.filter(run=run).order_by("-version").first()
    labels = Feedback.objects.filter(run=run, kind="rating").count()
    skipped = Metric.objects.filter(run=run, name="train/skipped_no_signal", value=1.0).count()
    from apps.rewards.models import GoldItem

    gold_ids = set(GoldItem.objects.filter(run=run).values_list("experience_id", flat=True))
    # Where the budget went: each rater's labels, and how many of them were on gold items.
    by_rater = {(f"careful {r.username}" if r.careful else f"random {r.username}"): (
        Feedback.objects.filter(run=run, kind="rating", author__username=r.username).count(),
        Feedback.objects.filter(run=run, kind="rating", author__username=r.username,
                                experience_id__in=gold_ids).count()) for r in raters}
    return {"by_rater": by_rater, "usable_from": usable_from, "skipped": skipped,"arm": arm, "seed": seed, "acc": acc, "gain": acc - base_acc[0], "greedy": greedy,
            "greedy_gain": greedy - base_acc[1], "labels": labels,
            "rollouts": Experience.objects.filter(run=run, is_expert=False).count(),
            "rm_acc": rm.accuracy if rm else None, "rm_versions": rm.version if rm else 0,
            # The unbiased figure: accuracy on the pairs only the random share handed out.
            "rm_acc_random": rm.accuracy_random if rm else None, "rm_pairs_random": (rm.pairs_random or 0) if rm else 0,
            "rm_heldout": rm.pairs_heldout if rm else 0,
            "rm_pairs": 0 if rm is None else (
                rm.pairs_heldout if crossval_folds >= 2 else rm.pairs_train + rm.pairs_heldout),
            "samples": samples, "probes": probes,
            "seconds": time.perf_counter() - started, "rm_seconds": rm_seconds, "load": os.getloadavg()[0]}


def _rm_random(rm: Any) -> str:
    """A version's accuracy on the random share's pairs and their count, '-' when none."""
    if rm is None or rm.accuracy_random is None:
        return "-"
    return f"{rm.accuracy_random:.2f}/{rm.pairs_random}"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


@dataclass(frozen=True)
class RaterSpec:
    """A preference the careful raters rate by: its name in the bench's lines, the rating, the
    page's noise (a drawn preference's own level, with --noise beside it) and what it is."""

    name: str
    rating: Rating
    noise: float
    description: str
    mixed: bool  # the preference mixes correctness in (the issue's mixed style + correctness)


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


def _measured(raw: dict[str, Any], rater: RaterSpec, base: Sampled) -> dict[str, Any]:
    """An arm's result read by one rater: its preferred share, arithmetic and untagged share
    over the arm's final samples, against the base's for the same rater and seed."""
    after = samples_rated(raw["samples"], rater.rating)
    return {**raw, "rater": rater.name, "share": after.share, "share_gain": after.share - base.share,
            "arithmetic": after.arithmetic, "arithmetic_gain": after.arithmetic - base.arithmetic,
            "untagged": after.untagged}


def _printable(result: dict[str, Any]) -> dict[str, Any]:
    """A result without its samples (800 completions) and step probes, for the RESULT line."""
    return {k: v for k, v in result.items() if k not in ("samples", "probes", "settings")}


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
    gain = {a: _mean([r["gain"] for r in rs]) for a, rs in by_arm.items()}
    labels = {a: _mean([r["labels"] for r in rs]) for a, rs in by_arm.items()}
    share_gain = {a: _mean([r["share_gain"] for r in rs]) for a, rs in by_arm.items()}
    arithmetic = {a: _mean([r["arithmetic"] for r in rs]) for a, rs in by_arm.items()}
    print(f"rater {rater.name} (noise {rater.noise:g}): preferred share gain per arm (base "
          f"{_mean([b.share for b in base]):.3f}): " + ", ".join(f"{a} {g:+.3f}" for a, g in share_gain.items())
          + "; sampled arithmetic accuracy beside (base " + f"{_mean([b.arithmetic for b in base]):.3f}): "
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
          f"{_mean(rm_accs):.2f} (>= 0.8) on "
          f"{sum(r['rm_heldout'] for r in results if r['arm'] == 'rm10')} held-out pairs, on the random share only "
          f"{_mean(rm_randoms):.2f} on {sum(r['rm_pairs_random'] for r in results if r['arm'] == 'rm10')}; "
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


def _family_summary(raters: list[RaterSpec], results: list[dict[str, Any]], *, seeds: list[int],
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


# ---------------------------------------------------------------- the results file (--out)

# What a result depends on beyond its (preference, seed, arm): a file's rows are resumed only
# under the same settings (a row run otherwise would mix into the distribution unseen).
SETTINGS = ("steps", "tasks", "repeat", "lr", "share", "rm_base", "min_rm_accuracy", "rm_kind", "noise",
            "random_raters", "noisy_raters", "max_tokens", "min_rm_heldout_pairs", "rm_confidence", "w_auto",
            "crossval_folds", "pairs", "trust", "verifier", "beta", "rm_gate", "scale_rewards", "demo_styled")
UNRATED = ("format", "auto")  # arms without people: run once per seed, read by every preference


class Journal:
    """The results file: one JSON line per (preference, seed, arm) result, appended (and flushed
    to disk) as soon as that arm is done, so a run stopped at any time keeps what finished;
    `--resume` reads it back and the loop skips what it holds. Each line carries the arm's final
    samples (a later preference reads an unrated arm's), its step probes, the base's figures for
    its preference and seed, the preference written out and the run's settings."""

    def __init__(self, path: Path | None, settings: dict[str, Any]) -> None:
        self.path, self.settings = path, settings
        self.done: dict[tuple[str, int, str], dict[str, Any]] = {}

    def read(self, raters: list[RaterSpec]) -> None:
        """Load the file's rows; a row under other settings, or a preference of the same name
        written out otherwise, is refused (ValueError); a line cut short is dropped."""
        if self.path is None or not self.path.exists():
            return
        import json
        from dataclasses import fields

        described = {r.name: r.description for r in raters}
        lines = self.path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                # Cut short where a run was killed while writing it: that arm did not finish.
                print(f"{self.path}: line {number} is cut short (a run stopped while writing it): skipped")
                continue
            if row.get("settings") != self.settings:
                other = {k: v for k, v in (row.get("settings") or {}).items() if self.settings.get(k) != v}
                raise ValueError(f"{self.path}: line {number} was run with other settings ({other})")
            if row["rater"] in described and row["description"] != described[row["rater"]]:
                raise ValueError(f"{self.path}: line {number}'s {row['rater']} is another preference "
                                 f"({row['description']})")
            names = {f.name for f in fields(StepProbe)}
            row["probes"] = [StepProbe(**{k: v for k, v in p.items() if k in names}) for p in row["probes"]]
            row["samples"] = [tuple(x) for x in row["samples"]]
            self.done[row["rater"], row["seed"], row["arm"]] = row

    def unrated(self, seed: int, arm: str) -> dict[str, Any] | None:
        """A finished arm without people on `seed`, whichever preference it was read by."""
        return next((row for (_, s, a), row in self.done.items() if s == seed and a == arm), None)

    def add(self, result: dict[str, Any], rater: RaterSpec, base: Sampled) -> None:
        import json
        from dataclasses import asdict

        row = {**result, "settings": self.settings, "description": rater.description, "base": asdict(base)}
        self.done[result["rater"], result["seed"], result["arm"]] = row
        if self.path is None:
            return
        line = json.dumps({**row, "probes": [asdict(p) for p in row.get("probes") or []]})
        with self.path.open("ab+") as f:  # appends go to the end whatever was read
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    f.write(b"\n")  # after a line cut short by a kill, a line of its own
            f.write((line + "\n").encode())
            f.flush()
            os.fsync(f.fileno())


def _seed_run(seed: int, *, raters: list[RaterSpec], arms: list[str], base: dict[tuple[str, int], Sampled],
              journal: Journal, run: Any) -> list[dict[str, Any]]:
    """Every arm of every preference on one seed, what the journal holds skipped: the arms
    without people first (once for the seed, kept at once), then each preference's arms in
    turn, so that each (preference, seed) pair is complete before the next starts. `run(arm,
    rating, noise)` runs one arm (run_arm)."""
    resumed = set(journal.done)
    for arm in arms:
        if arm in UNRATED and journal.unrated(seed, arm) is None:
            first = raters[0]
            journal.add(_measured(run(arm, first.rating, 0.0), first, base[first.name, seed]), first,
                        base[first.name, seed])
            print(f"RESULT {_printable(journal.done[first.name, seed, arm])}", flush=True)
    results = []
    for r in raters:
        for arm in arms:
            row = journal.done.get((r.name, seed, arm))
            if row is None:
                raw = (journal.unrated(seed, arm) if arm in UNRATED else None) or run(arm, r.rating, r.noise)
                journal.add(_measured(raw, r, base[r.name, seed]), r, base[r.name, seed])
                row = journal.done[r.name, seed, arm]
                print(f"RESULT {_printable(row)}", flush=True)
            elif (r.name, seed, arm) in resumed:
                print(f"RESUMED {r.name} s{seed} {arm} (from {journal.path})", flush=True)
            results.append(row)
    return results


def report_from(journal: Journal, *, raters: list[RaterSpec], arms: list[str],
                seeds: list[int]) -> tuple[list[dict[str, Any]], dict[tuple[str, int], Sampled]]:
    """The results a journal holds for these preferences, seeds and arms, in the bench's order,
    and the base's figures per (preference, seed) as the rows recorded them."""
    results = [journal.done[r.name, s, a] for s in seeds for r in raters for a in arms if (r.name, s, a) in journal.done]
    base = {(row["rater"], row["seed"]): Sampled(**row["base"]) for row in results}
    return results, base


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


def main() -> None:
    parser = argparse.ArgumentParser()
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
        _report(held, raters=raters, arms=arms, seeds=seeds, base=held_base, args=args)
        return
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
    base_acc = _accuracy(str(demo), demo, args.heldout)
    # The base's samples, drawn once per seed and read by every rater.
    base_samples = {seed: held_out_samples(str(demo), demo, max_tokens=args.max_tokens, seed=seed, heldout=args.heldout)
                    for seed in seeds}
    base = {(r.name, seed): samples_rated(base_samples[seed], r.rating) for r in raters for seed in seeds}
    for r in raters:
        if len(raters) > 1:
            print(f"preference {r.description}", flush=True)
        print(f"base expected accuracy {base_acc[0]:.4f}, greedy {base_acc[1]:.3f}, sampled arithmetic "
              f"{_mean([base[r.name, s].arithmetic for s in seeds]):.3f}, rater {r.name}'s preferred "
              f"share {_mean([base[r.name, s].share for s in seeds]):.3f}, untagged "
              f"{_mean([base[r.name, s].untagged for s in seeds]):.3f} (demo model {demo}, styled warm-up share "
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
                results += _seed_run(seed, raters=raters, arms=arms, base=base, journal=journal,
                                     run=lambda arm, rating, noise: run_arm(arm, rating=rating, noise=noise, **common))
    finally:
        processes_stop([proc])
        # Kept for a look after the run (the demo model may live elsewhere: BENCH_DEMO_DIR).
        (ROOT / ".cache").mkdir(exist_ok=True)
        shutil.copy(tmp / "server.log", ROOT / ".cache" / "bench-steering-server.log")
        shutil.rmtree(tmp, ignore_errors=True)
    _report(results, raters=raters, arms=arms, seeds=seeds, base=base, args=args)


def _report(results: list[dict[str, Any]], *, raters: list[RaterSpec], arms: list[str], seeds: list[int],
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
        _family_summary(raters, results, seeds=seeds, args=args)


if __name__ == "__main__":
    main()
