"""Write a tiny random-weight Llama in Hugging Face format into the folder named by argv[1]:
the model the test suite's real vLLM serves (scripts/install-engines runs this with the vLLM
venv's Python, which has torch, transformers and tokenizers). Nothing is fetched: the
tokenizer is a byte-level BPE trained here on a fixed ASCII corpus, with ChatML's special
tokens and chat template. Same input, same files: the weights come from a fixed seed.

- 2 layers, hidden size 256, ~1000 tokens of vocabulary: a few MB, loads in seconds.
- The output rows of the special tokens are zero, so greedy decoding (temperature 0, what
  the tests use) never ends a generation by itself: a finish is `length` or a stop string.
- The vocabulary holds only the corpus's bytes (printable ASCII), so every token decodes to
  plain text.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WORDS = (
    "the a of to and in is it you that he was for on are with as his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she which do their "
    "time if will way about many then them write would like so these her long make thing see him two has look "
    "more day could go come did number sound no most people my over know water than call first who may down "
    "side been now find any new work part take get place made live where after back little only round man year "
    "came show every good me give our under name very through just form sentence great think say help low line "
    "differ turn cause much mean before move right boy old too same tell does set three want air well also play "
    "small end put home read hand port large spell add even land here must big high such follow act why ask men "
    "change went light kind off need house picture try us again animal point mother world near build self earth "
    "father head stand own page should country found answer school grow study still learn plant cover food sun "
    "four between state keep eye never last let thought city tree cross farm hard start might story saw far sea "
    "draw left late run while press close night real life few north open seem together next white children begin "
    "got walk example ease paper group always music those both mark often letter until mile river car feet care "
    "second book carry took science eat room friend began idea fish mountain stop once base hear horse cut sure "
    "watch color face wood main enough plain girl usual young ready above ever red list though feel talk bird "
    "soon body dog family direct pose leave song measure door product black short numeral class wind question "
    "happen complete ship area half rock order fire south problem piece told knew pass since top whole king space"
).split()
PUNCTUATION = [".", ",", "?", "!", ":", ";", "-", "'", '"', "(", ")", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]


def corpus() -> list[str]:
    """Lines of the words in a fixed pseudo-random order, with punctuation and capitals: every
    printable ASCII byte the tests send appears, so none is dropped by the tokenizer."""
    gen = torch.Generator().manual_seed(1)
    lines = []
    for _ in range(400):
        picks = torch.randint(0, len(WORDS), (12,), generator=gen).tolist()
        lines.append(" ".join(WORDS[i] for i in picks).capitalize() + ".")
    lines.append(" ".join(PUNCTUATION))
    lines.append("".join(chr(c) for c in range(32, 127)))  # each printable byte at least once
    return lines


def tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIAL, show_progress=False))
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        chat_template=CHATML,
        model_max_length=2048,
    )


def main(dest: Path) -> None:
    tok = tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=0.2,  # peaked logits: greedy decoding does not hover between near-ties
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for token in SPECIAL:
            model.lm_head.weight[tok.convert_tokens_to_ids(token)].zero_()
    model = model.to(torch.bfloat16)
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
