"""A language model's evaluation (task=lm): the NLL of every held-out row, perplexity per token
and bits per byte, copy accuracy on repeats, and samples.

- Held-out text is scored row by row as the data gives it (heads_lab.data.lm): documents in
  non-overlapping blocks, each read from its BOS (a block's first tokens have little context, as
  in any non-overlapping evaluation; `eval.context` reads each block after up to that many tokens
  of the text before it, scoring only the block's own: a sliding window with the block as its
  stride), sentences each from its BOS with its EOS predicted. PPL = exp(Σ NLL / Σ tokens
  scored); bits per byte = Σ NLL / (ln 2 · Σ UTF-8 bytes scored, an EOS one byte). Every row's
  (tokens, bytes, NLL) is written (`scores.<split>.tsv`), so a report can resample rows: bits
  per byte is a ratio of sums, not a mean of the rows' own.
- Copy accuracy (data=repeats): the share of the second copy's tokens, the first of them
  excepted, that the model predicts greedily (argmax): copying in context.
- Samples: greedy and temperature continuations from the BOS (or a held-out text's start),
  for reading, not scoring.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from heads_lab.data import Split, bucket, collate
from heads_lab.data.tokenizer import BOS, EOS
from heads_lab.model import evaluating
from heads_lab.output.files import write_lines

LN2 = math.log(2)


def in_context(split: Split, context: int) -> tuple[Split, np.ndarray]:
    """A split of document blocks (open_end, consecutive) with each block preceded by up to
    `context` tokens of the blocks before it, and how many leading tokens of each row are that
    context (read, not scored)."""
    stream = np.concatenate([np.asarray(split.tgt[i], dtype=np.int64) for i in range(len(split))])
    lengths = np.asarray(split.tgt.lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    rows, lead = [], np.zeros(len(split), dtype=np.int64)
    for i, start in enumerate(starts):
        first = max(0, int(start) - context)
        lead[i] = int(start) - first
        rows.append(stream[first:int(start) + int(lengths[i])].tolist())
    return Split(None, None, [[] for _ in rows], rows, open_end=True), lead


@torch.no_grad()
def row_nll(model, split: Split, max_tokens: int, device,
            context: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(Σ NLL in nats, tokens scored) of every row of `split`, in its order. `context` (document
    blocks only): each block read after up to that many tokens of the text before it, its own
    tokens alone scored (eval.context)."""
    lead = np.zeros(len(split), dtype=np.int64)
    if context and split.open_end:
        split, lead = in_context(split, context)
    nll = np.zeros(len(split))
    tokens = np.zeros(len(split), dtype=np.int64)
    with evaluating(model):
        for ids in bucket(split.src_lens, split.tgt_lens, max_tokens):
            batch = collate(split, ids).to(device)
            keep = batch.tgt_out != model.pad_id  # [batch, len]
            if lead[ids].any():  # the context's tokens are read, not scored
                position = torch.arange(keep.shape[1], device=keep.device)[None, :]
                keep &= position >= torch.from_numpy(lead[ids]).to(keep.device)[:, None]
            hidden = model.decode(batch.tgt_in, model.encode(batch.src))
            logits = model.logits(hidden).float()  # [batch, len, vocab]
            losses = F.cross_entropy(logits.transpose(1, 2), batch.tgt_out, reduction="none")
            nll[ids] = (losses * keep).sum(dim=1).double().cpu().numpy()
            tokens[ids] = keep.sum(dim=1).cpu().numpy()
    return nll, tokens


def lm_perplexity(model, split: Split, max_tokens: int, device) -> dict[str, float]:
    """Perplexity per token, and bits per byte where the split has text (not repeats)."""
    nll, tokens = row_nll(model, split, max_tokens, device)
    return totals(nll, tokens, split.bytes)


def totals(nll: np.ndarray, tokens: np.ndarray, size: np.ndarray | None) -> dict[str, float]:
    loss = float(nll.sum()) / max(int(tokens.sum()), 1)
    out = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": int(tokens.sum())}
    if size is not None:
        out["bits_per_byte"] = float(nll.sum()) / (LN2 * max(int(size.sum()), 1))
        out["bytes"] = int(size.sum())
    return out


