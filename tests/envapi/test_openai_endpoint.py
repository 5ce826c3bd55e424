"""The OpenAI-compatible endpoint through the official `openai` client, against a live server
(daphne) and a real Celery rollout worker on the `rollout` queue.

The model is a tiny one taught to call a calculator (tests/agent_model.py), so a tool call
goes the whole way: offered by the chat template, sampled, parsed back into `tool_calls`,
sent back by the client as history, recorded per call, and assembled into an experience
when the session finishes.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
from django.contrib.auth.models import User

from apps.buffer.models import Experience
from apps.envapi.models import AgentCall, AgentSession
from apps.envapi.services import api_key_revoke
from tests.agent_model import CALC_TOOL, call_text, conversation, question, tool_model_save
from tests.envapi.conftest import make_key
from tests.factories import make_run, make_taskset
from tests.servers import celery_worker, start_server, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    torch.set_num_threads(1)
    return tool_model_save(tmp_path_factory.mktemp("agent-model") / "calc")


@pytest.fixture(scope="module")
def rollout_worker(django_db_setup: None, django_db_blocker: Any,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """The rollout worker behind the endpoint (tests/servers.py's rollout_stack, whose worker
    the last test stops)."""
    logs = tmp_path_factory.mktemp("openai-stack")
    with django_db_blocker.unblock(), celery_worker("rollout", name="openai-rollout", log=logs / "worker.log",
                                                    includes=("workers.explore.explorer",)) as proc:
        yield proc


@pytest.fixture(scope="module")
def stack(rollout_worker: subprocess.Popen[bytes], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # A long rollout wait (300 s): a test that means a failure to come back at once must not
    # pass by timing out.
    server, url = start_server(log=tmp_path_factory.mktemp("openai-server") / "server.log",
                               RFT_ROLLOUT_TIMEOUT_SECONDS="300")
    try:
        yield url
    finally:
        stop(server)


def _client(url: str, run_id: int, key: str, **kw: Any) -> Any:
    return openai.OpenAI(base_url=f"{url}/api/v1/runs/{run_id}/openai/v1", api_key=key, max_retries=0, timeout=300, **kw)


@pytest.fixture
def agent_run(owner: User, model_dir: Path) -> Any:
    return make_run(owner=owner, taskset=make_taskset(owner=owner), model=str(model_dir), engine="transformers",
                    name="agents")


def test_models_lists_the_current_version_and_each_published_one(stack: str, agent_run: Any) -> None:
    _, raw = make_key(agent_run, actions=["read"])
    ids = [m.id for m in _client(stack, agent_run.pk, raw).models.list()]
    assert ids[:2] == [f"run-{agent_run.pk}", f"run-{agent_run.pk}@v0"]


def test_a_plain_chat_completion_is_well_formed_with_usage_and_logprobs(stack: str, agent_run: Any) -> None:
    _, raw = make_key(agent_run)
    client = _client(stack, agent_run.pk, raw)
    out = client.chat.completions.create(
        model=f"run-{agent_run.pk}", messages=[{"role": "user", "content": "What is 2 + 3?"}],
        max_tokens=6, temperature=1.0, seed=3, logprobs=True, top_logprobs=2,
    )
    assert out.object == "chat.completion" and out.model == f"run-{agent_run.pk}"
    [choice] = out.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    tokens = choice.logprobs.content
    assert len(tokens) == out.usage.completion_tokens >= 1
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in tokens)
    assert all(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in tokens)
    assert out.usage.prompt_tokens > 0 and out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert out.system_fingerprint == f"rft-run{agent_run.pk}-v0"


def test_n_choices_come_back_indexed(stack: str, agent_run: Any) -> None:
    _, raw = make_key(agent_run)
    out = _client(stack, agent_run.pk, raw).chat.completions.create(
        model=f"run-{agent_run.pk}", messages=[{"role": "user", "content": "hi"}], n=3, max_completion_tokens=4,
        temperature=1.0,
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(c.message.role == "assistant" and c.finish_reason in ("stop", "length") for c in out.choices)
    assert 3 <= out.usage.completion_tokens <= 12


def test_a_stream_sends_chunks_that_add_up_to_the_whole_answer(stack: str, agent_run: Any) -> None:
    _, raw = make_key(agent_run)
    client = _client(stack, agent_run.pk, raw)
    kwargs: dict[str, Any] = {"model": f"run-{agent_run.pk}", "messages": conversation(2, 3)[:1], "tools": [CALC_TOOL],
                              "max_tokens": 60, "temperature": 0}
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True},
                                                 extra_headers={"X-Rft-Session": "streamed"}))
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert content == (whole.choices[0].message.content or "")
    assert [(tc.function.name, tc.function.arguments) for tc in calls] == [
        (tc.function.name, tc.function.arguments) for tc in whole.choices[0].message.tool_calls or []]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # A streamed call of a session is recorded like any other, by the time the stream ends.
    [recorded] = AgentCall.objects.filter(session__run=agent_run, session__name="streamed")
    assert len(recorded.choices[0]["token_ids"]) == whole.usage.completion_tokens


@pytest.fixture(scope="module")
def rambling_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny model: greedy, it goes on for hundreds of tokens without an end."""
    from workers.models.tiny import tiny_model_save

    return tiny_model_save(tmp_path_factory.mktemp("rambling") / "m", hidden_size=64, layers=2, heads=4, max_positions=1024)


