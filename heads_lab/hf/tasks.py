"""The task kinds of `hf:` models, one class each: what a model reads and is scored on.

- `translate` (an encoder-decoder: Marian): the source with its end token (</s>) into the
  encoder, the decoder teacher-forced on the reference (its start token + the reference), the
  loss over the reference tokens; maps at enc-self, dec-self and dec-enc; metric BLEU and chrF
  of its beam-search translations (sacrebleu) and the reference perplexity.
- `mlm` (an encoder: BERT, DistilBERT): [CLS] text [SEP]; a fixed 15 % of the text's tokens
  masked (seeded: the same positions every time), the loss over them; maps at enc-self; metric
  masked-token accuracy, loss and perplexity.
- `lm` (a decoder-only causal language model: GPT-2, Pythia, Llama, Mistral, Qwen2): BOS + text,
  where the tokenizer does not add the BOS itself (GPT-2, Pythia, Qwen2: their `<|endoftext|>`,
  as TransformerLens's `to_tokens` prepends it; Llama's tokenizer adds its own <s>); every token
  after the BOS predicted from those before it; maps at lm-self; metric perplexity per token and
  bits per byte = Σ NLL (nats) / (ln 2 · UTF-8 bytes of the texts scored, + 1 per end token the
  tokenizer appends), each text scored on its own from its BOS.

A task supplies the model's inputs and labels (`batch`), the attentions per site (`attentions`),
its special-token rule (`encode`, `text_end`, `check`), the metric of a pruning point
(`evaluate`) and what `info` says of its layers; heads_lab/hf/heads.py, prune.py and
subject.py call these and hold no branch on the task. A new task kind is one class here and its
name in TASKS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from heads_lab.errors import DataError

MASK_SHARE, MASK_SEED = 0.15, 20261127


@dataclass
class Batch:
    """Padded model inputs for sentences (src ids with the model's special tokens; tgt: a
    translator's reference ids, pieces + </s>)."""

    kwargs: dict[str, Any]
    src_len: list[int]
    tgt_len: list[int]


def padded(rows: list[list[int]], pad: int):
    """([rows, width] ids padded on the right with `pad`, the attention mask)."""
    import torch  # lazy: start-up time (torch)

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


def pad_id(pre) -> int:
    return pre.config.pad_token_id if pre.config.pad_token_id is not None else 0


@dataclass
class EvalData:
    """What a pruning point is evaluated on: the texts' ids, a translator's reference ids and
    reference texts, and the texts themselves (a language model's bytes)."""

    src: list[list[int]]
    tgt: list[list[int]] | None
    refs: list[str] | None
    texts: list[str]


class Task:
    """What every task kind has (see the module doc); the three below fill it in."""

    name: str
    sites: tuple[str, ...]
    metric: tuple[str, str]  # the pruning figure's metric: (key, label with {split})
    columns: tuple[str, ...]  # the pruning table's metric columns
    references: bool = False  # its loss reads reference translations
    text_end: int = 1  # special tokens after the text (a source's </s>, [SEP]): not words
    flops_length: int = 20  # info: the tokens of the forward pass whose FLOPs it counts
    prune_note: str = ""  # what the pruning table's note adds of how the metric is measured
    flops_said: str = "an encoder on a {tokens}-token text"  # info's note (flops_inputs' lengths)

    def check(self, name: str, tok, config) -> None:
        """A tokenizer without a special token the task needs: one line (a DataError)."""

    def start(self, tok, config) -> list[int]:
        """What `encode` puts before the tokenizer's own ids."""
        return []

    def encode(self, tok, start: list[int], texts: list[str]) -> list[list[int]]:
        return [start + list(ids) for ids in tok(list(texts))["input_ids"]]

    def spans(self, tok, start: list[int], text: str
              ) -> tuple[list[int], list[tuple[int, int]]] | None:
        """The ids of `text` as `encode` makes them, and each one's character span (special
        tokens: an empty one); None where the tokenizer gives no offsets."""
        try:
            enc = tok(text, return_offsets_mapping=True)
        except NotImplementedError:  # a tokenizer without offsets (Marian's SentencePiece)
            return None
        spans = enc.get("offset_mapping")
        if not spans:
            return None
        return start + list(enc["input_ids"]), [(0, 0)] * len(start) + [tuple(s) for s in spans]

    def batch(self, pre, src: list[list[int]], tgt: list[list[int]] | None, device="cpu",
              loss: bool = False) -> Batch:
        """The model's inputs; with `loss`, the labels its loss reads."""
        ids, mask = padded(src, pad_id(pre))
        return Batch({"input_ids": ids.to(device), "attention_mask": mask.to(device)},
                     [len(s) for s in src], [0] * len(src))

    def attentions(self, pre, b: Batch, has_target: bool) -> dict[str, Any]:
        """Per site the model's attention weights of the batch ([layers] of [batch, heads,
        query, key])."""
        out = pre.model(**{k: v for k, v in b.kwargs.items() if k != "labels"},
                        output_attentions=True)
        return {self.sites[0]: out.attentions}

    def tgt_in(self, pre, tgt: list[int] | None) -> list[int]:
        """A sentence's decoder input as its maps are labelled (none but a translator's)."""
        return []

    def layers(self, pre) -> str:
        return str(pre.layers(self.sites[0]))

    def flops_inputs(self, pre, length: int) -> tuple[dict[str, Any], int, dict[str, int]]:
        """info's forward pass: (inputs, the tokens its FLOPs are divided by, the lengths)."""
        import torch  # lazy: start-up time (torch)

        ids = torch.full((1, length), 5, dtype=torch.long, device=pre.model.device)
        return ({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, length,
                {"tokens": length})

    def kv_cache(self, pre, dtype_bytes: int) -> tuple[int | None, str]:
        """Bytes of key/value cache per token, and what it is a token of (None: no cache)."""
        return None, "no cache: an encoder reads its text at once"

    def evaluate(self, pre, data, device, batch_size: int, beam: int) -> dict[str, Any]:
        """The task metric of the current model (its heads masked by the caller)."""
        raise NotImplementedError


class Translate(Task):
    name, sites = "translate", ("enc-self", "dec-self", "dec-enc")
    metric, columns, references = ("bleu", "{split} BLEU"), ("bleu", "chrf", "ppl"), True
    flops_said = "a translator per target token, {src} source and {tgt} target tokens"

    def batch(self, pre, src, tgt, device="cpu", loss=False) -> Batch:
        """A translator's decoder_input_ids (its start token + the reference without </s>) and
        labels beside the source, where references are given."""
        b = super().batch(pre, src, None, device)
        if tgt is None:
            return b
        dec = [self.tgt_in(pre, t) for t in tgt]
        dec_ids, _ = padded(dec, pad_id(pre))
        labels, _ = padded(tgt, -100)
        b.kwargs |= {"decoder_input_ids": dec_ids.to(device), "labels": labels.to(device)}
        b.tgt_len = [len(d) for d in dec]
        return b

    def tgt_in(self, pre, tgt):
        return [pre.config.decoder_start_token_id] + list(tgt[:-1]) if tgt is not None else []

    def attentions(self, pre, b, has_target):
        inputs = {k: v for k, v in b.kwargs.items() if k != "labels"}
        if not has_target:  # the encoder alone
            return {"enc-self": pre.model.get_encoder()(**inputs, output_attentions=True).attentions}
        out = pre.model(**inputs, output_attentions=True)
        return {"enc-self": out.encoder_attentions, "dec-self": out.decoder_attentions,
                "dec-enc": out.cross_attentions}

    def layers(self, pre):
        return f"{pre.layers('enc-self')}+{pre.layers('dec-self')}"

    def flops_inputs(self, pre, length):
        import torch  # lazy: start-up time (torch)

        kwargs, _, _ = super().flops_inputs(pre, length)
        kwargs["decoder_input_ids"] = torch.full((1, length), 5, dtype=torch.long,
                                                 device=pre.model.device)
        return kwargs, length, {"src": length, "tgt": length}

    def kv_cache(self, pre, dtype_bytes):
        layers, kv, d_k = pre.layers("dec-self"), pre.kv_heads["dec-self"], pre.d_k["dec-self"]
        return (2 * layers * kv * d_k * dtype_bytes,
                "per target token, the decoder's self-attention (its cross-attention keeps as "
                "much again per source token)")

    def evaluate(self, pre, data, device, batch_size, beam):
        from heads_lab.training.evaluate import score  # lazy: start-up time (sacrebleu)

        losses, tokens, hyps = 0.0, 0, []
        for start in range(0, len(data.src), batch_size):
            part = data.src[start:start + batch_size]
            part_tgt = data.tgt[start:start + batch_size] if data.tgt is not None else None
            b = self.batch(pre, part, part_tgt, device, loss=True)
            out = pre.model(**b.kwargs)
            n = int((b.kwargs["labels"] != -100).sum())
            losses += float(out.loss) * n
            tokens += n
            if data.refs is not None:
                generated = pre.model.generate(
                    input_ids=b.kwargs["input_ids"], attention_mask=b.kwargs["attention_mask"],
                    num_beams=beam, max_new_tokens=int(1.5 * b.kwargs["input_ids"].shape[1]) + 10)
                hyps += pre.tokens.decode(generated.tolist())
        loss = losses / max(tokens, 1)
        s = score(hyps, data.refs, None)
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": tokens,
                "bleu": s["bleu"], "chrf": s["chrf"], "bleu_signature": s["bleu_signature"]}


class MaskedLM(Task):
    name, sites = "mlm", ("enc-self",)
    metric, columns = ("accuracy", "{split} masked-LM accuracy"), ("accuracy", "loss", "ppl")

    def check(self, name, tok, config):
        if tok.mask_token_id is None:
            raise DataError(f"hf:{name}: its tokenizer has no mask token, which a masked-LM "
                            "encoder's loss needs; save the model's own tokenizer beside it "
                            "(tokenizer.save_pretrained)")

    def batch(self, pre, src, tgt, device="cpu", loss=False) -> Batch:
        b = super().batch(pre, src, None, "cpu")
        if loss:
            b.kwargs |= self.masked(pre, b.kwargs["input_ids"], b.kwargs["attention_mask"])
        b.kwargs = {k: v.to(device) for k, v in b.kwargs.items()}
        return b

    @staticmethod
    def masked(pre, ids, mask) -> dict[str, Any]:
        """A fixed MASK_SHARE of the non-special tokens of each sentence replaced by [MASK] (at
        least one), their ids the labels: the masked-LM loss importance and pruning read."""
        import torch  # lazy: start-up time (torch)

        tok = pre.tokens.tok
        special = set(tok.all_special_ids)
        rng = np.random.default_rng(MASK_SEED)
        masked, labels = ids.clone(), torch.full_like(ids, -100)
        for i in range(ids.shape[0]):
            where = [j for j in range(int(mask[i].sum())) if int(ids[i, j]) not in special]
            if not where:
                continue
            chosen = rng.choice(where, size=max(1, round(MASK_SHARE * len(where))), replace=False)
            labels[i, chosen] = ids[i, chosen]
            masked[i, chosen] = tok.mask_token_id
        return {"input_ids": masked, "labels": labels}

    def layers(self, pre):
        return f"{pre.layers('enc-self')} (encoder)"

    def evaluate(self, pre, data, device, batch_size, beam):
        losses, tokens, correct = 0.0, 0, 0
        for start in range(0, len(data.src), batch_size):
            b = self.batch(pre, data.src[start:start + batch_size], None, device, loss=True)
            out = pre.model(**b.kwargs)
            labels = b.kwargs["labels"]
            n = int((labels != -100).sum())
            losses += float(out.loss) * n
            tokens += n
            correct += int(((out.logits.argmax(-1) == labels) & (labels != -100)).sum())
        loss = losses / max(tokens, 1)
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": tokens,
                "accuracy": correct / max(tokens, 1)}


