"""Standard test sets through sacrebleu's own loading (`eval.sacrebleu_test=wmt14`), so BLEU is
computed on exactly the text papers use. sacrebleu downloads a set once into ~/.sacrebleu
(or $SACREBLEU); offline and not yet downloaded, the run stops with one clear line."""

from __future__ import annotations

import sacrebleu.utils

from heads_lab.config.validate import check_sacrebleu_test
from heads_lab.data.batching import Split
from heads_lab.data.cleaning import normalize
from heads_lab.data.tokenizer import Tokenizer
from heads_lab.errors import DataError


def fetch(name: str, src: str, tgt: str) -> tuple[str, str]:
    """The test set's source and reference files, downloaded by sacrebleu the first time (a
    training run calls this before it trains, so that offline it stops at once, not after
    training)."""
    check_sacrebleu_test(name, src, tgt)
    langpair = f"{src}-{tgt}"
    try:
        return (sacrebleu.utils.get_source_file(name, langpair),
                sacrebleu.utils.get_reference_files(name, langpair)[0])
    except (Exception, SystemExit) as err:  # sacrebleu exits or raises when it cannot download
        raise DataError(f"sacrebleu could not fetch test set {name} ({langpair}): {err}; it "
                        "downloads once into ~/.sacrebleu (needs a network), or set "
                        "eval.sacrebleu_test=null") from None


def load(name: str, src: str, tgt: str, tokenizer: Tokenizer, normal_form: str) -> Split:
    """The test set as a Split: sources normalised like the training data; references exactly
    as sacrebleu gives them (the first reference where a set has several)."""
    src_path, ref_path = fetch(name, src, tgt)
    with open(src_path, encoding="utf-8") as f:
        sources = [normalize(line.rstrip("\n"), normal_form) for line in f]
    with open(ref_path, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    if len(sources) != len(refs) or not sources:
        raise DataError(f"sacrebleu test set {name} ({src}-{tgt}): {len(sources)} sources but "
                        f"{len(refs)} references")
    return Split(sources, refs, tokenizer.encode(sources), tokenizer.encode(refs))
