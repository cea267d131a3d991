"""The bundled reasoning model: a small Qwen3 (GQA, RoPE) and its word-level tokenizer.

``vase_sglang.bundled.train`` trains it on the chain task (``vase_sglang.bundled.tasks.chain``)
and writes weights, tokenizer and chat template into one folder that SGLang and HF transformers load
as is. The trained folder ships inside the package (``bundled_model_path()``), so
``scripts/serve.sh`` serves it with no download.

The vocabulary is exactly the task's words, one token each: the chat markers, ``<think>``
and ``</think>``, the digits, and the names ``R<i>`` / step markers ``S<i>``, ``T<i>``.
Other text maps to ``<unk>``: this is a model of one task, not of language.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config

from vase_sglang.bundled.tasks.chain import MAX_MODULUS, MAX_NAMES

BUNDLED_NAME = "chain-qwen3"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
THINK = ["<think>", "</think>"]
WORDS = ["user", "assistant", "system", "vars", "steps", "solve", "answer"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def bundled_model_path() -> Path:
    """The trained model folder that ships with the package."""
    return Path(__file__).resolve().parent / BUNDLED_NAME


def vocabulary() -> list[str]:
    names = [f"{p}{i}" for p in ("R", "S", "T") for i in range(MAX_NAMES)]
    return SPECIALS + THINK + WORDS + [str(d) for d in range(MAX_MODULUS)] + names


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer; decoding joins tokens with single spaces."""
    vocab = {word: i for i, word in enumerate(vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"], clean_up_tokenization_spaces=False,
    )
    # <think> markers are ordinary added tokens (as in Qwen3): they survive skip_special_tokens.
    fast.add_tokens(THINK)
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    return fast


def model_config(tokenizer: PreTrainedTokenizerFast, layers: int = 4, hidden: int = 256,
                 intermediate: int = 768, heads: int = 4, kv_heads: int = 2) -> Qwen3Config:
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert isinstance(pad_id, int)
    # transformers takes rope_theta / torch_dtype through **kwargs (its stubs do not list them).
    return Qwen3Config(  # type: ignore[call-arg]
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=hidden // heads, max_position_embeddings=4096, rope_theta=10_000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, torch_dtype="float32", use_sliding_window=False, sliding_window=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=pad_id,
        bos_token_id=None,
    )


def chat_prompt(tokenizer: PreTrainedTokenizerFast, prompt: str) -> str:
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    assert isinstance(text, str)  # tokenize=False returns the rendered text
    return text
