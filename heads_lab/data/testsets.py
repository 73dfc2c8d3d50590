"""Standard test sets through sacrebleu's own loading (`eval.sacrebleu_test=wmt14`), so BLEU is
computed on exactly the text papers use. sacrebleu downloads a set once into ~/.sacrebleu
(or $SACREBLEU); offline and not yet downloaded, the run stops with one clear line."""

from __future__ import annotations

from heads_lab.data.batching import Split
from heads_lab.data.cleaning import normalize
from heads_lab.data.tokenizer import Tokenizer
from heads_lab.errors import ConfigError, DataError


def check(name: str, src: str, tgt: str) -> None:
    """Refuse an unknown test set or language pair without touching the network."""
    from sacrebleu.utils import get_available_testsets, get_langpairs_for_testset

    if name not in get_available_testsets():
        raise ConfigError(f"eval.sacrebleu_test={name!r} is not a sacrebleu test set (e.g. wmt14, "
                          "wmt20, iwslt17; `sacrebleu --list` shows all)")
    pairs = get_langpairs_for_testset(name)
    if f"{src}-{tgt}" not in pairs:
        raise ConfigError(f"sacrebleu test set {name} has no {src}-{tgt} (data.src-data.tgt); it "
                          f"has {sorted(pairs)}")


def load(name: str, src: str, tgt: str, tokenizer: Tokenizer, normal_form: str) -> Split:
    """The test set as a Split: sources normalised like the training data; references exactly
    as sacrebleu gives them (the first reference where a set has several)."""
    from sacrebleu.utils import get_reference_files, get_source_file

    check(name, src, tgt)
    langpair = f"{src}-{tgt}"
    try:
        src_path = get_source_file(name, langpair)
        ref_path = get_reference_files(name, langpair)[0]
    except (Exception, SystemExit) as err:  # sacrebleu exits or raises when it cannot download
        raise DataError(f"sacrebleu could not fetch test set {name} ({langpair}): {err}; it "
                        "downloads once into ~/.sacrebleu (needs a network), or set "
                        "eval.sacrebleu_test=null") from None
    with open(src_path, encoding="utf-8") as f:
        sources = [normalize(line.rstrip("\n"), normal_form) for line in f]
    with open(ref_path, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    if len(sources) != len(refs) or not sources:
        raise DataError(f"sacrebleu test set {name} ({langpair}): {len(sources)} sources but "
                        f"{len(refs)} references")
    return Split(sources, refs, tokenizer.encode(sources), tokenizer.encode(refs))
