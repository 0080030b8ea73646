"""The fine-tuning model on its device, and how its steps run (`LoopOptions`).

A search builds one `ModelSlot` per task and loads every run's fresh model into it, so the
device memory, the host-dropout modules and torch.compile's programs are made once.
"""

import dataclasses

from maelm_jax.glue import classifier


@dataclasses.dataclass(frozen=True)
class LoopOptions:
    """How the steps run. At dropout 0 none changes what a run computes beyond float
    rounding (tests/test_finetune.py holds the losses to the loop before them;
    `python -m maelm_jax.bench finetune` times each). Above it, `compile`, `host_dropout`
    and `width_buckets` draw other masks of the same rate from the same seed, so a search
    records them and keeps to one (`search.loop_identity`)."""

    fused_adamw: bool = True  # the update as one kernel (CUDA and CPU), not ~10 per tensor
    first_token: bool = True  # the last layer at `<s>` alone (classifier.read_first_token_only)
    compile: bool = False  # torch.compile the model: pays on a GPU; eager if compiling fails
    compile_mode: str = "default"  # torch.compile's mode: "reduce-overhead" adds CUDA graphs
    check_every: int = 25  # steps between reads of the loss (each read waits for the device)
    host_dropout: bool = True  # eager on a CPU: masks 4 to a random word (host_dropout.py)
    # Widths rounded up to `bucket_width`'s few values, for compiled programs and graphs;
    # None: when compiled. Eager code runs each batch at its longest row, the least work.
    width_buckets: bool | None = None


class ModelSlot:
    """The model on the device, reused by the runs of a search: each run's freshly built
    model (built on the host after seeding, so its head is the seed's as before) is copied
    into it, so device memory, and torch.compile's programs, are made once, not per run."""

    def __init__(self, device, options: LoopOptions | None = None):
        self.device, self.options = device, options or LoopOptions()
        self.model = self.step_model = None
        self.compile_error: str | None = None

    def load(self, fresh):
        """(the model, what a train step calls: the model or its compiled self)."""
        from maelm_jax.finetuning import host_dropout  # torch, imported when a model is

        if (
            self.model is not None
            and type(fresh) is type(self.model)
            and fresh.config.to_dict() == self.model.config.to_dict()
        ):
            self.model.load_state_dict(fresh.state_dict())  # in place: compiled code stays
            host_dropout.clear_pools(self.model)
            return self.model, self.step_model
        self.model = fresh.to(self.device)
        compiled = self.options.compile and self.compile_error is None
        if self.options.host_dropout and self.device.type == "cpu" and not compiled:
            # (a compiled model draws its masks inside its own kernels)
            host_dropout.use_host_dropout(self.model)
        if self.options.first_token:
            classifier.read_first_token_only(self.model)
        elif getattr(type(self.model), "first_token_only", None) is not None:
            self.model.first_token_only = False
        self.step_model = self.model
        if compiled:
            import torch

            self.step_model = torch.compile(self.model, mode=self.options.compile_mode)
        return self.model, self.step_model

    @property
    def buckets(self) -> bool:
        """Whether batch widths go to `bucket_width`'s values (LoopOptions.width_buckets)."""
        if self.options.width_buckets is not None:
            return self.options.width_buckets
        return self.step_model is not self.model

    def fall_back(self, error: Exception) -> None:
        from absl import logging

        self.compile_error = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        logging.warning("torch.compile failed, training eagerly: %s", self.compile_error)
        self.step_model = self.model


def compile_failed(error: Exception) -> bool:
    """Whether `error`, raised by a compiled model's step, is torch.compile failing (its
    backend and Inductor, a construct Dynamo cannot trace, Dynamo's own bug), which the eager
    model can do without. The model's own bugs (a shape error shows as Dynamo's
    TorchRuntimeError), an out-of-memory, even one met while compiling, and all else are not."""
    import torch
    from torch._dynamo import exc

    inner = getattr(error, "inner_exception", None)  # what a backend failure wraps
    if isinstance(error, torch.OutOfMemoryError) or isinstance(inner, torch.OutOfMemoryError):
        return False
    return isinstance(
        error, (exc.BackendCompilerFailed, exc.Unsupported, exc.InternalTorchDynamoError)
    )
