import hashlib
from pathlib import Path

from laneway.engines.demo_model import BANNED_BYTE_TOKENS, DemoModelShape, write_demo_model


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_gives_identical_file_and_another_seed_differs(tmp_path: Path) -> None:
    a = write_demo_model(tmp_path / "a.gguf", DemoModelShape(seed=3))
    b = write_demo_model(tmp_path / "b.gguf", DemoModelShape(seed=3))
    c = write_demo_model(tmp_path / "c.gguf", DemoModelShape(seed=4))
    assert sha(a) == sha(b) != sha(c)
    assert a.stat().st_size < 1_000_000
    assert not (tmp_path / "a.gguf.tmp").exists()


def test_llama_cpp_loads_it_with_the_documented_vocab(demo_model_path: Path) -> None:
    from llama_cpp import Llama

    llm = Llama(model_path=str(demo_model_path), n_ctx=256, verbose=False)
    try:
        assert llm.tokenize(b"<|im_start|><|im_end|>", add_bos=False, special=True) == [259, 260]
        assert llm.token_eos() == 2
        assert llm.detokenize([3 + ord("A")]) == b"A"  # byte fallback ids are 3..258
        assert "<|im_start|>" in llm.metadata["tokenizer.chat_template"]
    finally:
        llm.close()
    assert BANNED_BYTE_TOKENS[0] == 131 and BANNED_BYTE_TOKENS[-1] == 258
