"""The TRL internals `workers/algorithms/trl_bridge.py` and the objectives (`workers/algorithms/objectives/`) lean on. When TRL moves any of
them, these fail first and name what moved (the numerics tests would fail too, less clearly)."""

from __future__ import annotations

import inspect
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

from kernel.algorithms.grpo import GRPOParams
from workers.algorithms import trl_bridge as bridge


def test_trl_is_the_pinned_version() -> None:
    import trl

    assert trl.__version__ == bridge.TRL_VERSION, (
        f"trl {trl.__version__} installed, bridge written for {bridge.TRL_VERSION}: review trl_bridge.py"
    )


def test_trl_check_refuses_another_version(monkeypatch: pytest.MonkeyPatch) -> None:
    import trl

    monkeypatch.setattr(trl, "__version__", "99.0.0")
    with pytest.raises(bridge.TrlApiMoved, match="99.0.0"):
        bridge.trl_check()


def test_grpo_trainer_still_has_the_internals_we_call() -> None:
    from trl import GRPOTrainer

    for name in ("compute_loss", "_compute_loss", "_get_per_token_logps_and_entropies", "_generate_and_score_completions",
                 "create_optimizer_and_scheduler"):
        assert hasattr(GRPOTrainer, name), f"GRPOTrainer.{name} is gone"
    params = inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters
    assert list(params)[1:5] == ["model", "input_ids", "attention_mask", "logits_to_keep"]
    source = inspect.getsource(GRPOTrainer._compute_loss)
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages",
                "old_per_token_logps", "ref_per_token_logps", "num_items_in_batch", "current_gradient_accumulation_steps",
                "tool_mask"):
        assert key in source, f"GRPOTrainer._compute_loss no longer reads {key!r}"
    # The action mask rides on TRL's tool_mask, multiplied into the completion mask for everything.
    assert 'completion_mask * inputs["tool_mask"]' in source, "GRPOTrainer no longer folds tool_mask into its loss mask"
    for metric in ("entropy", "kl", "clip_ratio/region_mean"):
        assert f'"{metric}"' in source, f"GRPOTrainer no longer logs {metric!r}"


def test_every_loss_type_our_config_offers_is_one_trl_knows() -> None:
    from trl import GRPOConfig

    ours = set(typing.get_args(GRPOParams.model_fields["loss_type"].annotation))
    source = inspect.getsource(__import__("trl.trainer.grpo_trainer", fromlist=["x"]).GRPOTrainer._compute_loss)
    for loss_type in ours:
        assert f'"{loss_type}"' in source, f"TRL's GRPO loss no longer has {loss_type!r}"
    assert "loss_type" in GRPOConfig.__dataclass_fields__


def test_dpo_and_sft_collators_and_losses_keep_their_shape() -> None:
    from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling, SFTTrainer

    out = DataCollatorForPreference(pad_token_id=0)([{"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5]}])
    assert set(out) == {"input_ids", "attention_mask", "completion_mask"}
    assert out["input_ids"].tolist() == [[1, 2, 3, 0], [1, 2, 4, 5]]
    lm = DataCollatorForLanguageModeling(pad_token_id=0)([{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}])
    assert lm["labels"].tolist() == [[-100, 2, 3]]
    for cls in (DPOTrainer, SFTTrainer):
        assert "compute_loss" in cls.__dict__, f"{cls.__name__}.compute_loss is no longer its own"
    assert '"rewards/accuracies"' in inspect.getsource(DPOTrainer._compute_loss)
    assert '"mean_token_accuracy"' in inspect.getsource(SFTTrainer.compute_loss)


def test_the_fused_head_patch_still_exists_with_its_signature() -> None:
    from trl.trainer.utils import add_fused_lm_head

    params: dict[str, Any] = dict(inspect.signature(add_fused_lm_head).parameters)
    assert {"model", "temperature", "outputs"} <= set(params)


def test_the_fused_heads_tile_sizes_are_module_globals_read_at_each_call() -> None:
    """trl_bridge.fused_head_tiles sets them; a TRL that binds them at import would ignore it."""
    from trl.kernels import chunked_logprob
    from trl.trainer import utils

    assert isinstance(chunked_logprob.TOKEN_CHUNK_SIZE, int) and isinstance(utils._CHUNKED_LOGPROB_CHUNK_SIZE, int)
    assert "TOKEN_CHUNK_SIZE" in inspect.getsource(chunked_logprob.ChunkedLogProbFunction.forward)
    assert "_CHUNKED_LOGPROB_CHUNK_SIZE" in inspect.getsource(utils.add_fused_lm_head)
    assert inspect.signature(chunked_logprob._use_triton).parameters.keys() == {"device"}


def test_every_trainer_of_a_process_shares_one_scratch_folder_removed_at_exit() -> None:
    """transformers' Trainer makes its `output_dir` when built, though nothing is saved there:
    a folder per trainer filled the temporary directory with empty folders."""
    script = "\n".join([
        "import pathlib, torch, transformers",
        "from workers.algorithms import trl_bridge as b",
        "first = b.common_args(b.TrainParams())['output_dir']",
        "args = transformers.TrainingArguments(**b.common_args(b.TrainParams(seed=3)))",
        "transformers.Trainer(model=torch.nn.Linear(1, 1), args=args)",
        "second = b.common_args(b.TrainParams(learning_rate=1.0))['output_dir']",
        "assert first == second and pathlib.Path(first).is_dir(), (first, second)",
        "print(first)",
    ])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    folder = Path(done.stdout.strip().splitlines()[-1])
    assert folder.name.startswith("rft-trl-")
    assert not folder.exists(), f"{folder} outlived its process"
