"""Fixtures for the reward tests: a small byte-level BPE tokenizer built locally (no download)."""

from __future__ import annotations

import asyncio

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "<think>The image looks rotated.</think> <answer>90</answer>",
    "I rotate the image by 45 degrees and compare. The answer is 135.",
    "Wrong answer, try again. Tool response: image 2 rotated by -90.",
    r"\boxed{2\sqrt{3}} \frac{1}{2} 0123456789",
]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A saved ``PreTrainedTokenizerFast`` (byte-level BPE, ChatML special tokens) loadable by verl's hf_tokenizer."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    path = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: str) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)


@pytest.fixture
def event_loop_for_verl():
    """A fresh current event loop: verl's reward managers capture ``get_event_loop()`` when constructed."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()
    asyncio.set_event_loop(None)
