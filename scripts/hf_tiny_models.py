"""Tiny random-weight Hugging Face models, built here from their configs with tokenizers trained on
local text and saved with `save_pretrained`: what heads-lab's `hf:` support is tested on where no
pretrained weights can be downloaded, and what anyone can run `heads-lab info / analyze / prune`
on without a network.

    python scripts/hf_tiny_models.py --out outputs/hf_tiny
    heads-lab info hf:outputs/hf_tiny/marian hf:outputs/hf_tiny/bert hf:outputs/hf_tiny/distilbert

Writes <out>/marian (MarianMTModel de→en, with a MarianTokenizer: one SentencePiece model for
both sides), <out>/bert (BertForMaskedLM) and <out>/distilbert (DistilBertForMaskedLM), the two
encoders sharing one WordPiece vocabulary, and the causal language models <out>/gpt2,
<out>/gpt_neox, <out>/llama, <out>/mistral (4 query heads sharing 2 key/value heads) and
<out>/qwen2 (head_dim 32, not d_model / h), each with a byte-level BPE tokenizer (Llama's and
Mistral's add their BOS <s> themselves, the others start from <|endoftext|>); d_model 64, 4
heads, 2 layers (2+2 for Marian). The
tokenizers are trained on Multi30k's German and English training text where $HEADS_LAB_DATA (or
--data) holds it, else on heads-lab's embedded synthetic language pair. The weights are random
(seeded) and the vocabularies' ids the same every build: the models are for testing the
plumbing, not for their numbers.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

SEED = 20261127
D_MODEL, HEADS, LAYERS, FFN, POSITIONS = 64, 4, 2, 128, 256


def texts(data: Path | None, count: int = 6000) -> list[str]:
    """German and English sentences to train the tokenizers on."""
    root = data / "multi30k" if data else None
    if root and (root / "train.de.gz").is_file():
        out = []
        for lang in ("de", "en"):
            with gzip.open(root / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
                out += [line.strip() for _, line in zip(range(count), f)]
        return out
    from heads_lab.config.schemas import SyntheticDataConfig  # lazy: only without Multi30k
    from heads_lab.data.synthetic import generate

    pairs = generate(SyntheticDataConfig(train_size=count, valid_size=10, test_size=10))["train"]
    return [p.src_text for p in pairs] + [p.tgt_text for p in pairs]


def marian(out: Path, lines: list[str]) -> Path:
    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "text.txt"
        corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(Path(tmp) / "spm"), vocab_size=1000,
            model_type="unigram", character_coverage=1.0, pad_id=-1, bos_id=-1, eos_id=1,
            unk_id=0, minloglevel=2)
        for name in ("source.spm", "target.spm"):
            (out / name).write_bytes((Path(tmp) / "spm.model").read_bytes())
    sp = spm.SentencePieceProcessor(model_file=str(out / "source.spm"))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    vocab["</s>"], vocab["<unk>"] = 1, 0
    vocab["<pad>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"),
                                str(out / "vocab.json"), source_lang="de", target_lang="en")
    config = MarianConfig(vocab_size=len(vocab), d_model=D_MODEL, encoder_layers=LAYERS,
                          decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                          decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
                          decoder_ffn_dim=FFN, max_position_embeddings=POSITIONS,
                          pad_token_id=vocab["<pad>"], eos_token_id=1,
                          decoder_start_token_id=vocab["<pad>"], forced_eos_token_id=1,
                          scale_embedding=True, num_beams=1, max_length=64)
    torch.manual_seed(SEED)
    MarianMTModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def encoders(out: Path, lines: list[str]) -> tuple[Path, Path]:
    import torch
    from tokenizers import BertWordPieceTokenizer
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertTokenizerFast,
        DistilBertConfig,
        DistilBertForMaskedLM,
        DistilBertTokenizerFast,
    )

    words = BertWordPieceTokenizer(lowercase=False, strip_accents=False)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "text.txt"
        corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
        words.train([str(corpus)], vocab_size=1000, min_frequency=1)
        words.save_model(tmp)
        vocab = Path(tmp) / "vocab.txt"
        # the same ids every build: the trainer orders its pieces differently each time (the same
        # set); its special tokens first, as it writes them, then the pieces sorted
        pieces = vocab.read_text(encoding="utf-8").splitlines()
        specials = [p for p in pieces if p.startswith("[") and p.endswith("]")]
        vocab.write_text("\n".join(specials + sorted(set(pieces) - set(specials))) + "\n",
                         encoding="utf-8")
        bert_tok = BertTokenizerFast(str(vocab), do_lower_case=False, strip_accents=False)
        distil_tok = DistilBertTokenizerFast(str(vocab), do_lower_case=False, strip_accents=False)
    size = bert_tok.vocab_size
    torch.manual_seed(SEED)
    bert = BertForMaskedLM(BertConfig(vocab_size=size, hidden_size=D_MODEL, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, intermediate_size=FFN,
                                      max_position_embeddings=POSITIONS))
    torch.manual_seed(SEED)
    distil = DistilBertForMaskedLM(DistilBertConfig(vocab_size=size, dim=D_MODEL, n_layers=LAYERS,
                                                    n_heads=HEADS, hidden_dim=FFN,
                                                    max_position_embeddings=POSITIONS))
    paths = out / "bert", out / "distilbert"
    for path, model, tok in zip(paths, (bert, distil), (bert_tok, distil_tok)):
        model.save_pretrained(path)
        tok.save_pretrained(path)
    return paths


# the causal language models: (family, its special tokens (BOS, EOS; None: none), whether its
# tokenizer adds the BOS itself, query heads, key/value heads, head_dim or None for d / h)
CAUSAL = (("gpt2", "<|endoftext|>", "<|endoftext|>", False, HEADS, HEADS, None),
          ("gpt_neox", "<|endoftext|>", "<|endoftext|>", False, HEADS, HEADS, None),
          ("llama", "<s>", "</s>", True, HEADS, 2, None),
          ("mistral", "<s>", "</s>", True, HEADS, 2, None),
          ("qwen2", None, "<|endoftext|>", False, HEADS, 2, 2 * D_MODEL // HEADS))


def byte_bpe(lines: list[str], bos: str | None, eos: str, adds_bos: bool):
    """A byte-level BPE tokenizer (GPT-2's kind) trained on `lines`, with its special tokens
    first; `adds_bos`: it puts the BOS before every text itself (as Llama's does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys(t for t in (bos, eos) if t))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=1000, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    byte_level = processors.ByteLevel(trim_offsets=True)
    tok.post_processor = (processors.Sequence([byte_level, processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])])
        if adds_bos else byte_level)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   unk_token=None)


