"""Dropout masks cut from blocks of random words (`maelm_jax/glue/host_dropout.py`): the rate,
the scale, every quarter of a word, the seed, and a fine-tuning run that depends on its own
seed alone when a search reuses one model."""

import json
import os

import numpy as np
import pytest
import torch
from torch import nn

from maelm_jax.benchmarks import finetune_speed
from maelm_jax.glue import classifier, host_dropout, model_slot, tasks, training
from maelm_jax.glue.recipe import Recipe

torch.set_num_threads(1)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_drops_at_the_rate_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    layer = host_dropout.HostDropout(p, host_dropout.MaskPool(p))
    x = torch.ones(1000, 1000)
    y = layer(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - p) < 5 * (p * (1 - p) / x.numel()) ** 0.5  # five sigma
    kept = y[y != 0]
    want_scale = 1 / (1 - round(p * 65536) / 65536)
    assert torch.all(kept == torch.tensor(want_scale, dtype=torch.float32))
    assert abs(y.mean().item() - 1) < 0.005
    layer.eval()
    assert layer(x) is x


def test_every_quarter_of_a_word_drops_alike():
    """Each element takes a 16-bit quarter of a 64-bit word; `random_()` without bounds
    leaves the top bit 0, which would keep every fourth element always."""
    torch.manual_seed(0)
    pool = host_dropout.MaskPool(0.1)
    masks = pool.take(torch.Size([250_000, 4]), torch.float32)  # a fresh block: word-aligned
    per_quarter = (masks == 0).float().mean(0)
    assert torch.all((per_quarter - 0.1).abs() < 0.003), per_quarter


def test_masks_follow_the_seed_and_differ_between_sites():
    def draw(seed):
        torch.manual_seed(seed)
        pool = host_dropout.MaskPool(0.1, block=8192)
        return [pool.take(torch.Size([3, 1000]), torch.float32).clone() for _ in range(3)]

    first, again, other = draw(1), draw(1), draw(2)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], first[1])  # the next site, the block's next bits
    assert not torch.equal(first[2], first[1])  # the third starts a new block
    assert not torch.equal(first[0], other[0])


def test_gradient_goes_through_the_kept_elements_only():
    torch.manual_seed(0)
    layer = host_dropout.HostDropout(0.3, host_dropout.MaskPool(0.3))
    x = torch.randn(64, 32, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach() / x.detach())


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return finetune_speed.make_export(str(tmp_path_factory.mktemp("host_dropout")), 1, 64)


def test_a_classifier_keeps_its_parameters_and_its_attention_dropout(export_dir):
    model = classifier.classifier(export_dir, 2, "pretrained", 0.1, 0.2)
    names = list(model.state_dict())
    plain = sum(type(m) is nn.Dropout for m in model.modules())
    assert host_dropout.use_host_dropout(model) == plain > 0
    assert list(model.state_dict()) == names
    assert not any(type(m) is nn.Dropout for m in model.modules())
    rates = {m.p for m in model.modules() if isinstance(m, host_dropout.HostDropout)}
    assert rates == {0.1, 0.2}  # attention's module only carries its rate to SDPA
    edges = nn.Sequential(nn.Dropout(0.0), nn.Dropout(1.0))  # 1.0 would divide by zero
    assert host_dropout.use_host_dropout(edges) == 0


def test_a_run_depends_on_its_seed_alone_in_a_reused_slot(export_dir):
    """A search loads each run into one model (model_slot.ModelSlot): the run's losses are
    those it has alone, whatever ran before it; and host masks do change them."""
    with open(os.path.join(export_dir, "config.json")) as f:
        data = finetune_speed._rows(128, 16, json.load(f)["vocab_size"])
    task, cpu = tasks.TASKS["sst2"], torch.device("cpu")
    recipe = Recipe(learning_rates=(1e-3,), batch_sizes=(8,), seeds=(1, 2), max_steps=12)
    first, second = recipe.runs("sst2", "pretrained", 16)
    subset = np.arange(len(data))

    def losses(slot, spec):
        torch.manual_seed(spec.seed)
        slot.load(classifier.classifier(export_dir, 2, "pretrained", 0.1, 0.1))
        on_device = training.to_device(data, 1, cpu, regression=False)
        rng = np.random.default_rng(spec.seed)
        return training._drain(training.train_steps(slot, task, on_device, spec, subset, rng))

    shared = model_slot.ModelSlot(cpu)
    losses(shared, first)
    after_another = losses(shared, second)
    alone = losses(model_slot.ModelSlot(cpu), second)
    np.testing.assert_array_equal(after_another, alone)
    plain = model_slot.LoopOptions(host_dropout=False)
    stock = losses(model_slot.ModelSlot(cpu, plain), second)
    assert not np.allclose(stock, alone)  # another draw of the masks: the option does act
