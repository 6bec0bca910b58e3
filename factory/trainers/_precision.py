"""Training that keeps its updates: float32 master weights, and a count of the weights that actually moved.

An optimizer that updates bfloat16 weights in place loses every update
smaller than half a bf16 step (about 0.4 % of the weight): at a DPO-sized
learning rate most elements never change, and the rest jump by whole steps.
So full fine-tuning keeps float32 weights (the policy is loaded in float32,
or upcast where a loader gave it in half precision) and computes in bf16
under autocast where the device supports it (``bf16=True``, accelerate's mixed
precision); LoRA keeps its frozen base in the dtype it was loaded in and its
adapters in float32 (peft casts them).

:class:`MovementProbe` records, before training, a fixed sample of the
trainable elements, and after training the share of them that changed; the
result records it with the weight and compute dtypes, and warns when it is
low.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MOVED_WARNING_SHARE", "MovementProbe", "compute_dtype", "keep_float32_master_weights", "weight_dtypes"]

#: Below this share of trainable elements moved, the training result warns.
MOVED_WARNING_SHARE = 0.5
# Elements sampled over all trainable tensors (about 4 MiB of float32 at most, whatever the model's size).
_SAMPLE = 1 << 20


def _dtype_names(parameters: list[Any]) -> str | None:
    names = sorted({str(p.dtype).removeprefix("torch.") for p in parameters})
    return ",".join(names) if names else None


def weight_dtypes(model: Any) -> dict[str, str | None]:
    """The dtypes of the model's trainable and frozen parameters (comma-joined where mixed; None where none)."""
    parameters = list(model.parameters())
    return {"trainable": _dtype_names([p for p in parameters if p.requires_grad]),
            "frozen": _dtype_names([p for p in parameters if not p.requires_grad])}


def compute_dtype(config: Any) -> str:
    """The dtype the forward and backward passes compute in under ``config`` (autocast where bf16 / fp16)."""
    if getattr(config, "bf16", False):
        return "bfloat16"
    if getattr(config, "fp16", False):
        return "float16"
    return "float32"


def keep_float32_master_weights(model: Any) -> str | None:
    """Upcast a model's half-precision floating parameters to float32 in place; the dtype they had, or None.

    For full fine-tuning only: the optimizer then updates float32 weights, and bf16 compute comes from autocast.
    """
    import torch

    half = {p.dtype for p in model.parameters() if p.dtype in (torch.bfloat16, torch.float16)}
    if not half:
        return None
    model.float()
    return ",".join(sorted(str(d).removeprefix("torch.") for d in half))


class MovementProbe:
    """A fixed sample of a model's trainable elements, to count how many an optimizer moved.

    Args:
        model: The model about to be trained (its trainable parameters are sampled now).
        seed: Seed of the sample's positions.
    """

    def __init__(self, model: Any, *, seed: int = 0) -> None:
        import torch

        trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad and p.numel()]
        self.total = sum(p.numel() for _, p in trainable)
        self._before: dict[str, tuple[Any, Any]] = {}
        if not self.total:
            return
        generator = torch.Generator().manual_seed(seed)
        for name, parameter in trainable:
            count = min(parameter.numel(), max(1, math.ceil(parameter.numel() * _SAMPLE / self.total)))
            if count == parameter.numel():
                index = torch.arange(count)
            else:
                index = torch.randint(parameter.numel(), (count,), generator=generator)
            values = parameter.detach().reshape(-1)[index.to(parameter.device)].to("cpu", copy=True)
            self._before[name] = (index, values)

    @property
    def sampled(self) -> int:
        """How many elements the sample holds."""
        return sum(values.numel() for _, values in self._before.values())

    def moved_share(self, model: Any) -> float | None:
        """The share of the sampled elements whose value changed; None where nothing was sampled."""
        parameters = dict(model.named_parameters())
        moved = seen = 0
        for name, (index, values) in self._before.items():
            parameter = parameters.get(name)
            if parameter is None:  # renamed by a wrapper: not comparable
                continue
            after = parameter.detach().reshape(-1)[index.to(parameter.device)].to("cpu")
            moved += int((after != values).sum())
            seen += values.numel()
        return moved / seen if seen else None
