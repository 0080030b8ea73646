"""Dropout masks cut from blocks of random words (`maelm_jax/finetuning/host_dropout.py`): the rate,
the scale, every quarter of a word, the seed, and a fine-tuning run that depends on its own
seed alone when a search reuses one model."""

import copy
import json
import os

import numpy as np
import pytest
import torch
from torch import nn

from maelm_jax.benchmarks import finetune_speed
from maelm_jax.finetuning import host_dropout, model_slot, training
from maelm_jax.finetuning.recipe import Recipe
from maelm_jax.glue import classifier, tasks

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


def test_masks_from_inside_and_across_blocks_keep_the_rate_and_the_scale():
    """Every site after a block's first takes its mask at an offset into the block, and a
    request that does not fit starts a new one: the rate and the scale hold there too, and
    in bfloat16."""
    torch.manual_seed(0)
    pool = host_dropout.MaskPool(0.1, block=10_000)
    shapes = [(7, 13), (3, 333), (1,), (2500, 4), (17, 50, 3), (9_999,)] * 30
    masks = [pool.take(torch.Size(shape), torch.float32) for shape in shapes]
    assert [tuple(m.shape) for m in masks] == shapes
    values = torch.cat([m.reshape(-1) for m in masks])
    scale = torch.tensor(pool.scale).item()  # in float32
    assert set(values.unique().tolist()) == {0.0, scale}
    dropped = (values == 0).float().mean().item()
    assert abs(dropped - 0.1) < 5 * (0.1 * 0.9 / values.numel()) ** 0.5, dropped
    for mask in masks[-6:]:  # a few thousand elements each: a plain site's share
        assert 0.05 < (mask == 0).float().mean().item() < 0.15 or mask.numel() < 1000
    half = pool.take(torch.Size([4000]), torch.bfloat16)
    assert half.dtype == torch.bfloat16
    assert set(half.unique().tolist()) == {0.0, torch.tensor(pool.scale).bfloat16().item()}


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


def two_layer_classifier(kind: str, export_root) -> nn.Module:
    """The two classes that read `<s>` alone in their last layer: the study's relative-bias
    class (its own switch) and plain `RobertaForSequenceClassification` (patched), at dropout
    0.1 with attention dropout 0 (SDPA's masks are PyTorch's, drawn in its kernel)."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    if kind == "relative_bias":
        root = finetune_speed.make_export(str(export_root), 2, 64)
        return classifier.classifier(root, 2, "pretrained", 0.1, 0.0)
    config = RobertaConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=40, hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.0, num_labels=2,
    )  # fmt: skip
    return RobertaForSequenceClassification(config)


@pytest.mark.parametrize("kind", ["relative_bias", "roberta"])
def test_the_first_token_last_layer_is_the_full_layers_row_under_dropout(kind, tmp_path):
    """Above dropout 0: with the same host masks, the last layer at `<s>` alone gives the
    full last layer's logits, loss and gradients. Its layers before the last draw the same
    masks in the same order; the last layer's sites and the head's draw other amounts from
    the pool, so the full model's `<s>` row is given the masks the first-token model drew
    there (forward hooks): a site the `<s>`-only layer skipped, added or took in another
    order would show."""
    torch.manual_seed(0)
    full = two_layer_classifier(kind, tmp_path)
    first = copy.deepcopy(full)
    assert classifier.read_first_token_only(first)
    if kind == "relative_bias":
        full.first_token_only = False
    for model in (full, first):
        assert host_dropout.use_host_dropout(model) > 0
        model.train()
    last = full.roberta.encoder.layer[-1]
    sites = ("attention.output.dropout", "output.dropout")
    names = [f"roberta.encoder.layer.{len(full.roberta.encoder.layer) - 1}.{s}" for s in sites]
    names.append("classifier.dropout")  # twice a forward: before and after the dense layer
    assert all(isinstance(full.get_submodule(n), host_dropout.HostDropout) for n in names)
    assert last is full.get_submodule(names[0].rsplit(".", 3)[0])

    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(5, 100, (6, 12)))
    ids[:, 0], ids[3:, 9:] = 0, 1  # <s>; the last three rows padded
    mask, labels = ids != 1, torch.tensor([0, 1, 1, 0, 1, 0])
    kept: dict[str, list] = {n: [] for n in names}

    def record(name):
        def hook(module, inputs, output):
            kept[name].append(output != 0)

        return hook

    def replay(name):
        def hook(module, inputs, output):
            keep = kept[name].pop(0)
            if output.dim() == 2:  # the head's [B, E]
                return inputs[0] * keep * module.pool.scale
            output = output.clone()
            output[:, :1] = inputs[0][:, :1] * keep * module.pool.scale
            return output

        return hook

    def run(model, hook):
        handles = [model.get_submodule(n).register_forward_hook(hook(n)) for n in names]
        torch.manual_seed(1)
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask).logits
        loss = torch.nn.functional.cross_entropy(out, labels)
        loss.backward()
        for h in handles:
            h.remove()
        return out.detach(), loss.item(), {k: p.grad.clone() for k, p in model.named_parameters()}

    got = run(first, record)
    assert [len(kept[n]) for n in names] == [1, 1, 2]
    assert all(k.shape[1] == 1 for n in names[:2] for k in kept[n])  # `<s>`'s row alone
    share = torch.cat([k.reshape(-1) for v in kept.values() for k in v]).float().mean().item()
    assert 0.8 < share < 0.97, share  # dropout acts, at about its rate
    want = run(full, replay)
    assert all(not v for v in kept.values())  # every recorded mask was used, in order
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=1e-5)  # logits ~1e-3
    assert abs(got[1] - want[1]) < 1e-6
    for name, grad in want[2].items():
        torch.testing.assert_close(got[2][name], grad, atol=1e-7, rtol=1e-4, msg=name)
    first.eval()
    with torch.no_grad():
        plain = first(input_ids=ids, attention_mask=mask).logits
    assert not torch.allclose(plain, got[0], atol=1e-3)  # the masks changed the logits


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
