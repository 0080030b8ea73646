"""What a user would pick instead on a GPU: HuggingFace PyTorch RobertaForMaskedLM and
ModernBertForMaskedLM, random init, bf16 autocast, SDPA attention, fused AdamW, 15% of
tokens as labels. Prints tokens/s per model; the project's JAX step on the same shapes is
jax_speed's.

A spec's `:compile` runs the model under `torch.compile` (the peer a user who cares about
speed runs, issue #52), `:compile-MODE` with that mode (`max-autotune`, `reduce-overhead`, ...);
the warm-up steps, where it compiles, are timed apart from the measured ones.

Usage: python -m maelm_jax.benchmarks.torch_peer OUTDIR VOCAB name=model@BxS[:compile[-MODE]] ...
"""

import functools
import json
import sys
import time

import torch
import transformers

DEVICE = "cuda"


def build(model, vocab):
    if model == "roberta-base":
        cfg = transformers.RobertaConfig(vocab_size=vocab, max_position_embeddings=514)

        return transformers.RobertaForMaskedLM(cfg)
    if model == "roberta-large":
        cfg = transformers.RobertaConfig(
            vocab_size=vocab,
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            max_position_embeddings=514,
        )
        return transformers.RobertaForMaskedLM(cfg)
    if model == "modernbert-base":
        ids = dict(pad_token_id=0, bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2)
        cfg = transformers.ModernBertConfig(vocab_size=vocab, **ids)
        return transformers.ModernBertForMaskedLM(cfg)
    raise SystemExit(f"unknown model {model}")


def compiled(model, mode: str):
    """The model as the spec's mode runs it: eager (""), or torch.compile's (default) mode."""
    if not mode:
        return model
    kind, _, compile_mode = mode.partition("-")
    if kind != "compile":
        raise SystemExit(f"unknown mode {mode!r}: use compile or compile-MODE")
    return torch.compile(model, mode=compile_mode or None)


def train_step(step_model, opt, ids, labels):
    """One bf16-autocast forward, backward and fused AdamW update."""
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        loss = step_model(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def main(out: str, vocab: int, specs: list[str]) -> None:
    """Times each spec in turn, rewriting OUTDIR/torch_peer_<first name>.json after each."""
    print(
        "torch",
        torch.__version__,
        "transformers",
        transformers.__version__,
        torch.cuda.get_device_name(),
        flush=True,
    )
    results = {}
    for arg in specs:
        name, _, rest = arg.partition("=")
        model_name, _, shape = rest.partition("@")
        shape, _, mode = shape.partition(":")
        batch, seq = map(int, shape.split("x"))
        t0 = time.time()
        try:
            torch.manual_seed(0)
            model = build(model_name, vocab).to(DEVICE)
            model.train()
            step_model = compiled(model, mode)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            ids = torch.randint(5, vocab, (batch, seq), device=DEVICE)
            labels = torch.full_like(ids, -100)
            pick = torch.rand(batch, seq, device=DEVICE) < 0.15
            labels[pick] = ids[pick]

            step = functools.partial(train_step, step_model, opt, ids, labels)

            start = time.perf_counter()
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            warmup_s = time.perf_counter() - start
            times = []
            for _ in range(4):
                start = time.perf_counter()
                for _ in range(5):
                    loss = step()
                torch.cuda.synchronize()
                times.append((time.perf_counter() - start) / 5)
            times.sort()
            med = (times[1] + times[2]) / 2
            params = sum(p.numel() for p in model.parameters())
            results[name] = {
                "attn": getattr(model.config, "_attn_implementation", None),
                "model": model_name,
                "batch": batch,
                "seq": seq,
                "mode": mode or "eager",
                "step_s": med,
                "warmup_s": warmup_s,  # 3 steps: the compile, where there is one
                "tokens_per_sec": batch * seq / med,
                "params": params,
                "loss": float(loss),
                "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
            }
            print(name, json.dumps(results[name]), flush=True)
        except Exception as e:
            results[name] = {"error": f"{type(e).__name__}: {str(e)[:1500]}"}
            print(name, "FAILED", results[name]["error"], flush=True)
        finally:
            model = step_model = opt = None
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        print(f"{name}: {time.time() - t0:.0f} s", flush=True)
        with open(f"{out}/torch_peer_{specs[0].split('=')[0]}.json", "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__.strip().splitlines()[-1])
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