class CausalLM(Task):
    name, sites = "lm", ("lm-self",)
    metric, columns = ("bits_per_byte", "{split} bits per byte"), ("bits_per_byte", "loss", "ppl")
    text_end = 0  # BOS + text: nothing after it
    flops_length = 128
    flops_said = "a language model at {tokens} tokens of context (or its positions where fewer)"
    prune_note = "; each text scored on its own from its BOS, bits per byte over its UTF-8 bytes"

    @staticmethod
    def bos(tok, config) -> int | None:
        """The token a text starts from: the tokenizer's BOS, else the model's, else its
        end-of-text token (GPT-2, Pythia and Qwen2 start a document with <|endoftext|>)."""
        for candidate in (tok.bos_token_id, getattr(config, "bos_token_id", None),
                          tok.eos_token_id):
            if candidate is not None:
                return int(candidate)
        return None

    def check(self, name, tok, config):
        if self.bos(tok, config) is None:
            raise DataError(f"hf:{name}: its tokenizer has no BOS or end-of-text token to start "
                            "a text from, which a causal language model reads first; save the "
                            "model's own tokenizer beside it (tokenizer.save_pretrained)")

    def start(self, tok, config) -> list[int]:
        """[BOS] where the tokenizer does not add it itself, else []."""
        bos = self.bos(tok, config)
        first = tok("a")["input_ids"][:1]
        return [] if first == [bos] else [bos]

    def batch(self, pre, src, tgt, device="cpu", loss=False) -> Batch:
        """Every token after the BOS is a label (the model shifts them: token t is predicted
        from the tokens before it); padding is not."""
        b = super().batch(pre, src, None, device)
        if loss:
            labels, _ = padded(src, -100)
            b.kwargs["labels"] = labels.to(device)
        return b

    def layers(self, pre):
        return f"{pre.layers('lm-self')} (decoder-only)"

    def kv_cache(self, pre, dtype_bytes):
        layers, kv, d_k = pre.layers("lm-self"), pre.kv_heads["lm-self"], pre.d_k["lm-self"]
        return 2 * layers * kv * d_k * dtype_bytes, "per token of context (keys and values)"

    def evaluate(self, pre, data, device, batch_size, beam):
        """Σ NLL over every token after each text's BOS (in nats), per token (loss, PPL) and per
        UTF-8 byte of the texts (bits per byte; an end token the tokenizer appends is one byte
        more)."""
        import torch.nn.functional as F  # lazy: start-up time (torch)

        nll, tokens, extra = 0.0, 0, 0
        eos = pre.tokens.tok.eos_token_id
        for start in range(0, len(data.src), batch_size):
            b = self.batch(pre, data.src[start:start + batch_size], None, device, loss=True)
            logits = pre.model(**{k: v for k, v in b.kwargs.items() if k != "labels"}).logits
            labels = b.kwargs["labels"][:, 1:]
            nll += float(F.cross_entropy(logits[:, :-1].float().transpose(1, 2), labels,
                                         ignore_index=-100, reduction="sum"))
            scored = labels != -100
            tokens += int(scored.sum())
            if eos is not None and eos != self.bos(pre.tokens.tok, pre.config):
                extra += int(((labels == eos) & scored).sum())
        size = sum(len(t.encode("utf-8")) for t in data.texts) + extra
        loss = nll / max(tokens, 1)
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": tokens,
                "bits_per_byte": nll / (math.log(2) * max(size, 1)), "bytes": size}


TASKS = {task.name: task for task in (Translate(), MaskedLM(), CausalLM())}
