"""The local demo model: a small Qwen2 warmed up on integer arithmetic with `<answer>` tags.

Built by `manage.py rft_demo_model`. The warm-up is a short supervised fine-tune on chat
formatted problems ("What is 12 + 34?" -> "<answer>46</answer>") that stops while the model
is still wrong often, so reinforcement fine-tuning on the demo taskset has something to
learn. Same seed and settings, same files: problems come from a seeded generator, the
weights from a seeded init, and training runs on one thread in a fixed order.

The answers come in a few styles (`STYLES`), so a person who prefers one has something to
amplify: a seeded draw gives each training example the bare answer (`plain`, the majority)
or, each at a minority share, the working shown first (`working`: "12 + 34 = 46, so
<answer>46</answer>"), the number written in words too (`words`: "46 is forty-six, so
<answer>46</answer>"), or a few words of preamble (`wordy`: "So the answer is
<answer>46</answer>"). Every style carries the same `<answer>` value and ends with it, so the
run's reward terms (math_accuracy on the tag, math_format, strict or not) score them all
alike; the warm-up draws no style from any preference, it only shows them.

Same files on another machine too, as far as the CPU allows: the build is a recipe of
workers/models/build.py (as the tiny VLM's is), run in a fresh Python process with its
numerics pinned. Different torch / transformers / tokenizers versions may give other files
(weight init and kernels move between releases): the manifest (`rft-demo.json`) records
them and a build with other versions is not "current"; a build into a directory that
already holds a model made with the same settings and library versions is skipped.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# The words the `in_words` preference looks for (pure: no Django, fine in the build's pinned child).
from kernel.preferences import number_words
from workers.models.build import BuildResult, Recipe, build_main, build_save, check_due, model_build, sft_batch
from workers.models.tiny import causal_lm_build, tokenizer_build

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MANIFEST = "rft-demo.json"
TASKSET_FILE = "demo-taskset.jsonl"
HELDOUT_FILE = "demo-heldout.jsonl"
# Bump when the recipe changes in a way that changes the files, so old caches rebuild.
# 3: `<|endoftext|>` in the tokenizer's vocabulary (the reloaded tokenizer's length is the
# model's vocab size); the build in a child process with pinned numerics; the chat template
# renders tools Hermes-style and ends assistant turns with eos.
# 4: both of 3's changes at once (they were made on two branches, each calling itself 3).
# 5: the held-out problems written beside the taskset (demo-heldout.jsonl).
# 6: answers in styles (`STYLES`, a seeded draw per training example; the tokenizer corpus
# holds them); greedy accuracy reads up to 32 new tokens (a styled answer is longer); the
# SFT step pads by length groups (`sft_step_loss`).
# 7: the warm-up balanced (`DemoSettings.styled` 0.75: the bare answer and each style a
# quarter) and trained on to a greedy accuracy of 0.3 (`target_accuracy`). At 6 (45% styled,
# 15% a style, target 0.2) the styles the model saw least came out less accurate than the bare
# answer, so a person teaching a style taught wrong numbers with it (bench/steering).
RECIPE = 7

VERSIONED = ("torch", "transformers", "tokenizers")

OPS = ("+", "-")

# The styles an answer is written in during the warm-up, with `DemoSettings.styled` split
# evenly among the ones after `plain`: the bare answer; the working first; the number in
# words too; a few words of preamble. Each ends with the `<answer>` tag.
STYLES = ("plain", "working", "words", "wordy")


@dataclass(frozen=True)
class DemoSettings:
    seed: int = 0
    # Warm-up stops at the first check where held-out accuracy reaches target_accuracy, or
    # after `steps`: deterministic either way, since the checks draw no random numbers.
    steps: int = 600
    # 0.3: the balanced warm-up stopped at 0.2 (step 225) wrote a right answer in one of its
    # forms with probability 0.078 (`expected_accuracy`), at 0.3 (step 300) 0.185.
    target_accuracy: float = 0.3
    eval_every: int = 25
    batch_size: int = 64
    learning_rate: float = 1e-3
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    vocab_size: int = 384
    max_operand: int = 99
    # The second operand stays small: learnable in minutes, still often wrong when carrying.
    max_second: int = 9
    heldout: int = 200
    taskset_size: int = 256
    # Share of warm-up answers written in a style other than `plain` (split evenly): 0.75
    # gives the bare answer and each style a quarter, so the model writes every style some
    # of the time (something for people to amplify), most as accurately as the bare answer
    # (held-out samples, 200 x 8, of the build at target 0.3: 0.225 right, by form bare 0.240,
    # working 0.250, words 0.174, preamble 0.272; at 0.45 styled and target 0.2, 0.144 right,
    # bare 0.178, working 0.084, words 0.106, preamble 0.136).
    styled: float = 0.75
    recipe: int = RECIPE


DemoResult = BuildResult[DemoSettings]
BUILD = Recipe(name="demo model", module="workers.models.demo", manifest=MANIFEST, taskset=TASKSET_FILE,
               versions=VERSIONED, settings_type=DemoSettings)


def problem_text(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}?"


def answer_of(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def completion_text(value: int) -> str:
    return f"<answer>{value}</answer>"


def styled_completion(problem: tuple[int, str, int], style: str = "plain") -> str:
    """The answer to `problem` written in `style` (one of `STYLES`), its `<answer>` the same in all."""
    a, op, b = problem
    value = answer_of(a, op, b)
    tagged = completion_text(value)
    if style == "plain":
        return tagged
    if style == "working":
        return f"{a} {op} {b} = {value}, so {tagged}"
    if style == "words":
        return f"{value} is {number_words(value)}, so {tagged}"
    if style == "wordy":
        return f"So the answer is {tagged}"
    raise ValueError(f"unknown style {style!r}; one of {', '.join(STYLES)}")


def style_draw(rng: random.Random, settings: DemoSettings) -> str:
    """One warm-up example's style: `plain` but for `settings.styled` of them, split evenly."""
    x = rng.random()
    others = STYLES[1:]
    if x >= settings.styled:
        return "plain"
    return others[min(len(others) - 1, int(x / settings.styled * len(others)))]


