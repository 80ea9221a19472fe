"""The chain is Qwen3: transformers' own Qwen3ForCausalLM (random weights, no hub) against the chain loaded from its
state dict by gradsweep.nn.hf.

FP64 Hugging Face is the reference, bf16 Hugging Face the stock baseline (what a user runs today), the Triton
chain the candidate; every comparison goes through the contract's ratio rule for the ``chain`` op (no tolerance
here). The chain's own FP64 reference (the sweep's) is held to the same rule. On the CPU: a tiny config under
the Triton interpreter. On a GPU (marker ``gpu``, in a clean process): a Qwen3-8B-shaped config with 2 layers.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # never reach the hub

import math

import pytest
import torch
import transformers  # a test dependency (CPU only): a missing one fails here, it never skips

from gradsweep.canonical import RowIdentity
from gradsweep.contract import load_contract
from gradsweep.harness.accuracy import check_accuracy, stock_error_of
from gradsweep.manifest import MANIFEST_DIR
from gradsweep.nn import Qwen3Decoder, new_context, reference_logp
from gradsweep.nn.hf import chain_weights, hf_gradients, hf_name, shape_from_config
from gradsweep.nn.qwen3 import WEIGHTS
from tests.helpers import run_compiled

TINY = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
QWEN3_8B_2_LAYERS = {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 2,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
TINY_LENGTHS = [37, 1, 22]
GPU_LENGTHS = [700, 77, 1031, 1]
SEED = 1234


def _config(fields: dict):
    return transformers.Qwen3Config(**fields, rms_norm_eps=1e-6, max_position_embeddings=4096,
                                    rope_parameters={"rope_type": "default", "rope_theta": 1.0e6},
                                    tie_word_embeddings=False, attn_implementation="eager")


def _hf_state(config, device: str) -> dict[str, torch.Tensor]:
    """Random weights (the sweep's scales: unit activations, not HF's 0.02 init), rounded to bf16 once so every
    model below consumes the same values."""
    shape = shape_from_config(config)
    gen = torch.Generator(device=device).manual_seed(SEED)
    state = {}
    for w in WEIGHTS:
        for layer in range(shape.layers) if w.per_layer else [None]:
            u = (torch.rand(w.shape(shape), generator=gen, device=device) * 2 - 1) * math.sqrt(3.0)
            state[hf_name(w, layer)] = (w.offset + w.scale(shape) * u).to(torch.bfloat16)
    return state


def _hf_run(config, state, dtype, lengths, ids, targets, upstream):
    """Per-token logp and parameter gradients of transformers' Qwen3, one sample per forward (B=1)."""
    device = ids.device
    with torch.device(device):
        model = transformers.Qwen3ForCausalLM(config).to(dtype)
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    logps, first = [], 0
    for n in lengths:
        pos = torch.arange(n, device=device)[None]
        logits = model(input_ids=ids[first:first + n][None], position_ids=pos).logits[0]
        lp = torch.log_softmax(logits.to(torch.promote_types(dtype, torch.float32)), -1)
        logps.append(lp.gather(-1, targets[first:first + n, None])[:, 0])
        first += n
    logp = torch.cat(logps)
    logp.backward(upstream.to(logp.dtype))
    grads = {name: p.grad.detach() for name, p in model.named_parameters()}
    del model
    return {"logp": logp.detach(), **grads}