def causal(out: Path, lines: list[str], families: tuple[str, ...] | None = None
           ) -> dict[str, Path]:
    """Tiny random GPT-2, GPT-NeoX (Pythia's), Llama and Mistral (4 query heads sharing 2
    key/value heads) and Qwen2 (2 key/value heads, head_dim 32 ≠ d_model / h = 16) causal LMs,
    each with a byte-level BPE tokenizer (`families`: those only)."""
    import torch
    import transformers

    paths = {}
    for family, bos, eos, adds_bos, heads, kv, width in CAUSAL:
        if families is not None and family not in families:
            continue
        tok = byte_bpe(lines, bos, eos, adds_bos)
        ids = {"bos_token_id": tok.convert_tokens_to_ids(bos) if bos else None,
               "eos_token_id": tok.convert_tokens_to_ids(eos), "vocab_size": len(tok)}
        if family == "gpt2":
            config = transformers.GPT2Config(n_embd=D_MODEL, n_layer=LAYERS, n_head=heads,
                                             n_inner=FFN, n_positions=POSITIONS, **ids)
        elif family == "gpt_neox":
            config = transformers.GPTNeoXConfig(
                hidden_size=D_MODEL, num_hidden_layers=LAYERS, num_attention_heads=heads,
                intermediate_size=FFN, max_position_embeddings=POSITIONS, **ids)
        else:
            kind = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config"}
            config = getattr(transformers, kind[family])(
                hidden_size=D_MODEL, num_hidden_layers=LAYERS, num_attention_heads=heads,
                num_key_value_heads=kv, intermediate_size=FFN,
                max_position_embeddings=POSITIONS, **({"head_dim": width} if width else {}),
                **ids)
        model_class = {"gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM",
                       "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                       "qwen2": "Qwen2ForCausalLM"}[family]
        torch.manual_seed(SEED)
        model = getattr(transformers, model_class)(config)
        paths[family] = out / family
        model.save_pretrained(paths[family])
        tok.save_pretrained(paths[family])
    return paths


def build(out: Path, data: Path | None = None, lm: bool = True) -> dict[str, Path]:
    """The tiny models under `out` (with `lm`, the causal LMs too); returns {family: dir}."""
    lines = texts(data)
    bert, distil = encoders(out, lines)
    made = {"marian": marian(out / "marian", lines), "bert": bert, "distilbert": distil}
    return made | (causal(out, lines) if lm else {})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/hf_tiny", help="where the model dirs go")
    parser.add_argument("--data", default=os.environ.get("HEADS_LAB_DATA"),
                        help="the dir holding multi30k/ (default $HEADS_LAB_DATA); without it "
                             "the synthetic pair's text")
    opts = parser.parse_args(argv)
    missing = []
    for name in ("transformers", "tokenizers", "sentencepiece"):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        print(f"error: hf_tiny_models.py needs {', '.join(missing)} (the hf extra): "
              "pip install 'heads-lab[hf]'", file=sys.stderr)
        return 2
    for family, path in build(Path(opts.out), Path(opts.data) if opts.data else None).items():
        print(f"{family}: {path}  (heads-lab info hf:{path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