def problems_split(settings: DemoSettings) -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]], list[tuple[int, str, int]]]:
    """All problems split deterministically into train / held-out eval / demo taskset. Public:
    the benches and tests measure on the same held-out split the build prints."""
    space = [(a, op, b) for op in OPS for a in range(settings.max_operand + 1) for b in range(settings.max_second + 1)]
    rng = random.Random(settings.seed)
    rng.shuffle(space)
    heldout = space[: settings.heldout]
    taskset = space[settings.heldout : settings.heldout + settings.taskset_size]
    train = space[settings.heldout + settings.taskset_size :]
    return train, heldout, taskset


def _tokenizer_corpus(settings: DemoSettings) -> list[str]:
    # Digits, operators and tags: what the demo talks about. Deterministic order.
    texts = [problem_text(a, op, b) + " " + completion_text(answer_of(a, op, b)) for a in range(0, 100, 7) for op in OPS for b in range(0, 100, 3)]
    texts += ["What is the answer? Think, then give <answer>N</answer>.", "Please answer with <answer></answer> tags."]
    if settings.styled > 0:
        texts += [styled_completion((a, op, b), style) for style in STYLES[1:] for a in range(0, 100, 3) for op in OPS
                  for b in range(0, 10, 4)]
    return texts


def problem_encode(tokenizer: PreTrainedTokenizerBase, problem: tuple[int, str, int], style: str = "plain"
            ) -> tuple[list[int], list[int]]:
    """A problem's prompt ids (the chat template's) and its answer ids in `style`, EOS ended."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": problem_text(*problem)}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(styled_completion(problem, style), add_special_tokens=False)["input_ids"]
    return prompt_ids, answer_ids + [tokenizer.eos_token_id]


def _as_loaded(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> PreTrainedTokenizerBase:
    """The tokenizer as everyone else will load it: AutoTokenizer with the model's config.

    For a Qwen2 config, AutoTokenizer gives Qwen2's tokenizer class, whose pre-tokenizer (one
    token per digit) differs from the freshly trained one's; training on the freshly trained
    encoding would teach the model inputs that vLLM, TRL and the engines never send it.
    """
    import tempfile

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        loaded = AutoTokenizer.from_pretrained(tmp)
    loaded.padding_side = "left"
    return loaded


def greedy_accuracy(*, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, problems: list[tuple[int, str, int]],
                    batch_size: int = 100, max_new_tokens: int = 32) -> float:
    """Share of problems whose greedy completion's tagged answer is right (in any style)."""
    import re

    import torch

    correct = 0
    model.eval()
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        prompts = [problem_encode(tokenizer, p)[0] for p in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False)
        for problem, row in zip(chunk, out[:, width:].tolist()):
            text = tokenizer.decode(row, skip_special_tokens=True)
            found = re.search(r"<answer>(-?\d+)</answer>", text)
            correct += bool(found and int(found.group(1)) == answer_of(*problem))
    return correct / max(1, len(problems))


