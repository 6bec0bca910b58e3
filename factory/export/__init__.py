"""Export: DPO / KTO / reward / SFT / GRPO rows, writers, manifests and dataset cards."""

__all__: list[str] = []
