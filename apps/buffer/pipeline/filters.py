"""filter: rows that should not be trained on, each dropped with its reason."""

from __future__ import annotations

import hashlib
import math
import re
from collections import defaultdict
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from apps.buffer.flags import flagging_kinds  # Django-free, as this module must be
from apps.buffer.pipeline.core import (
    Ctx,
    is_number,
    metadata_set,
    response_tokens,
    row_get,
    task_text,
)
from kernel.operators import Params, Row, register

_SPACES = re.compile(r"\s+")


def _text_of(row: Row, ctx: Ctx, fields: Literal["prompt", "response", "both"]) -> str:
    if ctx.stage == "import":
        return task_text(row)
    prompt = str(row.get("prompt_text") or "")
    response = str(row.get("response_text") or "")
    if fields == "prompt":
        return prompt
    if fields == "response":
        return response
    return f"{prompt}\x1f{response}"


def _normalised(text: str) -> str:
    return _SPACES.sub(" ", text).strip().casefold()


# --- exact dedup -----------------------------------------------------------------------


class DedupExactParams(Params):
    # batch: duplicates inside one write/claim batch; run: also against what the run stores.
    # An import always dedups across the whole taskset.
    scope: Literal["batch", "run"] = "run"
    fields: Literal["prompt", "response", "both"] = "both"
    # Compare case- and whitespace-insensitively.
    normalize: bool = True
    # Equal completions inside one GRPO group are independent samples, not duplicates.
    ignore_within_group: bool = True


def content_hash(text: str, *, normalize: bool) -> str:
    return hashlib.blake2b((_normalised(text) if normalize else text).encode(), digest_size=16).hexdigest()


@register("dedup_exact", stages=("write", "import", "claim"), params=DedupExactParams)
def dedup_exact(rows: list[Row], ctx: Ctx, params: DedupExactParams) -> None:
    """Drop exact duplicates (by content hash); the first one seen is kept."""
    # hash -> groups already holding it (a task import has one pseudo-group).
    seen: dict[str, set[str]] = ctx.my_state.setdefault("seen", defaultdict(set))
    hashes: list[str] = []
    for row in rows:
        text = _text_of(row, ctx, params.fields)
        if ctx.stage == "import":
            text = f"{row.get('domain') or ''}\x1f{text}"
        hashes.append(content_hash(text, normalize=params.normalize))
    if ctx.stage != "import" and params.scope == "run" and ctx.run_id is not None:
        _seen_in_run(rows, hashes, ctx, seen)
    for row, digest in zip(rows, hashes):
        group = "" if ctx.stage == "import" else str(row_get(row, "group_id") or "")
        holders = seen[digest]
        if holders and (not params.ignore_within_group or ctx.stage == "import" or holders - {group}):
            ctx.drop(row, "duplicate", digest[:12])
            continue
        holders.add(group)
        if ctx.stage != "import" and params.scope == "run":
            # Stored so later batches (and claims) can find this row by its hash.
            if (row.get("metadata") or {}).get("content_hash") != digest:
                metadata_set(row, content_hash=digest)


def _seen_in_run(rows: list[Row], hashes: list[str], ctx: Ctx, seen: dict[str, set[str]]) -> None:
    from django.db.models.fields.json import KeyTextTransform

    # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
    from apps.buffer.models import Experience

    own_keys = {str(row.get("key")) for row in rows}
    own_ids = {row.get("id") for row in rows if row.get("id") is not None}
    qs = (
        Experience.objects.filter(run_id=ctx.run_id or 0)
        .annotate(h=KeyTextTransform("content_hash", "metadata"))
        .filter(h__in=set(hashes))
        .exclude(status="filtered")
        .values_list("h", "group_id", "key", "id")
    )
    for digest, group, key, pk in qs:
        # A retried write of the same key, or the claimed row itself, is not a duplicate.
        if key in own_keys or pk in own_ids:
            continue
        seen[digest].add(group)


# --- near dedup ------------------------------------------------------------------------


class DedupNearParams(Params):
    # Estimated Jaccard similarity of character shingles above which two texts are one.
    threshold: float = Field(0.85, gt=0.0, lt=1.0)
    num_perm: int = Field(64, ge=16, le=512)
    shingle: int = Field(5, ge=1, le=32, description="characters per shingle")
    fields: Literal["prompt", "response", "both"] = "both"
    ignore_within_group: bool = True


def _shingles(text: str, k: int) -> list[bytes]:
    text = _normalised(text)
    if len(text) <= k:
        return [text.encode()]
    return list({text[i : i + k].encode() for i in range(len(text) - k + 1)})