@torch.no_grad()
def copy_accuracy(model, split: Split, max_tokens: int, device) -> float | None:
    """data=repeats: the share of the second copy's tokens (its first excepted, which nothing
    before predicts) that the model's argmax predicts."""
    if not split.repeats:
        return None
    hits = total = 0
    with evaluating(model):
        for ids in bucket(split.src_lens, split.tgt_lens, max_tokens):
            batch = collate(split, ids).to(device)
            guess = model.logits(model.decode(batch.tgt_in, model.encode(batch.src))).argmax(-1)
            for row, i in enumerate(ids):
                prefix, n = split.repeats[int(i)]
                # tgt_out[t] is token t of the row: the second copy is prefix + n .. prefix + 2n
                span = slice(prefix + n + 1, prefix + 2 * n)
                hits += int((guess[row, span] == batch.tgt_out[row, span]).sum())
                total += span.stop - span.start
    return hits / max(total, 1)


@torch.no_grad()
def sample(model, tokenizer, prompts: list[list[int]], length: int, temperature: float,
           seed: int, device) -> list[str]:
    """Continuations of `prompts` (ids after the BOS) by `length` tokens: greedy (temperature
    0) or sampled from softmax(logits / temperature) with its own generator, stopping at EOS."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    with evaluating(model):
        for prompt in prompts:
            ids = [BOS, *prompt]
            for _ in range(length):
                if len(ids) >= model.cfg.max_positions:
                    break
                x = torch.tensor([ids], device=device)
                logits = model.logits(model.decode(x, model.encode(x[:, :0])))[0, -1].float()
                if temperature <= 0:
                    nxt = int(logits.argmax())
                else:
                    probs = torch.softmax(logits / temperature, -1).cpu()
                    nxt = int(torch.multinomial(probs, 1, generator=generator))
                if nxt == EOS:
                    break
                ids.append(nxt)
            out.append(tokenizer.decode([ids[1 + len(prompt):]])[0])
    return out


def write_samples(model, tokenizer, split: Split, out: Path, device, seed: int,
                  length: int = 64) -> Path:
    """samples.txt: from the BOS alone and from the starts of two held-out rows, greedy and at
    temperature 0.8 (seeded by the run's seed)."""
    prompts = [[]] + [list(split.tgt[i][:16]) for i in range(min(2, len(split)))]
    lines = []
    for temperature in (0.0, 0.8):
        texts = sample(model, tokenizer, prompts, length, temperature, seed, device)
        for prompt, text in zip(prompts, texts):
            head = tokenizer.decode([prompt])[0] if prompt else ""
            how = "greedy" if temperature == 0 else f"temperature {temperature}"
            lines += [f"## {how}, from {'the BOS' if not prompt else repr(head)}",
                      head + text, ""]
    return write_lines(out, lines)


def write_rows(path: Path, nll: np.ndarray, tokens: np.ndarray, size: np.ndarray | None) -> Path:
    """scores.<split>.tsv: per held-out row its tokens scored, UTF-8 bytes and Σ NLL (nats)."""
    lines = ["tokens\tbytes\tnll"] + [
        f"{int(t)}\t{int(size[i]) if size is not None else ''}\t{float(nll[i])!r}"
        for i, t in enumerate(tokens)]
    return write_lines(path, lines)


def read_rows(path: Path) -> dict[str, np.ndarray]:
    """scores.<split>.tsv read back: {tokens, bytes (None without text), nll}."""
    rows = [line.split("\t") for line in Path(path).read_text().splitlines()[1:]]
    tokens = np.array([int(r[0]) for r in rows], dtype=np.int64)
    size = (np.array([int(r[1]) for r in rows], dtype=np.int64)
            if rows and rows[0][1] != "" else None)
    return {"tokens": tokens, "bytes": size, "nll": np.array([float(r[2]) for r in rows])}