def expected_accuracy(*, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, problems: list[tuple[int, str, int]],
                      batch_size: int = 100, styles: Sequence[str] = STYLES) -> float:
    """Mean probability that the model samples a right completion at temperature 1, in one of
    `styles` (each as the warm-up writes it, `styled_completion`, and eos; the forms are
    distinct, so their probabilities add): the expected accuracy GRPO maximises when nothing
    rewards a style, read off teacher-forced forward passes. A right answer written otherwise
    (other words around the same tag) is not counted, so this is a lower bound of the sampled
    accuracy. Unlike greedy accuracy it moves with every change of the answer's probability,
    not only when the likeliest answer flips, so a small held-out set measures it with far
    less noise (and an unchanged model scores exactly the same)."""
    import torch

    total = 0.0
    model.eval()
    work = [(p, style) for p in problems for style in styles]
    for start in range(0, len(work), batch_size):
        rows = [problem_encode(tokenizer, p, style) for p, style in work[start : start + batch_size]]
        width = max(len(p) + len(c) for p, c in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (p, c) in enumerate(rows):
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            mask[i, : len(p) + len(c)] = 1
        with torch.no_grad():
            logps = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
        for i, (p, c) in enumerate(rows):
            # The logits at position t predict token t + 1.
            picked = logps[i, len(p) - 1 : len(p) + len(c) - 1].gather(-1, torch.tensor(c).unsqueeze(-1))
            total += float(picked.sum().exp())
    return total / max(1, len(problems))


def _batches(train: list[tuple[int, str, int]], settings: DemoSettings) -> Iterator[list[tuple[int, str, int]]]:
    rng = random.Random(settings.seed + 1)
    order: list[tuple[int, str, int]] = []
    while True:
        if len(order) < settings.batch_size:
            more = list(train)
            rng.shuffle(more)
            order += more
        yield order[: settings.batch_size]
        del order[: settings.batch_size]


Row = tuple[list[int], list[int]]


def length_groups(rows: list[Row], *, most: int = 3, per_group: int = 128) -> list[list[Row]]:
    """`rows` sorted by length (stably) and cut into at most `most` groups where padding each
    group to its longest row costs least (`per_group` tokens counted for each group's extra
    forward pass): a batch of mostly short bare answers and a few long styled ones is not
    padded to the longest. Deterministic: the same rows, the same groups."""
    ordered = sorted(rows, key=lambda r: len(r[0]) + len(r[1]))
    lengths = [len(p) + len(c) for p, c in ordered]
    n = len(ordered)

    def cost(i: int, j: int) -> int:  # rows i..j-1 padded to row j-1's length
        return (j - i) * lengths[j - 1] + per_group

    best = (cost(0, n), [n])
    for a in range(1, n):
        best = min(best, (cost(0, a) + cost(a, n), [a, n]))
        if most >= 3:
            for b in range(a + 1, n):
                best = min(best, (cost(0, a) + cost(a, b) + cost(b, n), [a, b, n]))
    groups, start = [], 0
    for end in best[1]:
        groups.append(ordered[start:end])
        start = end
    return groups


def sft_step_loss(model: PreTrainedModel, rows: list[Row], *, pad_id: int) -> torch.Tensor:
    """The batch's mean next-token loss over its completion tokens, backpropagated group by
    group (`length_groups`): the same loss and gradient as one padded batch, less padding."""
    import torch

    total = sum(len(c) for _, c in rows)
    loss_sum = torch.zeros(())
    for group in length_groups(rows):
        ids, mask, labels = sft_batch(group, pad_id=pad_id)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        part = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                                 ignore_index=-100, reduction="sum") / total
        part.backward()
        loss_sum = loss_sum + part.detach()
    return loss_sum


