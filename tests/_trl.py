"""What the tests that train with TRL share: one-step arguments and the check that training happened.

Imports torch lazily: importing this module costs nothing where the ``train`` extra is absent.
"""

from __future__ import annotations

import math
from pathlib import Path


def common_args(tmp_path: Path) -> dict:
    """Arguments every trainer's config gets: one CPU step, logged, nothing saved or reported."""
    return {
        "output_dir": str(tmp_path / "out"),
        "max_steps": 1,
        "per_device_train_batch_size": 2,
        # Far above each trainer's default so that one step visibly moves float32 weights.
        "learning_rate": 1e-3,
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "seed": 0,
    }


def train_one_step(trainer) -> None:
    """Train, then check that a finite loss was logged and that some weight moved."""
    import torch

    before = {name: param.detach().clone() for name, param in trainer.model.named_parameters()}
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(math.isfinite(loss) for loss in losses)
    moved = [name for name, param in trainer.model.named_parameters() if not torch.equal(param, before[name])]
    assert moved, "no parameter changed after one optimiser step"