@register("dedup_near", stages=("write", "import", "claim"), params=DedupNearParams)
def dedup_near(rows: list[Row], ctx: Ctx, params: DedupNearParams) -> None:
    """Drop near-duplicates: MinHash LSH (datasketch) over character shingles."""
    from datasketch import MinHash, MinHashLSH

    state = ctx.my_state
    if "lsh" not in state:
        state["lsh"] = MinHashLSH(threshold=params.threshold, num_perm=params.num_perm)
        state["groups"] = {}
        state["n"] = 0
    lsh: MinHashLSH = state["lsh"]
    groups: dict[str, str] = state["groups"]
    texts = [_text_of(row, ctx, params.fields) for row in rows]
    sketches = MinHash.bulk([_shingles(t, params.shingle) for t in texts], num_perm=params.num_perm, seed=1)
    for row, sketch in zip(rows, sketches):
        group = "" if ctx.stage == "import" else str(row_get(row, "group_id") or "")
        matches = lsh.query(sketch)
        if params.ignore_within_group and ctx.stage != "import":
            matches = [m for m in matches if groups[m] != group]
        if matches:
            ctx.drop(row, "near_duplicate")
            continue
        name = f"r{state['n']}"
        state["n"] += 1
        groups[name] = group
        lsh.insert(name, sketch)


# --- length bounds ---------------------------------------------------------------------


class LengthParams(Params):
    # Tokens of the response (experiences only); characters of the response, or of the
    # prompt for tasks.
    min_tokens: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    min_chars: int | None = Field(None, ge=0)
    max_chars: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> LengthParams:
        for low, high in (("min_tokens", "max_tokens"), ("min_chars", "max_chars")):
            lo, hi = getattr(self, low), getattr(self, high)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"{low} ({lo}) is above {high} ({hi})")
        return self


@register("length_bounds", stages=("write", "import", "claim"), params=LengthParams)
def length_bounds(rows: list[Row], ctx: Ctx, params: LengthParams) -> None:
    """Drop rows whose response (or task prompt) is shorter or longer than the bounds."""
    for row in rows:
        if ctx.stage == "import":
            n_tokens, chars = None, len(task_text(row))
        else:
            n_tokens, chars = response_tokens(row), len(str(row.get("response_text") or ""))
        if n_tokens is not None:
            if params.min_tokens is not None and n_tokens < params.min_tokens:
                ctx.drop(row, "too_short", f"{n_tokens} tokens")
                continue
            if params.max_tokens is not None and n_tokens > params.max_tokens:
                ctx.drop(row, "too_long", f"{n_tokens} tokens")
                continue
        if params.min_chars is not None and chars < params.min_chars:
            ctx.drop(row, "too_short", f"{chars} characters")
        elif params.max_chars is not None and chars > params.max_chars:
            ctx.drop(row, "too_long", f"{chars} characters")


# --- invalid rewards -------------------------------------------------------------------


class RewardInvalidParams(Params):
    min_reward: float | None = None
    max_reward: float | None = None
    # A ready (trainable) row without a reward is invalid; expert rows are exempt (SFT).
    require_reward: bool = False


def _float_or_none(value: object) -> float | None:
    return float(value) if is_number(value) else None


@register("reward_invalid", stages=("write", "claim"), params=RewardInvalidParams)
def reward_invalid(rows: list[Row], ctx: Ctx, params: RewardInvalidParams) -> None:
    """Drop rows with NaN, infinite, non-numeric, missing or out-of-range rewards."""
    for row in rows:
        bad: dict[str, str] = {}
        for name in ("reward", "auto_reward", "human_reward"):
            value = row.get(name)
            if value is not None and not is_number(value):
                bad[name] = repr(value)[:50]
                # The bad value cannot be stored as a reward; it is kept in metadata.
                row[name] = None
        parts = row.get("reward_parts")
        if isinstance(parts, dict) and not all(is_number(v) for v in parts.values()):
            bad["reward_parts"] = ", ".join(k for k, v in parts.items() if not is_number(v))[:100]
            row["reward_parts"] = {k: v for k, v in parts.items() if is_number(v)}
        if bad:
            metadata_set(row, invalid_reward=bad)
            ctx.drop(row, "invalid_reward", ", ".join(bad))
            continue
        reward = _float_or_none(row.get("reward"))
        if reward is None:
            if params.require_reward and row.get("status", "ready") == "ready" and not row.get("is_expert"):
                ctx.drop(row, "missing_reward")
            continue
        if (params.min_reward is not None and reward < params.min_reward) or (
            params.max_reward is not None and reward > params.max_reward
        ):
            ctx.drop(row, "reward_out_of_range", f"{reward:g}")


# --- reward variance of GRPO groups ----------------------------------------------------


