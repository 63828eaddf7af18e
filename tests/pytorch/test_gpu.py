"""The CUDA paths: device choice, 16-mixed with a GradScaler, NCCL DDP (real GPUs only)."""

import os

import pytest
import torch

from gpulayer.pytorch import Runtime, Trainer, select_device

pytestmark = pytest.mark.gpu

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("GPULAYER_RUN_GPU_TESTS") != "1",
    reason="needs a CUDA GPU and GPULAYER_RUN_GPU_TESTS=1",
)


@needs_cuda
def test_auto_picks_the_local_ranks_gpu() -> None:
    assert select_device("auto", local_rank=0) == torch.device("cuda", 0)
    runtime = Runtime.from_env(env={"RANK": "0", "WORLD_SIZE": "1"})
    assert runtime.device.type == "cuda" and runtime.backend == "nccl"


@needs_cuda
def test_16_mixed_on_cuda_uses_a_grad_scaler_and_trains(gl_regression, gl_loader) -> None:
    module = gl_regression(lr=0.01)
    trainer = Trainer(max_epochs=3, precision="16-mixed", log_every_n_steps=1,
                      enable_progress_bar=False)  # fmt: skip
    trainer.fit(module, gl_loader())
    losses = [m["train/loss"] for _, m in trainer.history]
    assert module.device.type == "cuda"
    assert trainer._precision.scaler.get_scale() > 0
    assert losses[-1] < losses[0]


@needs_cuda
def test_bf16_mixed_on_cuda(gl_regression, gl_loader) -> None:
    trainer = Trainer(max_epochs=2, precision="bf16-mixed", enable_progress_bar=False)
    trainer.fit(gl_regression(), gl_loader(), gl_loader(n=16))
    assert trainer.callback_metrics["val/loss"] == trainer.callback_metrics["val/loss"]  # not NaN