def compare(fields: dict, lengths: list[int], device: str) -> dict[str, dict[str, tuple[float, float, float]]]:
    """(error, stock error, bound) per tensor, for the Triton chain and for the sweep's FP64 reference."""
    config = _config(fields)
    shape = shape_from_config(config)
    state = _hf_state(config, device)
    total = sum(lengths)
    gen = torch.Generator(device=device).manual_seed(SEED + 1)
    ids = torch.randint(0, shape.vocab, (total,), generator=gen, device=device)
    targets = torch.randint(0, shape.vocab, (total,), generator=gen, device=device)
    upstream = torch.randn(total, generator=gen, device=device) / total
    ref = _hf_run(config, state, torch.float64, lengths, ids, targets, upstream.double())
    stock = _hf_run(config, state, torch.bfloat16, lengths, ids, targets, upstream)

    rows = RowIdentity.packed(lengths)
    weights = {n: t.requires_grad_(True) for n, t in chain_weights(state, shape, device=device).items()}
    ctx = new_context(shape, lengths, device)
    ctx.begin_call(rows)
    logp = Qwen3Decoder(shape, "triton", weights)(ids, targets, ctx)
    logp.backward(upstream)
    cand = {"logp": logp.detach(), **hf_gradients({n: f.finish() for n, f in ctx.folds.items()}, shape)}
    del weights, ctx

    w64 = {n: t.requires_grad_(True) for n, t in chain_weights(state, shape, torch.float64, device).items()}
    ref_logp = reference_logp(w64, ids, targets, rows, shape)
    ref_logp.backward(upstream.double())
    ours64 = {"logp": ref_logp.detach(), **hf_gradients({n: t.grad for n, t in w64.items()}, shape)}

    contract = load_contract(MANIFEST_DIR / "contract.yaml")
    profile = "triton_interpret" if device == "cpu" else "triton_cuda_bf16"
    out: dict[str, dict[str, tuple[float, float, float]]] = {"triton": {}, "reference": {}}
    assert set(cand) == set(ref) == set(stock) == set(ours64)
    for name in ref:
        kind = "forward" if name == "logp" else "gradient"
        for who, run in (("triton", cand), ("reference", ours64)):
            acc = check_accuracy(contract, "chain", profile, name, kind, "bf16", run[name], ref[name],
                                 stock_error=stock_error_of(stock[name], ref[name]))
            out[who][name] = (acc.error, acc.stock_error, acc.bound)
    return out


def failures(measured: dict[str, dict[str, tuple[float, float, float]]]) -> list[str]:
    return [f"{who} {name}: error {e:.3g} > bound {b:.3g} (stock {s:.3g})"
            for who, per in measured.items() for name, (e, s, b) in per.items() if not e <= b]


def test_loader_maps_every_hf_weight_and_refuses_what_it_cannot_map():
    config = _config(TINY)
    shape = shape_from_config(config)
    assert (shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.rope_theta) == (32, 4, 2, 16, 1.0e6)
    state = _hf_state(config, "cpu")
    model = transformers.Qwen3ForCausalLM(config)
    assert set(state) == {n for n, _ in model.named_parameters()}
    weights = chain_weights(state, shape)
    assert torch.equal(weights["q_proj"][1], state["model.layers.1.self_attn.q_proj.weight"])
    with pytest.raises(ValueError, match="has no place"):
        chain_weights({**state, "model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}, shape)
    with pytest.raises(ValueError, match="attention_bias"):
        shape_from_config({**config.to_dict(), "attention_bias": True})
    with pytest.raises(ValueError, match="no tensor"):
        chain_weights({k: v for k, v in state.items() if "layers.1.mlp" not in k}, shape)
    tied = {k: v for k, v in state.items() if k != "lm_head.weight"}
    assert torch.equal(chain_weights(tied, shape)["lm_head"], state["model.embed_tokens.weight"])


def test_safetensors_file_round_trip(tmp_path):
    from safetensors.torch import save_file

    config = _config(TINY)
    state = _hf_state(config, "cpu")
    save_file(state, str(tmp_path / "model.safetensors"))
    a = chain_weights(tmp_path, shape_from_config(config))
    b = chain_weights(state, shape_from_config(config))
    assert set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)


def test_chain_matches_transformers_qwen3_within_the_contract_cpu():
    measured = compare(TINY, TINY_LENGTHS, "cpu")
    assert len(measured["triton"]) == 1 + 3 + 11 * 2  # logp, embed / final norm / lm_head, 11 weights a layer
    assert failures(measured) == []


_GPU_SCRIPT = """
import json, sys
from tests.test_qwen3_hf import GPU_LENGTHS, QWEN3_8B_2_LAYERS, compare, failures
measured = compare(QWEN3_8B_2_LAYERS, GPU_LENGTHS, "cuda")
print(json.dumps(measured))
bad = failures(measured)
print("\\n".join(bad) if bad else "HF-OK")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_chain_matches_transformers_qwen3_8b_shape_gpu():
    """Qwen3-8B's layer shape, 2 layers, random weights, compiled Triton kernels (a clean process)."""
    res = run_compiled(_GPU_SCRIPT, timeout=1500, env={"GRADSWEEP_HF_DEVICE": "cuda"})
    assert "HF-OK" in res.stdout, res.stdout[-4000:] + res.stderr[-4000:]
