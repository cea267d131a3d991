"""A tiny random-weight Qwen3 (GQA, RoPE) with a local byte-level BPE tokenizer.

Deterministic from the seed; loadable by SGLang and HF transformers. float32 weights,
so served with ``--dtype float32`` its logits can be compared with a reference loop.
The tests build it for exact comparisons (the bundled trained model is ``vase_sglang.bundled.model``).

    python -m vase_sglang.bundled.tiny_model OUT_DIR
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = ("the a of and to in is it that for on with as was at by an be this have from or one had not but what all "
         "were when we there can your which their said if do will each about how up out them then she many some so "
         "kv cache token decode budget recent window attention layer head value key query").split()


def _corpus(seed: int, n_lines: int = 2000):
    rng = random.Random(seed)
    for _ in range(n_lines):
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 16)))
        if rng.random() < 0.3:
            line += " " + str(rng.randint(0, 99999))
        yield line


def build_tiny_qwen3(out: Path, seed: int = 1234, vocab: int = 512) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(_corpus(seed)), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    fast.save_pretrained(out)
    pad_id = fast.convert_tokens_to_ids("<|endoftext|>")
    assert isinstance(pad_id, int)
    # transformers takes rope_theta / torch_dtype through **kwargs (its stubs do not list them).
    cfg = Qwen3Config(  # type: ignore[call-arg]
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
        rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="float32",
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"), pad_token_id=pad_id,
        use_sliding_window=False, sliding_window=None,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)  # type: ignore[arg-type]  # transformers' typed .to
    with torch.no_grad():  # larger than the default init, so outputs depend on the prompt
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.save_pretrained(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m vase_sglang.bundled.tiny_model OUT_DIR")
    print(build_tiny_qwen3(Path(sys.argv[1])))
