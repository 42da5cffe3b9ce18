"""The tiny model's tokenizer: a byte-level BPE trained on generated text, with the family's own tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from verl_mm_tools.tiny.corpus import generate_corpus
from verl_mm_tools.tiny.spec import TinyModelSpec

# Qwen's pre-tokenizer split (digits one by one, newlines on their own), so "\n" is exactly one token.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


def build_tokenizer(spec: TinyModelSpec) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on generated text, with the family's special tokens and chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    vocabulary = spec.family_record.vocabulary
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(vocabulary.special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(generate_corpus(spec.seed), trainer=trainer)
    core.add_tokens(list(vocabulary.added) + (list(vocabulary.thinking) if spec.template == "thinking" else []))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=vocabulary.eos,
        pad_token=vocabulary.pad,
        unk_token=None,
        bos_token=vocabulary.bos,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        extra_special_tokens=dict(vocabulary.named),
    )
    tokenizer.chat_template = spec.chat_template
    return tokenizer