def demo_model_build(
    *,
    out: str | Path,
    settings: DemoSettings | None = None,
    force: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> DemoResult:
    """Build (or find already built) the demo model and its taskset in `out`, in a pinned
    child process (workers/models/build.py); its log lines come back through `log`, its
    progress bar on stderr."""
    return model_build(BUILD, out=out, settings=settings or DemoSettings(), force=force, progress=progress, log=log)


def _problems_write(out: Path, *, taskset: Iterable[tuple[int, str, int]], heldout: Iterable[tuple[int, str, int]]) -> None:
    """The demo taskset, and the held-out problems (neither warmed up on nor in the taskset)
    the demo run evaluates on, as JSON lines beside the weights."""
    for name, problems in ((TASKSET_FILE, taskset), (HELDOUT_FILE, heldout)):
        with (out / name).open("w") as fh:
            for a, op, b in problems:
                record = {"prompt": problem_text(a, op, b), "answer": str(answer_of(a, op, b)), "domain": "math"}
                fh.write(json.dumps(record, sort_keys=True) + "\n")


def _build_here(*, out: Path, settings: DemoSettings, progress: bool, log: Callable[[str], None] = print) -> DemoResult:
    """The build proper, in this process (`demo_model_build` runs it in a pinned child)."""
    import torch
    from tqdm import tqdm

    started = time.monotonic()
    # One thread: summation order, hence the weights' bits, do not depend on the machine's cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train, heldout, taskset = problems_split(settings)
        built = tokenizer_build(texts=_tokenizer_corpus(settings), vocab_size=settings.vocab_size)
        model = causal_lm_build(
            tokenizer=built,
            hidden_size=settings.hidden_size,
            layers=settings.layers,
            heads=settings.heads,
            max_positions=256,
            seed=settings.seed,
        )
        tokenizer = _as_loaded(built, model)
        if len(tokenizer) != model.config.vocab_size:
            raise RuntimeError(f"the reloaded tokenizer has {len(tokenizer)} tokens, the model {model.config.vocab_size}")
        params = sum(p.numel() for p in model.parameters())
        log(f"demo model: {params / 1e6:.2f}M parameters, {len(train)} training problems, {settings.steps} steps")
        torch.manual_seed(settings.seed)
        optim = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(
            optim, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / settings.steps)
        )
        encoded: dict[tuple[tuple[int, str, int], str], tuple[list[int], list[int]]] = {}
        styles = random.Random(settings.seed + 2)
        model.train()
        bar = tqdm(total=settings.steps, desc="warm-up SFT", disable=not progress, mininterval=1.0)
        batches = _batches(train, settings)
        accuracy: float | None = None
        for step in range(settings.steps):
            rows = []
            for p in next(batches):
                style = style_draw(styles, settings)
                if (p, style) not in encoded:
                    encoded[p, style] = problem_encode(tokenizer, p, style)
                rows.append(encoded[p, style])
            loss = sft_step_loss(model, rows, pad_id=tokenizer.pad_token_id)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            sched.step()
            optim.zero_grad(set_to_none=True)
            bar.update(1)
            if step % 50 == 0 or step == settings.steps - 1:
                bar.set_postfix(loss=f"{loss.item():.3f}")
            if check_due(step=step, every=settings.eval_every, steps=settings.steps):
                accuracy = greedy_accuracy(model=model, tokenizer=tokenizer, problems=heldout)
                if progress:
                    bar.write(f"step {step + 1}: held-out accuracy {accuracy:.1%}")
                if accuracy >= settings.target_accuracy:
                    break
                accuracy = None
                model.train()
        bar.close()
        trained_steps = step + 1
        if accuracy is None:
            accuracy = greedy_accuracy(model=model, tokenizer=tokenizer, problems=heldout)
        log(f"demo model: after {trained_steps} steps, greedy accuracy on {len(heldout)} held-out problems: {accuracy:.1%}")

        files = build_save(BUILD, out, model=model, companion=tokenizer,
                           data_write=lambda at: _problems_write(at, taskset=taskset, heldout=heldout),
                           settings=settings, accuracy=accuracy, parameters=params, steps=trained_steps,
                           cpu_capability=torch.backends.cpu.get_cpu_capability())
    finally:
        torch.set_num_threads(threads)
    return DemoResult(
        out=out, settings=settings, accuracy=accuracy, built=True, seconds=time.monotonic() - started, files=files
    )


def _main(argv: list[str] | None = None) -> None:
    build_main(BUILD, _build_here, argv)


if __name__ == "__main__":
    _main()
