"""Write the demo model: a seeded random-weight Llama GGUF that llama.cpp runs on any CPU.

Tokenizer: SentencePiece ("llama") with byte fallback, ChatML chat template.
Token ids: <unk>=0 <s>=1 </s>=2, bytes <0x00>..<0xFF>=3..258, <|im_start|>=259, <|im_end|>=260.
Random weights emit lone bytes 0x80-0xFF (invalid UTF-8), so the demo deployment bans
ids BANNED_BYTE_TOKENS with a logit bias; the same seed gives a byte-identical file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WORDS = (
    "the of and to in is that it for was on are with as be this have from or by not but what all were "
    "when we there can an your which their said if do will each about how up out them then she many some "
    "so these would other into has more her two like him see time could no make than first been its who "
    "now people hello world user assistant system model token test"
).split()

EOS_TOKEN = 2
IM_END_TOKEN = 260
# Bytes 0x80..0xFF are ids 131..258: alone they are invalid UTF-8.
BANNED_BYTE_TOKENS = tuple(range(3 + 0x80, 3 + 0x100))


@dataclass(frozen=True)
class DemoModelShape:
    seed: int = 0
    embd: int = 64
    layers: int = 2
    heads: int = 4
    heads_kv: int = 0
    ctx: int = 2048
    f16: bool = False


def _vocab() -> tuple[list[str], list[int], list[float]]:
    import gguf

    t = gguf.TokenType
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["<|im_start|>", "<|im_end|>"]
    types = [t.UNKNOWN, t.CONTROL, t.CONTROL] + [t.BYTE] * 256 + [t.CONTROL] * 2
    scores = [0.0] * len(toks)
    pieces = ["\u2581"] + [chr(c) for c in range(33, 127)]
    pieces += [("\u2581" + w)[:i] for w in WORDS for i in range(2, len(w) + 2)]
    seen = set(toks)
    for p in dict.fromkeys(pieces):
        if p not in seen:
            seen.add(p)
            toks.append(p)
            types.append(t.NORMAL)
            scores.append(-float(len(scores)))
    return toks, [int(x) for x in types], scores


def write_demo_model(out: Path, shape: DemoModelShape = DemoModelShape()) -> Path:
    """Write the GGUF to `out` (atomically: a reader never sees half a file) and return it."""
    from laneway.engines import extras

    extras.require(extras.GGUF)  # an optional extra: say which, not ModuleNotFoundError
    import gguf

    toks, types, scores = _vocab()
    vocab, embd, heads, layers = len(toks), shape.embd, shape.heads, shape.layers
    heads_kv = shape.heads_kv or heads
    head_dim, ff = embd // heads, 4 * embd
    rng = np.random.default_rng(shape.seed)
    wdt = np.float16 if shape.f16 else np.float32

    def rnd(o: int, i: int) -> np.ndarray:  # numpy (out, in) == ggml ne [in, out]
        out: np.ndarray = (rng.standard_normal((o, i)) * 0.5 / np.sqrt(i)).astype(wdt)
        return out

    def ones() -> np.ndarray:  # norm weights stay F32
        return np.ones(embd, np.float32)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("laneway-tiny-random-llama")
    w.add_context_length(shape.ctx)
    w.add_embedding_length(embd)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if shape.f16 else gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(EOS_TOKEN)
    w.add_eot_token_id(IM_END_TOKEN)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.add_chat_template(CHATML_TEMPLATE)
    w.add_tensor("token_embd.weight", rnd(vocab, embd))
    for i in range(layers):
        for name, tensor in [
            ("attn_norm", ones()),
            ("attn_q", rnd(embd, embd)),
            ("attn_k", rnd(heads_kv * head_dim, embd)),
            ("attn_v", rnd(heads_kv * head_dim, embd)),
            ("attn_output", rnd(embd, embd)),
            ("ffn_norm", ones()),
            ("ffn_gate", rnd(ff, embd)),
            ("ffn_up", rnd(ff, embd)),
            ("ffn_down", rnd(embd, ff)),
        ]:
            w.add_tensor(f"blk.{i}.{name}.weight", tensor)
    w.add_tensor("output_norm.weight", ones())
    w.add_tensor("output.weight", rnd(vocab, embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    return out