class RewardVarianceParams(Params):
    # Rewards whose spread (max - min) is at most this are "all equal".
    tolerance: float = Field(1e-6, ge=0.0)
    # Judge a group only once this many members are known; by default the run's
    # repeat_times, so a group written in parts is not judged on its first part.
    group_size: int | None = Field(None, ge=2)


@register("reward_variance", stages=("write", "claim"), params=RewardVarianceParams)
def reward_variance(rows: list[Row], ctx: Ctx, params: RewardVarianceParams) -> None:
    """Drop GRPO groups whose rewards are all equal: they carry no advantage."""
    need = params.group_size or (getattr(ctx.run_cfg, "repeat_times", None) or 2)
    by_group: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        group = row_get(row, "group_id")
        if group not in (None, "") and not row.get("is_expert"):
            by_group[str(group)].append(row)
    others: dict[str, list[tuple[float | None, str]]] = defaultdict(list)
    if ctx.stage == "claim" and by_group:
        others = _stored_members(rows, list(by_group), ctx)
    for group, members in by_group.items():
        rewards: list[float | None] = [_float_or_none(r.get("reward")) for r in members]
        statuses = [str(r.get("status", "ready")) for r in members]
        for reward, status in others.get(group, []):
            rewards.append(reward)
            statuses.append(status)
        if len(rewards) < need or any(r is None for r in rewards) or "pending" in statuses:
            continue
        known = [r for r in rewards if r is not None]
        if max(known) - min(known) <= params.tolerance:
            for row in members:
                ctx.drop(row, "zero_variance", f"all {len(known)} rewards = {known[0]:g}")


def _stored_members(rows: list[Row], groups: list[str], ctx: Ctx) -> dict[str, list[tuple[float | None, str]]]:
    from django.db.models import Q

    # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
    from apps.buffer.models import Experience

    ids = [row["id"] for row in rows]
    qs = (
        Experience.objects.filter(run_id=ctx.run_id or 0, group_id__in=groups, is_expert=False)
        .exclude(pk__in=ids)
        # Members filtered for another reason are not part of the group's statistics.
        .filter(~Q(status="filtered") | Q(filter_reason__startswith="zero_variance"))
        .values_list("group_id", "reward", "status")
    )
    out: dict[str, list[tuple[float | None, str]]] = defaultdict(list)
    for group, reward, status in qs:
        out[group].append((reward if reward is None or math.isfinite(reward) else None, status))
    return out


# --- regex blocklist -------------------------------------------------------------------


class BlocklistParams(Params):
    patterns: list[str] = Field(min_length=1)
    ignore_case: bool = True
    # Which text of an experience to search; tasks are searched in their prompt.
    fields: Literal["prompt", "response", "both"] = "response"

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for i, pattern in enumerate(patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {i} {pattern!r} is not a valid regular expression: {exc}") from None
        return patterns


@register("blocklist", stages=("write", "import", "claim"), params=BlocklistParams)
def blocklist(rows: list[Row], ctx: Ctx, params: BlocklistParams) -> None:
    """Drop rows whose text matches any of the regular expressions."""
    flags = re.IGNORECASE if params.ignore_case else 0
    compiled = [re.compile(p, flags) for p in params.patterns]
    for row in rows:
        text = _text_of(row, ctx, params.fields)
        for pattern in compiled:
            if pattern.search(text):
                ctx.drop(row, "blocklist", pattern.pattern[:80])
                break


# --- human flags -----------------------------------------------------------------------


class FlaggedParams(Params):
    pass


@register("human_flagged", stages=("claim",), params=FlaggedParams)
def human_flagged(rows: list[Row], ctx: Ctx, params: FlaggedParams) -> None:
    """Drop experiences a person flagged (Feedback of a kind that flags, apps.buffer.flags)."""
    # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
    from apps.buffer.models import Experience

    ids = [row["id"] for row in rows]
    flags: dict[int, Any] = {}
    # Through the reverse relation of feedback.Feedback.experience (one join, both conditions
    # on the same feedback row): the feedback app sits above the buffer, so its model is not
    # imported here.
    for pk, value in Experience.objects.filter(
        pk__in=ids, feedback__run_id=ctx.run_id or 0, feedback__kind__in=flagging_kinds(),
        feedback__review__in=("pending", "accepted"),  # a flag the run's owner rejected flags nothing
    ).values_list("pk", "feedback__value"):
        flags.setdefault(pk, value)
    for row in rows:
        if row["id"] in flags:
            value = flags[row["id"]]  # the flag's {"flags": [...], "reason": str}, see Feedback
            value = value if isinstance(value, dict) else {}
            detail = value.get("reason") or ", ".join(value.get("flags") or ()) or "flagged"
            ctx.drop(row, "human_flagged", str(detail)[:100])