@pytest.fixture(scope="module")
def rambling_vllm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same kind of rambler with heads of 32 (vLLM's CPU attention has no head size 16),
    wider and deeper: vLLM steps the tiny one in about a millisecond, so 400 of its tokens took
    less time than handing the request to the worker, and the test measured the hand-over."""
    from workers.models.tiny import tiny_model_save

    return tiny_model_save(tmp_path_factory.mktemp("rambling-vllm") / "m", hidden_size=256, layers=4, heads=8,
                           max_positions=2048)


# Both kinds on the transformers engine, and vLLM's stream through the chat door: the kind is
# the endpoint's business (a chat is rendered to a prompt before any engine sees it), the stream
# the engine's. vLLM's completion door too was 75 s of the module's 171 (issue 50). vLLM's case
# judges how fast this host's CPU engine streams a long answer (57 s of a quiet run): it runs
# with the benches (`make test-bench`); what vLLM's stream carries through the endpoint is
# checked in `make test` by the SIGTERM test below.
@pytest.mark.parametrize(("kind", "engine"), [("chat", "transformers"), ("completion", "transformers"),
                                              pytest.param("chat", "vllm", marks=[pytest.mark.vllm, pytest.mark.bench])])
def test_a_stream_sends_the_text_while_the_model_is_still_generating(
    stack: str, owner: User, request: pytest.FixtureRequest, kind: str, engine: str
) -> None:
    """Token by token, with either engine: the text arrives spread over the generation, the
    first of it long before a whole answer could; not in one burst once the worker is done."""
    import time

    model_dir = request.getfixturevalue("rambling_dir" if engine == "transformers" else "rambling_vllm_dir")
    # Long enough that generating dominates the request's fixed cost (queue, worker, engine).
    max_tokens = 400 if engine == "transformers" else 1000
    run = make_run(owner=owner, model=str(model_dir), engine=engine, name=f"stream-{kind}-{engine}")
    _, raw = make_key(run)
    client = _client(stack, run.pk, raw)
    model = f"run-{run.pk}"

    def create(tokens: int = max_tokens, **kw: Any) -> Any:
        if kind == "chat":
            return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 1 + 2?"}],
                                                  max_tokens=tokens, temperature=0, **kw)
        # The chat prompt as text: the same greedy ramble.
        return client.completions.create(model=model, prompt="<|user|>What is 1 + 2?<|end|><|assistant|>", max_tokens=tokens,
                                         temperature=0, **kw)

    create(tokens=1)  # the worker loads the model (a whole ramble here only cost its tokens' time)
    # The timing bounds are judged on the best of five tries, a few seconds apart: on a shared
    # 2-core host one slow moment (another process's engine, a checkpoint) pushes one request's
    # first text back by seconds (CI, twice: first text at 1.13 s of a 1.33 s answer, at 1.88 s
    # of 3.52 s), and beside the suite's heaviest test three tries back to back all came late
    # (vLLM: first text at 2.35-3.07 s of a 2.6 s answer; alone, 0.03 s). A stream held back
    # until the worker is done fails every try.
    tries: list[str] = []
    for attempt in range(5):
        if attempt:
            time.sleep(3)
        started = time.perf_counter()
        whole = create()
        whole_seconds = time.perf_counter() - started
        whole_text = whole.choices[0].message.content if kind == "chat" else whole.choices[0].text
        assert whole.usage.completion_tokens >= 0.75 * max_tokens, whole.usage

        started = time.perf_counter()
        arrivals, text, finish = [], "", []
        for chunk in create(stream=True):
            for choice in chunk.choices:
                piece = choice.delta.content if kind == "chat" else choice.text
                if piece:
                    arrivals.append(time.perf_counter() - started)
                    text += piece
                if choice.finish_reason:
                    finish.append(choice.finish_reason)
        ended = time.perf_counter() - started
        # What the stream carries holds on every try, whatever the host's speed.
        assert text == whole_text and finish == [whole.choices[0].finish_reason]
        assert len(arrivals) >= 100
        tries.append(f"whole answer {whole_seconds:.2f} s; stream: first text at {arrivals[0]:.2f} s, last at "
                     f"{arrivals[-1]:.2f} s, done at {ended:.2f} s, {len(arrivals)} chunks; "
                     f"load {os.getloadavg()[0]:.1f}")
        print(f"\n{engine} {kind}: {tries[-1]}")
        # The first text comes before half the whole answer's time, and the text is spread over
        # most of the request (sent at the end in one go, the spread would be milliseconds).
        if arrivals[0] < 0.5 * whole_seconds and arrivals[-1] - arrivals[0] > 0.5 * ended:
            break
    else:
        measured = "\n".join(tries)
        if engine == "vllm" and os.getloadavg()[0] > 2 * (os.cpu_count() or 1):
            # A known limit, in docs/how-to/openai-agents.md: on a CPU host whose cores are saturated the vLLM
            # engine's stream comes in a burst near the end (the transformers engine's, over
            # the same web relay, does not). What it carries was checked on every try above.
            pytest.skip(f"the host is saturated; the vLLM stream's timing is not judged:\n{measured}")
        pytest.fail("the stream's text came in a burst on every try:\n" + measured)


def test_tools_reach_the_template_and_a_sampled_call_comes_back_as_tool_calls(stack: str, agent_run: Any) -> None:
    _, raw = make_key(agent_run)
    out = _client(stack, agent_run.pk, raw).chat.completions.create(
        model=f"run-{agent_run.pk}", messages=conversation(2, 3)[:1], tools=[CALC_TOOL], tool_choice="auto",
        max_tokens=60, temperature=0, extra_body={"return_token_ids": True},
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "calc"
    assert set(json.loads(call.function.arguments)) == {"expression"}
    assert call.id.startswith("call_")
    # The tool's definition was rendered into the prompt the model saw.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(agent_run.cfg.model)
    assert '"name": "calc"' in tok.decode(out.model_extra["prompt_token_ids"])


def test_completions_take_text_or_token_ids(stack: str, agent_run: Any) -> None:
    _, raw = make_key(agent_run)
    client = _client(stack, agent_run.pk, raw)
    out = client.completions.create(model=f"run-{agent_run.pk}", prompt="What is 2 + 3?", max_tokens=5, n=2,
                                    logprobs=1, temperature=1.0)
    assert out.object == "text_completion" and [c.index for c in out.choices] == [0, 1]
    for c in out.choices:
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == len(c.logprobs.text_offset) >= 1
    by_ids = client.completions.create(model=f"run-{agent_run.pk}@v0", prompt=[5, 6, 7], max_tokens=3, temperature=0)
    assert by_ids.usage.prompt_tokens == 3
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=f"run-{agent_run.pk}", prompt=[5, 6, 7], max_tokens=3, temperature=0, stream=True) if c.choices)
    assert streamed == by_ids.choices[0].text


def _body(raised: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    """The OpenAI error body the client raised with (the client types it as an object)."""
    body = raised.value.body
    assert isinstance(body, dict), body
    return body


def test_bad_requests_are_openai_errors_the_client_raises_as_its_own(stack: str, agent_run: Any, owner: User) -> None:
    _, raw = make_key(agent_run)
    client = _client(stack, agent_run.pk, raw)
    model = f"run-{agent_run.pk}"
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=model, messages=msgs, temperature=5)
    assert _body(bad)["type"] == "invalid_request_error" and _body(bad)["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[])
    with pytest.raises(openai.BadRequestError) as penalty:
        client.chat.completions.create(model=model, messages=msgs, presence_penalty=1.0)
    assert _body(penalty)["param"] == "presence_penalty"
    with pytest.raises(openai.BadRequestError) as nul:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "a\x00b"}])
    assert _body(nul)["param"] == "messages.0.content"
    with pytest.raises(openai.BadRequestError) as forced:
        client.chat.completions.create(model=model, messages=msgs, tools=[CALC_TOOL], tool_choice="required")
    assert _body(forced)["param"] is None and "tool_choice" in _body(forced)["message"]
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert _body(missing)["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=f"{model}@v7", messages=msgs)
    # Raw: the body is exactly OpenAI's error shape, also for JSON that does not parse.
    response = httpx.post(f"{stack}/api/v1/runs/{agent_run.pk}/openai/v1/chat/completions", content=b"{nope",
                          headers={"Authorization": f"Bearer {raw}", "Content-Type": "application/json"})
    assert response.status_code == 400 and set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_keys_of_another_run_read_only_or_revoked_are_refused(stack: str, agent_run: Any, owner: User) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    model = f"run-{agent_run.pk}"
    other = make_run(owner=owner, name="other")
    _, other_raw = make_key(other)
    # A key of another run is told the run is not found, as for a missing run (issue #33).
    with pytest.raises(openai.NotFoundError) as foreign:
        _client(stack, agent_run.pk, other_raw).chat.completions.create(model=model, messages=msgs)
    assert _body(foreign)["code"] == "not_found" and f"run {agent_run.pk} not found" in _body(foreign)["message"]
    _, read_raw = make_key(agent_run, actions=["read"])
    with pytest.raises(openai.PermissionDeniedError):
        _client(stack, agent_run.pk, read_raw).chat.completions.create(model=model, messages=msgs)
    key, raw = make_key(agent_run)
    api_key_revoke(key=key)
    with pytest.raises(openai.AuthenticationError) as revoked:
        _client(stack, agent_run.pk, raw).chat.completions.create(model=model, messages=msgs)
    assert _body(revoked)["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        _client(stack, agent_run.pk, "rft_nope_nope").models.list()


# ---- sessions become trajectories -----------------------------------------------------


def _forward_logprobs(model_dir: str, tokens: list[int], start: int) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0]
    logps = torch.log_softmax(logits.float(), -1)
    return [float(logps[i - 1, tokens[i]]) for i in range(start, len(tokens))]


def test_a_three_turn_session_with_a_tool_call_becomes_one_exact_experience(stack: str, agent_run: Any) -> None:
    key, raw = make_key(agent_run)
    task = agent_run.taskset.tasks.order_by("index").first()
    client = _client(stack, agent_run.pk, raw, default_headers={"X-Rft-Session": "calc-1", "X-Rft-Task": str(task.pk)})
    model = f"run-{agent_run.pk}"
    # Turn 1: the question; the model calls the tool.
    messages: list[dict[str, Any]] = [{"role": "user", "content": question(2, 3)}]
    first = client.chat.completions.create(model=model, messages=messages, tools=[CALC_TOOL], max_tokens=60, temperature=0,
                                           extra_body={"return_token_ids": True})
    [call] = first.choices[0].message.tool_calls
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    # Turn 2: the tool's answer; the model answers.
    second = client.chat.completions.create(model=model, messages=messages, tools=[CALC_TOOL], max_tokens=30, temperature=0,
                                            extra_body={"return_token_ids": True})
    messages += [{"role": "assistant", "content": second.choices[0].message.content},
                 {"role": "user", "content": "Sure?"}]
    # Turn 3: a follow-up from the user.
    third = client.chat.completions.create(model=model, messages=messages, tools=[CALC_TOOL], max_tokens=8, temperature=1.0,
                                           seed=1, extra_body={"return_token_ids": True})
    assert AgentCall.objects.filter(session__run=agent_run, session__name="calc-1").count() == 3

    response = httpx.post(f"{stack}/api/v1/runs/{agent_run.pk}/sessions/calc-1/finish",
                          json={"reward": 1.0, "reward_parts": {"correct": 1.0}}, headers={"Authorization": f"Bearer {raw}"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["splits"] == [] and body["turns"] == 3 and body["created"]
    [exp] = Experience.objects.filter(pk__in=body["experience_ids"])

    turns = [first, second, third]
    sampled = [t.choices[0].token_ids for t in turns]
    prompts = [t.model_extra["prompt_token_ids"] for t in turns]
    # Tokens: the first prompt, then each turn's sample followed by what the next prompt adds.
    assert exp.token_ids[: len(prompts[0])] == prompts[0] and exp.prompt_length == len(prompts[0])
    assert exp.token_ids == prompts[2] + sampled[2]
    assert prompts[1][: len(prompts[0]) + len(sampled[0])] == prompts[0] + sampled[0]
    # The mask is 1 exactly on the sampled tokens.
    expected_mask = ([1] * len(sampled[0]) + [0] * (len(prompts[1]) - len(prompts[0]) - len(sampled[0]))
                     + [1] * len(sampled[1]) + [0] * (len(prompts[2]) - len(prompts[1]) - len(sampled[1]))
                     + [1] * len(sampled[2]))
    assert exp.action_mask == expected_mask
    # The logprobs of the sampled tokens are those of a forward pass of the version that sampled them.
    forward = _forward_logprobs(agent_run.cfg.model, exp.token_ids, exp.prompt_length)
    assert exp.action_mask is not None and exp.logprobs is not None
    for i, m in enumerate(exp.action_mask):
        if m:
            assert abs(exp.logprobs[i] - forward[i]) < 1e-4, i
    assert exp.reward == 1.0 and exp.reward_parts == {"correct": 1.0} and exp.task_id == task.pk
    assert exp.metadata["turn_versions"] == [0, 0, 0] and exp.group_id.endswith(f"agent-task-{task.pk}")
    session = AgentSession.objects.get(run=agent_run, name="calc-1")
    assert session.status == "finished" and session.experience_ids == [exp.pk]
    # Finishing again changes nothing; calling into a finished session is refused.
    again = httpx.post(f"{stack}/api/v1/runs/{agent_run.pk}/sessions/calc-1/finish", json={"reward": 0.0},
                       headers={"Authorization": f"Bearer {raw}"}).json()
    assert again["experience_ids"] == [exp.pk] and not again["created"]
    with pytest.raises(openai.BadRequestError) as closed:
        client.chat.completions.create(model=model, messages=messages, max_tokens=2)
    assert _body(closed)["code"] == "session_closed"
    assert call_text(2, 3)  # the turn the tiny model was taught


# ---- the example agent ----------------------------------------------------------------


def test_the_example_agent_plays_through_the_endpoint_and_its_sessions_become_experiences(
    stack: str, owner: User, model_dir: Path
) -> None:
    """examples/calculator_agent.py end to end on the tool-taught model: it calls the tool,
    sends the result back, the model answers, the environment scores the answer, and each
    episode's session becomes one two-turn experience with that reward."""
    from apps.buffer.importers import taskset_create
    from examples.calculator_agent import agent_run
    from rftweb.client import RftClient
    from tests.agent_model import QUESTIONS

    taskset = taskset_create(name="sums", owner=owner,
                             records=[{"prompt": question(a, b), "answer": str(a + b), "domain": "math"} for a, b in QUESTIONS])
    run = make_run(owner=owner, taskset=taskset, model=str(model_dir), engine="transformers", name="calc-agent",
                   repeat_times=2)
    _, raw = make_key(run)
    with RftClient(stack, raw, timeout=300) as env:
        [episodes] = agent_run(env=env, openai_client=_client(stack, run.pk, raw), run_id=run.pk, rounds=1,
                               tasks_per_round=len(QUESTIONS), group=2, max_tokens=60, temperature=0.0, log=lambda _: None)
    assert len(episodes) == 2 * len(QUESTIONS)
    assert all(e.tool_calls == 1 and e.turns == 2 for e in episodes), [(e.tool_calls, e.answer) for e in episodes]
    exps = list(Experience.objects.filter(run=run).order_by("id"))
    assert len(exps) == len(episodes)
    by_session = {e.metadata["agent_session"]: e for e in exps}
    for episode in episodes:
        exp = by_session[episode.session]
        assert exp.reward == pytest.approx(episode.reward) and exp.reward_parts == episode.parts
        assert exp.metadata["turns"] == 2 and exp.task_id == episode.task_id
        # Two sampled stretches (the call, the answer) around the tool's answer.
        assert exp.action_mask is not None
        edges = sum(1 for a, b in zip(exp.action_mask, exp.action_mask[1:]) if a != b)
        assert exp.action_mask[0] == 1 and exp.action_mask[-1] == 1 and edges == 2
    # Episodes of one task form one group.
    assert len({e.group_id for e in exps}) == len(QUESTIONS)
    assert sum(e.parts["format"] > 0 for e in episodes) >= len(episodes) // 2


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # dead, its parent gone before reaping
    except psutil.NoSuchProcess:
        return True


@pytest.mark.vllm
def test_a_rollout_worker_holding_a_vllm_engine_ends_on_sigterm_with_its_engine(
    stack: str, rollout_worker: subprocess.Popen[bytes], owner: User, rambling_vllm_dir: Path
) -> None:
    """A person's Ctrl-C or a deploy's stop (SIGTERM to the worker's process group): the worker
    ends by itself, exit 0, and its engine's processes with it, within the grace `stop` gives
    before its SIGKILL. vLLM's own teardown, left to the interpreter's exit, outlasted that grace
    every time (the worker ended by SIGKILL: exit -9). Last in the module: it stops the worker."""
    pytest.importorskip("vllm")  # without it the worker would serve the run with transformers
    run = make_run(owner=owner, model=str(rambling_vllm_dir), engine="vllm", name="stopped")
    _, raw = make_key(run)
    client, model = _client(stack, run.pk, raw), f"run-{run.pk}"
    # The engine serves first: its stream carries the whole answer's text, in pieces, and its end.
    whole = client.completions.create(model=model, prompt="hi", max_tokens=24, temperature=0).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(model=model, prompt="hi", max_tokens=24, temperature=0,
                                                              stream=True) if c.choices]
    assert "".join(c.text for c in chunks) == whole.text and len([c for c in chunks if c.text]) > 1
    assert [c.finish_reason for c in chunks if c.finish_reason] == [whole.finish_reason]
    engine = [p.pid for p in psutil.Process(rollout_worker.pid).children(recursive=True)
              if "VLLM::" in " ".join(p.cmdline())]  # vLLM retitles its processes
    assert engine, "the vLLM engine runs in processes of its own"
    stop(rollout_worker)
    assert rollout_worker.returncode == 0
    assert all(_gone(pid) for pid in engine)
